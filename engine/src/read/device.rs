//! Reading windows of an array onto a GPU: the chunks they touch are read in batches (the
//! next batches' reads in flight while the device decodes the current one, and two batches
//! on the device at once, each on its own stream), zstd frames go
//! to the device compressed and nvCOMP decodes them there, other chunks (other codecs, inner
//! chunks of shards, chunks not stored, or every chunk when nvCOMP is absent) are decoded on
//! the CPU and go as values; a kernel places each chunk's parts into one device array.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use rayon::prelude::*;

use super::decode::decode_pool;
use super::plan::{self, Item, Unit};
use super::windows::{check_window, windows_at};
use crate::array::Region;
use crate::error::{Error, Result};
use crate::kernels::eval::gpu::nvcomp::nvcomp;
use crate::kernels::eval::gpu::{BatchChunk, DeviceArray, Gpu, Part};
use crate::store::Value;
use crate::zarr::ZarrArray;

/// Decoded bytes one batch holds at most on the device. nvCOMP decodes each zstd frame in
/// one stream of work, so its throughput grows with the frames one call takes (bench/GPU.md).
const BATCH_BYTES: u64 = 2 << 30;
/// Stored bytes one batch holds at most (as estimated from the first chunk's compression):
/// the page-locked staging they pass through.
const BATCH_STORED: u64 = 512 << 20;
/// Chunks one batch holds at most.
const BATCH_CHUNKS: usize = 4096;
/// Batches whose reads are in flight at once.
const BATCHES_AHEAD: usize = 2;

/// What a device read did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeviceReadStats {
    /// Chunks (or inner chunks) read.
    pub chunks: usize,
    /// Of those, decoded on the device by nvCOMP.
    pub device_decoded: usize,
    /// Bytes read from the store.
    pub stored_bytes: u64,
    /// Bytes of values placed in the output.
    pub output_bytes: u64,
    /// Seconds in all.
    pub seconds: f64,
    /// Seconds waiting for the store.
    pub wait_seconds: f64,
    /// Seconds decoding on the CPU (chunks the device does not decode).
    pub cpu_seconds: f64,
    /// Seconds of the read spent on the device's batches, host side: packing, launching and
    /// waiting for them (the read's span less its waits for storage and CPU decoding).
    pub device_seconds: f64,
    /// Of which, timed on the device: the copies to it.
    pub upload_seconds: f64,
    /// nvCOMP's decodes.
    pub decode_seconds: f64,
    /// Placing the parts.
    pub place_seconds: f64,
    /// Bytes nvCOMP decoded.
    pub device_decoded_bytes: u64,
    /// Why chunks were decoded on the CPU, when some were.
    pub cpu_note: Option<String>,
}

/// One chunk ready for the device: a zstd frame (its read's bytes, or a range of them) or
/// values the CPU decoded, with its decoded shape and where its parts go.
pub struct Prepared {
    bytes: PreparedBytes,
    shape: Vec<u64>,
    parts: Vec<Part>,
    key: String,
}

enum PreparedBytes {
    Frame(Arc<Value>),
    Values(Vec<u8>),
}

impl Prepared {
    /// Whether the device decodes it.
    pub fn is_frame(&self) -> bool {
        matches!(self.bytes, PreparedBytes::Frame(_))
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            PreparedBytes::Frame(v) => v,
            PreparedBytes::Values(v) => v,
        }
    }

    /// The chunk as the device takes it.
    pub fn as_batch_chunk(&self) -> BatchChunk<'_> {
        BatchChunk {
            bytes: self.bytes(),
            compressed: self.is_frame(),
            shape: &self.shape,
            parts: &self.parts,
            key: &self.key,
        }
    }
}

