//! Direct reads into caller memory: a region of an array, or many same-shaped windows at
//! once (the ML-training access pattern), from any store the engine opens.
//!
//! Every chunk a request touches is read once and decoded once, however many windows it
//! feeds. Reads go out in batches on the store's IO threads while earlier batches decode on
//! the compute pool; the encoded bytes waiting for decode are bounded. A chunk that fills a
//! contiguous part of the destination (whole rows of a full read) decodes straight into it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{mpsc, Arc, Condvar, Mutex};

use crate::array::buffer::for_each_run;
use crate::array::Region;
use crate::error::{Error, Result};
use crate::fork_safe::ForkSafe;
use crate::store::{open_store, ReadRequest};
use crate::zarr::ZarrArray;

/// Chunks per IO batch, per compute thread.
const CHUNKS_PER_BATCH_PER_THREAD: usize = 2;
/// Batches read ahead of the decoder (local stores; see `batches_ahead`).
const BATCHES_AHEAD: usize = 3;
/// Batches read ahead from stores where every request is a network round trip.
const REMOTE_BATCHES_AHEAD: usize = 16;

/// Opens the array at `url` for reading.
pub fn open_array(url: &str, io_threads: usize) -> Result<ZarrArray> {
    ZarrArray::open(open_store(url, io_threads.max(1))?)
}

/// Where the parts of one chunk go: (window index, the part of the array it copies).
type Pieces = Vec<(usize, Region)>;

/// The destination: `windows` same-shaped C-ordered boxes stacked in one buffer, written by
/// many decode jobs at once, each to its own (window, chunk) intersections.
pub(crate) struct Destination {
    ptr: *mut u8,
    len: usize,
    window_bytes: usize,
    windows: Vec<Region>,
}

// SAFETY: jobs write through `ptr` only to the bytes of their own (window, chunk)
// intersections, which never overlap: each element of a window lies in exactly one chunk,
// and windows occupy separate slices of the buffer. The buffer outlives every job (they
// finish inside the scope that borrows it).
unsafe impl Send for Destination {}
unsafe impl Sync for Destination {}

impl Destination {
    /// The destination over `out`, which holds `windows` of `window_bytes` each. It must not
    /// outlive `out`, and its users must write disjoint parts (see the `Send`/`Sync` note).
    pub(crate) fn over(out: &mut [u8], window_bytes: usize, windows: Vec<Region>) -> Self {
        Destination {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            window_bytes,
            windows,
        }
    }

    /// Copies `part` (absolute coordinates) of window `w` from `src`, a buffer over `chunk`.
    pub(crate) fn copy_from(
        &self,
        w: usize,
        chunk: &Region,
        part: &Region,
        src: &[u8],
        elem: usize,
    ) {
        let window = &self.windows[w];
        let base = w * self.window_bytes;
        for_each_run(chunk, window, part, elem, |so, doff, n| {
            debug_assert!(base + doff + n <= self.len);
            // SAFETY: the run lies inside window `w` (`part` lies inside it), and no other
            // job writes these bytes (see the `Send`/`Sync` note).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(so), self.ptr.add(base + doff), n);
            }
        });
    }

    /// Where the destination bytes of `part` of window `w` start, when they are one
    /// contiguous run (of `part.len() * elem` bytes).
    pub(crate) fn contiguous(&self, w: usize, part: &Region, elem: usize) -> Option<*mut u8> {
        let window = &self.windows[w];
        let rank = part.rank();
        // Leading axes of extent 1, then whole extents of the window: one run.
        let first = (0..rank).find(|&d| part.shape[d] > 1).unwrap_or(rank);
        let whole_after = (first + 1..rank).all(|d| part.shape[d] == window.shape[d]);
        if !whole_after {
            return None;
        }
        let strides = crate::array::grid::c_strides(&window.shape);
        let rel = part.relative_to(&window.start);
        let offset: u64 = (0..rank).map(|d| rel.start[d] * strides[d]).sum();
        let start = w * self.window_bytes + offset as usize * elem;
        let n = part.len() as usize * elem;
        if start + n > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above).
        Some(unsafe { self.ptr.add(start) })
    }
}

