//! Entry points: run a plan, rechunk an array, describe a store, and the codec floors used
//! by the benchmarks. The CLI and the Python bindings call these.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::array::buffer::copy_region;
use crate::array::{Buffer, ChunkGrid, Region};
use crate::error::{Error, Result, ResultExt};
use crate::exec::bands::{BandGroup, BlockBoxes};
use crate::exec::chunk_cache::ChunkCache;
use crate::exec::ops::{compute, reduce};
use crate::exec::{resident, Budget, Progress, Scheduler};
use crate::kernels::device::{Device, DeviceKernel, Placement};
use crate::optimize::fuse::Fused;
use crate::optimize::stages::{self, MaterialOrigin, PlanOptions, Stage};
use crate::plan::graph::Graph;
use crate::plan::Plan;
use crate::store::open_store;
use crate::zarr::{ArrayInfo, ArraySpec, Codec, ZarrArray};

mod job_groups;
mod rechunk;

pub use rechunk::{rechunk_plan, RechunkChunks, RechunkOptions};

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Memory budget in bytes; a quarter of the available memory when `None`.
    pub max_mem: Option<u64>,
    /// Compute threads; all cores when 0.
    pub threads: usize,
    /// IO threads per store.
    pub io_threads: usize,
    /// Where intermediates go; the system temporary directory when `None`.
    pub work_dir: Option<PathBuf>,
    /// Show a progress bar (only on a terminal).
    pub progress: bool,
    /// Raised to cancel (Ctrl-C).
    pub cancel: Arc<AtomicBool>,
    /// Counters to share with the caller, who may poll them while the run goes (the Python
    /// bindings report progress from them); the run makes its own when `None`.
    pub observe: Option<Arc<Progress>>,
    /// Make the run resumable: targets carry a job marker until the run completes (without
    /// `resume`, only those a write may not overwrite do), intermediates live in a work
    /// directory named after the job that outlives a failed run, and rerunning an unfinished
    /// job keeps every chunk it had written.
    pub resume: bool,
    /// Where fused elementwise programs run (reductions, FFTs and codecs stay on the CPU).
    pub device: Device,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_mem: None,
            threads: 0,
            io_threads: 8,
            work_dir: None,
            progress: false,
            cancel: Arc::new(AtomicBool::new(false)),
            observe: None,
            resume: true,
            device: Device::Cpu,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Plan name.
    pub plan: String,
    /// Wall time.
    pub seconds: f64,
    /// Tasks run.
    pub tasks: u64,
    /// Stages run, described.
    pub stages: Vec<String>,
    /// Bytes read from stores.
    pub bytes_read: u64,
    /// Bytes written to stores.
    pub bytes_written: u64,
    /// Bytes of chunks decoded.
    pub decoded_bytes: u64,
    /// Peak resident memory of the process (bytes), where the OS reports it.
    pub peak_rss: u64,
    /// The memory budget.
    pub max_mem: u64,
    /// Compute threads.
    pub threads: usize,
    /// Arrays written.
    pub outputs: Vec<String>,
    /// Where fused elementwise programs ran: `cpu`, or `cuda: NAME (compute_XY)`.
    pub device: String,
    /// Blocks of output whose fused program ran on the GPU.
    pub gpu_blocks: u64,
}

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where unknown.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// A safe default budget: a quarter of the available memory, at least 256 MiB.
pub fn default_max_mem() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(4 << 30);
    (avail / 4).max(256 << 20)
}

