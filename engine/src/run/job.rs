//! One job: a validated plan, its engine and physical plan, its targets created and its
//! materials opened. It runs stage by stage, or part by part of a stage (what a remote
//! worker will run), and finishes by marking its targets complete.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::batches::{cut_batches, BatchCut};
use super::fit::fitting_engine;
use super::job_groups::{self, JobGroup};
use super::resumed;
use super::string_copies;
use super::target_lock::{self, TargetLocks};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::driver::{
    attach_materials, open_materials, Driver, RunOptions, RunSummary, StageRecord,
};
use crate::physical::material::MaterialOrigin;
use crate::physical::stage::PhysicalPlan;
use crate::plan::graph::Graph;
use crate::plan::Plan;
use crate::store::open_store;

/// Removes the work directory when dropped.
struct WorkDir(Option<PathBuf>);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            remove_work_root(&p);
        }
    }
}

/// Removes a work directory: a local one, or everything under a URL's prefix (a work
/// directory on object storage, which all the processes of a job run in batches see). The
/// intermediates' metadata goes first: a late copy of a batch that finds a chunk missing then
/// finds its array gone too, and fails rather than read the chunk as the fill value (see
/// `ZarrArray::with_removal_guard`).
fn remove_work_root(root: &Path) {
    let url = root.display().to_string();
    match url.split_once("://") {
        Some((scheme, _)) if scheme != "file" => {
            if let Ok(store) = open_store(&url, 8) {
                if let Ok(keys) = store.list_prefix("") {
                    for key in keys.iter().filter(|k| is_metadata_key(k)) {
                        let _ = store.erase(key);
                    }
                }
                let _ = store.erase_prefix("");
            }
        }
        _ => {
            let dir = Path::new(url.strip_prefix("file://").unwrap_or(&url));
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    for name in ["zarr.json", ".zarray"] {
                        let _ = std::fs::remove_file(entry.path().join(name));
                    }
                }
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Whether `key` is an array's metadata document.
fn is_metadata_key(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    name == "zarr.json" || name == ".zarray"
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
fn job_fingerprint(graph: &Graph, groups: &[crate::plan::GroupDecl], strings: &str) -> String {
    let mut text = format!("{groups:?}\n{strings}");
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
fn physical_fingerprint(physical: &PhysicalPlan) -> String {
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

/// A job ready to run: targets and intermediates created, materials opened.
pub struct Job {
    name: String,
    started: Instant,
    driver: Driver,
    materials: Vec<MaterialOrigin>,
    groups: Vec<JobGroup>,
    outputs: Vec<String>,
    /// The job's fingerprint, when the run is resumable.
    job: Option<String>,
    work_root: PathBuf,
    has_intermediates: bool,
    /// Removes a non-resumable run's work directory when the job is dropped.
    _work: WorkDir,
    /// The locks of its local targets (none for a job attached to run batches).
    _locks: TargetLocks,
    records: Vec<StageRecord>,
}

impl Job {
    /// Validates `plan`, plans it for the budget of `opts` and creates its targets and
    /// intermediates (a resumable run keeps what an unfinished run of the same job wrote).
    pub fn prepare(plan: &Plan, opts: &RunOptions) -> Result<Job> {
        // A job run in batches is always marked and its work directory named after it: the
        // processes that run its batches find both (see `RunOptions::batched`).
        let resumable;
        let opts = match opts.batched && !opts.resume {
            true => {
                resumable = RunOptions {
                    resume: true,
                    ..opts.clone()
                };
                &resumable
            }
            false => opts,
        };
        let started = Instant::now();
        let (plan, strings) = string_copies::split(plan, opts.io_threads)?;
        let plan = &plan;
        let graph = Graph::build_part(plan, opts.io_threads, !strings.is_empty())?;
        let (engine, physical) = fitting_engine(&graph, opts)?;
        // A target belongs to the job (the plan over its sources); intermediates belong to
        // one physical plan of it (budget and threads shape them), so their directory names
        // both.
        let fingerprint = job_fingerprint(&graph, &plan.groups, &string_copies::describe(&strings));
        let job = opts.resume.then(|| fingerprint.clone());
        let work_root = work_root(opts.work_dir.as_deref(), job.as_deref(), &physical, started);
        let has_intermediates = physical
            .materials
            .iter()
            .any(|m| matches!(m.origin, MaterialOrigin::Intermediate { .. }));
        // A resumable run keeps its work directory when it fails; it removes it on success.
        let work = WorkDir((has_intermediates && job.is_none()).then(|| work_root.clone()));
        // No other job writes its targets now, and nothing the job may not replace is at
        // them; then its groups are made, before the arrays in them.
        let string_targets = string_copies::target_urls(&strings);
        let locks = target_lock::lock_targets(plan, &graph, &string_targets)?;
        let groups = job_groups::check_targets(plan, &graph, &fingerprint, opts.io_threads)?;
        string_copies::check_targets(&strings, &plan.groups, &fingerprint, opts.io_threads)?;
        job_groups::open(&groups, &fingerprint, opts.resume)?;
        let (arrays, resumed) = open_materials(
            &physical.materials,
            opts.io_threads,
            Some(&work_root),
            Some((&fingerprint, opts.resume)),
        )?;
        // Arrays of strings are small beside the arrays they label: copied now, in order.
        string_copies::run(&strings, &fingerprint, opts.io_threads, &engine.progress)?;
        let mut outputs = target_urls(&physical);
        outputs.extend(string_targets);
        let PhysicalPlan { materials, stages } = physical;
        if opts.batched {
            resumed::record(&work_root, &resumed, opts.io_threads)?;
        }
        let mut driver = Driver::new(engine, stages, arrays, resumed);
        if opts.batched {
            driver = driver.with_partials(partials_store(&work_root, opts)?);
        }
        Ok(Job {
            name: graph.name.clone(),
            started,
            driver,
            materials: materials.into_iter().map(|m| m.origin).collect(),
            groups,
            outputs,
            job,
            work_root,
            has_intermediates,
            _work: work,
            _locks: locks,
            records: Vec::new(),
        })
    }

    /// Opens the job that [`Job::prepare`] prepared, with `opts.batched`, in another
    /// process (or call) with the same plan and options, to run batches of its stages
    /// ([`Job::run_batch`], [`Job::run_merge`]) or to finish it once they have all run. It
    /// creates and erases nothing: a target or intermediate that is not the job's unfinished
    /// output is an error.
    pub fn attach(plan: &Plan, opts: &RunOptions) -> Result<Job> {
        let started = Instant::now();
        let (plan, strings) = string_copies::split(plan, opts.io_threads)?;
        let plan = &plan;
        let graph = Graph::build_part(plan, opts.io_threads, !strings.is_empty())?;
        let (engine, physical) = fitting_engine(&graph, opts)?;
        let fingerprint = job_fingerprint(&graph, &plan.groups, &string_copies::describe(&strings));
        let work_root = work_root(
            opts.work_dir.as_deref(),
            Some(&fingerprint),
            &physical,
            started,
        );
        let arrays = attach_materials(
            &physical.materials,
            opts.io_threads,
            &work_root,
            &fingerprint,
        )?;
        // The groups, to complete them when this process finishes the job.
        let groups = job_groups::check_targets(plan, &graph, &fingerprint, opts.io_threads)?;
        let mut outputs = target_urls(&physical);
        outputs.extend(string_copies::target_urls(&strings));
        // The materials an earlier run of the job had partly written, as the process that
        // prepared it found them: batches skip the tasks whose output chunks they hold.
        let resumed = resumed::read(&work_root, physical.materials.len(), opts.io_threads)?;
        let PhysicalPlan { materials, stages } = physical;
        let driver = Driver::new(engine, stages, arrays, resumed)
            .with_partials(partials_store(&work_root, opts)?);
        Ok(Job {
            name: graph.name.clone(),
            started,
            driver,
            materials: materials.into_iter().map(|m| m.origin).collect(),
            groups,
            outputs,
            job: Some(fingerprint),
            work_root,
            has_intermediates: false,
            _work: WorkDir(None),
            _locks: TargetLocks::default(),
            records: Vec::new(),
        })
    }

    /// The label of stage `at` (what it computes, for messages).
    pub fn stage_label(&self, at: usize) -> Result<String> {
        let stage = self.driver.stages().get(at).ok_or_else(|| {
            crate::error::Error::new(
                crate::error::ErrorKind::Value,
                format!("no stage {at}: the plan has {} stages", self.stage_count()),
            )
        })?;
        Ok(crate::exec::driver::stage_label(stage).to_string())
    }

    /// The tasks of stage `at` in order, each as (its part, its chunk reads): what
    /// [`Job::run_batch`] takes ranges of.
    pub fn task_layout(&self, at: usize) -> Result<Vec<(usize, usize)>> {
        self.driver.task_layout(at)
    }

    /// Cuts stage `at` into about `want` batches (see [`cut_batches`], with the
    /// job's `RunOptions::spread`); a stage read in bands into one batch per band group.
    pub fn cut(&self, at: usize, want: usize) -> Result<BatchCut> {
        // A stage read in bands: a batch per band group, which holds its band as a whole
        // run would (a group's tasks all read it; cutting one would load it twice).
        if let Some(bands) = self.driver.band_batches(at)? {
            return Ok(BatchCut {
                batches: bands.into_iter().map(|(tasks, _)| tasks).collect(),
                merges: Vec::new(),
            });
        }
        let layout = self.task_layout(at)?;
        Ok(cut_batches(&layout, want, self.driver.engine().spread))
    }

    /// Runs the tasks `tasks` of stage `at` (see [`Driver::run_batch`]); returns their record.
    pub fn run_batch(&mut self, at: usize, tasks: Range<usize>) -> Result<StageRecord> {
        let record = self.driver.run_batch(at, tasks)?;
        self.records.push(record.clone());
        Ok(record)
    }

    /// Runs the batch `tasks` of stage `at`, one of the stage's batches `batches`, then
    /// merges the reduction output chunks it split whose partial states are all written by
    /// now (see [`Driver::ready_merges`]); returns the batch's record and those chunks
    /// (parts), which the merge round can skip.
    pub fn run_batch_merging(
        &mut self,
        at: usize,
        tasks: Range<usize>,
        batches: &[Range<usize>],
    ) -> Result<(StageRecord, Vec<usize>)> {
        if !batches.contains(&tasks) {
            return Err(Error::new(
                ErrorKind::Value,
                format!("stage {at}: tasks {tasks:?} are not one of the batches {batches:?}"),
            ));
        }
        let record = self.run_batch(at, tasks.clone())?;
        let ready = self.driver.ready_merges(at, &tasks, batches)?;
        for &part in &ready {
            self.run_merge(at, part, batches)?;
        }
        Ok((record, ready))
    }

    /// Merges the partial states the batches `batches` of reduce stage `at` left for its
    /// output chunk `part` and writes the chunk (see [`Driver::run_merge`]).
    pub fn run_merge(
        &mut self,
        at: usize,
        part: usize,
        batches: &[Range<usize>],
    ) -> Result<StageRecord> {
        let record = self.driver.run_merge(at, part, batches)?;
        self.records.push(record.clone());
        Ok(record)
    }

    /// How many stages the job has.
    pub fn stage_count(&self) -> usize {
        self.driver.stages().len()
    }

    /// How many parts stage `at` has: [`Job::run_parts`] takes any range of them.
    pub fn parts(&self, at: usize) -> Result<usize> {
        self.driver.parts(at)
    }

    /// Runs stage `at` whole; returns its record, which the summary keeps.
    pub fn run_stage(&mut self, at: usize) -> Result<StageRecord> {
        let record = self.driver.run_stage(at)?;
        self.records.push(record.clone());
        Ok(record)
    }

    /// Runs the parts `parts` of stage `at` (see [`crate::exec::Task::part`]); returns their
    /// record, which the summary keeps.
    pub fn run_parts(&mut self, at: usize, parts: Range<usize>) -> Result<StageRecord> {
        let record = self.driver.run_parts(at, parts)?;
        self.records.push(record.clone());
        Ok(record)
    }

    /// Marks the targets and their groups complete, removes the work directory, and returns
    /// the summary of every stage run.
    pub fn finish(self) -> Result<RunSummary> {
        for (arr, origin) in self.driver.arrays().iter().zip(&self.materials) {
            if matches!(origin, MaterialOrigin::Target { .. }) {
                // Every batch has run: a temporary another process left in a target is a
                // write that process abandoned (it was killed mid-write; a rerun of its
                // batch wrote the chunk).
                if self.driver.runs_in_batches() {
                    arr.store().remove_abandoned_writes()?;
                }
                arr.finish_job()?;
            }
        }
        job_groups::finish(&self.groups, &self.outputs)?;
        if self.job.is_some() && (self.has_intermediates || self.attached_by_others()) {
            remove_work_root(&self.work_root);
        }
        let engine = self.driver.engine();
        engine.progress.finish();
        Ok(engine.summary(self.name, self.started, self.records, self.outputs))
    }
}

impl Job {
    /// Whether other processes may have written to the work directory (partial states).
    fn attached_by_others(&self) -> bool {
        self.driver.runs_in_batches()
    }
}

/// The URLs of a physical plan's targets.
fn target_urls(physical: &PhysicalPlan) -> Vec<String> {
    physical
        .materials
        .iter()
        .filter_map(|m| match &m.origin {
            MaterialOrigin::Target { url, .. } => Some(url.clone()),
            _ => None,
        })
        .collect()
}

/// The store of the partial states of a job run in batches: in its work directory.
fn partials_store(
    work_root: &Path,
    opts: &RunOptions,
) -> Result<std::sync::Arc<dyn crate::store::Store>> {
    let dir = work_root.join("partials");
    open_store(&dir.display().to_string(), opts.io_threads)
}

/// Where a job's intermediates go: a directory named after the job and its physical plan
/// for a resumable run (a rerun finds it), else after this process and moment.
fn work_root(
    base: Option<&Path>,
    job: Option<&str>,
    physical: &PhysicalPlan,
    started: Instant,
) -> PathBuf {
    let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
    match job {
        Some(job) => base.join(format!(
            "chunkfuse-job-{job}-{}",
            physical_fingerprint(physical)
        )),
        None => base.join(format!(
            "chunkfuse-{}-{}",
            std::process::id(),
            started.elapsed().as_nanos()
        )),
    }
}