/// Checks a window against the array's shape.
fn check_window(shape: &[u64], start: &[u64], size: &[u64], what: &str) -> Result<()> {
    if start.len() != shape.len() || size.len() != shape.len() {
        return Err(Error::plan(
            what,
            format!(
                "has {} start and {} size entries, but the array has {} axes",
                start.len(),
                size.len(),
                shape.len()
            ),
        ));
    }
    for d in 0..shape.len() {
        if start[d].saturating_add(size[d]) > shape[d] {
            return Err(Error::plan(
                what,
                format!(
                    "axis {d}: {}..{} is outside the array's extent {}",
                    start[d],
                    start[d].saturating_add(size[d]),
                    shape[d]
                ),
            ));
        }
    }
    Ok(())
}

/// Reads `region` of `array` into `out`, C order (exactly `region.len() * itemsize` bytes).
pub fn read_region(
    array: &ZarrArray,
    region: &Region,
    out: &mut [u8],
    threads: usize,
) -> Result<()> {
    check_window(&array.shape(), &region.start, &region.shape, "selection")?;
    read_windows(
        array,
        std::slice::from_ref(&region.start),
        &region.shape,
        out,
        threads,
    )
}

/// Reads the windows of shape `size` at each of `starts` into `out`, stacked in that order
/// (exactly `starts.len() * prod(size) * itemsize` bytes), decoding each touched chunk once,
/// on `threads` threads (0: one per core).
pub fn read_windows(
    array: &ZarrArray,
    starts: &[Vec<u64>],
    size: &[u64],
    out: &mut [u8],
    threads: usize,
) -> Result<()> {
    let shape = array.shape();
    let elem = array.dtype().size();
    for (i, s) in starts.iter().enumerate() {
        check_window(&shape, s, size, &format!("window {i}"))?;
    }
    let window_bytes = size.iter().product::<u64>() as usize * elem;
    if out.len() != window_bytes * starts.len() {
        return Err(Error::internal(format!(
            "output buffer holds {} bytes, the windows need {}",
            out.len(),
            window_bytes * starts.len()
        )));
    }
    if window_bytes == 0 || starts.is_empty() {
        return Ok(());
    }
    let windows: Vec<Region> = starts
        .iter()
        .map(|s| Region {
            start: s.clone(),
            shape: size.to_vec(),
        })
        .collect();
    let items = match inner_items(array, &windows)? {
        Some(items) => items,
        None => touched(array.grid(), &windows)
            .into_iter()
            .map(|(idx, pieces)| Item {
                req: Some(ReadRequest::whole(array.chunk_key(&idx))),
                units: vec![Unit {
                    idx,
                    pieces,
                    inner: None,
                }],
            })
            .collect(),
    };
    let dest = Destination::over(out, window_bytes, windows);
    let pool = decode_pool(threads)?;
    let threads = pool.current_num_threads();
    decode_all(array, &items, &dest, &pool, threads)
}

/// A touched inner chunk of one shard: its position in the shard (C order), its index in
/// the array's inner grid, and the parts of windows it fills.
type TouchedInner = (usize, Vec<u64>, Pieces);

/// One read, and the chunks decoded from what it returns.
struct Item {
    /// What to read; `None` when nothing is stored (inner chunks their shard does not hold).
    req: Option<ReadRequest>,
    /// The chunks decoded from it.
    units: Vec<Unit>,
}

/// A chunk, or an inner chunk of a shard, to decode, and where its parts go.
struct Unit {
    idx: Vec<u64>,
    pieces: Pieces,
    /// For an inner chunk (of the array's inner grid): where its bytes lie in what its item
    /// read, or `None` when its shard does not store it (the fill value). `None` for a
    /// stored chunk or shard, which is the whole read.
    inner: Option<Option<std::ops::Range<usize>>>,
}

/// Every chunk of `grid` the windows touch, with the parts of windows it fills, in storage
/// order.
fn touched(grid: &crate::array::ChunkGrid, windows: &[Region]) -> BTreeMap<Vec<u64>, Pieces> {
    let mut chunks: BTreeMap<Vec<u64>, Pieces> = BTreeMap::new();
    for (w, window) in windows.iter().enumerate() {
        for idx in grid.chunks_overlapping(window) {
            if let Some(part) = grid.chunk_region(&idx).intersect(window) {
                chunks.entry(idx).or_default().push((w, part));
            }
        }
    }
    chunks
}

/// Inner chunks whose bytes lie at most this far apart in their shard are read together.
const COALESCE_GAP: u64 = 256 << 10;
/// The longest read that coalescing makes (a single larger inner chunk is read alone).
const COALESCE_MAX: u64 = 8 << 20;

