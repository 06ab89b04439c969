//! `run_chunk_function`: a Python function computes each output chunk while the engine reads,
//! decodes, encodes and writes. Only the call itself holds the GIL.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use chunkfuse_engine::array::{Buffer, DType};
use chunkfuse_engine::chunk_job::{run_chunk_job, ChunkJob};
use chunkfuse_engine::exec::ops::chunk_fn::{ChunkFunction, ChunkTask};
use chunkfuse_engine::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList};

use crate::driver::{drive_with, observed_options};
use crate::to_py;

/// Calls `function(task, [bytearray, ...]) -> bytes` under the GIL; keeps the first Python
/// exception so the caller gets it back with its own type.
struct PyChunkFunction {
    function: Py<PyAny>,
    out_dtype: DType,
    raised: Mutex<Option<PyErr>>,
    cancel: Arc<AtomicBool>,
}

impl ChunkFunction for PyChunkFunction {
    fn call(&self, task: usize, inputs: Vec<Buffer>) -> chunkfuse_engine::Result<Buffer> {
        // Once the run is cancelled (Ctrl-C, or another chunk's function raised) no chunk's
        // function starts: the tasks already read would otherwise each run it in turn.
        if self.cancel.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::cancelled());
        }
        let result = Python::attach(|py| -> PyResult<Vec<u8>> {
            let arrays = inputs
                .iter()
                .map(|b| PyByteArray::new(py, b.bytes()))
                .collect::<Vec<_>>();
            drop(inputs);
            let out = self.function.call1(py, (task, PyList::new(py, arrays)?))?;
            let bytes = out.cast_bound::<PyBytes>(py)?;
            Ok(bytes.as_bytes().to_vec())
        });
        match result {
            Ok(bytes) => Buffer::from_bytes(self.out_dtype, bytes),
            Err(e) => {
                let message = Python::attach(|py| e.to_string() + &type_name(py, &e));
                if let Ok(mut first) = self.raised.lock() {
                    first.get_or_insert(e);
                }
                self.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(Error::new(
                    ErrorKind::Internal,
                    format!("the Python function raised: {message}"),
                ))
            }
        }
    }
}

fn type_name(py: Python<'_>, e: &PyErr) -> String {
    e.get_type(py)
        .name()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default()
}

/// A task as Python gives it: `(output chunk index, [(input number, input chunk index)])`.
type PyTask = (Vec<u64>, Vec<(usize, Vec<u64>)>);

/// Computes every chunk of the existing array `target` with `function`.
///
/// `tasks` are `(output chunk index, [(input number, input chunk index), ...])`; `function` is
/// called as `function(task_number, [bytearray per input chunk])` and returns the output
/// chunk as `bytes` (C order, `out_dtype`). An exception it raises stops the run and is raised
/// here unchanged; the chunks already written are whole.
#[pyfunction]
#[pyo3(signature = (
    name, inputs, target, out_dtype, tasks, function, max_mem=None, threads=0, work_dir=None,
    progress=None
))]
#[allow(clippy::too_many_arguments)]
pub fn run_chunk_function(
    py: Python<'_>,
    name: String,
    inputs: Vec<String>,
    target: String,
    out_dtype: &str,
    tasks: Vec<PyTask>,
    function: Py<PyAny>,
    max_mem: Option<u64>,
    threads: usize,
    work_dir: Option<PathBuf>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let out_dtype = DType::parse(out_dtype).map_err(to_py)?;
    let (opts, counters) = observed_options(max_mem, threads, work_dir, false);
    let cancel = opts.cancel.clone();
    let function = Arc::new(PyChunkFunction {
        function,
        out_dtype,
        raised: Mutex::new(None),
        cancel: cancel.clone(),
    });
    let job = ChunkJob {
        name,
        inputs,
        target,
        tasks: tasks
            .into_iter()
            .map(|(out, reads)| ChunkTask { out, reads })
            .collect(),
        function: function.clone(),
    };
    drive_with(
        py,
        counters,
        cancel,
        progress,
        move || run_chunk_job(job, &opts),
        move |_, e| {
            let raised = function.raised.lock().ok().and_then(|mut r| r.take());
            raised.unwrap_or_else(|| to_py(e))
        },
    )
}
