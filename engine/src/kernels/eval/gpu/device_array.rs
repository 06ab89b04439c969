//! An array in device memory that a read filled: its allocation (freed when the last holder
//! drops it), shape and element type, copied back to the host on request and handed to other
//! libraries by address (DLPack, in the bindings).

use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;

use super::failure::{cuda_error, guarded};
use super::runtime::Gpu;
use crate::array::DType;
use crate::error::{Error, Result};

/// A C-ordered array in one device allocation.
pub struct DeviceArray {
    gpu: &'static Gpu,
    ptr: CUdeviceptr,
    bytes: usize,
    shape: Vec<u64>,
    dtype: DType,
}

impl std::fmt::Debug for DeviceArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceArray({:?}, {}, {} bytes on {})",
            self.shape,
            self.dtype.name(),
            self.bytes,
            self.gpu.describe()
        )
    }
}

impl DeviceArray {
    /// A new array of `shape` and `dtype` on `gpu`, its values not yet written.
    pub fn alloc(gpu: &'static Gpu, shape: &[u64], dtype: DType) -> Result<DeviceArray> {
        let bytes = shape.iter().product::<u64>() as usize * dtype.size();
        let ptr = guarded("allocating device memory", || {
            gpu.bind()?;
            // SAFETY: a plain device allocation (at least one byte), freed in `drop`.
            unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| {
                cuda_error(
                    &format!("allocating {bytes} bytes of device memory for a read"),
                    e,
                )
            })
        })?;
        Ok(DeviceArray {
            gpu,
            ptr,
            bytes,
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// The device address of the first value.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes the values take.
    pub fn nbytes(&self) -> usize {
        self.bytes
    }

    /// The shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.gpu.ordinal()
    }

    /// The device it lives on.
    pub fn gpu(&self) -> &'static Gpu {
        self.gpu
    }

    /// Gives the array a new shape of as many values (an integer index dropping an axis).
    pub fn reshape(&mut self, shape: &[u64]) -> Result<()> {
        let old: u64 = self.shape.iter().product();
        let new: u64 = shape.iter().product();
        if old != new {
            return Err(Error::internal(format!(
                "cannot give {:?} ({old} values) the shape {shape:?}",
                self.shape
            )));
        }
        self.shape = shape.to_vec();
        Ok(())
    }

    /// Copies the values into `out` (exactly `nbytes()` long).
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.bytes {
            return Err(Error::internal(format!(
                "host buffer of {} bytes for a device array of {}",
                out.len(),
                self.bytes
            )));
        }
        guarded("copying a device array to the host", || {
            self.gpu.bind()?;
            // SAFETY: the allocation holds `bytes` bytes, all written by the read that made
            // it (it synchronized before returning the array).
            unsafe { result::memcpy_dtoh_sync(out, self.ptr) }
                .map_err(|e| cuda_error("copying a device array to the host", e))
        })
    }
}

impl Drop for DeviceArray {
    fn drop(&mut self) {
        // The last holder may be any thread (Python's garbage collector, a consumer's DLPack
        // deleter): bind the context first.
        let _ = guarded("freeing device memory", || {
            self.gpu.bind()?;
            // SAFETY: allocated by `alloc`, freed once; nothing is queued on it (reads
            // synchronize before handing the array out).
            unsafe { result::free_sync(self.ptr) }.map_err(|e| cuda_error("freeing", e))
        });
    }
}