/// For a sharded array with a standard shard layout: the inner chunks the windows touch,
/// read in runs of neighbours (each shard's index read first, by one ranged read per
/// shard) and decoded one by one, in parallel. `None` for other arrays, read chunk by chunk.
fn inner_items(array: &ZarrArray, windows: &[Region]) -> Result<Option<Vec<Item>>> {
    let Some(layout) = array.shard_layout() else {
        return Ok(None);
    };
    let mut by_shard: BTreeMap<Vec<u64>, Vec<TouchedInner>> = BTreeMap::new();
    for (idx, pieces) in touched(array.inner_grid(), windows) {
        let (shard, pos) = layout.locate(&idx);
        by_shard.entry(shard).or_default().push((pos, idx, pieces));
    }
    let reqs = by_shard
        .keys()
        .map(|s| ReadRequest {
            key: array.chunk_key(s),
            range: Some(layout.index_range()),
        })
        .collect();
    let indexes = array
        .store()
        .get_many(reqs)
        .map_err(|e| e.with_array(array.name()))?;
    let mut items = Vec::new();
    for ((shard, inner), index) in by_shard.into_iter().zip(indexes) {
        let key = array.chunk_key(&shard);
        let ranges = match index {
            None => None,
            Some(bytes) => Some(array.parse_shard_index(layout, &key, &bytes)?),
        };
        items.extend(shard_items(&key, ranges.as_deref(), inner));
    }
    Ok(Some(items))
}

/// The reads of one shard's touched inner chunks, given where the shard's index puts them
/// (`None`: no shard is stored): runs of stored neighbours in the order they lie, each one
/// read, and one read-less item for the inner chunks not stored.
fn shard_items(
    key: &str,
    ranges: Option<&[crate::zarr::shard::InnerRange]>,
    inner: Vec<TouchedInner>,
) -> Vec<Item> {
    let mut stored = Vec::new();
    let mut absent = Vec::new();
    for (pos, idx, pieces) in inner {
        match ranges.and_then(|r| r.get(pos).copied().flatten()) {
            Some(r) => stored.push((r.offset, r.len.unwrap_or(0), idx, pieces)),
            None => absent.push(Unit {
                idx,
                pieces,
                inner: Some(None),
            }),
        }
    }
    stored.sort_by_key(|(offset, ..)| *offset);
    let mut items: Vec<Item> = Vec::new();
    let mut run: Option<(u64, u64, Vec<Unit>)> = None;
    let close = |items: &mut Vec<Item>, (start, end, units): (u64, u64, Vec<Unit>)| {
        items.push(Item {
            req: Some(ReadRequest {
                key: key.to_string(),
                range: Some(crate::store::ByteRange::new(start, Some(end - start))),
            }),
            units,
        })
    };
    for (offset, len, idx, pieces) in stored {
        let end = offset + len;
        let joins = run.as_ref().is_some_and(|(start, stop, _)| {
            offset >= *stop && offset - *stop <= COALESCE_GAP && end - *start <= COALESCE_MAX
        });
        if !joins {
            if let Some(done) = run.take() {
                close(&mut items, done);
            }
            run = Some((offset, end, Vec::new()));
        }
        if let Some((start, stop, units)) = run.as_mut() {
            *stop = end;
            let at = (offset - *start) as usize;
            units.push(Unit {
                idx,
                pieces,
                inner: Some(Some(at..at + len as usize)),
            });
        }
    }
    if let Some(done) = run.take() {
        close(&mut items, done);
    }
    if !absent.is_empty() {
        items.push(Item {
            req: None,
            units: absent,
        });
    }
    items
}

