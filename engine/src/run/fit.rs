//! The engine a plan runs on and its physical plan, chosen so that every task fits the
//! budget, checked over in-memory stand-ins before anything is created on disk.

use crate::error::{Error, Result};
use crate::exec::driver::{banded_stage, in_windows, open_materials, Engine, RunOptions};
use crate::kernels::device::Placement;
use crate::optimize::stages;
use crate::physical::options::PlanOptions;
use crate::physical::stage::PhysicalPlan;
use crate::plan::graph::Graph;

/// The physical plan of `graph` for `engine`'s budget and threads, and its largest task that
/// cannot fit the budget, if any (see [`Engine::misfit`]).
fn plan_checked(
    engine: &Engine,
    graph: &Graph,
    io_threads: usize,
) -> Result<(PhysicalPlan, Option<(u64, Error)>)> {
    let limits = engine.limits();
    let physical = stages::plan(
        graph,
        PlanOptions {
            budget: limits.task_budget,
            threads: engine.scheduler.threads(),
            batch_bytes: limits.batch_limit,
            spread: limits.spread,
        },
    )?;
    let (stand_ins, _) = open_materials(&physical.materials, io_threads, None, None)?;
    for stage in &physical.stages {
        // A stage read in bands was checked against the budget band by band.
        let banded = banded_stage(
            stage,
            &stand_ins,
            limits.task_budget,
            limits.batch_limit,
            limits.workers,
        )?;
        if banded.is_some() {
            continue;
        }
        // The largest task that does not fit, of all the stage's, made a window at a time.
        let mut worst: Option<(u64, Error)> = None;
        in_windows(stage, &stand_ins, limits, &Placement::Cpu, |tasks| {
            if let Some(misfit) = engine.misfit(&tasks) {
                if worst.as_ref().is_none_or(|w| misfit.0 > w.0) {
                    worst = Some(misfit);
                }
            }
            Ok(())
        })?;
        if worst.is_some() {
            return Ok((physical, worst));
        }
    }
    Ok((physical, None))
}

/// The engine of a run and the physical plan it runs, every task of which fits the budget.
/// The run takes as many compute threads as the budget affords; where a task does not fit
/// beside what those threads set aside, it takes as many fewer as that task needs (or one),
/// so a budget never refuses a plan that a smaller budget, affording fewer threads, runs.
/// When not even one thread fits, the refusal names the task and the bytes it needs.
pub fn fitting_engine(graph: &Graph, opts: &RunOptions) -> Result<(Engine, PhysicalPlan)> {
    let mut opts = opts.clone();
    loop {
        let engine = Engine::new(&opts)?;
        let (physical, misfit) = plan_checked(&engine, graph, opts.io_threads)?;
        let Some((need, error)) = misfit else {
            return Ok((engine, physical));
        };
        let threads = engine.scheduler.threads();
        if threads <= 1 {
            return Err(error);
        }
        opts.threads = (1..threads)
            .rev()
            .find(|&t| engine.task_budget_on(t) >= need)
            .unwrap_or(1);
        // The next engine's budget lends to the buffer pool once this one has stopped.
        drop(engine);
    }
}
