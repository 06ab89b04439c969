//! A stage's tasks: what each stage reads and writes, its tasks as planned, the bands a
//! compute stage may read its input in, and the tasks a resumed run may skip.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use super::record::{StageKind, StageRecord};
use crate::error::Result;
use crate::exec::band_groups::{BandGroup, BlockBoxes};
use crate::exec::held::Materials;
use crate::exec::ops::reduce::partials::Window;
use crate::exec::ops::region::read::Arrays;
use crate::exec::ops::{compute, reduce, stream_copy};
use crate::exec::{resident, Task};
use crate::kernels::device::{DeviceKernel, Placement};
use crate::kernels::eval::Inst;
use crate::physical::fused::{Fused, Leaf};
use crate::physical::stage::Stage;
use crate::zarr::ZarrArray;

/// The value a stage reads.
pub fn stage_input(stage: &Stage) -> &Fused {
    match stage {
        Stage::Compute { input, .. }
        | Stage::Stream { input, .. }
        | Stage::Reduce { input, .. } => input,
    }
}

/// The output material of a stage whose tasks a resumed run may skip.
pub fn stage_output(stage: &Stage) -> Option<usize> {
    match stage {
        Stage::Compute { out, .. } | Stage::Stream { out, .. } => Some(*out),
        Stage::Reduce { .. } => None,
    }
}

/// A record of stage `index` before it runs: its kind, label, output and unit of work.
pub fn stage_record(index: usize, stage: &Stage, arrays: &Arrays) -> StageRecord {
    let (kind, out, label, unit) = match stage {
        Stage::Compute {
            out, block, label, ..
        } => (StageKind::Compute, *out, label, block.clone()),
        Stage::Stream {
            out, group, label, ..
        } => (StageKind::Stream, *out, label, group.clone()),
        Stage::Reduce { out, label, .. } => (StageKind::Reduce, *out, label, Vec::new()),
    };
    let mut record = StageRecord::new(index, kind, label, arrays[out].name());
    record.unit = unit;
    let input = stage_input(stage);
    record.reads = input.leaves.iter().map(|l| leaf_read(l, arrays)).collect();
    record.fused = input
        .program
        .insts
        .iter()
        .filter_map(|inst| match inst {
            Inst::Call { func, .. } => Some(func.name().to_string()),
            Inst::Cast { to, .. } => Some(format!("astype {}", to.name())),
            Inst::Load { .. } | Inst::Const { .. } => None,
        })
        .collect();
    record
}

/// What a leaf reads, for people: the array, or what the tasks compute of arrays.
fn leaf_read(leaf: &Leaf, arrays: &Arrays) -> String {
    let name = |mat: usize| arrays[mat].name().to_string();
    match (&leaf.fft, &leaf.concat) {
        (Some(_), _) => format!("transform of {}", name(leaf.mat)),
        (None, Some(join)) => {
            let mut parts: Vec<String> = Vec::new();
            for p in &join.parts {
                let n = name(p.mat);
                if !parts.contains(&n) {
                    parts.push(n);
                }
            }
            format!(
                "join of {} part(s) of {}",
                join.parts.len(),
                parts.join(", ")
            )
        }
        (None, None) if leaf.band.is_some() => format!("{} (in bands)", name(leaf.mat)),
        (None, None) => name(leaf.mat),
    }
}