/// Removes the work directory when dropped.
struct WorkDir(Option<PathBuf>);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Opens every material: sources as they are, targets and intermediates created in their
/// stores, or, without a `work_root`, created in memory as stand-ins for planning checks.
/// `job` is the job's fingerprint (arrays created are marked as its unfinished output) and
/// whether to resume what an unfinished run of it left.
fn open_materials(
    materials: &[stages::Material],
    io_threads: usize,
    work_root: Option<&std::path::Path>,
    job: Option<(&str, bool)>,
) -> Result<(crate::exec::ops::region::Arrays, Vec<bool>)> {
    static STAND_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut arrays = Vec::with_capacity(materials.len());
    let mut resumed = vec![false; materials.len()];
    for (i, m) in materials.iter().enumerate() {
        let (store, spec) = match (&m.origin, work_root) {
            (MaterialOrigin::Source(a), _) => {
                arrays.push(a.clone());
                continue;
            }
            (MaterialOrigin::Target { spec, .. } | MaterialOrigin::Intermediate { spec }, None) => {
                let n = STAND_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let store = crate::store::memory::MemoryStore::named(&format!("stand-in-{n}"));
                (store, spec)
            }
            (MaterialOrigin::Target { url, spec, .. }, Some(_)) => {
                (open_store(url, io_threads)?, spec)
            }
            (MaterialOrigin::Intermediate { spec }, Some(root)) => {
                let dir = root.join(format!("{i}.zarr"));
                (open_store(&dir.display().to_string(), io_threads)?, spec)
            }
        };
        let attrs = match &m.origin {
            MaterialOrigin::Target { attrs, .. } => attrs.clone(),
            _ => Default::default(),
        };
        // A target is marked while the job runs when the run may resume it, or when it may
        // not be overwritten (a rerun recognises its own unfinished output by the marker).
        let marked = job.filter(|&(_, resume)| resume || !spec.overwrite);
        let arr = match (marked, work_root) {
            (Some((job, resume)), Some(_)) => {
                let (arr, again) = ZarrArray::open_target(store.clone(), spec, &attrs, job, resume)
                    .array_ctx(&m.name)?;
                resumed[i] = again;
                arr
            }
            _ => ZarrArray::create_with(store.clone(), spec, &attrs, None).array_ctx(&m.name)?,
        }
        .with_name(&m.name);
        // The engine's sharded intermediates are read inner chunk by inner chunk.
        let arr = match &m.origin {
            MaterialOrigin::Intermediate { spec } if spec.shards.is_some() => {
                arr.with_inner_reads()
            }
            _ => arr,
        };
        if work_root.is_none() {
            store.erase_prefix("")?;
        }
        arrays.push(Arc::new(arr));
    }
    Ok((Arc::new(arrays), resumed))
}

/// FNV-1a, 64 bits: a fingerprint that stays the same across runs and builds.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What identifies a job: its typed graph, with each source's URL and metadata, and the
/// groups it writes. A rerun with the same plan over the same sources has the same
/// fingerprint. Sources are identified by their metadata, not their contents.
fn job_fingerprint(graph: &Graph, groups: &[crate::plan::GroupDecl]) -> String {
    let mut text = format!("{groups:?}\n");
    for node in &graph.nodes {
        let kind = match &node.kind {
            crate::plan::node::NodeKind::Source(a) => format!("source {} {:?}", a.url(), a.info()),
            k => format!("{k:?}"),
        };
        text.push_str(&format!(
            "{} {:?} {} {:?} {kind}\n",
            node.id,
            node.shape,
            node.dtype,
            node.grid.chunk_shape()
        ));
    }
    format!("{:016x}", fnv1a(&text))
}

/// What identifies a physical plan of a job (its intermediates depend on the budget).
fn physical_fingerprint(physical: &stages::PhysicalPlan) -> String {
    let materials: Vec<String> = physical
        .materials
        .iter()
        .map(|m| {
            let origin = match &m.origin {
                MaterialOrigin::Source(a) => a.url().to_string(),
                MaterialOrigin::Target { url, spec, attrs } => format!("{url} {spec:?} {attrs:?}"),
                MaterialOrigin::Intermediate { spec } => format!("{spec:?}"),
            };
            format!("{} {:?} {}", m.name, m.grid.chunk_shape(), origin)
        })
        .collect();
    let text = format!("{materials:?} {:?}", physical.stages);
    format!("{:016x}", fnv1a(&text))
}

/// The output material of a stage whose tasks a resumed run may skip.
fn stage_input(stage: &Stage) -> &crate::optimize::fuse::Fused {
    match stage {
        Stage::Compute { input, .. }
        | Stage::Stream { input, .. }
        | Stage::Reduce { input, .. } => input,
    }
}

fn stage_output(stage: &Stage) -> Option<usize> {
    match stage {
        Stage::Compute { out, .. } | Stage::Stream { out, .. } => Some(*out),
        Stage::Reduce { .. } => None,
    }
}

