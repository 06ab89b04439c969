//! Counting the missing values (NaN, or a given stored value) of windows of an array, for
//! every combination of window starts along each axis: what a training loader needs to drop
//! the anchors whose windows hold too many, before its first batch.
//!
//! One pass over the chunks the windows touch: each chunk is read and decoded once (in
//! batches, by [`read_windows`](super::windows::read_windows)), its missing values marked, and the
//! marks summed over each window's part of the chunk axis by axis (a prefix sum along an
//! axis gives every window's interval at once). The parts add up across chunks.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::array::{DType, Region};
use crate::error::{Error, Result};
use crate::zarr::ZarrArray;

/// Chunks read at once, per decode thread.
const CHUNKS_PER_THREAD: usize = 2;

/// The number of missing values in the window of shape `size` at every combination of
/// `starts` (one ascending list of window starts per axis), in C order over those lists. A
/// value is missing when it is NaN (floats) or equals `missing` (as stored, before any
/// scale or offset). `threads` decode threads (0: one per core).
pub fn missing_counts(
    array: &ZarrArray,
    size: &[u64],
    starts: &[Vec<u64>],
    missing: Option<f64>,
    threads: usize,
) -> Result<Vec<u64>> {
    let shape = array.shape();
    check(&shape, size, starts)?;
    let total: usize = starts.iter().map(Vec::len).product();
    let counts: Vec<AtomicU64> = (0..total).map(|_| AtomicU64::new(0)).collect();
    if total == 0 || size.contains(&0) {
        return Ok(vec![0; total]);
    }
    let grid = array.grid();
    let chunk = grid.chunk_shape();
    let axes: Vec<Vec<u64>> = (0..shape.len())
        .map(|d| touched_chunks(chunk[d], size[d], &starts[d]))
        .collect();
    // Chunks grouped by their region's shape (edge chunks are smaller), read in batches.
    let mut by_shape: std::collections::BTreeMap<Vec<u64>, Vec<Region>> = Default::default();
    for idx in product(&axes) {
        let region = grid.chunk_region(&idx);
        by_shape
            .entry(region.shape.clone())
            .or_default()
            .push(region);
    }
    let pool = super::decode::decode_pool(threads)?;
    let per_read = CHUNKS_PER_THREAD * pool.current_num_threads();
    let elem = array.dtype().size();
    let out_strides =
        crate::array::grid::c_strides(&starts.iter().map(|s| s.len() as u64).collect::<Vec<_>>());
    for (chunk_shape, regions) in by_shape {
        let chunk_bytes = chunk_shape.iter().product::<u64>() as usize * elem;
        for batch in regions.chunks(per_read) {
            let corners: Vec<Vec<u64>> = batch.iter().map(|r| r.start.clone()).collect();
            let mut buf = vec![0u8; chunk_bytes * batch.len()];
            super::windows::read_windows(array, &corners, &chunk_shape, &mut buf, threads)?;
            let work = || -> Result<()> {
                use rayon::prelude::*;
                batch
                    .par_iter()
                    .zip(buf.par_chunks(chunk_bytes))
                    .try_for_each(|(region, bytes)| {
                        let marks = mark(bytes, array.dtype(), missing)?;
                        add_chunk(region, marks, size, starts, &out_strides, &counts);
                        Ok(())
                    })
            };
            pool.install(work)?;
        }
    }
    Ok(counts.into_iter().map(AtomicU64::into_inner).collect())
}