/// The groups of a compute stage that reads an FFT's input in bands (see `exec::band_groups`),
/// when every band fits the budget, both while it loads and beside the largest of the tasks
/// that read it: the planned bands, or narrower ones where those do not fit. Otherwise (not
/// even one block's band fits) the stage's tasks read their chunks themselves.
pub fn banded_stage(
    stage: &Stage,
    arrays: &Materials,
    task_budget: u64,
    batch_limit: u64,
    workers: usize,
) -> Result<Option<Vec<BandGroup>>> {
    let Stage::Compute {
        input, out, block, ..
    } = stage
    else {
        return Ok(None);
    };
    let Some(boxes) = BlockBoxes::of(input, arrays, &arrays[*out], block, batch_limit, workers)?
    else {
        return Ok(None);
    };
    let fits = |g: &BandGroup| {
        let arr = &arrays[g.mat];
        let bytes = g.band.len() * arr.dtype().size() as u64;
        bytes.saturating_add(boxes.largest_task) <= task_budget
            && resident::band_task_memory(arr, &g.band, batch_limit) <= task_budget
    };
    let mut max_len = boxes.max_len;
    loop {
        let groups = boxes.groups(max_len);
        if groups.iter().all(fits) {
            return Ok(Some(groups));
        }
        if max_len <= 1 {
            return Ok(None);
        }
        max_len /= 2;
    }
}

/// Drops the tasks whose output chunks all exist already and tells the others which of theirs
/// do; returns how many it dropped.
pub fn skip_done(tasks: &mut Vec<Task>, out: &ZarrArray) -> Result<usize> {
    Ok(skip_written(tasks, &written_keys(out)?))
}

/// The keys `out`'s store holds.
pub fn written_keys(out: &ZarrArray) -> Result<HashSet<String>> {
    Ok(out.store().list_prefix("")?.into_iter().collect())
}

/// [`skip_done`] with the keys its output holds listed once (`existing`).
pub fn skip_written(tasks: &mut Vec<Task>, existing: &HashSet<String>) -> usize {
    let before = tasks.len();
    tasks.retain(|t| t.outputs.is_empty() || !t.outputs.iter().all(|k| existing.contains(k)));
    for t in tasks.iter_mut() {
        t.processor.keep_existing(existing);
    }
    before - tasks.len()
}

/// The compute stage value `input` compiled for `placement`, when it runs off the CPU.
pub fn device_kernel(placement: &Placement, input: &Fused) -> Result<Option<Arc<DeviceKernel>>> {
    let leaf_dtypes: Vec<_> = input.leaves.iter().map(|l| l.dtype).collect();
    Ok(placement
        .kernel(&input.program, &leaf_dtypes, input.shape.len())?
        .map(Arc::new))
}

/// The limits a stage's tasks are planned within: the bytes of one read batch, what one
/// reduce task may hold (it decides how many pieces a task folds together), what the stage's
/// tasks may reserve in all (a reduction splits its inputs into no more groups than it
/// fits), and the tasks that run at once.
#[derive(Debug, Clone, Copy)]
pub struct TaskLimits {
    /// Decoded bytes of one read batch.
    pub batch_limit: u64,
    /// What one reduce task may hold.
    pub task_share: u64,
    /// What the stage's tasks may reserve in all.
    pub task_budget: u64,
    /// Tasks that run at once.
    pub workers: usize,
    /// Groups a reduction's output chunk is spread over at least (see `RunOptions::spread`).
    pub spread: usize,
}

/// The tasks of one stage, with its fused program compiled for `placement`.
pub fn stage_tasks(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    placement: &Placement,
) -> Result<Vec<Task>> {
    Ok(window_tasks(stage, arrays, limits, placement, None)?.0)
}

/// The tasks of one stage in `window` (all without one; see [`Window`]), and how many the
/// stage has; a window past them is an error naming how many there are. A compute or stream
/// stage makes only the tasks of the window.
pub fn window_tasks(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    placement: &Placement,
    window: Option<&Window>,
) -> Result<(Vec<Task>, usize)> {
    let range = window.map(|w| w.tasks.clone());
    let Some((tasks, total)) = task_range(stage, arrays, limits, placement, range.clone())? else {
        return reduce_tasks(stage, arrays, limits, window);
    };
    if let Some(r) = range {
        if r.start > r.end || r.end > total {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Value,
                format!(
                    "{} has tasks 0..{total}; {r:?} is not among them",
                    stage_label(stage)
                ),
            ));
        }
    }
    Ok((tasks, total))
}