/// The groups of a compute stage that reads an FFT's input in bands (see `exec::bands`),
/// when every band fits the budget, both while it loads and beside the largest of the tasks
/// that read it: the planned bands, or narrower ones where those do not fit. Otherwise (not
/// even one block's band fits) the stage's tasks read their chunks themselves.
fn banded_stage(
    stage: &Stage,
    arrays: &[Arc<ZarrArray>],
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

/// Runs a compute stage band by band: loads each group's band, runs the group's blocks
/// (reading the band), lets the band go. `stage` is the compute stage's value, output
/// material, blocks and label. With `resumed`, blocks whose output chunks exist already are
/// skipped; returns how many tasks were skipped so, of how many (both 0 unless `resumed`).
fn run_in_bands(
    engine: &Engine,
    stage: (&Fused, usize, &[u64], &str),
    arrays: &Arc<Vec<Arc<ZarrArray>>>,
    groups: Vec<BandGroup>,
    batch_limit: u64,
    workers: usize,
    resumed: bool,
) -> Result<(usize, usize)> {
    let (input, out, block, label) = stage;
    let kernel = device_kernel(&engine.placement, input)?;
    let input = Arc::new(input.clone());
    // A group's tasks left to run, and how many were skipped as done.
    let group_tasks = |blocks: &[Vec<u64>]| -> Result<(Vec<crate::exec::Task>, usize)> {
        let mut tasks = compute::tasks_for_blocks(
            input.clone(),
            arrays.clone(),
            arrays[out].clone(),
            block,
            blocks.to_vec(),
            label,
            batch_limit,
            workers,
            kernel.clone(),
        )?;
        let skipped = match resumed {
            true => skip_done(&mut tasks, &arrays[out])?,
            false => 0,
        };
        Ok((tasks, skipped))
    };
    let (mut done, mut total) = (0, 0);
    // One band's memory serves the next.
    let mut spare: Option<Vec<u8>> = None;
    for group in groups {
        // A resumed run loads no band whose blocks are all written.
        if resumed {
            let (left, skipped) = group_tasks(&group.blocks)?;
            done += skipped;
            total += left.len() + skipped;
            if left.is_empty() {
                continue;
            }
        }
        let (load, band) = resident::band_task(
            arrays[group.mat].clone(),
            group.band,
            batch_limit,
            spare.take(),
        )?;
        engine.progress.add_tasks(1);
        engine.scheduler.run(vec![load])?;
        // Planned once the band is held, the blocks read it instead of its chunks.
        let (tasks, _) = group_tasks(&group.blocks)?;
        engine.progress.add_tasks(tasks.len() as u64);
        engine.scheduler.run(tasks)?;
        spare = band.release();
    }
    Ok((done, total))
}

/// Drops the tasks whose output chunks all exist already and tells the others which of theirs
/// do; returns how many it dropped.
fn skip_done(tasks: &mut Vec<crate::exec::Task>, out: &ZarrArray) -> Result<usize> {
    let existing: std::collections::HashSet<String> =
        out.store().list_prefix("")?.into_iter().collect();
    let before = tasks.len();
    tasks.retain(|t| t.outputs.is_empty() || !t.outputs.iter().all(|k| existing.contains(k)));
    for t in tasks.iter_mut() {
        t.processor.keep_existing(&existing);
    }
    Ok(before - tasks.len())
}

/// The compute stage value `input` compiled for `placement`, when it runs off the CPU.
fn device_kernel(placement: &Placement, input: &Fused) -> Result<Option<Arc<DeviceKernel>>> {
    let leaf_dtypes: Vec<_> = input.leaves.iter().map(|l| l.dtype).collect();
    Ok(placement
        .kernel(&input.program, &leaf_dtypes, input.shape.len())?
        .map(Arc::new))
}

/// The description of a compute stage `label` of blocks of `block` output chunks.
fn compute_stage_name(label: &str, block: &[u64]) -> String {
    format!("{label} (blocks of {block:?} chunks)")
}

/// The tasks of one stage and its description. `task_share` is what one reduce task may hold
/// (it decides how many pieces a task folds together), `task_budget` what the stage's tasks
/// may reserve in all (a reduction splits its inputs into no more groups than it fits);
/// `workers` run the tasks at once.
#[allow(clippy::too_many_arguments)]
fn stage_tasks(
    stage: &Stage,
    arrays: &Arc<Vec<Arc<ZarrArray>>>,
    batch_limit: u64,
    task_share: u64,
    task_budget: u64,
    workers: usize,
    placement: &Placement,
) -> Result<(String, Vec<crate::exec::Task>)> {
    Ok(match stage {
        Stage::Compute {
            input,
            out,
            block,
            label,
        } => (
            compute_stage_name(label, block),
            compute::tasks(
                Arc::new(input.clone()),
                arrays.clone(),
                arrays[*out].clone(),
                block,
                label,
                batch_limit,
                workers,
                device_kernel(placement, input)?,
            )?,
        ),
        Stage::Stream {
            input,
            out,
            group,
            stream_bytes,
            batch_bytes,
            label,
        } => (
            format!("{label} (groups of {group:?} chunks)"),
            crate::exec::ops::stream_copy::tasks(
                Arc::new(input.clone()),
                arrays.clone(),
                arrays[*out].clone(),
                group,
                *stream_bytes,
                label,
                *batch_bytes,
            )?,
        ),
        Stage::Reduce {
            input,
            out,
            func,
            axes,
            keepdims,
            ddof,
            label,
        } => (
            label.clone(),
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
            )?,
        ),
    })
}

/// The scheduler, counters and budget of one run.
pub(crate) struct Engine {
    pub scheduler: Scheduler,
    pub progress: Arc<Progress>,
    /// The whole budget.
    pub max_mem: u64,
    /// What tasks may reserve (the budget less the buffer pool's share).
    pub task_budget: u64,
    /// The device fused elementwise programs run on.
    pub placement: Placement,
}

