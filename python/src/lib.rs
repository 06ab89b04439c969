//! `chunkfuse._engine`: thin pyo3 bindings over the engine. Every engine call releases the
//! GIL; errors map to `chunkfuse.exceptions` classes by kind.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use chunkfuse_engine::exec::progress::Progress;
use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run::{self, RunOptions};
use chunkfuse_engine::{Error, ErrorKind};
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind {
        ErrorKind::Plan => PyValueError::new_err(msg),
        ErrorKind::Store => PyOSError::new_err(msg),
        ErrorKind::Memory => PyMemoryError::new_err(msg),
        ErrorKind::Cancelled => PyKeyboardInterrupt::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The engine version.
#[pyfunction]
fn version() -> &'static str {
    chunkfuse_engine::VERSION
}

/// Runs a JSON plan with `${NAME}` parameters; returns the run summary as JSON text.
///
/// The engine runs on its own thread with the GIL released; this thread wakes every 50 ms to
/// let Python handle signals, so Ctrl-C cancels the run promptly (the engine stops at its next
/// task boundary and no partial chunk is left visible). `progress`, if given, is called with
/// `(tasks_done, tasks_total)` from this thread whenever they changed; an exception it raises
/// cancels the run and is raised here.
#[pyfunction]
#[pyo3(signature = (
    plan_json, params=BTreeMap::new(), max_mem=None, threads=0, work_dir=None, progress=None
))]
fn run_plan(
    py: Python<'_>,
    plan_json: &str,
    params: BTreeMap<String, String>,
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
    let counters = Arc::new(Progress::new(false));
    let opts = RunOptions {
        max_mem,
        threads,
        work_dir,
        observe: Some(counters.clone()),
        ..RunOptions::default()
    };
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
    let cancel = opts.cancel.clone();
    let (tx, rx) = mpsc::channel();
    let engine = std::thread::Builder::new()
        .name("chunkfuse-run".into())
        .spawn(move || {
            // The receiver only goes away when Python gave up waiting; nothing to report then.
            let _ = tx.send(run::run_plan(&plan, &opts));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the engine thread: {e}")))?;
    let mut rx = rx;
    let outcome = loop {
        // The receiver is not Sync, so it moves into the GIL-free closure and back out.
        let (back, received) = py.detach(move || {
            let received = rx.recv_timeout(Duration::from_millis(50));
            (rx, received)
        });
        rx = back;
        match received {
            Ok(result) => break result,
            Err(RecvTimeoutError::Timeout) => {
                if let Err(stop) = py.check_signals().and_then(|()| report()) {
                    cancel.store(true, Ordering::SeqCst);
                    // Wait for the engine to stop so nothing runs after we return.
                    let _ = py.detach(|| engine.join());
                    return Err(stop);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "the engine thread stopped without a result",
                ))
            }
        }
    };
    let _ = py.detach(|| engine.join());
    let summary = outcome.map_err(to_py)?;
    report()?;
    serde_json::to_string(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The module.
#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    chunkfuse_engine::exec::memory::configure_allocator();
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(run_plan, m)?)?;
    m.add("__version__", chunkfuse_engine::VERSION)?;
    Ok(())
}