/// The parts of `unit` (a chunk over `region`) relative to the chunk and to their windows.
fn parts(unit: &Unit, region: &Region, windows: &[Region]) -> Vec<Part> {
    let rel = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<u64>>();
    unit.pieces
        .iter()
        .map(|(w, part)| Part {
            from: rel(&part.start, &region.start),
            window: *w,
            to: rel(&part.start, &windows[*w].start),
            shape: part.shape.clone(),
        })
        .collect()
}

/// Makes `unit` ready for the device from `value`, its item's read: a stored zstd frame of a
/// plain chunk stays compressed when `frames` (nvCOMP is there); anything else is decoded
/// here.
pub fn prepare(
    array: &ZarrArray,
    unit: &Unit,
    value: Option<Arc<Value>>,
    frames: bool,
    windows: &[Region],
) -> Result<Prepared> {
    let idx = &unit.idx;
    let key = array.chunk_key(idx);
    if let Some(at) = &unit.inner {
        let region = array.inner_grid().chunk_region(idx);
        let bytes = match (at, &value) {
            (Some(at), Some(v)) => Some(v.get(at.clone()).ok_or_else(|| {
                Error::internal(format!("inner chunk at {at:?} lies outside its read"))
            })?),
            _ => None,
        };
        let buf = array.decode_inner(idx, bytes.filter(|b| !b.is_empty()))?;
        return Ok(Prepared {
            bytes: PreparedBytes::Values(buf.into_bytes()),
            parts: parts(unit, &region, windows),
            shape: region.shape,
            key,
        });
    }
    let region = array.grid().chunk_region(idx);
    let parts = parts(unit, &region, windows);
    let elem = array.dtype().size() as u64;
    let frame = match (
        &value,
        frames.then(|| array.zstd_frame_shape(idx)).flatten(),
    ) {
        (Some(v), Some(shape)) if one_whole_frame(v, shape.iter().product::<u64>() * elem) => {
            Some((v.clone(), shape))
        }
        _ => None,
    };
    if let Some((v, shape)) = frame {
        return Ok(Prepared {
            bytes: PreparedBytes::Frame(v),
            shape,
            parts,
            key,
        });
    }
    let owned = value.map(|v| Arc::try_unwrap(v).unwrap_or_else(|v| Value::Owned(v.to_vec())));
    let buf = array.decode_chunk(idx, owned)?;
    Ok(Prepared {
        bytes: PreparedBytes::Values(buf.into_bytes()),
        shape: region.shape,
        parts,
        key,
    })
}

/// Whether `bytes` are one whole zstd frame whose header, where it says, gives `len` decoded
/// bytes. Others (truncated or joined frames, another size) are decoded on the CPU, which
/// names what is wrong; nvCOMP does not check a frame's structure before decoding it.
fn one_whole_frame(bytes: &[u8], len: u64) -> bool {
    use zstd::zstd_safe::{find_frame_compressed_size, get_frame_content_size};
    let sized = match get_frame_content_size(bytes) {
        Ok(Some(n)) => n == len,
        Ok(None) => true,
        Err(_) => false,
    };
    sized && find_frame_compressed_size(bytes).is_ok_and(|n| n == bytes.len())
}

