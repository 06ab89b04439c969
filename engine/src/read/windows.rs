//! Reading windows (or one region) of an array into caller memory: the plan of what they
//! touch, the chunks the cache holds copied, the rest read and decoded.

use super::cache::ChunkCache;
use super::destination::Destination;
use super::{decode, plan};
use crate::array::Region;
use crate::error::{Error, Result};
use crate::zarr::ZarrArray;

/// Checks a window against the array's shape.
pub(super) fn check_window(shape: &[u64], start: &[u64], size: &[u64], what: &str) -> Result<()> {
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
                    "axis {d}: {} elements from {} go past the array's extent {}",
                    size[d], start[d], shape[d]
                ),
            ));
        }
    }
    Ok(())
}

/// The windows of shape `size` at each of `starts`.
pub(super) fn windows_at(starts: &[Vec<u64>], size: &[u64]) -> Vec<Region> {
    starts
        .iter()
        .map(|s| Region {
            start: s.clone(),
            shape: size.to_vec(),
        })
        .collect()
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
    read_windows_cached(array, starts, size, out, threads, None)
}

/// [`read_windows`], taking the chunks `cache` holds from it and keeping the chunks it
/// decodes there.
pub fn read_windows_cached(
    array: &ZarrArray,
    starts: &[Vec<u64>],
    size: &[u64],
    out: &mut [u8],
    threads: usize,
    cache: Option<&ChunkCache>,
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
    let windows = windows_at(starts, size);
    let cache = cache.filter(|c| c.budget() > 0);
    let plan = plan::plan(array, &windows, cache)?;
    let dest = Destination::over(out, window_bytes, windows);
    let pool = decode::decode_pool(threads)?;
    let threads = pool.current_num_threads();
    decode::copy_hits(&plan.hits, &dest, &pool, elem);
    decode::decode_all(array, &plan.items, &dest, &pool, threads, cache)
}
