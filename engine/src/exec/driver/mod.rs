//! The executor driver: runs the stages of a physical plan over its opened materials, one
//! stage after another, and chooses for each how its tasks get their input (bands of an
//! FFT's input, decoded chunks kept for later stages, small inputs loaded once and shared,
//! tasks a resumed run skips). Each stage reports a [`StageRecord`]. The same choices made
//! over in-memory stand-ins, running nothing, explain a plan.
//!
//! The unit of work a caller may address is a range of a stage's parts
//! ([`Driver::run_parts`]): tasks that may run apart from the stage's others, in another
//! call or process.

mod batches;
mod engine;
mod opening;
mod options;
mod placing;
mod record;
mod tasks;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

pub use engine::{task_need, Engine};
pub use opening::{attach_materials, open_materials};
pub use options::RunOptions;
pub use record::{KeptChunks, RunSummary, Snapshot, StageKind, StageRecord, Strategy};
pub use tasks::{
    banded_stage, in_windows, stage_label, stage_tasks, window_tasks, TaskLimits, WINDOW_TASKS,
};

use crate::error::{Error, ErrorKind, Result};
use crate::exec::band_groups::BandGroup;
use crate::exec::chunk_cache::ChunkCache;
use crate::exec::ops::compute;
use crate::exec::ops::region::read::Arrays;
use crate::exec::{resident, Task};
use crate::kernels::device::Placement;
use crate::physical::stage::Stage;
use crate::store::Store;

/// Runs (or explains) the stages of one physical plan.
pub struct Driver {
    engine: Engine,
    stages: Arc<[Stage]>,
    arrays: Arrays,
    /// Per material: a target a resumed run had partly written.
    resumed: Vec<bool>,
    /// Materials whose decoded chunks are kept for later stages (see `exec::chunk_cache`),
    /// each with the last stage that reads them.
    caching: RefCell<Vec<(usize, usize)>>,
    /// Plan every choice, run nothing.
    explain: bool,
    /// Whether the stages are placed for a GPU (see [`placing`]).
    gpu: bool,
    /// Where a stage run in batches leaves the partial states of reductions (see
    /// [`Driver::run_batch`]).
    partials: Option<Arc<dyn Store>>,
}

impl Driver {
    /// A driver that runs `stages` over `arrays` (opened by [`open_materials`]) on `engine`.
    pub fn new(engine: Engine, stages: Vec<Stage>, arrays: Arrays, resumed: Vec<bool>) -> Self {
        Driver {
            gpu: engine.placement.is_gpu(),
            engine,
            stages: stages.into(),
            arrays,
            resumed,
            caching: RefCell::default(),
            explain: false,
            partials: None,
        }
    }

    /// The driver, with `store` for the partial states of reductions run in batches.
    pub fn with_partials(mut self, store: Arc<dyn Store>) -> Self {
        self.partials = Some(store);
        self
    }

    /// A driver that makes every choice a run makes over `stand_ins` (materials opened by
    /// [`open_materials`] without a work directory) and runs nothing.
    pub fn explaining(engine: Engine, stages: Vec<Stage>, stand_ins: Arrays) -> Self {
        let resumed = vec![false; stand_ins.len()];
        Driver {
            explain: true,
            ..Driver::new(engine, stages, stand_ins, resumed)
        }
    }

    /// The driver, explaining where each stage would run with a GPU though none is open.
    pub fn placing_for_a_gpu(mut self) -> Self {
        self.gpu = true;
        self
    }

    /// The stages driven.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The engine the stages run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The materials, opened.
    pub fn arrays(&self) -> &Arrays {
        &self.arrays
    }

    /// The limits the stages' tasks are planned within.
    pub fn limits(&self) -> TaskLimits {
        self.engine.limits()
    }

    /// Runs stage `at` whole, choosing how its tasks read; returns its record.
    pub fn run_stage(&mut self, at: usize) -> Result<StageRecord> {
        let stages = self.stage(at)?;
        let stage = &stages[at];
        let (before, mut record) = self.start(at, stage);
        let limits = self.limits();
        // A stage read in bands holds its bands and nothing else: its budget checks count
        // only them and their tasks.
        let banded = banded_stage(
            stage,
            &self.arrays,
            limits.task_budget,
            limits.batch_limit,
            limits.workers,
        )?;
        let result = match banded {
            _ if record.device == "gpu" && matches!(stage, Stage::Reduce { .. }) => {
                self.drop_caches(&|_, _| false);
                self.reduce_on_device(stage, &mut record)
            }
            Some(groups) => {
                // Its bands were sized for the whole budget.
                self.drop_caches(&|_, _| false);
                self.run_in_bands(stage, groups, &mut record)
            }
            None => self.run_tasks(at, &mut record),
        };
        self.drop_caches(&|_, last| last > at);
        self.end(stage, before, record, result)
    }

