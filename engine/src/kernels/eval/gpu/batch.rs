//! Decoding a batch of chunks on the device: their bytes (zstd frames, or values the CPU
//! decoded) packed into page-locked memory together with nvCOMP's argument arrays and the
//! parts' descriptors, copied over in one transfer, decoded by nvCOMP's batched zstd
//! decoder, and placed into a device array by one kernel launch per 65 535 parts; launched
//! on a staging's stream and finished (waited for, checked, timed) later, so the next batch
//! can be packed and launched on another staging meanwhile.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use rayon::prelude::*;

use super::device_array::DeviceArray;
use super::failure::cuda_error;
use super::nvcomp::{nvcomp, status_name, DecodeCall};
use super::place::{PieceDesc, Side, PLACE_KERNEL, PLACE_SOURCE};
use super::read_staging::{grown_host, ReadStaging};
use super::runtime::Gpu;
use super::staging::grow as grown_device;
use crate::error::{Error, ErrorKind, Result};

/// Alignment of every region of the transfer and of the scratch buffer.
const ALIGN: usize = 256;
/// Parts one launch places (the grid's `y` limit).
const PARTS_PER_LAUNCH: usize = 65_535;
/// Blocks sharing one part's rows, at most.
const BLOCKS_PER_PART: i64 = 512;

/// One chunk of a batch.
#[derive(Debug)]
pub struct BatchChunk<'a> {
    /// What is uploaded: a zstd frame (`compressed`) or the chunk's values.
    pub bytes: &'a [u8],
    /// Whether nvCOMP decodes `bytes`.
    pub compressed: bool,
    /// The chunk's shape as decoded (C order).
    pub shape: &'a [u64],
    /// Where its parts go.
    pub parts: &'a [Part],
    /// The chunk's key, for errors.
    pub key: &'a str,
}

/// A part of a chunk and where it goes in the output.
#[derive(Debug, Clone)]
pub struct Part {
    /// Where the part starts in the chunk.
    pub from: Vec<u64>,
    /// The window (leading index of the output) it goes to.
    pub window: usize,
    /// Where it starts in the window.
    pub to: Vec<u64>,
    /// Its shape.
    pub shape: Vec<u64>,
}

/// Where a batch's device time went, in seconds (timed by events on its stream).
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchTimes {
    /// Copying the batch to the device.
    pub upload: f64,
    /// nvCOMP's decode.
    pub decode: f64,
    /// Placing the parts.
    pub place: f64,
}

/// Where everything of one batch lies: in the transfer (host and device input alike) and in
/// the scratch buffer nvCOMP decodes into.
struct Layout {
    /// Each chunk's bytes in the transfer.
    input_at: Vec<usize>,
    /// Each compressed chunk's decoded values in the scratch buffer.
    decoded_at: Vec<usize>,
    /// The compressed chunks, by index.
    compressed: Vec<usize>,
    /// nvCOMP's argument arrays in the transfer (four of `compressed.len()` u64 each).
    args_at: usize,
    /// The parts' descriptors in the transfer.
    parts_at: usize,
    /// Bytes transferred.
    upload: usize,
    /// Decoded sizes and statuses nvCOMP writes, and its temporary memory, in the scratch.
    actual_at: usize,
    statuses_at: usize,
    temp_at: usize,
    temp: usize,
}

