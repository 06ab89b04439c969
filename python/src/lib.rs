//! `chunkfuse._engine`: thin pyo3 bindings over the engine. Every engine call releases the
//! GIL; errors map to `chunkfuse.exceptions` classes by kind.

mod chunk_function;
mod device_array;
mod driver;
mod gate;
mod job;
mod permute;
mod pooled;
mod reading;

use std::collections::BTreeMap;
use std::path::PathBuf;

use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run;
use chunkfuse_engine::{Error, ErrorKind};
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

/// The Python exception for an engine error, by kind.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind {
        ErrorKind::Plan | ErrorKind::Value => PyValueError::new_err(msg),
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
/// cancels the run and is raised here. With `resume`, a rerun of an unfinished job keeps
/// the chunks it had written (see `RunOptions::resume`).
#[pyfunction]
#[pyo3(signature = (
    plan_json, params=BTreeMap::new(), max_mem=None, threads=0, work_dir=None, progress=None,
    resume=true, device="cpu"
))]
#[allow(clippy::too_many_arguments)]
fn run_plan(
    py: Python<'_>,
    plan_json: &str,
    params: BTreeMap<String, String>,
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
    progress: Option<Bound<'_, PyAny>>,
    resume: bool,
    device: &str,
) -> PyResult<String> {
    let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
    let (mut opts, counters) = driver::observed_options(max_mem, threads, work_dir, resume);
    opts.device = device.parse().map_err(to_py)?;
    let cancel = opts.cancel.clone();
    driver::drive(py, counters, cancel, progress, move || {
        run::run_plan(&plan, &opts)
    })
}

/// How a JSON plan with `${NAME}` parameters would run, as JSON text: its stages, with the
/// choices a run under the same budget and threads makes for each. Nothing is created and no
/// task runs; the plan's sources are opened. Ctrl-C cancels as in `run_plan`.
#[pyfunction]
#[pyo3(signature = (plan_json, params=BTreeMap::new(), max_mem=None, threads=0, device="cpu"))]
fn explain_plan(
    py: Python<'_>,
    plan_json: &str,
    params: BTreeMap<String, String>,
    max_mem: Option<u64>,
    threads: usize,
    device: &str,
) -> PyResult<String> {
    let plan = Plan::from_json(plan_json, &params).map_err(to_py)?;
    let (mut opts, counters) = driver::observed_options(max_mem, threads, None, false);
    opts.device = device.parse().map_err(to_py)?;
    let cancel = opts.cancel.clone();
    driver::drive(py, counters, cancel, None, move || {
        run::explain_plan(&plan, &opts)
    })
}

/// Where fused elementwise programs run for `device` (`"cpu"`, `"cuda"` or `"auto"`):
/// `"cpu"` or `"cuda: NAME (compute_XY)"`; an error naming why when `"cuda"` cannot be used.
#[pyfunction]
fn device_info(py: Python<'_>, device: &str) -> PyResult<String> {
    let device: chunkfuse_engine::kernels::device::Device = device.parse().map_err(to_py)?;
    py.detach(move || {
        chunkfuse_engine::kernels::device::Placement::open(device).map(|p| p.describe())
    })
    .map_err(to_py)
}

/// Stops every engine call of this process in progress, as Ctrl-C stops the main thread's
/// (each raises KeyboardInterrupt once its work has stopped).
#[pyfunction]
fn interrupt_calls() {
    gate::interrupt_all();
}

/// Bytes in a size such as `"2GB"`, `"512MiB"` or `"1000"`; a bad size is a ValueError
/// saying what is wrong with it (the caller names the argument).
#[pyfunction]
fn parse_bytes(text: &str) -> PyResult<u64> {
    chunkfuse_engine::exec::memory::parse_bytes(text).map_err(|e| PyValueError::new_err(e.message))
}

/// The metadata summary of the array at `url` (shape, dtype, chunks, shards, codecs, ...),
/// as `chunkfuse info --json` prints it.
#[pyfunction]
fn array_info(py: Python<'_>, url: &str) -> PyResult<Py<PyAny>> {
    let text = gate::call(py, || {
        chunkfuse_engine::run::info(url)
            .and_then(|i| serde_json::to_string(&i).map_err(|e| Error::internal(e.to_string())))
    })?;
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (text,))?.unbind())
}

/// Sets how local files are read from now on, process-wide: `"auto"`, `"uring"` or
/// `"pread"`; an error for anything else, or for `"uring"` where io_uring is refused.
#[pyfunction]
fn set_io(mode: &str) -> PyResult<()> {
    use chunkfuse_engine::store::uring;
    let mode = uring::IoMode::parse(mode).map_err(to_py)?;
    uring::reader_for(mode, None).map_err(to_py)?;
    uring::set_io_mode(mode);
    Ok(())
}

/// Sets the timeouts (seconds) of object stores opened from now on, process-wide; with no
/// arguments, goes back to the environment (`CHUNKFUSE_IO_CONNECT_TIMEOUT_S`,
/// `CHUNKFUSE_IO_TIMEOUT_S`, `CHUNKFUSE_IO_RETRY_TIMEOUT_S`) and the defaults. Returns the
/// longest a request to a server that never answers takes to fail, in seconds.
#[pyfunction]
#[pyo3(signature = (connect=None, request=None, retry=None))]
fn set_io_timeouts(
    connect: Option<f64>,
    request: Option<f64>,
    retry: Option<f64>,
) -> PyResult<f64> {
    use chunkfuse_engine::store::object::{set_timeouts, Timeouts};
    use std::time::Duration;
    let seconds = |name: &str, v: Option<f64>, default: Duration| match v {
        None => Ok(default),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(PyValueError::new_err(format!(
            "{name} must be a number of seconds >= 0, got {s}"
        ))),
    };
    let timeouts = if connect.is_none() && request.is_none() && retry.is_none() {
        None
    } else {
        set_timeouts(None).map_err(to_py)?;
        let now = Timeouts::current();
        Some(Timeouts {
            connect: seconds("connect", connect, now.connect)?,
            request: seconds("request", request, now.request)?,
            retry: seconds("retry", retry, now.retry)?,
        })
    };
    set_timeouts(timeouts).map_err(to_py)?;
    Ok(Timeouts::current().worst_case().as_secs_f64())
}

/// How local files are read now (`"auto"`, `"uring"` or `"pread"`).
#[pyfunction]
fn io_mode() -> &'static str {
    chunkfuse_engine::store::uring::io_mode().name()
}

/// The module.
#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    chunkfuse_engine::exec::memory::configure_allocator();
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(run_plan, m)?)?;
    m.add_function(wrap_pyfunction!(explain_plan, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(array_info, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_function::run_chunk_function, m)?)?;
    m.add_class::<reading::ArrayReader>()?;
    m.add_class::<reading::ChunkCache>()?;
    m.add_class::<device_array::DeviceArray>()?;
    m.add_class::<pooled::PooledBuffer>()?;
    m.add_function(wrap_pyfunction!(permute::feistel_permute, m)?)?;
    m.add_function(wrap_pyfunction!(reading::decode_cf, m)?)?;
    m.add_class::<job::PyJob>()?;
    m.add_function(wrap_pyfunction!(set_io, m)?)?;
    m.add_function(wrap_pyfunction!(interrupt_calls, m)?)?;
    m.add_function(wrap_pyfunction!(io_mode, m)?)?;
    m.add_function(wrap_pyfunction!(set_io_timeouts, m)?)?;
    m.add("__version__", chunkfuse_engine::VERSION)?;
    Ok(())
}
