//! A stage run in batches: ranges of its tasks, each run apart (in another call or process),
//! and the merges of the reductions' output chunks the batches cut (see
//! `exec::ops::reduce::partials`).

use std::ops::Range;

use super::{task_need, window_tasks, Driver, StageRecord};
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::exec::band_groups::BandGroup;
use crate::exec::driver::tasks::skip_done;
use crate::exec::driver::{banded_stage, stage_tasks};
use crate::exec::ops::reduce::{
    self,
    partials::{self, PartialSink, Window},
};
use crate::kernels::device::Placement;
use crate::physical::stage::Stage;

/// A band group of a stage read in bands and the range of the stage's tasks it serves.
pub type BandBatch = (Range<usize>, BandGroup);

impl Driver {
    /// Whether the driver has a store for partial states: its stages may run in batches.
    pub fn runs_in_batches(&self) -> bool {
        self.partials.is_some()
    }

    /// The band groups stage `at` reads in (see [`banded_stage`]), each with the range of
    /// the stage's tasks (its blocks, in order) it serves; None when it reads no bands. A
    /// batch of such a stage is whole groups, and holds their bands as a whole run would.
    pub fn band_batches(&self, at: usize) -> Result<Option<Vec<BandBatch>>> {
        let stages = self.stage(at)?;
        let limits = self.limits();
        let Some(groups) = banded_stage(
            &stages[at],
            &self.arrays,
            limits.task_budget,
            limits.batch_limit,
            limits.workers,
        )?
        else {
            return Ok(None);
        };
        let mut first = 0;
        Ok(Some(
            groups
                .into_iter()
                .map(|g| {
                    let range = first..first + g.blocks.len();
                    first = range.end;
                    (range, g)
                })
                .collect(),
        ))
    }

    /// Runs the tasks `tasks` (indices in the stage's task order) of stage `at`, each reading
    /// its own chunks (a stage read in bands: the band groups the range covers, in their
    /// bands); returns the record of what ran. Output chunks of a reduction whose
    /// groups the range cuts are not written: the merged state of the groups it holds goes to
    /// the partials store, for [`Driver::run_merge`]. Running a range twice writes the same
    /// values.
    pub fn run_batch(&mut self, at: usize, tasks: Range<usize>) -> Result<StageRecord> {
        let stages = self.stage(at)?;
        let stage = &stages[at];
        if let Some(bands) = self.band_batches(at)? {
            let held: Vec<BandGroup> = bands
                .iter()
                .filter(|(r, _)| tasks.start <= r.start && r.end <= tasks.end)
                .map(|(_, g)| g.clone())
                .collect();
            let covered: usize = held.iter().map(|g| g.blocks.len()).sum();
            if covered != tasks.len() || tasks.end > bands.last().map_or(0, |(r, _)| r.end) {
                let ranges: Vec<_> = bands.iter().map(|(r, _)| r.clone()).collect();
                return Err(Error::new(
                    ErrorKind::Value,
                    format!(
                        "stage {at} reads in bands: a batch is whole band groups {ranges:?}, \
                         not tasks {tasks:?}"
                    ),
                ));
            }
            let (before, mut record) = self.start_apart(at, stage);
            let result = self.run_in_bands(stage, held, &mut record);
            return self.end(stage, before, record, result);
        }
        let (before, mut record) = self.start_apart(at, stage);
        let window = Window {
            tasks,
            sink: self.partial_sink(at)?,
        };
        let (mut tasks, _) = window_tasks(
            stage,
            &self.arrays,
            self.limits(),
            &self.engine.placement,
            Some(&window),
        )?;
        let parts: std::collections::BTreeSet<usize> = tasks.iter().map(|t| t.part).collect();
        record.parts = parts.len() as u64;
        record.tasks += tasks.len() as u64;
        // A rerun of a job an earlier run left unfinished: tasks whose output chunks that
        // run wrote are done (reductions' tasks, which write no chunk of their own, run).
        if let Some(out) = self.resumed_output(stage) {
            record.resumed = true;
            record.tasks_done_before += skip_done(&mut tasks, &self.arrays[out])? as u64;
        }
        record.largest_task_bytes = tasks.iter().map(task_need).max().unwrap_or(0);
        let result = match self.explain {
            true => Ok(()),
            false => {
                self.engine.progress.add_tasks(tasks.len() as u64);
                self.engine.scheduler.run(tasks)
            }
        };
        self.end(stage, before, record, result)
    }

