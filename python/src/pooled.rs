//! Batch memory from the engine's buffer pool: a buffer a batch is read into goes back to the
//! pool when Python drops the last array over it, so the next batch lands in memory already
//! mapped rather than faulting in fresh pages while the engine's threads copy into it.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;

use chunkfuse_engine::array::pool;
use pyo3::exceptions::PyBufferError;
use pyo3::{ffi, prelude::*};

/// The parts of a pooled vector, put back together when the buffer is dropped.
struct Parts {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

// SAFETY: `Parts` owns its allocation alone (taken apart from a `Vec<u8>`, which is `Send` and
// `Sync`); Python writes its bytes only through the buffer protocol, as it does any bytearray.
unsafe impl Send for Parts {}
// SAFETY: as above: no Rust code reads or writes the bytes while the buffer lives.
unsafe impl Sync for Parts {}

impl Drop for Parts {
    fn drop(&mut self) {
        // SAFETY: the parts are a vector taken apart in `PooledBuffer::new`, put back once.
        let v = unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) };
        pool::give(v);
    }
}

/// A writable buffer of bytes from the engine's pool (contents unspecified), handed back to
/// the pool when the last object over it (a numpy array, a memoryview) is gone.
#[pyclass(frozen, module = "chunkfuse._engine")]
pub struct PooledBuffer {
    parts: Parts,
}

#[pymethods]
impl PooledBuffer {
    /// A buffer of `nbytes` bytes from the pool.
    #[new]
    fn new(nbytes: i128) -> PyResult<Self> {
        let len = usize::try_from(nbytes)
            .ok()
            .filter(|n| *n <= isize::MAX as usize)
            .ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "PooledBuffer: nbytes must be a byte count from 0 to {}, got {nbytes}",
                    isize::MAX
                ))
            })?;
        let mut v = ManuallyDrop::new(pool::take_filled(len));
        Ok(PooledBuffer {
            parts: Parts {
                ptr: v.as_mut_ptr(),
                len: v.len(),
                cap: v.capacity(),
            },
        })
    }

    /// Its size in bytes.
    fn __len__(&self) -> usize {
        self.parts.len
    }

    /// Exports the bytes, writable, as one contiguous run of unsigned bytes.
    ///
    /// # Safety
    /// Called by Python with a `view` to fill, as the buffer protocol requires.
    unsafe fn __getbuffer__(
        slf: PyRef<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("PooledBuffer: no view to fill"));
        }
        let parts = &slf.parts;
        // SAFETY: `view` is Python's to fill; the object (and so the bytes) outlives the view,
        // which holds a reference to it.
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                parts.ptr as *mut c_void,
                parts.len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if filled != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// Nothing to release: the bytes live as long as the object.
    ///
    /// # Safety
    /// Called by Python with a view it filled through `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
