//! Direct reads into caller memory: a region of an array, or many same-shaped windows at
//! once (the ML-training access pattern), from any store the engine opens.
//!
//! Every chunk a request touches is read once and decoded once, however many windows it
//! feeds. Reads go out in batches on the store's IO threads while earlier batches decode on
//! the compute pool; the encoded bytes waiting for decode are bounded. A chunk that fills a
//! contiguous part of the destination (whole rows of a full read) decodes straight into it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};

use crate::array::buffer::for_each_run;
use crate::array::Region;
use crate::error::{Error, Result};
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
                idx,
                pieces,
                inner: false,
            })
            .collect(),
    };
    let dest = Destination::over(out, window_bytes, windows);
    let pool = decode_pool(threads)?;
    let threads = pool.current_num_threads();
    decode_all(array, &items, &dest, &pool, threads)
}

/// One chunk (or inner chunk of a shard) to read and decode, and where its parts go.
struct Item {
    idx: Vec<u64>,
    /// What to read; `None` for an inner chunk the shard does not store (the fill value).
    req: Option<ReadRequest>,
    pieces: Pieces,
    /// An inner chunk (of the array's inner grid), not a stored chunk or shard.
    inner: bool,
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

/// For a sharded array whose windows touch under half of the inner chunks of the shards
/// they reach: the inner chunks to read on their own (each shard's index read first, by
/// one ranged read per shard). `None` when whole shards are the better read.
fn inner_items(array: &ZarrArray, windows: &[Region]) -> Result<Option<Vec<Item>>> {
    let Some(layout) = array.shard_layout() else {
        return Ok(None);
    };
    let inner = touched(array.inner_grid(), windows);
    let mut shards: BTreeMap<Vec<u64>, usize> = BTreeMap::new();
    for idx in inner.keys() {
        let n = shards.len();
        shards.entry(layout.locate(idx).0).or_insert(n);
    }
    if 2 * inner.len() as u64 >= shards.len() as u64 * layout.chunks_per_shard() {
        return Ok(None);
    }
    let shard_list: Vec<Vec<u64>> = {
        let mut v = vec![Vec::new(); shards.len()];
        for (s, &i) in &shards {
            v[i] = s.clone();
        }
        v
    };
    let reqs = shard_list
        .iter()
        .map(|s| ReadRequest {
            key: array.chunk_key(s),
            range: Some(layout.index_range()),
        })
        .collect();
    let indexes = array
        .store()
        .get_many(reqs)
        .map_err(|e| e.with_array(array.name()))?;
    let mut ranges = Vec::with_capacity(indexes.len());
    for (s, index) in shard_list.iter().zip(indexes) {
        ranges.push(match index {
            None => None,
            Some(bytes) => Some(layout.parse_index(&bytes).map_err(|msg| {
                Error::new(
                    crate::error::ErrorKind::Corrupt,
                    format!("cannot read shard index: {msg}"),
                )
                .with_array(array.name())
                .with_chunk_key(array.chunk_key(s))
                .with_store(array.url())
            })?),
        });
    }
    let items = inner
        .into_iter()
        .map(|(idx, pieces)| {
            let (shard, pos) = layout.locate(&idx);
            let at = shards[&shard];
            let range = ranges[at].as_ref().and_then(|r| r[pos]);
            Item {
                req: range.map(|r| ReadRequest {
                    key: array.chunk_key(&shard),
                    range: Some(r),
                }),
                idx,
                pieces,
                inner: true,
            }
        })
        .collect();
    Ok(Some(items))
}

/// The decode pool of `threads` threads (0: one per core), made once per size and kept, so
/// a training loop calling [`read_windows`] often does not start threads each time.
fn decode_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let mut pools = POOLS
        .get_or_init(Default::default)
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
            let Ok((b, result)) = rx.recv() else {
                fail(Error::store(
                    array.url(),
                    "IO thread ended without an answer",
                ));
                break;
            };
            let values = match result {
                Ok(v) => v,
                Err(e) => {
                    fail(e.with_array(array.name()));
                    break;
                }
            };
            backlog.add(batches[b].len());
            // Items that read nothing (inner chunks not stored) take no value.
            let mut values = values.into_iter();
            let values: Vec<Option<crate::store::Value>> = batches[b]
                .iter()
                .map(|item| item.req.as_ref().and_then(|_| values.next().flatten()))
                .collect();
            for (item, value) in batches[b].iter().zip(values) {
                let (backlog, fail, failed) = (&backlog, &fail, &failed);
                scope.spawn(move |_| {
                    if !failed() {
                        if let Err(e) = decode_one(array, item, value, dest, elem) {
                            fail(e);
                        }
                    }
                    backlog.done();
                });
            }
            if failed() {
                break;
            }
            if next < batches.len() {
                // Keep at most a few batches of encoded bytes waiting for the decoder.
                backlog.wait_below(depth * per_batch);
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

/// Decodes chunk `idx` and copies its parts into the windows.
fn decode_one(
    array: &ZarrArray,
    item: &Item,
    value: Option<crate::store::Value>,
    dest: &Destination,
    elem: usize,
) -> Result<()> {
    let (idx, pieces) = (&item.idx, &item.pieces);
    if item.inner {
        let buf = array.decode_inner(idx, value)?;
        let region = array.inner_grid().chunk_region(idx);
        for (w, part) in pieces {
            dest.copy_from(*w, &region, part, buf.bytes(), elem);
        }
        crate::array::pool::give(buf.into_bytes());
        return Ok(());
    }
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
}