    /// Runs the reduction `stage` whole on the run's GPU (its placing said it can), then its
    /// output's write tasks.
    fn reduce_on_device(&self, stage: &Stage, record: &mut StageRecord) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let (true, Stage::Reduce { out, .. }) = (self.explain, stage) {
            // What a run writes once the device has reduced: its write tasks.
            let plan = crate::exec::ops::reduce::device::write_plan(&self.arrays[*out]);
            record.tasks = plan.len() as u64;
            record.parts = plan.len() as u64;
            record.largest_task_bytes = plan.iter().map(|(_, m)| *m).max().unwrap_or(0);
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        if let (Placement::Gpu(gpu), Stage::Reduce { out, .. }) = (self.engine.placement, stage) {
            use crate::exec::ops::reduce::{device, device_form};
            let out = &self.arrays[*out];
            let form = device_form::device_reduce(stage, out.dtype())
                .map_err(|why| Error::internal(format!("placed on the GPU, yet {why}")))?;
            let input = &self.arrays[form.leaf.mat];
            // The slabs' stored bytes and their reads in flight stay within the budget.
            let limits = self.limits();
            let stored_limit = (limits.task_budget / 4).max(1);
            let tasks = device::run_on_device(
                stage,
                &form,
                input,
                out,
                gpu,
                limits.workers,
                stored_limit,
                &self.engine.progress,
            )?;
            return self.run_planned(stage, tasks, record);
        }
        let _ = record;
        Err(Error::internal(format!(
            "{} was placed on a GPU the run has not opened",
            stage_label(stage)
        )))
    }

    /// Runs the parts `parts` of stage `at` (see [`Task::part`]), each task reading its own
    /// chunks (no bands, no kept chunks: those serve a stage run whole); returns the record
    /// of what ran. Parts whose output chunks a resumed run finds written are skipped.
    pub fn run_parts(&mut self, at: usize, parts: Range<usize>) -> Result<StageRecord> {
        let stages = self.stage(at)?;
        let stage = &stages[at];
        let (before, mut record) = self.start_apart(at, stage);
        let (limits, placement) = (self.limits(), &self.engine.placement);
        let made = tasks::task_range(stage, &self.arrays, limits, placement, Some(parts.clone()))?;
        let (mut tasks, total) = match made {
            Some(made) => made,
            None => {
                let tasks = stage_tasks(stage, &self.arrays, limits, placement)?;
                let total = tasks::parts_of(&tasks) as usize;
                (tasks, total)
            }
        };
        if parts.start > parts.end || parts.end > total {
            return Err(Error::new(
                ErrorKind::Value,
                format!(
                    "stage {at} ({}) has parts 0..{total}; {parts:?} is not among them",
                    record.label
                ),
            ));
        }
        tasks.retain(|t| parts.contains(&t.part));
        record.parts = parts.len() as u64;
        let result = self.run_planned(stage, tasks, &mut record);
        self.end(stage, before, record, result)
    }

    /// The counters before stage `at` starts, and its record, to be filled as it runs.
    fn start(&self, at: usize, stage: &Stage) -> (Snapshot, StageRecord) {
        let mut record = tasks::stage_record(at, stage, &self.arrays);
        record.task_budget = self.engine.task_budget;
        if self.gpu {
            let out = match stage {
                Stage::Compute { out, .. }
                | Stage::Stream { out, .. }
                | Stage::Reduce { out, .. } => *out,
            };
            let placed = placing::on_a_gpu(stage, self.arrays[out].dtype());
            record.device = placed.device.to_string();
            record.device_note = placed.note;
        }
        (Snapshot::of(&self.engine.progress), record)
    }