/// The decode pool of `threads` threads (0: one per core), made once per size and kept, so
/// a training loop calling [`read_windows`] often does not start threads each time. A child
/// process forked after the pools were made gets its own (see [`crate::fork_safe`]).
fn decode_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>> {
    type Pools = Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>;
    static POOLS: ForkSafe<Pools> = ForkSafe::new();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let pools = POOLS.get_or_init(Pools::default);
    let mut pools = pools
        .lock()
        .map_err(|_| Error::internal("decode pool registry poisoned"))?;
    if let Some(p) = pools.get(&threads) {
        return Ok(p.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("chunkfuse-read-{i}"))
        .build()
        .map_err(|e| Error::internal(e.to_string()))?;
    let pool = Arc::new(pool);
    pools.insert(threads, pool.clone());
    Ok(pool)
}

/// Counts decode jobs not yet finished, so IO stays a bounded distance ahead.
struct Backlog {
    pending: Mutex<usize>,
    changed: Condvar,
}

impl Backlog {
    fn add(&self, n: usize) {
        if let Ok(mut p) = self.pending.lock() {
            *p += n;
        }
    }
    fn done(&self) {
        if let Ok(mut p) = self.pending.lock() {
            *p = p.saturating_sub(1);
        }
        self.changed.notify_all();
    }
    fn wait_below(&self, limit: usize) {
        let Ok(mut p) = self.pending.lock() else {
            return;
        };
        while *p >= limit {
            match self.changed.wait(p) {
                Ok(g) => p = g,
                Err(_) => return,
            }
        }
    }
}

/// Reads every chunk of `chunks` in batches and decodes each into its windows on `pool`.
fn decode_all(
    array: &ZarrArray,
    chunks: &[Item],
    dest: &Destination,
    pool: &rayon::ThreadPool,
    threads: usize,
) -> Result<()> {
    let per_batch = CHUNKS_PER_BATCH_PER_THREAD * threads;
    let batches: Vec<&[Item]> = chunks.chunks(per_batch).collect();
    // Decode jobs per read, on average (coalesced inner chunks give several), so the backlog
    // limit counts reads.
    let units: usize = chunks.iter().map(|item| item.units.len()).sum();
    let units_per_item = units.div_ceil(chunks.len().max(1)).max(1);
    let (tx, rx) = mpsc::channel();
    let submit = |b: usize| {
        let reqs = batches[b]
            .iter()
            .filter_map(|item| item.req.clone())
            .collect();
        let tx = tx.clone();
        array.store().read_batch(
            reqs,
            Box::new(move |r| {
                let _ = tx.send((b, r));
            }),
        );
    };
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let fail = |e: Error| {
        if let Ok(mut slot) = first_error.lock() {
            slot.get_or_insert(e);
        }
    };
    let failed = || first_error.lock().map(|s| s.is_some()).unwrap_or(true);
    let backlog = Backlog {
        pending: Mutex::new(0),
        changed: Condvar::new(),
    };
    let elem = array.dtype().size();
    // Encoded bytes waiting for the decoder stay within `depth` batches.
    let depth = if array.store().latency_bound() {
        REMOTE_BATCHES_AHEAD
    } else {
        BATCHES_AHEAD
    };
    let ahead = depth.min(batches.len());
    for b in 0..ahead {
        submit(b);
    }
    let mut next = ahead;
    pool.in_place_scope(|scope| {
        for _ in 0..batches.len() {
            let lost = || Error::store(array.url(), "IO thread ended without an answer");
            let (b, result) = match crate::cancel::recv(&rx, lost) {
                Ok(answer) => answer,
                Err(e) => {
                    fail(e);
                    break;
                }
            };
            let values = match result {
                Ok(v) => v,
                Err(e) => {
                    fail(e.with_array(array.name()));
                    break;
                }
            };
            backlog.add(batches[b].iter().map(|item| item.units.len()).sum());
            // Items that read nothing (inner chunks not stored) take no value.
            let mut values = values.into_iter();
            let values: Vec<Option<crate::store::Value>> = batches[b]
                .iter()
                .map(|item| item.req.as_ref().and_then(|_| values.next().flatten()))
                .collect();
            for (item, value) in batches[b].iter().zip(values) {
                // The units of one read share its bytes; the last to finish frees them.
                let mut value = value.map(Arc::new);
                let last = item.units.len().saturating_sub(1);
                for (u, unit) in item.units.iter().enumerate() {
                    let (backlog, fail, failed) = (&backlog, &fail, &failed);
                    let value = if u == last {
                        value.take()
                    } else {
                        value.clone()
                    };
                    scope.spawn(move |_| {
                        if !failed() {
                            if let Err(e) = decode_one(array, unit, value, dest, elem) {
                                fail(e);
                            }
                        }
                        backlog.done();
                    });
                }
            }
            if failed() {
                break;
            }
            if next < batches.len() {
                // Keep at most a few batches of encoded bytes waiting for the decoder.
                backlog.wait_below(depth * per_batch * units_per_item);
                submit(next);
                next += 1;
            }
        }
    });
    // Reads still in flight after an error answer into a dropped channel; nothing waits.
    match first_error.into_inner() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Ok(()),
        Err(_) => Err(Error::internal("read error slot poisoned")),
    }
}

