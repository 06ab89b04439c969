//! Reading the planned chunks in batches on the store's IO threads while earlier batches
//! decode on the compute pool, each chunk's parts copied into its windows.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Condvar, Mutex};

use super::cache::{CacheKey, ChunkCache};
use super::destination::Destination;
use super::plan::{prefix_bytes, Hit, Item, Unit};
use crate::error::{Error, Result};
use crate::fork_safe::ForkSafe;
use crate::zarr::ZarrArray;

/// Chunks per IO batch, per compute thread.
const CHUNKS_PER_BATCH_PER_THREAD: usize = 2;
/// Batches read ahead of the decoder (local stores; see `batches_ahead`).
const BATCHES_AHEAD: usize = 3;
/// Batches read ahead from stores where every request is a network round trip.
const REMOTE_BATCHES_AHEAD: usize = 16;

/// The decode pool of `threads` threads (0: one per core), made once per size and kept, so
/// a training loop calling [`read_windows`] often does not start threads each time. A child
/// process forked after the pools were made gets its own (see [`crate::fork_safe`]).
pub(super) fn decode_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>> {
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
pub(super) fn decode_all(
    array: &ZarrArray,
    chunks: &[Item],
    dest: &Destination,
    pool: &rayon::ThreadPool,
    threads: usize,
    cache: Option<&ChunkCache>,
) -> Result<()> {
    let url: Arc<str> = Arc::from(array.url());
    let keep = cache.map(|c| (c, &url));
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
                    let (backlog, fail, failed, keep) = (&backlog, &fail, &failed, keep);
                    let value = if u == last {
                        value.take()
                    } else {
                        value.clone()
                    };
                    scope.spawn(move |_| {
                        if !failed() {
                            if let Err(e) = decode_one(array, unit, value, dest, elem, keep) {
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

/// Where decoded chunks are kept: the cache and the array's URL (for the keys).
type Keep<'a> = Option<(&'a ChunkCache, &'a Arc<str>)>;

/// Decodes `unit` from `value` (its item's read) and copies its parts into the windows;
/// with `keep`, the decoded chunk is then kept in the cache.
fn decode_one(
    array: &ZarrArray,
    unit: &Unit,
    value: Option<Arc<crate::store::Value>>,
    dest: &Destination,
    elem: usize,
    keep: Keep<'_>,
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
        release(keep, true, idx, buf.into_bytes());
        return Ok(());
    }
    // A stored chunk is its item's only unit: the value is this job's alone.
    let value = value.map(|v| Arc::try_unwrap(v).map_err(|_| Error::internal("chunk read shared")));
    let value = value.transpose()?;
    let region = array.grid().chunk_region(idx);
    if let ([(w, part)], None) = (pieces.as_slice(), keep) {
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
    // Windows that end early in the chunk (in C order) need only that much of it decoded;
    // but a chunk the cache holds too short a prefix of is being read again (a chunk-aware
    // order): decode it whole, once, rather than a longer prefix each time.
    let through = match keep {
        Some((cache, url)) if cache.holds(&CacheKey::new(url, false, idx)) => {
            region.len() as usize * elem
        }
        _ => prefix_bytes(&region, pieces, elem),
    };
    let buf = array.decode_chunk_through(idx, value, through)?;
    for (w, part) in pieces {
        dest.copy_from(*w, &region, part, &buf, elem);
    }
    release(keep, false, idx, buf);
    Ok(())
}

/// Keeps a decoded chunk in the cache, or gives its buffer back to the pool.
fn release(keep: Keep<'_>, inner: bool, idx: &[u64], buf: Vec<u8>) {
    match keep {
        Some((cache, url)) => cache.put(CacheKey::new(url, inner, idx), buf),
        None => crate::array::pool::give(buf),
    }
}

/// Copies the parts of the windows that chunks found in the cache fill.
pub(super) fn copy_hits(hits: &[Hit], dest: &Destination, pool: &rayon::ThreadPool, elem: usize) {
    use rayon::prelude::*;
    pool.install(|| {
        hits.par_iter().for_each(|hit| {
            for (w, part) in &hit.pieces {
                dest.copy_from(*w, &hit.region, part, &hit.data, elem);
            }
        })
    });
}