/// The items of each batch: at most `BATCH_BYTES` of decoded values, `BATCH_STORED` of
/// stored bytes (estimated from the first chunk's compression) and `BATCH_CHUNKS` chunks (an
/// item larger than that is a batch alone).
pub fn batches(array: &ZarrArray, items: &[Item]) -> Vec<Range<usize>> {
    let elem = array.dtype().size() as u64;
    let ratio = array.sampled_compression().unwrap_or(1.0).max(1.0);
    let limit = BATCH_BYTES.min((BATCH_STORED as f64 * ratio) as u64);
    let grid = if array.shard_layout().is_some() {
        array.inner_grid()
    } else {
        array.grid()
    };
    let mut out = Vec::new();
    let (mut start, mut bytes, mut chunks) = (0usize, 0u64, 0usize);
    for (i, item) in items.iter().enumerate() {
        let b: u64 = item
            .units
            .iter()
            .map(|u| grid.chunk_region(&u.idx).len() * elem)
            .sum();
        let n = item.units.len();
        if i > start && (bytes + b > limit || chunks + n > BATCH_CHUNKS) {
            out.push(start..i);
            (start, bytes, chunks) = (i, 0, 0);
        }
        bytes += b;
        chunks += n;
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
}

/// Starts the reads of `items`; the receiver gets their values in order.
fn fetch(array: &ZarrArray, items: &[Item]) -> mpsc::Receiver<Result<Vec<Option<Value>>>> {
    let reqs = items.iter().filter_map(|i| i.req.clone()).collect();
    let (tx, rx) = mpsc::channel();
    array.store().read_batch(
        reqs,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx
}

/// Reads the windows of shape `size` at each of `starts` into a new device array of shape
/// `(len(starts), *size)` on `gpu`; `threads` CPU threads (0: one per core) prepare chunks.
pub fn read_windows_to_device(
    array: &ZarrArray,
    starts: &[Vec<u64>],
    size: &[u64],
    gpu: &'static Gpu,
    threads: usize,
) -> Result<(DeviceArray, DeviceReadStats)> {
    let t0 = Instant::now();
    let shape = array.shape();
    for (i, s) in starts.iter().enumerate() {
        check_window(&shape, s, size, &format!("window {i}"))?;
    }
    let mut out_shape = vec![starts.len() as u64];
    out_shape.extend_from_slice(size);
    let out = DeviceArray::alloc(gpu, &out_shape, array.dtype())?;
    let mut stats = DeviceReadStats::default();
    if starts.is_empty() || size.contains(&0) {
        return Ok((out, stats));
    }
    let windows = windows_at(starts, size);
    let items = plan::plan(array, &windows, None)?.items;
    let frames = match nvcomp() {
        Ok(_) => true,
        Err(why) => {
            stats.cpu_note = Some(why);
            false
        }
    };
    let pool = decode_pool(threads)?;
    let ranges = batches(array, &items);
    let mut inflight: VecDeque<_> = ranges
        .iter()
        .take(BATCHES_AHEAD)
        .map(|r| fetch(array, &items[r.clone()]))
        .collect();
    let device = Instant::now();
    let ((), times) = gpu
        .reading(|queue| {
            for (b, range) in ranges.iter().enumerate() {
                let batch = &items[range.clone()];
                let waited = Instant::now();
                let rx = inflight
                    .pop_front()
                    .ok_or_else(|| Error::internal("device read lost a batch"))?;
                let lost = || Error::store(array.url(), "IO thread ended without an answer");
                let values =
                    crate::cancel::recv(&rx, lost)?.map_err(|e| e.with_array(array.name()))?;
                stats.wait_seconds += waited.elapsed().as_secs_f64();
                if let Some(next) = ranges.get(b + BATCHES_AHEAD) {
                    inflight.push_back(fetch(array, &items[next.clone()]));
                }
                stats.stored_bytes += values.iter().flatten().map(|v| v.len() as u64).sum::<u64>();
                let mut values = values.into_iter();
                let mut jobs = Vec::new();
                for item in batch {
                    let value = item.req.as_ref().and_then(|_| values.next().flatten());
                    let value = value.map(Arc::new);
                    jobs.extend(item.units.iter().map(|u| (u, value.clone())));
                }
                let cpu = Instant::now();
                let prepared: Vec<Prepared> = pool.install(|| {
                    jobs.into_par_iter()
                        .map(|(u, v)| prepare(array, u, v, frames, &windows))
                        .collect::<Result<_>>()
                })?;
                stats.chunks += prepared.len();
                stats.device_decoded += prepared.iter().filter(|p| p.is_frame()).count();
                if stats.cpu_note.is_none() && prepared.iter().any(|p| !p.is_frame()) {
                    stats.cpu_note = Some(cpu_reason(array));
                }
                stats.cpu_seconds += cpu.elapsed().as_secs_f64();
                stats.device_decoded_bytes += prepared
                    .iter()
                    .filter(|p| p.is_frame())
                    .map(|p| p.shape.iter().product::<u64>() * array.dtype().size() as u64)
                    .sum::<u64>();
                let chunks: Vec<BatchChunk<'_>> =
                    prepared.iter().map(Prepared::as_batch_chunk).collect();
                pool.install(|| queue.push(&chunks, &out, size))?;
            }
            Ok(())
        })
        .map_err(|e| e.with_array(array.name()).with_store(array.url()))?;
    // The device's batches overlap the reads and the CPU's preparing: their span, less those.
    stats.device_seconds =
        (device.elapsed().as_secs_f64() - stats.wait_seconds - stats.cpu_seconds).max(0.0);
    stats.upload_seconds = times.upload;
    stats.decode_seconds = times.decode;
    stats.place_seconds = times.place;
    stats.output_bytes = out.nbytes() as u64;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok((out, stats))
}

/// Why a read's chunks went to the device as values rather than zstd frames.
fn cpu_reason(array: &ZarrArray) -> String {
    if array.shard_layout().is_some() {
        "inner chunks of shards are decoded on the CPU".into()
    } else if array
        .zstd_frame_shape(&vec![0; array.shape().len()])
        .is_some()
    {
        "chunks not stored (fill values) are made on the CPU".into()
    } else {
        "the device decodes zstd over little-endian bytes; this array's codecs are decoded \
         on the CPU"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::Codec;

    /// A 7 x 10 x 9 float32 array of 3 x 4 x 4 chunks (edge chunks padded) holding i * 0.5.
    fn array(dir: &std::path::Path, codec: Codec, shards: Option<Vec<u64>>) -> ZarrArray {
        let values: Vec<f32> = (0..630).map(|i| i as f32 * 0.5).collect();
        super::super::tests::sample_array_with(dir, codec, shards, &values)
    }

    /// What the device does, on the host: frames decoded with zstd, parts copied.
    fn emulate(prepared: &[Prepared], out: &mut [f32], window: &[u64]) {
        let per_window: u64 = window.iter().product();
        for p in prepared {
            let values: Vec<u8> = match &p.bytes {
                PreparedBytes::Frame(v) => zstd::decode_all(&v[..]).unwrap(),
                PreparedBytes::Values(v) => v.clone(),
            };
            let values: &[f32] = bytemuck::cast_slice(&values);
            assert_eq!(values.len() as u64, p.shape.iter().product::<u64>());
            for part in &p.parts {
                let n: u64 = part.shape.iter().product();
                for i in 0..n {
                    let (mut rem, mut at) = (i, vec![0u64; 3]);
                    for d in (0..3).rev() {
                        at[d] = rem % part.shape[d];
                        rem /= part.shape[d];
                    }
                    let src = (0..3).fold(0, |o, d| o * p.shape[d] + part.from[d] + at[d]);
                    let dst = (0..3).fold(0, |o, d| o * window[d] + part.to[d] + at[d]);
                    out[(part.window as u64 * per_window + dst) as usize] = values[src as usize];
                }
            }
        }
    }

    fn read_emulated(
        arr: &ZarrArray,
        starts: &[Vec<u64>],
        size: &[u64],
        frames: bool,
    ) -> (Vec<f32>, usize) {
        let windows = windows_at(starts, size);
        let items = plan::plan(arr, &windows, None).unwrap().items;
        assert_eq!(batches(arr, &items), vec![0..items.len()]);
        let reqs: Vec<_> = items.iter().filter_map(|i| i.req.clone()).collect();
        let mut values = arr.store().get_many(reqs).unwrap().into_iter();
        let mut prepared = Vec::new();
        for item in &items {
            let value = item
                .req
                .as_ref()
                .and_then(|_| values.next().flatten())
                .map(Arc::new);
            for u in &item.units {
                prepared.push(prepare(arr, u, value.clone(), frames, &windows).unwrap());
            }
        }
        let n = starts.len() * size.iter().product::<u64>() as usize;
        let mut out = vec![f32::NAN; n];
        emulate(&prepared, &mut out, size);
        (out, prepared.iter().filter(|p| p.is_frame()).count())
    }

    fn host_read(arr: &ZarrArray, starts: &[Vec<u64>], size: &[u64]) -> Vec<f32> {
        let n = starts.len() * size.iter().product::<u64>() as usize;
        let mut out = vec![0u8; n * 4];
        super::super::read_windows(arr, starts, size, &mut out, 2).unwrap();
        bytemuck::cast_slice(&out).to_vec()
    }

    #[test]
    fn zstd_chunks_go_compressed_and_their_parts_land_where_the_host_read_puts_them() {
        let starts = vec![vec![0, 0, 0], vec![2, 5, 3], vec![4, 6, 5], vec![0, 0, 0]];
        let size = [3u64, 4, 4];
        for (codec, shards, framed) in [
            (Codec::default(), None, true),
            (Codec::None, None, false),
            (Codec::default(), Some(vec![6, 8, 8]), false),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let arr = array(dir.path(), codec, shards.clone());
            let want = host_read(&arr, &starts, &size);
            for frames in [true, false] {
                let (got, sent) = read_emulated(&arr, &starts, &size, frames);
                assert_eq!(got, want, "shards {shards:?}, frames {frames}");
                assert_eq!(
                    sent > 0,
                    framed && frames,
                    "shards {shards:?}, frames {frames}"
                );
            }
            let whole = arr.shape();
            let (got, _) = read_emulated(&arr, &[vec![0, 0, 0]], &whole, true);
            assert_eq!(got, host_read(&arr, &[vec![0, 0, 0]], &whole));
        }
    }

    #[test]
    fn batches_hold_at_most_their_bytes_and_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let arr = array(dir.path(), Codec::default(), None);
        let whole = Region::whole(&arr.shape());
        let items = plan::plan(&arr, &[whole], None).unwrap().items;
        let ranges = batches(&arr, &items);
        assert_eq!(ranges, vec![0..items.len()]);
        assert!(cpu_reason(&arr).contains("not stored"));
    }

    #[test]
    fn only_whole_single_frames_of_the_chunk_s_size_go_to_the_device() {
        let values = vec![7u8; 4096];
        let frame = zstd::bulk::compress(&values, 3).unwrap();
        assert!(one_whole_frame(&frame, 4096));
        assert!(!one_whole_frame(&frame, 4095));
        assert!(!one_whole_frame(&frame[..frame.len() - 3], 4096));
        let joined = [frame.clone(), frame].concat();
        assert!(!one_whole_frame(&joined, 4096));
        assert!(!one_whole_frame(b"not zstd", 4096));
    }

    #[test]
    fn a_truncated_chunk_is_decoded_on_the_cpu_which_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let arr = array(dir.path(), Codec::default(), None);
        let key = arr.chunk_key(&[1, 0, 0]);
        let path = dir.path().join(&key);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let windows = [Region::whole(&arr.shape())];
        let items = plan::plan(&arr, &windows, None).unwrap().items;
        let item = items.iter().find(|i| i.units[0].idx == [1, 0, 0]).unwrap();
        let value = arr
            .store()
            .get_many(vec![item.req.clone().unwrap()])
            .unwrap();
        let value = value.into_iter().next().flatten().map(Arc::new);
        let err = match prepare(&arr, &item.units[0], value, true, &windows) {
            Ok(_) => panic!("a truncated chunk was sent to the device"),
            Err(e) => e,
        };
        assert_eq!(
            err.context.chunk_key.as_deref(),
            Some(key.as_str()),
            "{err}"
        );
    }
}