/// Decodes `unit` from `value` (its item's read) and copies its parts into the windows.
fn decode_one(
    array: &ZarrArray,
    unit: &Unit,
    value: Option<Arc<crate::store::Value>>,
    dest: &Destination,
    elem: usize,
) -> Result<()> {
    let (idx, pieces) = (&unit.idx, &unit.pieces);
    if let Some(at) = &unit.inner {
        let bytes = match (at, &value) {
            (Some(at), Some(v)) => Some(v.get(at.clone()).ok_or_else(|| {
                Error::internal(format!(
                    "inner chunk at {at:?} lies outside the {} bytes read",
                    v.len()
                ))
            })?),
            _ => None,
        };
        let buf = array.decode_inner(idx, bytes.filter(|b| !b.is_empty()));
        // The last unit done with the read hands its buffer back to the pool (dropped, a run
        // of inner chunks read into memory would be freed, and the next read would fault in
        // fresh memory).
        if let Some(read) = value.and_then(Arc::into_inner) {
            read.recycle();
        }
        let buf = buf?;
        let region = array.inner_grid().chunk_region(idx);
        for (w, part) in pieces {
            dest.copy_from(*w, &region, part, buf.bytes(), elem);
        }
        crate::array::pool::give(buf.into_bytes());
        return Ok(());
    }
    // A stored chunk is its item's only unit: the value is this job's alone.
    let value = value.map(|v| Arc::try_unwrap(v).map_err(|_| Error::internal("chunk read shared")));
    let value = value.transpose()?;
    let region = array.grid().chunk_region(idx);
    if let [(w, part)] = pieces.as_slice() {
        if *part == region {
            if let Some(at) = dest.contiguous(*w, part, elem) {
                // SAFETY: `contiguous` checked the run lies inside the buffer, and only this
                // job writes these bytes (see `Destination`).
                let slot =
                    unsafe { std::slice::from_raw_parts_mut(at, part.len() as usize * elem) };
                return array.decode_chunk_into(idx, value, slot);
            }
        }
    }
    // Windows that end early in the chunk (in C order) need only that much of it decoded.
    let buf = array.decode_chunk_through(idx, value, prefix_bytes(&region, pieces, elem))?;
    for (w, part) in pieces {
        dest.copy_from(*w, &region, part, &buf, elem);
    }
    crate::array::pool::give(buf);
    Ok(())
}