impl Engine {
    pub fn new(opts: &RunOptions) -> Result<Engine> {
        let max_mem = opts.max_mem.unwrap_or_else(default_max_mem);
        let placement = Placement::open(opts.device)?;
        let progress = opts
            .observe
            .clone()
            .unwrap_or_else(|| Arc::new(Progress::new(opts.progress)));
        // An eighth of the budget keeps freed chunk buffers for reuse; tasks get the rest.
        crate::exec::memory::scale_allocator_to_budget(max_mem);
        let pool_bytes = (max_mem / 8).min(256 << 20);
        crate::array::pool::set_capacity(pool_bytes);
        // Each compute thread holds memory no task counts (see `THREAD_OVERHEAD`): small
        // budgets run on fewer threads, and what they hold is set aside.
        let requested = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        };
        let threads = crate::exec::memory::threads_for_budget(max_mem, requested);
        let thread_bytes = crate::exec::memory::thread_overhead(max_mem, threads);
        // A GPU's driver memory and transfer buffers are held for the whole run.
        let device_bytes = placement.host_bytes(threads);
        let task_budget = (max_mem - pool_bytes - thread_bytes)
            .checked_sub(device_bytes)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                Error::new(
                    crate::error::ErrorKind::Memory,
                    format!(
                        "the budget of {} cannot hold what the GPU keeps in host memory ({}: \
                         its driver, and pinned transfer buffers for {} threads)",
                        crate::exec::memory::human_bytes(max_mem),
                        crate::exec::memory::human_bytes(device_bytes),
                        threads
                    ),
                )
            })?;
        let scheduler = Scheduler::new(
            threads,
            Budget::lending_to_pool(task_budget),
            progress.clone(),
            opts.cancel.clone(),
        )?;
        Ok(Engine {
            scheduler,
            progress,
            max_mem,
            task_budget,
            placement,
        })
    }

    /// The summary of a finished run that started at `started`.
    pub fn summary(
        &self,
        plan: String,
        started: Instant,
        stages: Vec<String>,
        outputs: Vec<String>,
    ) -> RunSummary {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        RunSummary {
            plan,
            seconds: started.elapsed().as_secs_f64(),
            tasks: load(&self.progress.tasks_done),
            stages,
            bytes_read: load(&self.progress.bytes_read),
            bytes_written: load(&self.progress.bytes_written),
            decoded_bytes: load(&self.progress.decoded_bytes),
            peak_rss: peak_rss(),
            max_mem: self.max_mem,
            threads: self.scheduler.threads(),
            outputs,
            device: self.placement.describe(),
            gpu_blocks: load(&self.progress.gpu_blocks),
        }
    }

    /// Bytes of one read batch.
    fn batch_limit(&self) -> u64 {
        (self.max_mem / 16).max(1)
    }

    /// Tasks that run at once: one per compute thread.
    fn workers(&self) -> usize {
        self.scheduler.threads().max(1)
    }

    /// What one reduce task may hold to fold several pieces per pass over its accumulator:
    /// room for two tasks per thread.
    fn task_share(&self) -> u64 {
        (self.task_budget / (2 * self.workers() as u64)).max(2 * self.batch_limit())
    }

    /// What tasks could reserve were the run on `threads` compute threads instead: each
    /// thread sets its overhead aside (see [`crate::exec::memory::thread_overhead`]).
    fn task_budget_on(&self, threads: usize) -> u64 {
        let pool_bytes = (self.max_mem / 8).min(256 << 20);
        self.max_mem
            .saturating_sub(pool_bytes)
            .saturating_sub(crate::exec::memory::thread_overhead(self.max_mem, threads))
            .saturating_sub(self.placement.host_bytes(threads))
    }

    /// The error for a task that cannot fit the budget, or Ok. A task must fit together with
    /// the state other tasks of its stage may hold while it waits to start (a reduction's
    /// partial results waiting to be merged): were it larger, it would wait for bytes that
    /// only its own run frees.
    pub fn check_fits(&self, tasks: &[crate::exec::task::Task]) -> Result<()> {
        match self.misfit(tasks) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// The largest of `tasks` when it cannot fit the budget (see [`Engine::check_fits`]):
    /// the bytes it needs and the error naming it.
    fn misfit(&self, tasks: &[crate::exec::task::Task]) -> Option<(u64, Error)> {
        let t = tasks.iter().max_by_key(|t| task_need(t))?;
        let need = task_need(t);
        if need <= self.task_budget {
            return None;
        }
        let held = t.processor.held_by_others();
        let error = Error::new(
            crate::error::ErrorKind::Memory,
            format!(
                "{} needs {}{} but the budget for tasks is {} (of --max-mem {}); raise \
                 --max-mem or use smaller chunks",
                t.label,
                crate::exec::memory::human_bytes(need),
                match held {
                    0 => String::new(),
                    h => format!(
                        " ({} of it held by partial results of other tasks)",
                        crate::exec::memory::human_bytes(h)
                    ),
                },
                crate::exec::memory::human_bytes(self.task_budget),
                crate::exec::memory::human_bytes(self.max_mem)
            ),
        );
        Some((need, error))
    }

    /// The physical plan of `graph` for this engine's budget and threads, and its largest
    /// task that cannot fit the budget, if any (see [`Engine::misfit`]), found with
    /// in-memory stand-ins before anything is created on disk.
    fn plan_checked(
        &self,
        graph: &Graph,
        io_threads: usize,
    ) -> Result<(stages::PhysicalPlan, Option<(u64, Error)>)> {
        let (task_budget, batch_limit, workers) =
            (self.task_budget, self.batch_limit(), self.workers());
        let physical = stages::plan(
            graph,
            PlanOptions {
                budget: task_budget,
                threads: self.scheduler.threads(),
                batch_bytes: batch_limit,
            },
        )?;
        let (stand_ins, _) = open_materials(&physical.materials, io_threads, None, None)?;
        for stage in &physical.stages {
            // A stage read in bands was checked against the budget band by band.
            if banded_stage(stage, &stand_ins, task_budget, batch_limit, workers)?.is_some() {
                continue;
            }
            let (_, tasks) = stage_tasks(
                stage,
                &stand_ins,
                batch_limit,
                self.task_share(),
                task_budget,
                workers,
                &Placement::Cpu,
            )?;
            if let Some(misfit) = self.misfit(&tasks) {
                return Ok((physical, Some(misfit)));
            }
        }
        Ok((physical, None))
    }
}