/// The tasks `range` (all without one, cut to those there are) of a compute or stream stage,
/// made without the others, and how many the stage has (task `i` is its part `i`); `None`
/// for a reduction.
pub fn task_range(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    placement: &Placement,
    range: Option<Range<usize>>,
) -> Result<Option<(Vec<Task>, usize)>> {
    let TaskLimits {
        batch_limit,
        workers,
        ..
    } = limits;
    Ok(Some(match stage {
        Stage::Compute {
            input,
            out,
            block,
            label,
        } => compute::tasks(
            Arc::new(input.clone()),
            arrays.clone(),
            arrays[*out].clone(),
            block,
            label,
            batch_limit,
            workers,
            device_kernel(placement, input)?,
            range,
        )?,
        Stage::Stream {
            input,
            out,
            group,
            stream_bytes,
            batch_bytes,
            label,
        } => stream_copy::tasks(
            Arc::new(input.clone()),
            arrays.clone(),
            arrays[*out].clone(),
            group,
            *stream_bytes,
            label,
            *batch_bytes,
            range,
        )?,
        Stage::Reduce { .. } => return Ok(None),
    }))
}

/// Tasks of a compute or stream stage made at once: a stage with more makes them a window at
/// a time, so what they hold before they run (their reads planned, their keys) does not grow
/// with the stage.
pub const WINDOW_TASKS: usize = 1024;

/// Calls `f` with every task of `stage`: [`WINDOW_TASKS`] at a time for a compute or stream
/// stage, all at once for a reduction.
pub fn in_windows(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    placement: &Placement,
    mut f: impl FnMut(Vec<Task>) -> Result<()>,
) -> Result<()> {
    let Some((_, total)) = task_range(stage, arrays, limits, placement, Some(0..0))? else {
        return f(stage_tasks(stage, arrays, limits, placement)?);
    };
    for start in (0..total).step_by(WINDOW_TASKS) {
        let range = start..(start + WINDOW_TASKS).min(total);
        if let Some((tasks, _)) = task_range(stage, arrays, limits, placement, Some(range))? {
            f(tasks)?;
        }
    }
    Ok(())
}

/// How many parts `stage` has (see [`Task::part`]).
pub fn count_parts(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    placement: &Placement,
) -> Result<usize> {
    Ok(
        match task_range(stage, arrays, limits, placement, Some(0..0))? {
            Some((_, total)) => total,
            None => parts_of(&stage_tasks(stage, arrays, limits, placement)?) as usize,
        },
    )
}

/// The tasks of a reduction stage in `window` (see [`window_tasks`]).
fn reduce_tasks(
    stage: &Stage,
    arrays: &Arrays,
    limits: TaskLimits,
    window: Option<&Window>,
) -> Result<(Vec<Task>, usize)> {
    let TaskLimits {
        task_share,
        task_budget,
        workers,
        spread,
        ..
    } = limits;
    let Stage::Reduce {
        input,
        out,
        func,
        axes,
        keepdims,
        ddof,
        label,
    } = stage
    else {
        return Err(crate::error::Error::internal("not a reduction"));
    };
    reduce::tasks(
        Arc::new(input.clone()),
        arrays.clone(),
        arrays[*out].clone(),
        reduce::ReduceParams {
            func: *func,
            axes: axes.clone(),
            keepdims: *keepdims,
            ddof: *ddof,
        },
        label,
        task_share,
        task_budget,
        workers,
        spread,
        window,
    )
}

/// A stage's label.
pub fn stage_label(stage: &Stage) -> &str {
    match stage {
        Stage::Compute { label, .. }
        | Stage::Stream { label, .. }
        | Stage::Reduce { label, .. } => label,
    }
}

/// How many parts `tasks` fall into (see [`Task::part`]).
pub fn parts_of(tasks: &[Task]) -> u64 {
    tasks.iter().map(|t| t.part + 1).max().unwrap_or(0) as u64
}