/// Bytes from the start of a C-ordered chunk over `region` up to the last element any of
/// `pieces` reads.
fn prefix_bytes(region: &Region, pieces: &Pieces, elem: usize) -> usize {
    pieces
        .iter()
        .map(|(_, part)| region.c_prefix_len(part) as usize * elem)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::DType;
    use crate::store::fs::FsStore;
    use crate::store::Store;
    use crate::zarr::{ArraySpec, Codec};

    fn sample_array(dir: &std::path::Path, codec_default: bool) -> (ZarrArray, Vec<f32>) {
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir, 2).unwrap());
        let shape = vec![7u64, 10, 9];
        let spec = ArraySpec {
            shape: shape.clone(),
            dtype: DType::F32,
            chunks: vec![3, 4, 4],
            shards: None,
            codec: if codec_default {
                Codec::default()
            } else {
                Codec::None
            },
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let arr = ZarrArray::create(store, &spec).unwrap();
        let values: Vec<f32> = (0..7 * 10 * 9).map(|i| i as f32 * 0.5 - 3.0).collect();
        let whole = Region::whole(&shape);
        for idx in arr.grid().chunk_indices() {
            let region = arr.grid().chunk_region(&idx);
            let mut buf = crate::array::Buffer::zeros(DType::F32, region.len() as usize);
            crate::array::buffer::copy_region(
                bytemuck::cast_slice(&values),
                &whole,
                buf.bytes_mut(),
                &region,
                &region,
                4,
            );
            if let Some(bytes) = arr.encode_chunk(&idx, &buf).unwrap() {
                arr.store().set(&arr.chunk_key(&idx), bytes).unwrap();
            }
        }
        (arr, values)
    }

    fn expected(values: &[f32], start: &[u64], size: &[u64]) -> Vec<f32> {
        let mut out = Vec::new();
        for i in 0..size[0] {
            for j in 0..size[1] {
                for k in 0..size[2] {
                    let (a, b, c) = (start[0] + i, start[1] + j, start[2] + k);
                    out.push(values[(a * 90 + b * 9 + c) as usize]);
                }
            }
        }
        out
    }

    #[test]
    fn windows_and_regions_match_the_values_written() {
        for codec_default in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let (arr, values) = sample_array(dir.path(), codec_default);
            let whole = Region::whole(&arr.shape());
            let mut out = vec![0u8; 7 * 10 * 9 * 4];
            read_region(&arr, &whole, &mut out, 2).unwrap();
            assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), &values[..]);
            let starts = vec![vec![0, 0, 0], vec![2, 5, 3], vec![4, 6, 5], vec![2, 5, 3]];
            let size = [3u64, 4, 4];
            let mut out = vec![0u8; starts.len() * 48 * 4];
            read_windows(&arr, &starts, &size, &mut out, 2).unwrap();
            let got: &[f32] = bytemuck::cast_slice(&out);
            for (w, s) in starts.iter().enumerate() {
                assert_eq!(&got[w * 48..(w + 1) * 48], &expected(&values, s, &size)[..]);
            }
        }
    }

    #[test]
    fn windows_outside_the_array_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (arr, _) = sample_array(dir.path(), true);
        let mut out = vec![0u8; 2 * 2 * 2 * 4];
        let err = read_windows(&arr, &[vec![6, 9, 8]], &[2, 2, 2], &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("window 0"), "{err}");
        assert!(err.to_string().contains("outside"), "{err}");
        let err = read_windows(&arr, &[vec![0, 0]], &[2, 2, 2], &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("3 axes"), "{err}");
    }

    #[test]
    fn neighbouring_inner_chunks_are_read_together() {
        use crate::store::ByteRange;
        const MIB: u64 = 1 << 20;
        let at = |offset: u64, len: u64| Some(ByteRange::new(offset, Some(len)));
        // Positions 0..6 of a shard: 0 and 1 adjoin, 2 follows after a small gap, 3 would make
        // the run longer than COALESCE_MAX, 4 lies far after 3, 5 is not stored, and 6
        // lies before 0 in the file.
        let ranges = vec![
            at(MIB, 3 * MIB),
            at(4 * MIB, 2 * MIB),
            at(6 * MIB + 1000, MIB),
            at(7 * MIB + 1000, 3 * MIB),
            at(20 * MIB, 100),
            None,
            at(0, MIB),
        ];
        let touched = (0..7).map(|p| (p, vec![p as u64], Pieces::new())).collect();
        let items = shard_items("c/0", Some(&ranges), touched);
        type Read = Option<(u64, u64)>;
        type Decoded = Vec<(u64, Option<std::ops::Range<usize>>)>;
        let summary: Vec<(Read, Decoded)> = items
            .iter()
            .map(|item| {
                let read = item.req.as_ref().map(|r| {
                    let range = r.range.unwrap();
                    (range.offset, range.len.unwrap())
                });
                let units = item
                    .units
                    .iter()
                    .map(|u| (u.idx[0], u.inner.clone().unwrap()))
                    .collect();
                (read, units)
            })
            .collect();
        let m = MIB as usize;
        assert_eq!(
            summary,
            vec![
                (
                    Some((0, 6 * MIB + 1000 + MIB)),
                    vec![
                        (6, Some(0..m)),
                        (0, Some(m..4 * m)),
                        (1, Some(4 * m..6 * m)),
                        (2, Some(6 * m + 1000..7 * m + 1000)),
                    ]
                ),
                (Some((7 * MIB + 1000, 3 * MIB)), vec![(3, Some(0..3 * m))]),
                (Some((20 * MIB, 100)), vec![(4, Some(0..100))]),
                (None, vec![(5, None)]),
            ]
        );
        assert!(items
            .iter()
            .all(|i| i.req.as_ref().is_none_or(|r| r.key == "c/0")));
        // A shard not stored: every inner chunk is the fill value, nothing is read.
        let touched = (0..3).map(|p| (p, vec![p as u64], Pieces::new())).collect();
        let items = shard_items("c/1", None, touched);
        assert_eq!(items.len(), 1);
        assert!(items[0].req.is_none() && items[0].units.len() == 3);
    }
}