    /// The tasks of stage `at` in order: for each, its part and how many chunk reads it
    /// makes (a measure of its work), for cutting the stage into batches.
    pub fn task_layout(&self, at: usize) -> Result<Vec<(usize, usize)>> {
        let stages = self.stage(at)?;
        let tasks = stage_tasks(&stages[at], &self.arrays, self.limits(), &Placement::Cpu)?;
        Ok(tasks
            .iter()
            .map(|t| (t.part, t.batches.iter().map(Vec::len).sum::<usize>().max(1)))
            .collect())
    }

    /// Merges the partial states that the batches `batches` (task ranges of stage `at`, a
    /// reduction) left for output chunk `part`, in batch order, and writes the chunk.
    pub fn run_merge(
        &mut self,
        at: usize,
        part: usize,
        batches: &[Range<usize>],
    ) -> Result<StageRecord> {
        let stages = self.stage(at)?;
        let stage = &stages[at];
        let Stage::Reduce {
            input,
            out,
            func,
            axes,
            keepdims,
            ddof,
            ..
        } = stage
        else {
            return Err(Error::new(
                ErrorKind::Value,
                format!("stage {at} is not a reduction: it has no partial states to merge"),
            ));
        };
        let (before, mut record) = self.start_apart(at, stage);
        let layout = self.task_layout(at)?;
        let chunk_tasks = match layout.iter().position(|&(p, _)| p == part) {
            Some(first) => first..first + layout.iter().filter(|&&(p, _)| p == part).count(),
            None => {
                return Err(Error::new(
                    ErrorKind::Value,
                    format!("stage {at} ({}) has no part {part}", record.label),
                ))
            }
        };
        let cuts = partials::cuts(&chunk_tasks, batches);
        let out = self.arrays[*out].clone();
        let idx = out
            .grid()
            .chunk_indices()
            .into_iter()
            .nth(part)
            .ok_or_else(|| Error::internal("a reduction part without its output chunk"))?;
        let params = reduce::ReduceParams {
            func: *func,
            axes: axes.clone(),
            keepdims: *keepdims,
            ddof: *ddof,
        };
        let count = axes.iter().map(|&a| input.shape[a]).product();
        let sink = self.partial_sink(at)?;
        // A merge round runs alone after its stage's batches (most often one merge, of a
        // reduction into one chunk): the chunk is encoded on the machine's cores.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .max(self.engine.workers());
        let result = (|| {
            let encoded = partials::merge_chunk(&out, &params, count, &idx, &sink, &cuts, threads)?;
            let key = out.chunk_key(&idx);
            match encoded {
                Some(bytes) => out.store().set(&key, bytes),
                None => out.store().erase(&key),
            }
            .chunk_ctx(&key)
        })();
        record.parts = 1;
        record.tasks = 1;
        self.end(stage, before, record, result)
    }

    /// The output chunks (parts) of reduce stage `at` that the batch `tasks` holds only some
    /// groups of and whose partial states, as the stage's batches `batches` cut them, are all
    /// written: after its tasks, a batch that finds every state of a chunk merges it (two
    /// batches that finish together may both do so; they write the same bytes), and the
    /// merge round is left the chunks no batch found complete. Empty for other stages.
    pub fn ready_merges(
        &self,
        at: usize,
        tasks: &Range<usize>,
        batches: &[Range<usize>],
    ) -> Result<Vec<usize>> {
        let stages = self.stage(at)?;
        let Stage::Reduce { out, .. } = &stages[at] else {
            return Ok(Vec::new());
        };
        let layout = self.task_layout(at)?;
        let sink = self.partial_sink(at)?;
        let out = &self.arrays[*out];
        let indices = out.grid().chunk_indices();
        let mut ready = Vec::new();
        let mut first = 0;
        while first < layout.len() {
            let part = layout[first].0;
            let end = first + layout[first..].iter().take_while(|t| t.0 == part).count();
            let chunk_tasks = first..end;
            first = end;
            let touched = chunk_tasks.start < tasks.end && tasks.start < chunk_tasks.end;
            let whole = tasks.start <= chunk_tasks.start && chunk_tasks.end <= tasks.end;
            if !touched || whole {
                continue;
            }
            let idx = indices
                .get(part)
                .ok_or_else(|| Error::internal("a reduction part without its output chunk"))?;
            let mut complete = true;
            for groups in partials::cuts(&chunk_tasks, batches) {
                let key = sink.key(idx, &groups);
                if sink.store.size_of(&key).chunk_ctx(&key)?.is_none() {
                    complete = false;
                    break;
                }
            }
            if complete {
                ready.push(part);
            }
        }
        Ok(ready)
    }

    /// Where stage `at` leaves partial states.
    fn partial_sink(&self, at: usize) -> Result<PartialSink> {
        let store = self.partials.clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Value,
                "a stage runs in batches only in a job with a work directory",
            )
        })?;
        Ok(PartialSink {
            store,
            prefix: format!("stage-{at}"),
        })
    }
}
