//! `chunkfuse._engine`: thin pyo3 bindings over the engine. Every engine call releases the
//! GIL; errors map to `chunkfuse.exceptions` classes by kind.

use std::collections::BTreeMap;

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
#[pyfunction]
#[pyo3(signature = (plan_json, params=BTreeMap::new(), max_mem=None, threads=0))]
fn run_plan(
    py: Python<'_>,
    plan_json: &str,
    params: BTreeMap<String, String>,
    max_mem: Option<u64>,
    threads: usize,
) -> PyResult<String> {
    let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
    let opts = RunOptions {
        max_mem,
        threads,
        ..RunOptions::default()
    };
    let summary = py.detach(|| run::run_plan(&plan, &opts)).map_err(to_py)?;
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