    /// As [`start`](Self::start), for tasks of the stage run apart from the others (parts,
    /// batches): a reduction then runs on the CPU, each task folding its own pieces.
    fn start_apart(&self, at: usize, stage: &Stage) -> (Snapshot, StageRecord) {
        let (before, mut record) = self.start(at, stage);
        if record.device == "gpu" && matches!(stage, Stage::Reduce { .. }) {
            record.device = "cpu".into();
            record.device_note = Some("a reduction run in parts or batches runs on the CPU".into());
        }
        (before, record)
    }

    /// The record of `stage` once `result` is in: what it moved since `before`; or, when it
    /// failed, the error, its output's unfinished streamed chunks discarded (they never
    /// appear).
    fn end(
        &self,
        stage: &Stage,
        before: Snapshot,
        mut record: StageRecord,
        result: Result<()>,
    ) -> Result<StageRecord> {
        if let Err(e) = result {
            if let Some(out) = tasks::stage_output(stage) {
                self.arrays[out].store().discard_parts();
            }
            return Err(e);
        }
        if !self.explain {
            before.close(&self.engine.progress, &mut record);
        }
        Ok(record)
    }

    /// How many parts stage `at` has (see [`Task::part`]): what [`Driver::run_parts`] takes.
    pub fn parts(&self, at: usize) -> Result<usize> {
        let stages = self.stage(at)?;
        tasks::count_parts(&stages[at], &self.arrays, self.limits(), &Placement::Cpu)
    }

