//! Arrays a read left on the GPU (`chunkfuse.read(..., device="cuda")`), handed to PyTorch,
//! CuPy or JAX through DLPack without a copy, or copied back to numpy.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use chunkfuse_engine::array::DType;
use chunkfuse_engine::kernels::eval::gpu::DeviceArray as EngineArray;
use chunkfuse_engine::read::DeviceReadStats;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::to_py;

/// DLPack's device type of CUDA memory.
const KDL_CUDA: i32 = 2;
/// The capsule's name before a consumer takes it.
const DLTENSOR: &CStr = c"dltensor";

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What a handed-over tensor keeps alive: the allocation and the shape it points into.
struct Holder {
    _array: Arc<EngineArray>,
    shape: Vec<i64>,
}

/// DLPack's code and bits for `dtype`.
fn dl_dtype(dtype: DType) -> DlDataType {
    let name = dtype.name();
    let code = if name == "bool" {
        6
    } else if name.starts_with("complex") {
        5
    } else if name.starts_with("float") {
        2
    } else if name.starts_with("uint") {
        1
    } else {
        0
    };
    DlDataType {
        code,
        bits: (dtype.size() * 8) as u8,
        lanes: 1,
    }
}

/// Frees a managed tensor and what it holds (called by its consumer, or by the capsule's
/// destructor when nobody took it).
unsafe extern "C" fn delete_managed(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: both boxes were leaked by `__dlpack__` for this tensor and are freed once.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx as *mut Holder));
    }
}

/// The capsule's destructor: frees the tensor unless a consumer renamed the capsule (took it).
unsafe extern "C" fn drop_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule made in `__dlpack__`.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_managed(managed as *mut DlManagedTensor);
        }
    }
}

/// An array in GPU memory, made by `chunkfuse.read(..., device="cuda")` or
/// `chunkfuse.read_windows(..., device="cuda")`.
#[pyclass(frozen, module = "chunkfuse._engine")]
pub struct DeviceArray {
    array: Arc<EngineArray>,
    stats: DeviceReadStats,
}

impl DeviceArray {
    /// Wraps what a device read made.
    pub fn new(array: EngineArray, stats: DeviceReadStats) -> Self {
        DeviceArray {
            array: Arc::new(array),
            stats,
        }
    }
}

#[pymethods]
impl DeviceArray {
    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.array.shape())
    }

    /// numpy's name for the element type.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.array.dtype().name()
    }

    /// Bytes the values take.
    #[getter]
    fn nbytes(&self) -> usize {
        self.array.nbytes()
    }

    /// `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.array.ordinal())
    }

    /// What the read did: chunks, how many the GPU decoded, bytes read and placed, seconds
    /// waiting for storage, decoding on the CPU and on the device, and why chunks were
    /// decoded on the CPU.
    #[getter]
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let text =
            serde_json::to_string(&self.stats).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
    }

    /// `(2, ordinal)`: CUDA memory, for DLPack consumers.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.array.ordinal() as i32)
    }

    /// A DLPack capsule of the values (no copy; the read synchronized, so any stream may
    /// use them). Consumers: `torch.from_dlpack`, `cupy.from_dlpack`, `jax.dlpack.from_dlpack`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version);
        let here = self.__dlpack_device__();
        if dl_device.is_some_and(|d| d != here) {
            return Err(PyBufferError::new_err(format!(
                "the array lives on {}; DLPack export to {dl_device:?} would need a copy",
                self.device()
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "chunkfuse.DeviceArray exports without copying (copy=True is not supported)",
            ));
        }
        let holder = Box::new(Holder {
            _array: self.array.clone(),
            shape: self.array.shape().iter().map(|&n| n as i64).collect(),
        });
        let shape_ptr = holder.shape.as_ptr() as *mut i64;
        let managed = Box::new(DlManagedTensor {
            dl_tensor: DlTensor {
                data: self.array.device_ptr() as *mut c_void,
                device: DlDevice {
                    device_type: KDL_CUDA,
                    device_id: here.1,
                },
                ndim: self.array.shape().len() as i32,
                dtype: dl_dtype(self.array.dtype()),
                shape: shape_ptr,
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: Box::into_raw(holder) as *mut c_void,
            deleter: Some(delete_managed),
        });
        let raw = Box::into_raw(managed);
        // SAFETY: a capsule over the leaked tensor, named as DLPack requires; its destructor
        // frees the tensor unless a consumer took it (and then the consumer calls `deleter`).
        let capsule = unsafe {
            pyo3::ffi::PyCapsule_New(raw as *mut c_void, DLTENSOR.as_ptr(), Some(drop_capsule))
        };
        if capsule.is_null() {
            // SAFETY: the capsule was not made: nothing else owns the tensor.
            unsafe { delete_managed(raw) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: a new reference returned by PyCapsule_New.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
    }

    /// Copies the values into `out`, a writable C-contiguous buffer of exactly `nbytes`
    /// bytes (the GIL released).
    fn copy_to_host(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = PyBuffer::<u8>::get(out)?;
        if buffer.readonly() || !buffer.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "out needs a writable, C-contiguous uint8 buffer",
            ));
        }
        let (ptr, len) = (buffer.buf_ptr() as usize, buffer.len_bytes());
        let array = self.array.clone();
        py.detach(move || {
            // SAFETY: the buffer protocol keeps `out` alive and in place while `buffer` is
            // held (past this call); it is writable and `len` bytes long.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            array.copy_to_host(dst)
        })
        .map_err(to_py)?;
        drop(buffer);
        Ok(())
    }

    /// The values, copied into a new numpy array.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let out = py
            .import("numpy")?
            .call_method1("empty", (this.shape(py)?, this.dtype()))?;
        let bytes = out
            .call_method1("reshape", (-1,))?
            .call_method1("view", ("uint8",))?;
        this.copy_to_host(py, &bytes)?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray(shape={:?}, dtype={}, device={})",
            self.array.shape(),
            self.array.dtype().name(),
            self.device()
        )
    }
}
