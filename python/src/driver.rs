//! Runs a plan through the gate (`crate::gate`): the calling Python thread waits with the GIL
//! released, waking every 50 ms to handle signals (Ctrl-C cancels) and report progress.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chunkfuse_engine::exec::progress::Progress;
use chunkfuse_engine::run::RunOptions;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::to_py;

/// Run options for a call from Python, with counters the waiting thread reads for progress.
pub fn observed_options(
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
    resume: bool,
) -> (RunOptions, Arc<Progress>) {
    let counters = Arc::new(Progress::new(false));
    let opts = RunOptions {
        max_mem,
        threads,
        work_dir,
        resume,
        observe: Some(counters.clone()),
        ..RunOptions::default()
    };
    (opts, counters)
}

/// Runs `job` on an engine thread; returns what it returns (a run's summary, a plan's
/// explanation) as JSON text.
///
/// `progress(tasks_done, tasks_total)` is called (with the GIL, on this thread) whenever the
/// counters changed; an exception from it, or a signal handler's (KeyboardInterrupt), sets
/// `cancel`, waits for the engine to stop, and is raised. `on_error` may turn an engine error
/// into the Python exception behind it.
pub fn drive<F, T>(
    py: Python<'_>,
    counters: Arc<Progress>,
    cancel: Arc<AtomicBool>,
    progress: Option<Bound<'_, PyAny>>,
    job: F,
) -> PyResult<String>
where
    F: FnOnce() -> chunkfuse_engine::Result<T> + Send + 'static,
    T: serde::Serialize + Send,
{
    drive_with(py, counters, cancel, progress, job, |_, e| to_py(e))
}

/// `drive`, with a custom mapping of engine errors to Python exceptions.
pub fn drive_with<F, M, T>(
    py: Python<'_>,
    counters: Arc<Progress>,
    cancel: Arc<AtomicBool>,
    progress: Option<Bound<'_, PyAny>>,
    job: F,
    on_error: M,
) -> PyResult<String>
where
    F: FnOnce() -> chunkfuse_engine::Result<T> + Send,
    T: serde::Serialize + Send,
    M: FnOnce(Python<'_>, chunkfuse_engine::Error) -> PyErr,
{
    let mut reported = (0u64, 0u64);
    let mut report = || -> PyResult<()> {
        let now = (
            counters.tasks_done.load(Ordering::Relaxed),
            counters.tasks_total.load(Ordering::Relaxed),
        );
        if let Some(cb) = &progress {
            if now != reported {
                reported = now;
                cb.call1(now)?;
            }
        }
        Ok(())
    };
    let outcome = crate::gate::run(py, cancel, job, &mut report)?;
    let summary = outcome.map_err(|e| on_error(py, e))?;
    report()?;
    serde_json::to_string(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}
