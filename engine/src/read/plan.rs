//! What a read touches: the chunks (or the inner chunks of shards) under its windows, the
//! parts of windows each fills, and the reads that fetch them, coalesced per shard.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cache::{CacheKey, ChunkCache};
use crate::array::Region;
use crate::error::Result;
use crate::store::ReadRequest;
use crate::zarr::ZarrArray;

/// Where the parts of one chunk go: (window index, the part of the array it copies).
pub(super) type Pieces = Vec<(usize, Region)>;

/// A touched inner chunk of one shard: its position in the shard (C order), its index in
/// the array's inner grid, and the parts of windows it fills.
type TouchedInner = (usize, Vec<u64>, Pieces);

/// One read, and the chunks decoded from what it returns.
pub(super) struct Item {
    /// What to read; `None` when nothing is stored (inner chunks their shard does not hold).
    pub(super) req: Option<ReadRequest>,
    /// The chunks decoded from it.
    pub(super) units: Vec<Unit>,
}

/// A chunk, or an inner chunk of a shard, to decode, and where its parts go.
pub(super) struct Unit {
    pub(super) idx: Vec<u64>,
    pub(super) pieces: Pieces,
    /// For an inner chunk (of the array's inner grid): where its bytes lie in what its item
    /// read, or `None` when its shard does not store it (the fill value). `None` for a
    /// stored chunk or shard, which is the whole read.
    pub(super) inner: Option<Option<std::ops::Range<usize>>>,
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

/// A touched chunk found decoded in the cache: its region, the parts of windows it fills,
/// and its bytes.
pub(super) struct Hit {
    pub(super) region: Region,
    pub(super) pieces: Pieces,
    pub(super) data: Arc<Vec<u8>>,
}

/// What a read does: copy the chunks found in the cache, and read and decode the rest.
pub(super) struct Plan {
    pub(super) hits: Vec<Hit>,
    pub(super) items: Vec<Item>,
}

/// The chunks (for a sharded array with a standard shard layout: the inner chunks) the
/// windows touch: those the cache holds, and reads of the rest. Inner chunks are read in
/// runs of neighbours (each shard's index read first, by one ranged read per shard) and
/// decoded one by one, in parallel; other arrays are read chunk by chunk.
pub(super) fn plan(
    array: &ZarrArray,
    windows: &[Region],
    cache: Option<&ChunkCache>,
) -> Result<Plan> {
    let layout = array.shard_layout();
    let grid = if layout.is_some() {
        array.inner_grid()
    } else {
        array.grid()
    };
    let elem = array.dtype().size();
    let url: Arc<str> = Arc::from(array.url());
    let mut hits = Vec::new();
    let mut missed = Vec::new();
    for (idx, pieces) in touched(grid, windows) {
        let region = grid.chunk_region(&idx);
        let found = cache.and_then(|c| {
            let need = prefix_bytes(&region, &pieces, elem);
            c.get(&CacheKey::new(&url, layout.is_some(), &idx), need)
        });
        match found {
            Some(data) => hits.push(Hit {
                region,
                pieces,
                data,
            }),
            None => missed.push((idx, pieces)),
        }
    }
    let items = match layout {
        Some(layout) => inner_items(array, layout, missed)?,
        None => missed
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
    Ok(Plan { hits, items })
}

/// The reads of the touched inner chunks `missed` of a sharded array, grouped by shard.
fn inner_items(
    array: &ZarrArray,
    layout: &crate::zarr::shard::ShardLayout,
    missed: Vec<(Vec<u64>, Pieces)>,
) -> Result<Vec<Item>> {
    let mut by_shard: BTreeMap<Vec<u64>, Vec<TouchedInner>> = BTreeMap::new();
    for (idx, pieces) in missed {
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
    Ok(items)
}

/// Bytes from the start of a C-ordered chunk over `region` up to the last element any of
/// `pieces` reads.
pub(super) fn prefix_bytes(region: &Region, pieces: &Pieces, elem: usize) -> usize {
    pieces
        .iter()
        .map(|(_, part)| region.c_prefix_len(part) as usize * elem)
        .max()
        .unwrap_or(0)
}

/// The reads of one shard's touched inner chunks, given where the shard's index puts them
/// (`None`: no shard is stored): runs of stored neighbours in the order they lie, each one
/// read, and one read-less item for the inner chunks not stored.
pub(super) fn shard_items(
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
