//! `Job`: a plan run in batches, perhaps by other processes (`chunkfuse.distributed`). The
//! process that prepares a job cuts each stage into batches and finishes it; any process
//! with the same plan and options attaches to it and runs batches. Every call goes through
//! the gate (GIL released, Ctrl-C cancels).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, TryLockError};

use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run::{self, RunOptions};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::{driver, to_py};

/// A job run in batches.
#[pyclass(name = "Job", module = "chunkfuse._engine")]
pub struct PyJob {
    job: Mutex<Option<run::Job>>,
    stages: usize,
}

/// The options of a batched job.
fn batched_options(
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
    device: &str,
    spread: usize,
) -> PyResult<RunOptions> {
    let (mut opts, _) = driver::observed_options(max_mem, threads, work_dir, true);
    opts.device = device.parse().map_err(to_py)?;
    opts.batched = true;
    opts.spread = spread;
    Ok(opts)
}

/// Serialises what a call returns as JSON text.
fn json<T: serde::Serialize>(value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

impl PyJob {
    fn open(
        py: Python<'_>,
        plan_json: &str,
        params: BTreeMap<String, String>,
        opts: RunOptions,
        attach: bool,
    ) -> PyResult<Self> {
        let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
        let job = crate::gate::call(py, move || match attach {
            true => run::Job::attach(&plan, &opts),
            false => run::Job::prepare(&plan, &opts),
        })?;
        Ok(PyJob {
            stages: job.stage_count(),
            job: Mutex::new(Some(job)),
        })
    }

    /// The job, once no other thread's call holds it: waits without the GIL (the holder's
    /// gate needs it) and lets Ctrl-C end the wait.
    fn lock(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, Option<run::Job>>> {
        loop {
            match self.job.try_lock() {
                Ok(guard) => return Ok(guard),
                Err(TryLockError::WouldBlock) => {
                    py.detach(|| std::thread::sleep(std::time::Duration::from_millis(5)));
                    py.check_signals()?;
                }
                Err(TryLockError::Poisoned(_)) => {
                    return Err(PyRuntimeError::new_err("a call on this job panicked"))
                }
            }
        }
    }

    /// Runs `call` on the job behind the gate.
    fn with_job<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut run::Job) -> chunkfuse_engine::Result<T> + Send,
    ) -> PyResult<T> {
        let mut guard = self.lock(py)?;
        let job = guard
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("this job is finished"))?;
        crate::gate::call(py, move || call(job))
    }
}

#[pymethods]
impl PyJob {
    /// Validates and plans a JSON plan for the budget, creates its targets and intermediates
    /// (marked as this job's unfinished output, in a work directory named after the job, so
    /// other processes find them) and returns the job, ready to be cut into batches.
    /// `spread`: the batches that will run at once; a reduction's output chunk is folded in
    /// at least that many groups where it has the pieces. Every process of a job must give
    /// the same options.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (plan_json, params=BTreeMap::new(), max_mem=None, threads=0, work_dir=None, device="cpu", spread=0))]
    fn prepare(
        py: Python<'_>,
        plan_json: &str,
        params: BTreeMap<String, String>,
        max_mem: Option<u64>,
        threads: usize,
        work_dir: Option<PathBuf>,
        device: &str,
        spread: usize,
    ) -> PyResult<Self> {
        let opts = batched_options(max_mem, threads, work_dir, device, spread)?;
        Self::open(py, plan_json, params, opts, false)
    }

    /// Opens, in this process, the job another prepared with the same plan and options, to
    /// run its batches. Creates and erases nothing: a target that is not the job's
    /// unfinished output (the job finished, or it was replaced) raises OSError.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (plan_json, params=BTreeMap::new(), max_mem=None, threads=0, work_dir=None, device="cpu", spread=0))]
    fn attach(
        py: Python<'_>,
        plan_json: &str,
        params: BTreeMap<String, String>,
        max_mem: Option<u64>,
        threads: usize,
        work_dir: Option<PathBuf>,
        device: &str,
        spread: usize,
    ) -> PyResult<Self> {
        let opts = batched_options(max_mem, threads, work_dir, device, spread)?;
        Self::open(py, plan_json, params, opts, true)
    }

    /// How many stages the job has; they run in order, each after the last has finished.
    fn stage_count(&self) -> usize {
        self.stages
    }

    /// Cuts stage `stage` into about `want` batches of about equal work: JSON text with
    /// `label` (what the stage computes), `tasks` (how many the stage has), `batches` (task ranges as [start, end] pairs, in
    /// order) and `merges` (the output chunks of a reduction the batches split, merged once
    /// they have all run).
    fn cut(&self, py: Python<'_>, stage: usize, want: usize) -> PyResult<String> {
        let (tasks, cut, label) = self.with_job(py, move |job| {
            let tasks = job.task_layout(stage)?.len();
            Ok((tasks, job.cut(stage, want)?, job.stage_label(stage)?))
        })?;
        let batches: Vec<[usize; 2]> = cut.batches.iter().map(|b| [b.start, b.end]).collect();
        json(&serde_json::json!({
            "label": label,
            "tasks": tasks,
            "batches": batches,
            "merges": cut.merges,
        }))
    }

    /// Runs tasks `start..end` of stage `stage`; returns their stage record as JSON text.
    /// Running a batch again writes the same chunks. With `cut` (the stage's batches, this
    /// one among them), it then merges the reduction output chunks it split whose partial
    /// states are all written, and the record's `merged` lists them (parts).
    #[pyo3(signature = (stage, start, end, cut=None))]
    fn run_batch(
        &self,
        py: Python<'_>,
        stage: usize,
        start: usize,
        end: usize,
        cut: Option<Vec<(usize, usize)>>,
    ) -> PyResult<String> {
        let Some(cut) = cut else {
            let record = self.with_job(py, move |job| job.run_batch(stage, start..end))?;
            return json(&record);
        };
        let ranges: Vec<_> = cut.into_iter().map(|(s, e)| s..e).collect();
        let (record, merged) = self.with_job(py, move |job| {
            job.run_batch_merging(stage, start..end, &ranges)
        })?;
        let mut out =
            serde_json::to_value(&record).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        if let Some(fields) = out.as_object_mut() {
            fields.insert("merged".to_owned(), merged.into());
        }
        json(&out)
    }

    /// Merges the partial states that `batches` (the stage's cut) left for output chunk
    /// `part` of reduce stage `stage` and writes the chunk; returns the record as JSON text.
    fn run_merge(
        &self,
        py: Python<'_>,
        stage: usize,
        part: usize,
        batches: Vec<(usize, usize)>,
    ) -> PyResult<String> {
        let ranges: Vec<_> = batches.into_iter().map(|(s, e)| s..e).collect();
        let record = self.with_job(py, move |job| job.run_merge(stage, part, &ranges))?;
        json(&record)
    }

    /// Marks the targets complete and removes the work directory; returns the summary of
    /// what this process ran, as JSON text. The job cannot be used after.
    fn finish(&self, py: Python<'_>) -> PyResult<String> {
        let job = self
            .lock(py)?
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this job is finished"))?;
        let summary = crate::gate::call(py, move || job.finish())?;
        json(&summary)
    }
}