/// Checks the window and the starts against the array.
fn check(shape: &[u64], size: &[u64], starts: &[Vec<u64>]) -> Result<()> {
    if size.len() != shape.len() || starts.len() != shape.len() {
        return Err(Error::plan(
            "missing counts",
            format!(
                "a window of {} axes and starts for {}, but the array has {} axes",
                size.len(),
                starts.len(),
                shape.len()
            ),
        ));
    }
    for d in 0..shape.len() {
        if starts[d].windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::plan(
                "missing counts",
                format!("axis {d}: window starts must ascend, without repeats"),
            ));
        }
        if let Some(last) = starts[d].last() {
            if last.saturating_add(size[d]) > shape[d] {
                return Err(Error::plan(
                    "missing counts",
                    format!(
                        "axis {d}: a window at {last} of {} reaches past the array's extent {}",
                        size[d], shape[d]
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The chunk indices along one axis (chunks of `chunk`) that windows of `len` at `starts`
/// touch, ascending.
fn touched_chunks(chunk: u64, len: u64, starts: &[u64]) -> Vec<u64> {
    let mut out = BTreeSet::new();
    for &s in starts {
        let (first, last) = (s / chunk, (s + len - 1) / chunk);
        out.extend(first..=last);
    }
    out.into_iter().collect()
}

/// Every combination of one entry per axis, in C order.
fn product(axes: &[Vec<u64>]) -> Vec<Vec<u64>> {
    let mut out = vec![Vec::new()];
    for axis in axes {
        out = out
            .into_iter()
            .flat_map(|head| {
                axis.iter().map(move |&i| {
                    let mut idx = head.clone();
                    idx.push(i);
                    idx
                })
            })
            .collect();
    }
    out
}

/// 1 for each missing element of `bytes` (elements of `dtype`), else 0.
fn mark(bytes: &[u8], dtype: DType, missing: Option<f64>) -> Result<Vec<u32>> {
    macro_rules! flags {
        ($t:ty, $nan:expr) => {{
            let n = std::mem::size_of::<$t>();
            bytes
                .chunks_exact(n)
                .map(|b| {
                    let mut raw = [0u8; std::mem::size_of::<$t>()];
                    raw.copy_from_slice(b);
                    let v = <$t>::from_ne_bytes(raw);
                    #[allow(clippy::redundant_closure_call)]
                    let nan: bool = ($nan)(v);
                    u32::from(nan || missing.is_some_and(|m| v as f64 == m))
                })
                .collect()
        }};
    }
    Ok(match dtype {
        DType::Bool | DType::U8 => flags!(u8, |_| false),
        DType::I8 => flags!(i8, |_| false),
        DType::I16 => flags!(i16, |_| false),
        DType::I32 => flags!(i32, |_| false),
        DType::I64 => flags!(i64, |_| false),
        DType::U16 => flags!(u16, |_| false),
        DType::U32 => flags!(u32, |_| false),
        DType::U64 => flags!(u64, |_| false),
        DType::F32 => flags!(f32, |v: f32| v.is_nan()),
        DType::F64 => flags!(f64, |v: f64| v.is_nan()),
        DType::C64 | DType::C128 => {
            return Err(Error::plan(
                "missing counts",
                format!("{dtype} arrays have no missing-value test"),
            ))
        }
    })
}

/// Adds the missing marks of the chunk over `region` to the count of every window (of
/// `size`, at the combinations of `starts`) that overlaps it.
fn add_chunk(
    region: &Region,
    marks: Vec<u32>,
    size: &[u64],
    starts: &[Vec<u64>],
    out_strides: &[u64],
    counts: &[AtomicU64],
) {
    let rank = region.shape.len();
    // Per axis: the index of the first start whose window overlaps the chunk, and each
    // overlapping window's interval in chunk coordinates.
    let mut first = Vec::with_capacity(rank);
    let mut spans: Vec<Vec<(usize, usize)>> = Vec::with_capacity(rank);
    for d in 0..rank {
        let (c0, c1) = (region.start[d], region.start[d] + region.shape[d]);
        let lo = starts[d].partition_point(|&s| s + size[d] <= c0);
        let hi = starts[d].partition_point(|&s| s < c1);
        first.push(lo);
        spans.push(
            starts[d][lo..hi]
                .iter()
                .map(|&s| {
                    (
                        (s.max(c0) - c0) as usize,
                        ((s + size[d]).min(c1) - c0) as usize,
                    )
                })
                .collect(),
        );
    }
    if spans.iter().any(Vec::is_empty) {
        return;
    }
    let mut dims: Vec<usize> = region.shape.iter().map(|&n| n as usize).collect();
    let mut block: Vec<u64> = marks.into_iter().map(u64::from).collect();
    for d in 0..rank {
        block = sum_intervals(&block, &dims, d, &spans[d]);
        dims[d] = spans[d].len();
    }
    // The block covers starts first[d].. along each axis.
    let strides =
        crate::array::grid::c_strides(&dims.iter().map(|&n| n as u64).collect::<Vec<_>>());
    for (k, &v) in block.iter().enumerate() {
        if v == 0 {
            continue;
        }
        let mut at = 0u64;
        for d in 0..rank {
            let i = (k as u64 / strides[d]) % dims[d] as u64;
            at += (first[d] as u64 + i) * out_strides[d];
        }
        counts[at as usize].fetch_add(v, Ordering::Relaxed);
    }
}

/// `values` (C order over `dims`) with axis `axis` replaced by the sums over each of
/// `spans` (half-open intervals along it).
fn sum_intervals(
    values: &[u64],
    dims: &[usize],
    axis: usize,
    spans: &[(usize, usize)],
) -> Vec<u64> {
    let outer: usize = dims[..axis].iter().product();
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out = vec![0u64; outer * spans.len() * inner];
    let mut prefix = vec![0u64; (n + 1) * inner];
    for o in 0..outer {
        let src = &values[o * n * inner..(o + 1) * n * inner];
        for k in 0..n {
            for i in 0..inner {
                prefix[(k + 1) * inner + i] = prefix[k * inner + i] + src[k * inner + i];
            }
        }
        for (j, &(lo, hi)) in spans.iter().enumerate() {
            let dst = &mut out[(o * spans.len() + j) * inner..(o * spans.len() + j + 1) * inner];
            for (i, v) in dst.iter_mut().enumerate() {
                *v = prefix[hi * inner + i] - prefix[lo * inner + i];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_sums_along_each_axis() {
        // 2 x 3, summed over columns [0, 2) and [1, 3), then over rows [0, 2).
        let v = vec![1, 2, 3, 4, 5, 6];
        let cols = sum_intervals(&v, &[2, 3], 1, &[(0, 2), (1, 3)]);
        assert_eq!(cols, vec![3, 5, 9, 11]);
        let rows = sum_intervals(&cols, &[2, 2], 0, &[(0, 2)]);
        assert_eq!(rows, vec![12, 16]);
    }

    #[test]
    fn touched_chunks_are_the_union_of_the_windows() {
        assert_eq!(touched_chunks(4, 3, &[0, 10, 13]), vec![0, 2, 3]);
        assert_eq!(
            product(&[vec![1, 2], vec![5]]),
            vec![vec![1, 5], vec![2, 5]]
        );
    }

    #[test]
    fn counts_equal_a_count_of_each_window() {
        use crate::store::{fs::FsStore, Store};
        use crate::zarr::{ArraySpec, Codec};
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
        let shape = [7u64, 10, 9];
        let spec = ArraySpec {
            shape: shape.to_vec(),
            dtype: DType::F32,
            chunks: vec![3, 4, 4],
            shards: None,
            codec: Codec::default(),
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let arr = ZarrArray::create(store, &spec).unwrap();
        let value = |i: u64, j: u64, k: u64| match (i * 7 + j * 3 + k) % 11 {
            0 => f32::NAN,
            4 | 9 => -9.0,
            _ => 1.0,
        };
        for idx in arr.grid().chunk_indices() {
            let r = arr.grid().chunk_region(&idx);
            let mut vals = Vec::new();
            for i in 0..r.shape[0] {
                for j in 0..r.shape[1] {
                    for k in 0..r.shape[2] {
                        vals.push(value(r.start[0] + i, r.start[1] + j, r.start[2] + k));
                    }
                }
            }
            let mut buf = crate::array::Buffer::zeros(DType::F32, vals.len());
            buf.bytes_mut().copy_from_slice(bytemuck::cast_slice(&vals));
            let bytes = arr.encode_chunk(&idx, &buf).unwrap().unwrap();
            arr.store().set(&arr.chunk_key(&idx), bytes).unwrap();
        }
        let size = [2u64, 3, 4];
        let starts = vec![vec![0, 1, 5], vec![0, 3, 4, 7], vec![2, 5]];
        for missing in [None, Some(-9.0)] {
            let got = missing_counts(&arr, &size, &starts, missing, 2).unwrap();
            let mut want = Vec::new();
            for &a in &starts[0] {
                for &b in &starts[1] {
                    for &c in &starts[2] {
                        let mut n = 0;
                        for i in a..a + size[0] {
                            for j in b..b + size[1] {
                                for k in c..c + size[2] {
                                    let v = value(i, j, k);
                                    n += u64::from(v.is_nan() || Some(v as f64) == missing);
                                }
                            }
                        }
                        want.push(n);
                    }
                }
            }
            assert_eq!(got, want, "missing {missing:?}");
        }
        let err = missing_counts(&arr, &size, &[vec![1, 0], vec![0], vec![0]], None, 1);
        assert!(err.unwrap_err().to_string().contains("ascend"));
        let err = missing_counts(&arr, &size, &[vec![6], vec![0], vec![0]], None, 1);
        assert!(err.unwrap_err().to_string().contains("reaches past"));
    }

    #[test]
    fn marks_find_nan_and_the_missing_value() {
        let f: Vec<u8> = [1.0f32, f32::NAN, -9.0, 2.0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(mark(&f, DType::F32, Some(-9.0)).unwrap(), vec![0, 1, 1, 0]);
        assert_eq!(mark(&f, DType::F32, None).unwrap(), vec![0, 1, 0, 0]);
        let i: Vec<u8> = [5i16, -32767, 7]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(mark(&i, DType::I16, Some(-32767.0)).unwrap(), vec![0, 1, 0]);
    }
}