fn layout(chunks: &[BatchChunk<'_>], elem: usize, parts: usize) -> Result<Layout> {
    let nv = chunks.iter().any(|c| c.compressed).then(nvcomp).transpose();
    let nv = nv.map_err(|why| Error::new(ErrorKind::Unsupported, why))?;
    let (align_in, align_out, align_temp) = match nv {
        Some(n) => (
            ALIGN.max(n.alignments.input),
            ALIGN.max(n.alignments.output),
            ALIGN.max(n.alignments.temp),
        ),
        None => (ALIGN, ALIGN, ALIGN),
    };
    let (mut input_at, mut at) = (Vec::with_capacity(chunks.len()), 0usize);
    let (mut decoded_at, mut scratch) = (vec![0usize; chunks.len()], 0usize);
    let (mut compressed, mut largest) = (Vec::new(), 0usize);
    for (i, c) in chunks.iter().enumerate() {
        at = at.next_multiple_of(align_in);
        input_at.push(at);
        at += c.bytes.len();
        if c.compressed {
            let len = c.shape.iter().product::<u64>() as usize * elem;
            scratch = scratch.next_multiple_of(align_out);
            decoded_at[i] = scratch;
            scratch += len;
            largest = largest.max(len);
            compressed.push(i);
        }
    }
    let k = compressed.len();
    let args_at = at.next_multiple_of(ALIGN);
    let parts_at = (args_at + 32 * k).next_multiple_of(ALIGN);
    let upload = parts_at + parts * std::mem::size_of::<PieceDesc>();
    let actual_at = scratch.next_multiple_of(ALIGN);
    let statuses_at = actual_at + 8 * k;
    let temp_at = (statuses_at + 4 * k).next_multiple_of(align_temp);
    let temp = match nv {
        Some(n) if k > 0 => n
            .temp_bytes(k, largest, scratch)
            .map_err(|e| Error::new(ErrorKind::Internal, e))?,
        _ => 0,
    };
    Ok(Layout {
        input_at,
        decoded_at,
        compressed,
        args_at,
        parts_at,
        upload,
        actual_at,
        statuses_at,
        temp_at,
        temp,
    })
}

/// A raw pointer the pack threads share; each writes its own bytes of the buffer.
#[derive(Clone, Copy)]
struct Dest(*mut u8);
// SAFETY: the pack threads write disjoint ranges of one live allocation.
unsafe impl Send for Dest {}
// SAFETY: as above.
unsafe impl Sync for Dest {}

impl Dest {
    /// Copies `bytes` to offset `at`.
    ///
    /// # Safety
    /// `at..at + bytes.len()` lies inside the allocation, and nothing else writes it.
    unsafe fn write(&self, at: usize, bytes: &[u8]) {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.add(at), bytes.len())
    }
}

/// A batch launched on its staging's stream: what finishing it checks and times.
pub struct InFlight {
    stream: Arc<CudaStream>,
    events: [cudarc::driver::CudaEvent; 4],
    /// The compressed chunks' keys and decoded sizes, in nvCOMP's order.
    wants: Vec<(String, u64)>,
    /// Where nvCOMP writes its decoded sizes and statuses.
    actual: CUdeviceptr,
    statuses: CUdeviceptr,
}

impl InFlight {
    /// Waits for the batch; returns where its device time went, or a `corrupt` error naming
    /// a chunk nvCOMP could not decode.
    pub fn finish(self) -> Result<BatchTimes> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_error("waiting for the device", e))?;
        check_statuses(&self.wants, self.actual, self.statuses)?;
        let secs = |a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| cuda_error("timing", e))
        };
        let [e0, e1, e2, e3] = &self.events;
        Ok(BatchTimes {
            upload: secs(e0, e1)?,
            decode: secs(e1, e2)?,
            place: secs(e2, e3)?,
        })
    }
}