    /// The stages, which hold stage `at`, or an error naming the stages there are.
    fn stage(&self, at: usize) -> Result<Arc<[Stage]>> {
        self.stages
            .get(at)
            .map(|_| self.stages.clone())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Value,
                    format!("no stage {at}: the plan has {} stages", self.stages.len()),
                )
            })
    }

    /// Whether stage output `out` is a target a resumed run had partly written.
    fn resumed_output(&self, stage: &Stage) -> Option<usize> {
        tasks::stage_output(stage).filter(|&o| self.resumed[o])
    }

    /// Skips (in a resumed run) and runs `tasks`, all of `stage`, recording their count.
    fn run_planned(
        &self,
        stage: &Stage,
        mut tasks: Vec<Task>,
        record: &mut StageRecord,
    ) -> Result<()> {
        record.tasks += tasks.len() as u64;
        record.largest_task_bytes = record
            .largest_task_bytes
            .max(tasks.iter().map(task_need).max().unwrap_or(0));
        if let Some(out) = self.resumed_output(stage) {
            record.resumed = true;
            record.tasks_done_before += tasks::skip_done(&mut tasks, &self.arrays[out])? as u64;
        }
        if self.explain {
            return Ok(());
        }
        self.engine.progress.add_tasks(tasks.len() as u64);
        self.engine.scheduler.run(tasks)
    }

    /// Stops keeping the chunks of the materials `keep` (given the material and the last
    /// stage that reads it) says no to.
    fn drop_caches(&self, keep: &dyn Fn(usize, usize) -> bool) {
        let arrays = &self.arrays;
        self.caching.borrow_mut().retain(|&(mat, last)| {
            let kept = keep(mat, last);
            if !kept {
                arrays.held(mat).set_chunk_cache(None);
            }
            kept
        });
    }

    /// Bytes of decoded chunks kept for later stages now.
    fn cached_bytes(&self) -> u64 {
        self.caching
            .borrow()
            .iter()
            .filter_map(|&(mat, _)| self.arrays.held(mat).chunk_cache())
            .map(|c| c.bytes())
            .sum()
    }

    /// Runs a compute stage band by band: loads each group's band, runs the group's blocks
    /// (reading the band), lets the band go. A resumed run loads no band whose blocks are all
    /// written.
    fn run_in_bands(
        &self,
        stage: &Stage,
        groups: Vec<BandGroup>,
        record: &mut StageRecord,
    ) -> Result<()> {
        let Stage::Compute {
            input,
            out,
            block,
            label,
        } = stage
        else {
            return Err(Error::internal("only compute stages read bands"));
        };
        let limits = self.limits();
        let kernel = tasks::device_kernel(&self.engine.placement, input)?;
        let input = Arc::new(input.clone());
        let group_tasks = |blocks: &[Vec<u64>]| {
            compute::tasks_for_blocks(
                input.clone(),
                self.arrays.clone(),
                self.arrays[*out].clone(),
                block,
                blocks.to_vec(),
                label,
                limits.batch_limit,
                limits.workers,
                kernel.clone(),
            )
        };
        record.strategy = Strategy::Bands;
        record.bands = groups.len() as u64;
        // One band's memory serves the next.
        let mut spare: Option<Vec<u8>> = None;
        let resumed = self.resumed_output(stage);
        for group in groups {
            let band_bytes = resident::band_task_memory(
                &self.arrays[group.mat],
                &group.band,
                limits.batch_limit,
            );
            record.largest_task_bytes = record.largest_task_bytes.max(band_bytes);
            record.parts += group.blocks.len() as u64;
            // Explained, or resumed (no band is loaded whose blocks are all written), the
            // blocks are planned before their band is held too.
            if self.explain || resumed.is_some() {
                let mut left = group_tasks(&group.blocks)?;
                if let Some(o) = resumed {
                    record.resumed = true;
                    let skipped = tasks::skip_done(&mut left, &self.arrays[o])?;
                    record.tasks_done_before += skipped as u64;
                    record.tasks += skipped as u64;
                }
                if self.explain {
                    record.tasks += left.len() as u64;
                    continue;
                }
                if left.is_empty() {
                    continue;
                }
            }
            let (load, band) = resident::band_task(
                (
                    self.arrays[group.mat].clone(),
                    self.arrays.held(group.mat).clone(),
                ),
                group.band,
                limits.batch_limit,
                spare.take(),
            )?;
            self.engine.progress.add_tasks(1);
            self.engine.scheduler.run(vec![load])?;
            // Planned once the band is held, the blocks read it instead of its chunks.
            let mut tasks = group_tasks(&group.blocks)?;
            if let Some(o) = resumed {
                tasks::skip_done(&mut tasks, &self.arrays[o])?;
            }
            record.tasks += tasks.len() as u64;
            record.largest_task_bytes = record
                .largest_task_bytes
                .max(tasks.iter().map(task_need).max().unwrap_or(0));
            self.engine.progress.add_tasks(tasks.len() as u64);
            self.engine.scheduler.run(tasks)?;
            spare = band.release();
        }
        Ok(())
    }

    /// Runs stage `at` task by task: keeps the chunks later stages read again while the
    /// tasks fit beside them, loads small inputs every task reads once, then runs the tasks.
    fn run_tasks(&self, at: usize, record: &mut StageRecord) -> Result<()> {
        let stages = self.stages.clone();
        let stage = &stages[at];
        let (limits, placement) = (self.limits(), &self.engine.placement);
        if let Some((_, total)) =
            tasks::task_range(stage, &self.arrays, limits, placement, Some(0..0))?
        {
            if total > WINDOW_TASKS {
                return self.run_in_windows(stage, total, record);
            }
        }
        let tasks_of = || stage_tasks(stage, &self.arrays, limits, placement);
        let mut tasks = tasks_of()?;
        record.parts = tasks::parts_of(&tasks);
        // The most a task needs of the budget, the partial results of its reduction it waits
        // beside included: what chunks kept or loaded for the stage must leave room for, or
        // the task would wait for bytes they never free.
        let largest_of = |tasks: &[Task]| tasks.iter().map(task_need).max().unwrap_or(0);
        // Chunks kept for later stages stay only while this stage's tasks fit beside them;
        // else they go, and the tasks read their chunks themselves.
        if largest_of(&tasks).saturating_add(self.cached_bytes()) > limits.task_budget {
            self.drop_caches(&|_, _| false);
            tasks = tasks_of()?;
        }
        let largest = largest_of(&tasks);
        let in_use = self.cached_bytes();
        let started = self.keep_for_later(at, largest, in_use, record);
        // What the caches may still take this stage.
        let assigned: u64 = record.caches.iter().map(|c| c.room).sum();
        let largest = largest.saturating_add(in_use + assigned);
        // Small arrays that the stage's tasks would each read again are loaded once and
        // shared; the stage's tasks must still fit beside them.
        let budget = limits.task_budget;
        let share_limit = (budget / 8).min(budget.saturating_sub(largest));
        let mats = resident::worth_sharing(tasks::stage_input(stage), &self.arrays, share_limit);
        let (load, _shared) = resident::load_tasks(&mats, &self.arrays, limits.batch_limit)?;
        if !load.is_empty() && self.engine.check_fits(&load).is_ok() {
            record.shared = mats
                .iter()
                .map(|&m| self.arrays[m].name().to_string())
                .collect();
            if !self.explain {
                self.engine.progress.add_tasks(load.len() as u64);
                self.engine.scheduler.run(load)?;
                tasks = tasks_of()?;
            }
        }
        // `_shared` holds the loaded arrays until the tasks that read them are done.
        let ran = self.run_planned(stage, tasks, record);
        for (cache, mat) in record.caches.iter_mut().zip(started) {
            cache.kept = self.arrays.held(mat).chunk_cache().map_or(0, |c| c.bytes());
        }
        ran
    }

    /// Runs a compute or stream stage of `total` tasks (more than [`WINDOW_TASKS`]) making
    /// its tasks [`WINDOW_TASKS`] at a time as the scheduler takes them. Such a stage keeps
    /// no chunks for later stages and loads no input once for all its tasks.
    fn run_in_windows(&self, stage: &Stage, total: usize, record: &mut StageRecord) -> Result<()> {
        let (limits, placement) = (self.limits(), &self.engine.placement);
        record.parts = total as u64;
        let resumed = self.resumed_output(stage);
        let written = match resumed {
            Some(out) => {
                record.resumed = true;
                Some(tasks::written_keys(&self.arrays[out])?)
            }
            None => None,
        };
        let record = RefCell::new(record);
        let window = |start: usize| -> Result<Vec<Task>> {
            if start > 0 {
                // The plans of the windows run so far are freed, among buffers in use.
                crate::exec::memory::release_freed_memory();
            }
            let range = start..(start + WINDOW_TASKS).min(total);
            let (mut tasks, _) =
                tasks::task_range(stage, &self.arrays, limits, placement, Some(range))?
                    .ok_or_else(|| Error::internal("a reduction is not run in windows"))?;
            let largest = tasks.iter().map(task_need).max().unwrap_or(0);
            // Chunks kept for later stages stay only while the tasks fit beside them (decided
            // before any task starts: the first window's tasks are the stage's).
            if start == 0 && largest.saturating_add(self.cached_bytes()) > limits.task_budget {
                self.drop_caches(&|_, _| false);
            }
            let mut r = record.borrow_mut();
            r.tasks += tasks.len() as u64;
            r.largest_task_bytes = r.largest_task_bytes.max(largest);
            if let Some(existing) = &written {
                r.tasks_done_before += tasks::skip_written(&mut tasks, existing) as u64;
            }
            if !self.explain {
                self.engine.progress.add_tasks(tasks.len() as u64);
            }
            Ok(tasks)
        };
        let mut starts = (0..total).step_by(WINDOW_TASKS);
        if self.explain {
            return starts.try_for_each(|s| window(s).map(drop));
        }
        let tasks = starts.flat_map(|s| match window(s) {
            Ok(tasks) => tasks.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        });
        self.engine.scheduler.run_lazily(tasks)
    }

    /// Starts keeping the decoded chunks of what stage `at` reads and later stages read again,
    /// within a quarter of the budget, leaving room for one of the stage's `largest` tasks
    /// per worker beside the `in_use` bytes kept already; returns the materials, in the order
    /// of `record.caches`.
    fn keep_for_later(
        &self,
        at: usize,
        largest: u64,
        in_use: u64,
        record: &mut StageRecord,
    ) -> Vec<usize> {
        let budget = self.engine.task_budget;
        let running = largest.saturating_mul(self.engine.workers() as u64);
        let mut room = (budget / 4)
            .saturating_sub(in_use)
            .min(budget.saturating_sub(running.saturating_add(in_use)));
        let mut started = Vec::new();
        for (mat, last) in resident::read_again(&self.stages, at) {
            let (arr, holds) = (&self.arrays[mat], self.arrays.held(mat));
            if holds.chunk_cache().is_some() || holds.resident().is_some() || room == 0 {
                continue;
            }
            let limit = arr.info().nbytes.min(room);
            room -= limit;
            record.caches.push(KeptChunks {
                array: arr.name().to_string(),
                room: limit,
                kept: 0,
            });
            holds.set_chunk_cache(Some(Arc::new(ChunkCache::new(limit))));
            self.caching.borrow_mut().push((mat, last));
            started.push(mat);
        }
        started
    }
}