/// The bytes `t` needs of the budget: its own, and what other tasks of its stage may hold
/// while it waits to start.
fn task_need(t: &crate::exec::task::Task) -> u64 {
    t.memory + t.processor.held_by_others()
}

/// The engine of a run and the physical plan it runs, every task of which fits the budget.
/// The run takes as many compute threads as the budget affords; where a task does not fit
/// beside what those threads set aside, it takes as many fewer as that task needs (or one),
/// so a budget never refuses a plan that a smaller budget, affording fewer threads, runs.
/// When not even one thread fits, the refusal names the task and the bytes it needs.
fn fitting_engine(graph: &Graph, opts: &RunOptions) -> Result<(Engine, stages::PhysicalPlan)> {
    let mut opts = opts.clone();
    loop {
        let engine = Engine::new(&opts)?;
        let (physical, misfit) = engine.plan_checked(graph, opts.io_threads)?;
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

/// Validates and runs `plan`.
pub fn run_plan(plan: &Plan, opts: &RunOptions) -> Result<RunSummary> {
    let started = Instant::now();
    let graph = Graph::build(plan, opts.io_threads)?;
    let (engine, physical) = fitting_engine(&graph, opts)?;
    let (progress, task_budget) = (engine.progress.clone(), engine.task_budget);
    let (batch_limit, workers) = (engine.batch_limit(), engine.workers());
    let task_share = engine.task_share();
    // Create targets and intermediates (validation has passed).
    // A target belongs to the job (the plan over its sources); intermediates belong to one
    // physical plan of it (budget and threads shape them), so their directory names both.
    let fingerprint = job_fingerprint(&graph, &plan.groups);
    let job = opts.resume.then(|| fingerprint.clone());
    let work_base = opts.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work_root = match &job {
        Some(job) => work_base.join(format!(
            "chunkfuse-job-{job}-{}",
            physical_fingerprint(&physical)
        )),
        None => work_base.join(format!(
            "chunkfuse-{}-{}",
            std::process::id(),
            started.elapsed().as_nanos()
        )),
    };
    let has_intermediates = physical
        .materials
        .iter()
        .any(|m| matches!(m.origin, MaterialOrigin::Intermediate { .. }));
    // A resumable run keeps its work directory when it fails; it removes it on success.
    let work = WorkDir((has_intermediates && job.is_none()).then(|| work_root.clone()));
    // Nothing the job may not replace is at its targets; then its groups are made, before
    // the arrays in them.
    let groups = job_groups::check_targets(plan, &graph, &fingerprint, opts.io_threads)?;
    job_groups::open(&groups, &fingerprint, opts.resume)?;
    let (arrays, resumed) = open_materials(
        &physical.materials,
        opts.io_threads,
        Some(&work_root),
        Some((&fingerprint, opts.resume)),
    )?;
    let outputs: Vec<String> = physical
        .materials
        .iter()
        .filter_map(|m| match &m.origin {
            MaterialOrigin::Target { url, .. } => Some(url.clone()),
            _ => None,
        })
        .collect();
    let mut stage_names = Vec::new();
    // Materials whose decoded chunks are kept for later stages (see `exec::chunk_cache`),
    // each with the last stage that reads them.
    let mut caching: Vec<(usize, usize)> = Vec::new();
    let drop_caches = |caching: &mut Vec<(usize, usize)>, keep: &dyn Fn(usize, usize) -> bool| {
        caching.retain(|&(mat, last)| {
            let kept = keep(mat, last);
            if !kept {
                arrays[mat].set_chunk_cache(None);
            }
            kept
        });
    };
    for (at, stage) in physical.stages.iter().enumerate() {
        // A stage read in bands holds its bands and nothing else: its budget checks count
        // only them and their tasks.
        let banded = banded_stage(stage, &arrays, task_budget, batch_limit, workers)?;
        if banded.is_some() {
            // Its bands were sized for the whole budget.
            drop_caches(&mut caching, &|_, _| false);
        }
        let resumed_out = stage_output(stage).filter(|&o| resumed[o]);
        let result = match (banded, stage) {
            (
                Some(groups),
                Stage::Compute {
                    input,
                    out,
                    block,
                    label,
                },
            ) => {
                let mut name = format!(
                    "{} (in {} band{})",
                    compute_stage_name(label, block),
                    groups.len(),
                    if groups.len() == 1 { "" } else { "s" }
                );
                let ran = run_in_bands(
                    &engine,
                    (input, *out, block, label),
                    &arrays,
                    groups,
                    batch_limit,
                    workers,
                    resumed_out.is_some(),
                );
                if let (Ok((done, total)), Some(_)) = (&ran, resumed_out) {
                    name = format!("{name} (resumed: {done} of {total} tasks were done)");
                }
                stage_names.push(name);
                ran.map(|_| ())
            }
            _ => {
                let tasks_of = || {
                    stage_tasks(
                        stage,
                        &arrays,
                        batch_limit,
                        task_share,
                        task_budget,
                        workers,
                        &engine.placement,
                    )
                };
                let (mut name, mut tasks) = tasks_of()?;
                // The most a task needs of the budget, the partial results of its reduction
                // it waits beside included: what chunks kept or loaded for the stage must
                // leave room for, or the task would wait for bytes they never free.
                let largest_of = |tasks: &[crate::exec::task::Task]| {
                    tasks.iter().map(task_need).max().unwrap_or(0)
                };
                let cached_bytes = |caching: &[(usize, usize)]| -> u64 {
                    caching
                        .iter()
                        .filter_map(|&(mat, _)| arrays[mat].chunk_cache())
                        .map(|c| c.bytes())
                        .sum()
                };
                // Chunks kept for later stages stay only while this stage's tasks fit beside
                // them; else they go, and the tasks read their chunks themselves.
                if largest_of(&tasks).saturating_add(cached_bytes(&caching)) > task_budget {
                    drop_caches(&mut caching, &|_, _| false);
                    (name, tasks) = tasks_of()?;
                }
                // The chunks of what this stage reads and later stages read again are kept
                // as this stage decodes them, within a quarter of the budget, leaving room
                // for one of the stage's largest tasks per worker.
                let largest = largest_of(&tasks);
                let in_use = cached_bytes(&caching);
                let running = largest.saturating_mul(workers as u64);
                let mut cache_room = (task_budget / 4)
                    .saturating_sub(in_use)
                    .min(task_budget.saturating_sub(running.saturating_add(in_use)));
                let mut assigned = 0u64;
                let mut started = Vec::new();
                for (mat, last) in resident::read_again(&physical.stages, at) {
                    let arr = &arrays[mat];
                    if arr.chunk_cache().is_some() || arr.resident().is_some() || cache_room == 0 {
                        continue;
                    }
                    let limit = arr.info().nbytes.min(cache_room);
                    cache_room -= limit;
                    assigned += limit;
                    arr.set_chunk_cache(Some(Arc::new(ChunkCache::new(limit))));
                    caching.push((mat, last));
                    started.push(mat);
                }
                // What the caches may still take this stage.
                let largest = largest.saturating_add(in_use + assigned);
                // Small arrays that the stage's tasks would each read again are loaded once
                // and shared; the stage's tasks must still fit beside them.
                let share_limit = (task_budget / 8).min(task_budget.saturating_sub(largest));
                let mats = resident::worth_sharing(stage_input(stage), &arrays, share_limit);
                let (load, _shared) = resident::load_tasks(&mats, &arrays, batch_limit)?;
                if !load.is_empty() && engine.check_fits(&load).is_ok() {
                    progress.add_tasks(load.len() as u64);
                    engine.scheduler.run(load)?;
                    (name, tasks) = tasks_of()?;
                }
                if let Some(out) = resumed_out {
                    let total = tasks.len();
                    let done = skip_done(&mut tasks, &arrays[out])?;
                    name = format!("{name} (resumed: {done} of {total} tasks were done)");
                }
                progress.add_tasks(tasks.len() as u64);
                let ran = engine.scheduler.run(tasks);
                for mat in started {
                    let kept = arrays[mat].chunk_cache().map_or(0, |c| c.bytes());
                    if kept > 0 {
                        name = format!(
                            "{name} (kept {} of {}'s decoded chunks for a later stage)",
                            crate::exec::memory::human_bytes(kept),
                            arrays[mat].name()
                        );
                    }
                }
                stage_names.push(name);
                ran
            }
        };
        drop_caches(&mut caching, &|_, last| last > at);
        if let Err(e) = result {
            // Chunks streamed in parts that did not finish never appear.
            if let Some(out) = stage_output(stage) {
                arrays[out].store().discard_parts();
            }
            return Err(e);
        }
    }
    for (arr, m) in arrays.iter().zip(&physical.materials) {
        if matches!(m.origin, MaterialOrigin::Target { .. }) {
            arr.finish_job()?;
        }
    }
    job_groups::finish(&groups, &outputs)?;
    if job.is_some() && has_intermediates {
        let _ = std::fs::remove_dir_all(&work_root);
    }
    progress.finish();
    drop(work);
    Ok(engine.summary(graph.name.clone(), started, stage_names, outputs))
}

/// Describes the array at `url`, with its stored size.
#[derive(Debug, Clone, Serialize)]
pub struct StoreInfo {
    /// Metadata summary.
    #[serde(flatten)]
    pub info: ArrayInfo,
    /// Bytes of stored chunks.
    pub stored_bytes: u64,
    /// Chunks present in the store.
    pub stored_chunks: u64,
    /// Decoded size over stored size.
    pub compression_ratio: f64,
}

/// Reads the metadata and chunk sizes of the array at `url`.
pub fn info(url: &str) -> Result<StoreInfo> {
    let store = open_store(url, 4)?;
    let arr = ZarrArray::open(store.clone())?;
    let mut stored = 0u64;
    let mut count = 0u64;
    for idx in arr.grid().chunk_indices() {
        if let Some(s) = store.size_of(&arr.chunk_key(&idx))? {
            stored += s;
            count += 1;
        }
    }
    let info = arr.info().clone();
    let ratio = if stored > 0 {
        info.nbytes as f64 / stored as f64
    } else {
        0.0
    };
    Ok(StoreInfo {
        info,
        stored_bytes: stored,
        stored_chunks: count,
        compression_ratio: ratio,
    })
}

/// Timings of the codec floors.
#[derive(Debug, Clone, Serialize)]
pub struct CodecFloor {
    /// Decode (and, for `codec`, encode) time.
    pub seconds: f64,
    /// Time to decode every source chunk.
    pub decode_seconds: f64,
    /// Time to encode every target chunk (0 for `decode`).
    pub encode_seconds: f64,
    /// Decoded bytes.
    pub decoded_bytes: u64,
    /// Compute threads.
    pub threads: usize,
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::internal(e.to_string()))
}

/// Reads every chunk of `url` into memory (untimed), then times decoding all of them on
/// `threads` threads; with `target_chunks`, also times encoding the array as those chunks
/// with `codec` (the rechunk codec floor). No IO is timed.
pub fn codec_floor(
    url: &str,
    threads: usize,
    target: Option<(&[u64], &Codec)>,
) -> Result<CodecFloor> {
    let store = open_store(url, 8)?;
    // Chunks, or the inner chunks of a sharded array, as runs read them.
    let arr = ZarrArray::open(store.clone())?.with_inner_reads();
    let indices = arr.read_grid().chunk_indices();
    let encoded = store.get_many(
        indices
            .iter()
            .map(|i| arr.read_request(i))
            .collect::<Result<Vec<_>>>()?,
    )?;
    let pool = pool(threads)?;
    let shape = arr.shape();
    let whole = Region::whole(&shape);
    let size = arr.dtype().size();
    let t0 = Instant::now();
    // Decode only: each buffer goes back to the pool at once, as in a streaming run.
    let Some((chunks, codec)) = target else {
        let decoded_bytes: u64 = pool.install(|| {
            encoded
                .into_par_iter()
                .zip(indices.par_iter())
                .map(|(b, i)| arr.decode_read(i, b).map(|buf| buf.bytes().len() as u64))
                .sum::<Result<u64>>()
        })?;
        let decode_seconds = t0.elapsed().as_secs_f64();
        return Ok(CodecFloor {
            seconds: decode_seconds,
            decode_seconds,
            encode_seconds: 0.0,
            decoded_bytes,
            threads: pool.current_num_threads(),
        });
    };
    let decoded: Vec<Buffer> = pool.install(|| {
        encoded
            .into_par_iter()
            .zip(indices.par_iter())
            .map(|(b, i)| arr.decode_read(i, b))
            .collect::<Result<Vec<_>>>()
    })?;
    let decode_seconds = t0.elapsed().as_secs_f64();
    let decoded_bytes: u64 = decoded.iter().map(|b| b.bytes().len() as u64).sum();
    let encode_seconds = {
        let mut full = Buffer::zeros(arr.dtype(), whole.len() as usize);
        for (b, i) in decoded.iter().zip(&indices) {
            let r = arr.read_grid().chunk_region(i);
            copy_region(b.bytes(), &r, full.bytes_mut(), &whole, &r, size);
        }
        drop(decoded);
        let spec = ArraySpec {
            shape: shape.clone(),
            dtype: arr.dtype(),
            chunks: chunks.to_vec(),
            shards: None,
            codec: codec.clone(),
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let target = ZarrArray::create(
            crate::store::memory::MemoryStore::named("codec-floor"),
            &spec,
        )?;
        let grid = ChunkGrid::regular(&shape, chunks)?;
        let t1 = Instant::now();
        pool.install(|| {
            grid.chunk_indices()
                .par_iter()
                .try_for_each(|i| -> Result<()> {
                    let r = grid.chunk_region(i);
                    let mut c = Buffer::zeros(arr.dtype(), r.len() as usize);
                    copy_region(full.bytes(), &whole, c.bytes_mut(), &r, &r, size);
                    target.encode_chunk(i, &c).map(|_| ())
                })
        })?;
        t1.elapsed().as_secs_f64()
    };
    Ok(CodecFloor {
        seconds: decode_seconds + encode_seconds,
        decode_seconds,
        encode_seconds,
        decoded_bytes,
        threads: pool.current_num_threads(),
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

/// Decodes every chunk of one batch and drops it: the read floor's only work.
struct DecodeOnly {
    array: Arc<ZarrArray>,
    chunks: Vec<Vec<u64>>,
    next: usize,
}

impl crate::exec::Processor for DecodeOnly {
    fn process(
        &mut self,
        _batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut crate::exec::TaskContext,
    ) -> Result<Vec<crate::exec::WriteOp>> {
        let idx = &self.chunks[self.next..self.next + data.len()];
        self.next += data.len();
        let bytes: u64 = data
            .into_par_iter()
            .zip(idx.par_iter())
            .map(|(b, i)| {
                self.array
                    .decode_read(i, b)
                    .map(|buf| buf.bytes().len() as u64)
            })
            .sum::<Result<u64>>()?;
        ctx.add_decoded(bytes);
        Ok(Vec::new())
    }

    fn finish(
        self: Box<Self>,
        _ctx: &mut crate::exec::TaskContext,
    ) -> Result<Vec<crate::exec::WriteOp>> {
        Ok(Vec::new())
    }
}

/// The read floor: reads and decodes every chunk of `url` through the scheduler and the IO
/// threads, as a run does, with no compute and no writes. Timed as a run is: from before the
/// array is opened and the scheduler made.
pub fn read_floor(url: &str, threads: usize, max_mem: Option<u64>) -> Result<CodecFloor> {
    let t0 = Instant::now();
    let max_mem = max_mem.unwrap_or_else(default_max_mem);
    let array = Arc::new(ZarrArray::open(open_store(url, 8)?)?.with_inner_reads());
    let progress = Arc::new(Progress::new(false));
    let scheduler = Scheduler::new(
        threads,
        Budget::new(max_mem),
        progress.clone(),
        Arc::new(AtomicBool::new(false)),
    )?;
    // What a run's tasks read one at a time: chunks, or inner chunks of a sharded array.
    let grid = array.read_grid();
    let indices = grid.chunk_indices();
    let chunk_bytes = grid.chunk_shape().iter().product::<u64>() * array.dtype().size() as u64;
    // Tasks of about 64 MiB of chunks, read in batches of one chunk per thread.
    let per_task = ((64u64 << 20) / chunk_bytes.max(1)).max(1) as usize;
    let per_batch = scheduler.threads().max(1);
    let tasks = indices
        .chunks(per_task)
        .map(|group| {
            Ok(crate::exec::Task {
                label: format!("read {url}"),
                memory: 3 * per_batch as u64 * chunk_bytes,
                batches: group
                    .chunks(per_batch)
                    .map(|b| {
                        b.iter()
                            .map(|i| {
                                Ok(crate::exec::ReadOp {
                                    store: array.store().clone(),
                                    req: array.read_request(i)?,
                                })
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                    .collect::<Result<Vec<_>>>()?,
                outputs: Vec::new(),
                processor: Box::new(DecodeOnly {
                    array: array.clone(),
                    chunks: group.to_vec(),
                    next: 0,
                }),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    scheduler.run(tasks)?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(CodecFloor {
        seconds,
        decode_seconds: seconds,
        encode_seconds: 0.0,
        decoded_bytes: progress
            .decoded_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        threads: scheduler.threads(),
    })
}
