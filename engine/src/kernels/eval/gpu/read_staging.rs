//! The buffers device reads reuse from batch to batch, grown to the largest batch: page-locked
//! host memory to pack a batch into, the device buffers it is copied to and decoded into, and
//! the stream they run on.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::CudaStream;

use super::failure::cuda_error;
use super::staging::DeviceBuf;
use crate::error::Result;

/// Stagings (and so batches in flight) one device read uses.
pub const SLOTS: usize = 2;

/// Alignment of every allocation's size.
const ALIGN: usize = 256;

/// Page-locked host memory.
pub struct HostBuf {
    ptr: *mut u8,
    len: usize,
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: from `malloc_host`, freed once; transfers from it were synchronized.
        unsafe {
            let _ = result::free_host(self.ptr as _);
        }
    }
}

/// The buffers device reads reuse, and their stream.
pub struct ReadStaging {
    /// The stream device reads run on.
    pub stream: Arc<CudaStream>,
    /// Page-locked memory the batch is packed into.
    pub host: Option<HostBuf>,
    /// The batch on the device.
    pub input: Option<DeviceBuf>,
    /// What nvCOMP decodes into, with its sizes, statuses and temporary memory.
    pub scratch: Option<DeviceBuf>,
}

// SAFETY: the raw pointers are owned allocations, used by one thread at a time (the staging
// lives behind the device's mutex).
unsafe impl Send for ReadStaging {}

/// The address of `slot`'s page-locked allocation, made again (at least `len` bytes, rounded
/// up to a MiB) when it is smaller.
pub fn grown_host(slot: &mut Option<HostBuf>, len: usize) -> Result<*mut u8> {
    if let Some(b) = slot.as_ref().filter(|b| b.len >= len) {
        return Ok(b.ptr);
    }
    *slot = None;
    let len = len.max(ALIGN).next_multiple_of(1 << 20);
    // SAFETY: a plain page-locked allocation, freed in `HostBuf::drop`.
    let ptr = unsafe { result::malloc_host(len, 0) }
        .map_err(|e| cuda_error(&format!("allocating {len} bytes of pinned memory"), e))?;
    *slot = Some(HostBuf {
        ptr: ptr as *mut u8,
        len,
    });
    Ok(ptr as *mut u8)
}

impl ReadStaging {
    /// Buffers for `stream`, none allocated yet.
    pub fn new(stream: Arc<CudaStream>) -> ReadStaging {
        ReadStaging {
            stream,
            host: None,
            input: None,
            scratch: None,
        }
    }
}
