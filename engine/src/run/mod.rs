//! Entry points: run a plan (whole, or stage by stage and part by part through a [`Job`]),
//! explain one, rechunk an array, describe a store, and the codec floors the benchmarks use.
//! The CLI and the Python bindings call these; the stage loop itself is the executor's
//! (`exec::driver`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::exec::driver::{open_materials, Driver};
use crate::kernels::device::{Device, Placement};
use crate::plan::graph::Graph;
use crate::plan::Plan;

mod batches;
mod encode_floor;
mod fit;
mod floor;
mod info;
mod job;
mod job_groups;
mod rechunk;
mod resumed;
mod string_copies;
mod target_lock;

pub use crate::exec::driver::{
    KeptChunks, RunOptions, RunSummary, StageKind, StageRecord, Strategy,
};
pub use crate::exec::memory::{default_max_mem, peak_rss};
pub use batches::{cut_batches, BatchCut};
pub use encode_floor::{encode_floor, DeviceEncodeFloor, EncodeFloor};
pub use floor::{codec_floor, read_floor, CodecFloor};
pub use info::{group_info, info, GroupInfo, GroupMember, StoreInfo};
pub use job::Job;
pub use rechunk::{array_chunks, rechunk_plan, RechunkChunks, RechunkOptions};

/// Validates and runs `plan`.
pub fn run_plan(plan: &Plan, opts: &RunOptions) -> Result<RunSummary> {
    let mut job = Job::prepare(plan, opts)?;
    for at in 0..job.stage_count() {
        job.run_stage(at)?;
    }
    job.finish()
}

/// How a plan would run, without running it or creating anything.
#[derive(Debug, Clone, Serialize)]
pub struct Explained {
    /// Plan name.
    pub plan: String,
    /// The memory budget.
    pub max_mem: u64,
    /// What the tasks may reserve of it.
    pub task_budget: u64,
    /// Compute threads the budget affords.
    pub threads: usize,
    /// Where fused elementwise programs would run.
    pub device: String,
    /// The stages, with the choices a run makes for each (what they would move is 0).
    pub stages: Vec<StageRecord>,
}

/// Validates and plans `plan` as [`run_plan`] would, then makes each stage's choices over
/// in-memory stand-ins of its arrays: nothing is created and no task runs.
pub fn explain_plan(plan: &Plan, opts: &RunOptions) -> Result<Explained> {
    // Arrays of strings are copied, not computed on: no stage runs them.
    let (plan, strings) = string_copies::split(plan, opts.io_threads)?;
    let graph = Graph::build_part(&plan, opts.io_threads, !strings.is_empty())?;
    // Asked for a GPU this machine cannot open, it explains where a run on one would place
    // each stage (a run here fails, naming why).
    let unopened = match opts.device {
        Device::Cuda => Placement::open(Device::Cuda).err(),
        _ => None,
    };
    let mut opts = opts.clone();
    if unopened.is_some() {
        opts.device = Device::Cpu;
    }
    let (engine, physical) = fit::fitting_engine(&graph, &opts)?;
    let (stand_ins, _) = open_materials(&physical.materials, opts.io_threads, None, None)?;
    let (max_mem, task_budget) = (engine.max_mem, engine.task_budget);
    let threads = engine.scheduler.threads();
    let device = match &unopened {
        Some(e) => format!("cuda, not on this machine ({})", e.message),
        None => engine.placement.describe(),
    };
    let mut driver = Driver::explaining(engine, physical.stages, stand_ins);
    if unopened.is_some() {
        driver = driver.placing_for_a_gpu();
    }
    let stages = (0..driver.stages().len())
        .map(|at| driver.run_stage(at))
        .collect::<Result<_>>()?;
    Ok(Explained {
        plan: graph.name.clone(),
        max_mem,
        task_budget,
        threads,
        device,
        stages,
    })
}

/// Parameters as `NAME=VALUE` pairs into a map; an entry without `=` is an error.
pub fn parse_params(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| Error::plan("--param", format!("\"{p}\" is not NAME=VALUE")))
        })
        .collect()
}
