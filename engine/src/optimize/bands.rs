//! Bands: a source held in memory slab by slab while the tasks that read it run (see
//! [`LeafBand`]), and what loading it that way costs next to the alternatives.

use crate::array::{ChunkGrid, Region};
use crate::physical::fused::LeafBand;
use crate::physical::options::PlanOptions;
use crate::zarr::Codec;
use crate::zarr::ZarrArray;

/// What a spilled copy costs on top of decoding the input once, in decodes of the input:
/// writing the values raw into the work directory, the copies between chunk layouts, and
/// reading them back. Measured on the ERA5 power spectrum (zstd-3 source, 2 cores): the copy
/// stage took 1.25 s against 0.45 s to decode its chunks, and the transform read the copy
/// back in about 0.1 s more, so the copy costs about two decodes.
pub(crate) const SPILL_COST: f64 = 2.0;

/// Bands of the whole of `read` of `arr` (a source) that fit `limit` bytes, aligned to the
/// consumers' regions `out_chunks`, along the axis not in `axes` (an FFT's transformed axes)
/// where they cost least, with that cost in decodes of the whole input (each band decodes the
/// chunks it overlaps, only as far as the band reaches in them where the codec allows). `None`
/// when no band fits.
pub(crate) fn cheapest_bands(
    arr: &ZarrArray,
    read: &Region,
    axes: &[usize],
    out_chunks: &[u64],
    limit: u64,
) -> Option<(LeafBand, f64)> {
    let itemsize = arr.dtype().size() as u64;
    let grid = arr.grid();
    (0..read.rank())
        .filter(|d| !axes.contains(d) && read.shape[*d] > 0)
        .filter_map(|d| {
            let slab = read.len() / read.shape[d] * itemsize;
            let unit = out_chunks[d].clamp(1, read.shape[d]);
            let units = read.shape[d].div_ceil(unit);
            let per_band = (limit / (slab * unit).max(1)).min(units);
            if per_band == 0 {
                return None;
            }
            // As few bands as fit, of even length.
            let bands = units.div_ceil(per_band);
            let max_len = units.div_ceil(bands) * unit;
            let band = LeafBand { axis: d, max_len };
            Some((band, band_cost(arr, grid, read, band)))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Decodes of the whole of `read` that loading it band by band costs.
fn band_cost(arr: &ZarrArray, grid: &ChunkGrid, read: &Region, band: LeafBand) -> f64 {
    let d = band.axis;
    // One chunk per position along the band axis stands for all: the bands span every other
    // axis whole.
    let mut probe: Vec<u64> = grid
        .chunks_overlapping(read)
        .first()
        .cloned()
        .unwrap_or_default();
    if probe.len() != read.rank() {
        return f64::INFINITY;
    }
    let axis = &grid.axes()[d];
    let chunks = axis.overlapping(read.start[d], read.shape[d]);
    let whole: u64 = chunks.clone().map(|i| axis.chunk(i).1).sum();
    let mut decoded = 0u64;
    let mut lo = read.start[d];
    while lo < read.end(d) {
        let hi = (lo + band.max_len).min(read.end(d));
        for i in axis.overlapping(lo, hi - lo) {
            probe[d] = i as u64;
            let region = grid.chunk_region(&probe);
            let (cs, cn) = axis.chunk(i);
            let part_lo = lo.max(cs);
            let part_hi = hi.min(cs + cn);
            decoded += if arr.prefix_decodable(&probe) {
                let mut part = region.clone();
                part.start[d] = part_lo;
                part.shape[d] = part_hi - part_lo;
                // Decoded fraction of the chunk, scaled to its length along the axis.
                region.c_prefix_len(&part) * cn / region.len().max(1)
            } else {
                cn
            };
        }
        lo = hi;
    }
    decoded as f64 / whole.max(1) as f64
}

/// The most a copy read in bands may cost, in decodes of its input, to be taken over the
/// other way to copy it: a stream copy encoding with `stream` (see `exec::ops::stream_copy`),
/// or with `None` an intermediate array. `None` when bands never pay.
///
/// Measured with 2 threads:
/// - Against zstd streams of level 3 or more (or 0, zstd's default), of values that compress (`compression`: how
///   many times smaller the source stores them, at least [`COMPRESSIBLE`]): zstd's streaming
///   path copies its input into a window that wraps, and matches found across the wrap take
///   a slower loop, so streaming takes 1.2–1.3 times as long as compressing a whole chunk at
///   once. On ERA5 (stored 1.31 times smaller; level 3, (1, 721, 1440) into (256, 73, 144) at
///   1 GB) two bands (1.5 decodes) took 4.9 s against 5.5 s streamed.
/// - Against other streams: never. Lower levels, or values zstd finds few matches in, encode
///   at little more than the cost of the copies bands add (into the band and out of it), and
///   a stream storing values as they are costs nothing more (noise stored 1.08 times smaller:
///   0.6–0.8 s in bands against 0.4–0.55 s streamed at level 3, 0.45 s at level 1).
/// - Against an intermediate: bands decoding the input 1.5 times took 0.55 s against 0.65 s,
///   1.6 times as long, 2.5 times 0.88 s against 0.64 s (50 × 1024 × 1024 float32 noise, zstd
///   level 1, into (50, 64, 64)).
pub(crate) fn most_band_cost(stream: Option<&Codec>, compression: Option<f64>) -> Option<f64> {
    // Level 0 is zstd's default level, 3 (zarr-python writes it so).
    let level_3_or_more = |level: i32| level == 0 || level >= 3;
    match stream {
        Some(Codec::Zstd { level })
            if level_3_or_more(*level) && compression >= Some(COMPRESSIBLE) =>
        {
            Some(2.0)
        }
        Some(_) => None,
        None => Some(1.6),
    }
}

/// How many times smaller than its values a source must be stored for bands to be weighed
/// against a zstd stream (see [`most_band_cost`]).
pub(crate) const COMPRESSIBLE: f64 = 1.2;

/// The bytes of the budget left for a band beside what runs with it: `opts.threads` tasks of
/// `task` bytes reading from it, or, while it loads, two batches of reads (of source chunks of
/// `chunk` bytes), read and decoded. `None` when nothing is left.
pub(crate) fn room_for_band(task: u64, chunk: u64, opts: PlanOptions) -> Option<u64> {
    let loading = 4 * opts.batch_bytes.max(chunk);
    let beside = loading.max(opts.threads.max(1) as u64 * task);
    opts.budget.checked_sub(beside)
}

/// Bands of source `arr` for a plain copy of it into output chunks of shape `out_chunks`, each
/// band holding whole output chunks' regions along its axis within `limit` bytes (see
/// [`room_for_band`]), with their cost in decodes of the whole input. `None` when no band
/// fits.
pub(crate) fn copy_bands(
    arr: &ZarrArray,
    out_chunks: &[u64],
    limit: u64,
) -> Option<(LeafBand, f64)> {
    cheapest_bands(arr, &Region::whole(&arr.shape()), &[], out_chunks, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_are_weighed_against_streams_only_of_compressible_values_at_level_3_or_more() {
        let zstd = |level| Codec::Zstd { level };
        assert_eq!(most_band_cost(Some(&zstd(3)), Some(1.31)), Some(2.0));
        assert_eq!(most_band_cost(Some(&zstd(9)), Some(2.0)), Some(2.0));
        assert_eq!(most_band_cost(Some(&zstd(0)), Some(1.31)), Some(2.0));
        // Noise (few matches), an unknown sample, a cheap level, values stored raw.
        assert_eq!(most_band_cost(Some(&zstd(3)), Some(1.08)), None);
        assert_eq!(most_band_cost(Some(&zstd(3)), None), None);
        assert_eq!(most_band_cost(Some(&zstd(1)), Some(2.0)), None);
        assert_eq!(most_band_cost(Some(&Codec::None), Some(2.0)), None);
        // Against an intermediate array, whatever the values.
        assert_eq!(most_band_cost(None, None), Some(1.6));
    }
}
