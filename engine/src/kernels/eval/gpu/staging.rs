//! Per-thread transfer state. Copies between the engine's (pageable) buffers and the device
//! go through two pinned host buffers in pieces: the CPU fills or drains one while the
//! device copies the other, at the bus's speed rather than the driver's pageable-copy path.
//! Device buffers grow to the largest block and are reused from block to block.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream};

use super::failure::cuda_error;
use crate::error::Result;

/// Bytes of one pinned buffer: one piece of a copy.
pub const PIECE_BYTES: usize = 4 << 20;
/// Pinned host memory each compute thread holds once it has run a GPU block.
pub const PINNED_BYTES_PER_THREAD: u64 = 2 * PIECE_BYTES as u64;
/// Device allocations are aligned to this (and each uploaded part starts on it).
const ALIGN: usize = 256;

/// Page-locked host memory and the event of the last copy that used it.
struct Pinned {
    ptr: *mut u8,
    event: CudaEvent,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` and is freed once, after its last copy.
        unsafe {
            let _ = result::event::synchronize(self.event.cu_event());
            let _ = result::free_host(self.ptr as _);
        }
    }
}

/// A device allocation of `len` bytes.
pub struct DeviceBuf {
    ptr: CUdeviceptr,
    len: usize,
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_sync`, freed once; its stream is synchronized first.
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// One thread's stream, pinned buffers and device buffers.
pub struct Staging {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pinned: [Pinned; 2],
    input: Option<DeviceBuf>,
    output: Option<DeviceBuf>,
}

thread_local! {
    static STAGING: RefCell<Option<Staging>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's staging for `ctx`, made on first use.
pub fn with_staging<T>(
    ctx: &Arc<CudaContext>,
    f: impl FnOnce(&mut Staging) -> Result<T>,
) -> Result<T> {
    STAGING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Staging::new(ctx)?);
        }
        match slot.as_mut() {
            Some(s) => f(s),
            None => Err(crate::error::Error::internal("no GPU staging")),
        }
    })
}

fn pinned(ctx: &Arc<CudaContext>) -> Result<Pinned> {
    let event = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
        .map_err(|e| cuda_error("creating an event", e))?;
    // SAFETY: a plain page-locked allocation, freed in `Pinned::drop`.
    let ptr = unsafe { result::malloc_host(PIECE_BYTES, 0) }
        .map_err(|e| cuda_error("allocating pinned host memory", e))?;
    Ok(Pinned {
        ptr: ptr as *mut u8,
        event,
    })
}

/// The address of `slot`'s allocation, made again (at least `len` bytes, rounded up to a
/// MiB) when it is smaller.
pub fn grow(slot: &mut Option<DeviceBuf>, len: usize) -> Result<CUdeviceptr> {
    if let Some(b) = slot.as_ref().filter(|b| b.len >= len) {
        return Ok(b.ptr);
    }
    *slot = None;
    let len = len.max(ALIGN).next_multiple_of(1 << 20);
    // SAFETY: a plain device allocation, freed in `DeviceBuf::drop`.
    let ptr = unsafe { result::malloc_sync(len) }
        .map_err(|e| cuda_error("allocating device memory", e))?;
    *slot = Some(DeviceBuf { ptr, len });
    Ok(ptr)
}

impl Staging {
    fn new(ctx: &Arc<CudaContext>) -> Result<Staging> {
        let stream = ctx
            .new_stream()
            .map_err(|e| cuda_error("creating a stream", e))?;
        Ok(Staging {
            ctx: ctx.clone(),
            stream,
            pinned: [pinned(ctx)?, pinned(ctx)?],
            input: None,
            output: None,
        })
    }

    /// The thread's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies `parts` to the device, each at an `ALIGN`-aligned offset of one input buffer;
    /// returns each part's device address.
    pub fn upload(&mut self, parts: &[&[u8]]) -> Result<Vec<CUdeviceptr>> {
        let mut offsets = Vec::with_capacity(parts.len());
        let mut total = 0usize;
        for p in parts {
            offsets.push(total);
            total = (total + p.len()).next_multiple_of(ALIGN);
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_error("binding the context", e))?;
        let base = grow(&mut self.input, total)?;
        let stream = self.stream.cu_stream();
        let mut turn = 0usize;
        for (part, &offset) in parts.iter().zip(&offsets) {
            for (i, piece) in part.chunks(PIECE_BYTES).enumerate() {
                let buf = &self.pinned[turn % 2];
                turn += 1;
                // SAFETY: the event covers the last copy out of this buffer, so it is free
                // to fill; the copy reads `piece.len()` bytes of it into the input buffer,
                // which `grow` sized for every part.
                unsafe {
                    result::event::synchronize(buf.event.cu_event())
                        .map_err(|e| cuda_error("waiting for a copy", e))?;
                    let host = std::slice::from_raw_parts_mut(buf.ptr, piece.len());
                    host.copy_from_slice(piece);
                    let dst = base + (offset + i * PIECE_BYTES) as CUdeviceptr;
                    result::memcpy_htod_async(dst, host, stream)
                        .map_err(|e| cuda_error("copying to the device", e))?;
                    result::event::record(buf.event.cu_event(), stream)
                        .map_err(|e| cuda_error("recording a copy", e))?;
                }
            }
        }
        Ok(offsets.iter().map(|&o| base + o as CUdeviceptr).collect())
    }

    /// A device buffer of at least `len` bytes for a kernel's output.
    pub fn output(&mut self, len: usize) -> Result<CUdeviceptr> {
        grow(&mut self.output, len)
    }

    /// Queues the copy of piece `k` (`len` bytes) of the output at `src` into pinned buffer
    /// `k % 2`.
    fn queue_download(&self, src: CUdeviceptr, k: usize, len: usize) -> Result<()> {
        let buf = &self.pinned[k % 2];
        // SAFETY: the pinned buffer holds PIECE_BYTES >= len bytes, and the caller drained
        // what it held before; the source lies inside the output buffer.
        unsafe {
            let host = std::slice::from_raw_parts_mut(buf.ptr, len);
            let from = src + (k * PIECE_BYTES) as CUdeviceptr;
            result::memcpy_dtoh_async(host, from, self.stream.cu_stream())
                .map_err(|e| cuda_error("copying from the device", e))?;
            result::event::record(buf.event.cu_event(), self.stream.cu_stream())
                .map_err(|e| cuda_error("recording a copy", e))
        }
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`, once the work queued
    /// on the stream before is done: piece `k + 1` is on its way while piece `k` is drained.
    pub fn download(&mut self, src: CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        let total = dst.len();
        let count = total.div_ceil(PIECE_BYTES);
        let len_of = |k: usize| PIECE_BYTES.min(total - k * PIECE_BYTES);
        if count > 0 {
            self.queue_download(src, 0, len_of(0))?;
        }
        for k in 0..count {
            if k + 1 < count {
                self.queue_download(src, k + 1, len_of(k + 1))?;
            }
            let buf = &self.pinned[k % 2];
            let at = k * PIECE_BYTES;
            // SAFETY: the event covers the copy of piece `k` into this buffer.
            unsafe {
                result::event::synchronize(buf.event.cu_event())
                    .map_err(|e| cuda_error("waiting for a copy", e))?;
                dst[at..at + len_of(k)]
                    .copy_from_slice(std::slice::from_raw_parts(buf.ptr, len_of(k)));
            }
        }
        Ok(())
    }
}
