//! `chunkfuse._engine`: thin pyo3 bindings over the engine. Every engine call releases the
//! GIL; errors map to `chunkfuse.exceptions` classes by kind.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

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
/// task boundary and no partial chunk is left visible).
#[pyfunction]
#[pyo3(signature = (plan_json, params=BTreeMap::new(), max_mem=None, threads=0, work_dir=None))]
fn run_plan(
    py: Python<'_>,
    plan_json: &str,
    params: BTreeMap<String, String>,
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
) -> PyResult<String> {
    let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
    let opts = RunOptions {
        max_mem,
        threads,
        work_dir,
        ..RunOptions::default()
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
                if let Err(interrupt) = py.check_signals() {
                    cancel.store(true, Ordering::SeqCst);
                    // Wait for the engine to stop so nothing runs after we return.
                    let _ = py.detach(|| engine.join());
                    return Err(interrupt);
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