impl Gpu {
    /// Launches the decode of `chunks` into `out` (whose leading axis counts windows of
    /// `window`, C order) on `st`'s stream: packs them into its page-locked buffer, copies
    /// them over, decodes the zstd frames and places every part. `st`'s buffers are in use
    /// until the returned batch is finished; `None` for no chunks.
    pub(super) fn launch_batch(
        &self,
        st: &mut ReadStaging,
        chunks: &[BatchChunk<'_>],
        out: &DeviceArray,
        window: &[u64],
    ) -> Result<Option<InFlight>> {
        if chunks.is_empty() {
            return Ok(None);
        }
        let elem = out.dtype().size();
        let parts: usize = chunks.iter().map(|c| c.parts.len()).sum();
        let lay = layout(chunks, elem, parts)?;
        self.bind()?;
        let input = grown_device(&mut st.input, lay.upload)?;
        let scratch = grown_device(&mut st.scratch, lay.temp_at + lay.temp)?;
        let host = Dest(grown_host(&mut st.host, lay.upload)?);
        let descs = descriptors(chunks, &lay, (input, scratch), out, window)?;
        pack(chunks, &lay, host, (input, scratch), &descs, elem);
        let events = [(); 4].map(|_| self.new_event());
        let [e0, e1, e2, e3] = events;
        let events = [e0?, e1?, e2?, e3?];
        let mark = |e: &cudarc::driver::CudaEvent| {
            e.record(&st.stream)
                .map_err(|err| cuda_error("recording an event", err))
        };
        let stream = st.stream.cu_stream();
        mark(&events[0])?;
        // SAFETY: the host buffer holds `upload` bytes, packed above; the device input was
        // grown to as many. Neither is touched again before the batch is finished.
        unsafe {
            let host = std::slice::from_raw_parts(host.0, lay.upload);
            result::memcpy_htod_async(input, host, stream)
                .map_err(|e| cuda_error("copying chunks to the device", e))?;
        }
        mark(&events[1])?;
        let k = lay.compressed.len();
        if k > 0 {
            let nv = nvcomp().map_err(|why| Error::new(ErrorKind::Unsupported, why))?;
            let arg = |n: usize| (input + (lay.args_at + 8 * k * n) as u64) as CUdeviceptr;
            let call = DecodeCall {
                compressed: arg(0),
                compressed_bytes: arg(1),
                buffer_bytes: arg(2),
                outputs: arg(3),
                actual_bytes: scratch + lay.actual_at as u64,
                statuses: scratch + lay.statuses_at as u64,
                count: k,
                temp: (scratch + lay.temp_at as u64, lay.temp),
            };
            // SAFETY: every array lies in the input or scratch buffers sized by `layout` for
            // `k` chunks; the stream orders the decode after the upload.
            unsafe { nv.decode_async(&call, stream) }
                .map_err(|e| cuda_error("decoding chunks on the device", e))?;
        }
        mark(&events[2])?;
        self.launch_place(&st.stream, input + lay.parts_at as u64, &descs, elem)?;
        mark(&events[3])?;
        let wants = lay
            .compressed
            .iter()
            .map(|&i| {
                let c = &chunks[i];
                let want = c.shape.iter().product::<u64>() * elem as u64;
                (c.key.to_string(), want)
            })
            .collect();
        Ok(Some(InFlight {
            stream: st.stream.clone(),
            events,
            wants,
            actual: scratch + lay.actual_at as u64,
            statuses: scratch + lay.statuses_at as u64,
        }))
    }

    /// Launches the placing kernel over the `descs` uploaded at `at`.
    fn launch_place(
        &self,
        stream: &Arc<CudaStream>,
        at: CUdeviceptr,
        descs: &[PieceDesc],
        elem: usize,
    ) -> Result<()> {
        let func = self.function(PLACE_SOURCE, PLACE_KERNEL)?;
        let elem = elem as i32;
        for (g, group) in descs.chunks(PARTS_PER_LAUNCH).enumerate() {
            let rows = group.iter().map(PieceDesc::rows).max().unwrap_or(1);
            let cfg = LaunchConfig {
                grid_dim: (rows.clamp(1, BLOCKS_PER_PART) as u32, group.len() as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let first = at + (g * PARTS_PER_LAUNCH * std::mem::size_of::<PieceDesc>()) as u64;
            let mut launch = stream.launch_builder(&func);
            launch.arg(&first);
            launch.arg(&elem);
            // SAFETY: `cf_place(const Piece*, int)`: the descriptors were uploaded at `first`
            // (one per grid row) and each names ranges inside the batch's buffers and `out`.
            unsafe { launch.launch(cfg) }
                .map_err(|e| cuda_error("launching the placing kernel", e))?;
        }
        Ok(())
    }
}

/// The parts' descriptors: each chunk's values lie in the scratch buffer (decoded there) or
/// in the transfer (uploaded decoded).
fn descriptors(
    chunks: &[BatchChunk<'_>],
    lay: &Layout,
    (input, scratch): (CUdeviceptr, CUdeviceptr),
    out: &DeviceArray,
    window: &[u64],
) -> Result<Vec<PieceDesc>> {
    let elem = out.dtype().size();
    let window_bytes = window.iter().product::<u64>() * elem as u64;
    let mut descs = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let base = if c.compressed {
            scratch + lay.decoded_at[i] as u64
        } else {
            input + lay.input_at[i] as u64
        };
        for p in c.parts {
            let src = Side {
                base,
                shape: c.shape,
                at: &p.from,
            };
            let dst = Side {
                base: out.device_ptr() + p.window as u64 * window_bytes,
                shape: window,
                at: &p.to,
            };
            descs.push(PieceDesc::new(src, dst, &p.shape, elem)?);
        }
    }
    Ok(descs)
}

/// Fills the transfer: the chunks' bytes (in parallel), nvCOMP's argument arrays and the
/// descriptors.
fn pack(
    chunks: &[BatchChunk<'_>],
    lay: &Layout,
    host: Dest,
    (input, scratch): (CUdeviceptr, CUdeviceptr),
    descs: &[PieceDesc],
    elem: usize,
) {
    let write = |at: usize, bytes: &[u8]| {
        // SAFETY: `layout` placed every region inside the `upload` bytes of the host buffer,
        // and no two regions overlap.
        unsafe { host.write(at, bytes) }
    };
    chunks
        .par_iter()
        .zip(&lay.input_at)
        .for_each(|(c, &at)| write(at, c.bytes));
    let k = lay.compressed.len();
    let mut args = vec![0u64; 4 * k];
    for (j, &i) in lay.compressed.iter().enumerate() {
        let c = &chunks[i];
        args[j] = input + lay.input_at[i] as u64;
        args[k + j] = c.bytes.len() as u64;
        args[2 * k + j] = c.shape.iter().product::<u64>() * elem as u64;
        args[3 * k + j] = scratch + lay.decoded_at[i] as u64;
    }
    write(lay.args_at, bytemuck::cast_slice(&args));
    write(lay.parts_at, bytemuck::cast_slice(descs));
}

/// Checks nvCOMP's status and decoded size for each compressed chunk (`wants`: its key and
/// decoded size).
fn check_statuses(
    wants: &[(String, u64)],
    actual: CUdeviceptr,
    statuses: CUdeviceptr,
) -> Result<()> {
    let k = wants.len();
    if k == 0 {
        return Ok(());
    }
    let mut sizes = vec![0u64; k];
    let mut codes = vec![0i32; k];
    // SAFETY: nvCOMP wrote `k` sizes and statuses there; the stream was synchronized.
    unsafe {
        result::memcpy_dtoh_sync(&mut sizes, actual)
            .map_err(|e| cuda_error("reading decode sizes", e))?;
        result::memcpy_dtoh_sync(&mut codes, statuses)
            .map_err(|e| cuda_error("reading decode statuses", e))?;
    }
    for (j, (key, want)) in wants.iter().enumerate() {
        let why = if codes[j] != 0 {
            Some(format!("nvCOMP: {}", status_name(codes[j])))
        } else if sizes[j] != *want {
            Some(format!(
                "it decodes to {} bytes, the chunk needs {want}",
                sizes[j]
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("cannot decode chunk on the device: {why}"),
            )
            .with_chunk_key(key));
        }
    }
    Ok(())
}
