//! Chunk grids (regular or per-axis lists) and regions (boxes) of an array.

use crate::error::{Error, ErrorKind, Result};

/// A box inside an array: `start[d] .. start[d] + shape[d]` on every axis `d`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region {
    /// First index on each axis.
    pub start: Vec<u64>,
    /// Extent on each axis.
    pub shape: Vec<u64>,
}

impl Region {
    /// The region `[0, shape)`.
    pub fn whole(shape: &[u64]) -> Self {
        Region {
            start: vec![0; shape.len()],
            shape: shape.to_vec(),
        }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    /// True when some axis has extent 0.
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// One past the last index on axis `d`.
    pub fn end(&self, d: usize) -> u64 {
        self.start[d] + self.shape[d]
    }

    /// The overlap of two regions of the same rank, or `None` when they do not overlap.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let mut start = Vec::with_capacity(self.rank());
        let mut shape = Vec::with_capacity(self.rank());
        for d in 0..self.rank() {
            let s = self.start[d].max(other.start[d]);
            let e = self.end(d).min(other.end(d));
            if e <= s {
                return None;
            }
            start.push(s);
            shape.push(e - s);
        }
        Some(Region { start, shape })
    }

    /// True when `other` lies inside `self`.
    pub fn contains(&self, other: &Region) -> bool {
        (0..self.rank()).all(|d| other.start[d] >= self.start[d] && other.end(d) <= self.end(d))
    }

    /// Elements from the start of a C-ordered buffer over this region up to and including the
    /// last element of `part` (which must lie inside it): how much of the buffer must be
    /// decoded to reach all of `part`. 0 for an empty part.
    pub fn c_prefix_len(&self, part: &Region) -> u64 {
        if part.is_empty() {
            return 0;
        }
        let strides = c_strides(&self.shape);
        (0..self.rank())
            .map(|d| (part.end(d) - 1 - self.start[d]) * strides[d])
            .sum::<u64>()
            + 1
    }

    /// This region expressed relative to `origin` (which must not lie after it).
    pub fn relative_to(&self, origin: &[u64]) -> Region {
        Region {
            start: self.start.iter().zip(origin).map(|(s, o)| s - o).collect(),
            shape: self.shape.clone(),
        }
    }
}

/// Strides in elements of a C-ordered buffer of `shape`.
pub fn c_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The chunk boundaries of one axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisChunks {
    split: Split,
}

/// How an axis is split: arithmetic for a regular split (whatever its chunk count: a sparse
/// array may declare billions of chunks), listed boundaries otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Split {
    /// Chunks of `size` over `len` elements (the last may be shorter; `len` may be 0).
    Regular { len: u64, size: u64 },
    /// Offsets of chunk starts followed by the axis length: chunk `i` covers
    /// `bounds[i] .. bounds[i + 1]`, with `regular` the nominal size when every chunk but the
    /// last (at most as long) has one length.
    Listed {
        bounds: Vec<u64>,
        regular: Option<u64>,
    },
}

impl AxisChunks {
    /// A regular split of `len` into chunks of `size` (the last may be shorter).
    pub fn regular(len: u64, size: u64) -> Result<Self> {
        if size == 0 {
            return Err(Error::new(
                ErrorKind::Plan,
                "chunk size must be positive, got 0",
            ));
        }
        Ok(AxisChunks {
            split: Split::Regular { len, size },
        })
    }

    /// An irregular split given by chunk sizes, which must add up to the axis length.
    pub fn from_sizes(sizes: &[u64]) -> Result<Self> {
        if sizes.contains(&0) {
            return Err(Error::new(ErrorKind::Plan, "chunk sizes must be positive"));
        }
        let mut bounds = vec![0u64];
        for s in sizes {
            let last = *bounds.last().unwrap_or(&0);
            let next = last.checked_add(*s).ok_or_else(|| {
                Error::new(ErrorKind::Plan, "chunk sizes add up past 2^64 elements")
            })?;
            bounds.push(next);
        }
        let regular = match sizes {
            [] => None,
            [first, rest @ ..] => {
                let all_but_last = &rest[..rest.len().saturating_sub(1)];
                let last_ok = rest.last().is_none_or(|l| l <= first);
                (all_but_last.iter().all(|s| s == first) && last_ok).then_some(*first)
            }
        };
        Ok(AxisChunks {
            split: Split::Listed { bounds, regular },
        })
    }

    /// Axis length.
    pub fn len(&self) -> u64 {
        match &self.split {
            Split::Regular { len, .. } => *len,
            Split::Listed { bounds, .. } => *bounds.last().unwrap_or(&0),
        }
    }

    /// True when the axis has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        match &self.split {
            Split::Regular { len, size } => len.div_ceil(*size) as usize,
            Split::Listed { bounds, .. } => bounds.len() - 1,
        }
    }

    /// Where chunk `i` starts (`i == count()`: the axis length).
    fn bound(&self, i: usize) -> u64 {
        match &self.split {
            Split::Regular { len, size } => (i as u64).saturating_mul(*size).min(*len),
            Split::Listed { bounds, .. } => bounds[i],
        }
    }

    /// Start and length of chunk `i`.
    pub fn chunk(&self, i: usize) -> (u64, u64) {
        let start = self.bound(i);
        (start, self.bound(i + 1) - start)
    }

    /// The nominal chunk size of a regular axis.
    pub fn regular_size(&self) -> Option<u64> {
        match &self.split {
            Split::Regular { size, .. } => Some(*size),
            Split::Listed { regular, .. } => *regular,
        }
    }

    /// The largest chunk length.
    pub fn max_size(&self) -> u64 {
        match &self.split {
            Split::Regular { len, size } => (*size).min(*len),
            Split::Listed { .. } => (0..self.count())
                .map(|i| self.chunk(i).1)
                .max()
                .unwrap_or(0),
        }
    }

    /// Chunk sizes, in order.
    pub fn sizes(&self) -> Vec<u64> {
        (0..self.count()).map(|i| self.chunk(i).1).collect()
    }

    /// The chunk holding element `at` (`count()` when `at` is the axis length or past it).
    fn chunk_of(&self, at: u64) -> usize {
        match &self.split {
            Split::Regular { len, size } if at < *len => (at / size) as usize,
            Split::Regular { .. } => self.count(),
            Split::Listed { bounds, .. } => match bounds.binary_search(&at) {
                Ok(i) => i,
                Err(i) => i - 1,
            },
        }
    }

    /// Indices of the chunks overlapping `start .. start + len`.
    pub fn overlapping(&self, start: u64, len: u64) -> std::ops::Range<usize> {
        if len == 0 || self.count() == 0 {
            return 0..0;
        }
        let end = start.saturating_add(len);
        let first = self.chunk_of(start);
        // The chunk holding the last element, plus one.
        let last = self.chunk_of(end - 1) + 1;
        first.min(self.count())..last.min(self.count())
    }

    /// True when every boundary of `self` is a boundary of `other` too (each chunk of
    /// `other` lies inside one chunk of `self`).
    pub fn is_coarsening_of(&self, other: &AxisChunks) -> bool {
        if self.len() != other.len() {
            return false;
        }
        match (&self.split, &other.split) {
            (Split::Regular { size: a, .. }, Split::Regular { size: b, .. }) => {
                self.count() <= 1 || a % b == 0
            }
            _ => (0..=self.count()).all(|i| {
                let b = self.bound(i);
                let j = other.chunk_of(b);
                j >= other.count() || other.bound(j) == b
            }),
        }
    }
}

/// A chunk grid: one [`AxisChunks`] per axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkGrid {
    axes: Vec<AxisChunks>,
}

impl ChunkGrid {
    /// A grid from its axes.
    pub fn new(axes: Vec<AxisChunks>) -> Self {
        ChunkGrid { axes }
    }

    /// A regular grid of `chunks` over `shape`.
    pub fn regular(shape: &[u64], chunks: &[u64]) -> Result<Self> {
        if shape.len() != chunks.len() {
            return Err(Error::new(
                ErrorKind::Plan,
                format!(
                    "chunks {chunks:?} have {} entries but the array has rank {}",
                    chunks.len(),
                    shape.len()
                ),
            ));
        }
        let axes = shape
            .iter()
            .zip(chunks)
            .map(|(&n, &c)| AxisChunks::regular(n, if c == 0 { 0 } else { c.min(n.max(1)) }))
            .collect::<Result<Vec<_>>>()?;
        Ok(ChunkGrid { axes })
    }

    /// The per-axis chunk boundaries.
    pub fn axes(&self) -> &[AxisChunks] {
        &self.axes
    }

    /// The array shape.
    pub fn shape(&self) -> Vec<u64> {
        self.axes.iter().map(|a| a.len()).collect()
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    /// Number of chunks along each axis.
    pub fn grid_shape(&self) -> Vec<u64> {
        self.axes.iter().map(|a| a.count() as u64).collect()
    }

    /// Total number of chunks.
    pub fn num_chunks(&self) -> u64 {
        self.grid_shape().iter().product()
    }

    /// The nominal chunk shape (largest chunk per axis).
    pub fn chunk_shape(&self) -> Vec<u64> {
        self.axes.iter().map(|a| a.max_size()).collect()
    }

    /// The region covered by the chunk at grid index `idx`.
    pub fn chunk_region(&self, idx: &[u64]) -> Region {
        let (start, shape) = self
            .axes
            .iter()
            .zip(idx)
            .map(|(a, &i)| a.chunk(i as usize))
            .unzip();
        Region { start, shape }
    }

    /// Grid indices of every chunk in C order.
    pub fn chunk_indices(&self) -> Vec<Vec<u64>> {
        indices_in(&self.grid_shape())
    }

    /// Grid indices of the chunks that overlap `region`, in C order.
    pub fn chunks_overlapping(&self, region: &Region) -> Vec<Vec<u64>> {
        let ranges: Vec<std::ops::Range<usize>> = self
            .axes
            .iter()
            .enumerate()
            .map(|(d, a)| a.overlapping(region.start[d], region.shape[d]))
            .collect();
        let mut out = Vec::new();
        let mut cur: Vec<u64> = ranges.iter().map(|r| r.start as u64).collect();
        if ranges.iter().any(|r| r.is_empty()) {
            return out;
        }
        loop {
            out.push(cur.clone());
            let mut d = ranges.len();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                cur[d] += 1;
                if cur[d] < ranges[d].end as u64 {
                    break;
                }
                cur[d] = ranges[d].start as u64;
            }
        }
    }
}

/// Every index of a grid of `shape`, in C order (one empty index for rank 0).
pub fn indices_in(shape: &[u64]) -> Vec<Vec<u64>> {
    indices_between(shape, 0..shape.iter().product())
}

/// The indices `range` (positions in C order, cut to the grid) of a grid of `shape`, made
/// without the others.
pub fn indices_between(shape: &[u64], range: std::ops::Range<u64>) -> Vec<Vec<u64>> {
    let total: u64 = shape.iter().product();
    let (start, end) = (range.start.min(total), range.end.min(total));
    let mut out = Vec::with_capacity(end.saturating_sub(start) as usize);
    if start >= end {
        return out;
    }
    let mut cur = vec![0u64; shape.len()];
    let mut rest = start;
    for d in (0..shape.len()).rev() {
        cur[d] = rest % shape[d];
        rest /= shape[d];
    }
    for _ in start..end {
        out.push(cur.clone());
        for d in (0..shape.len()).rev() {
            cur[d] += 1;
            if cur[d] < shape[d] {
                break;
            }
            cur[d] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_between_are_those_of_the_whole_grid_there() {
        let shape = [3, 1, 4, 2];
        // Every index of the grid, the last axis fastest, as nested loops give them.
        let mut all = Vec::new();
        for i in 0..3 {
            for k in 0..4 {
                for l in 0..2 {
                    all.push(vec![i, 0, k, l]);
                }
            }
        }
        assert_eq!(indices_in(&shape), all);
        for (a, b) in [
            (0usize, 24usize),
            (0, 0),
            (5, 17),
            (23, 24),
            (20, 99),
            (30, 40),
        ] {
            let want: Vec<_> = all
                .iter()
                .skip(a)
                .take(b.min(24).saturating_sub(a))
                .cloned()
                .collect();
            assert_eq!(
                indices_between(&shape, a as u64..b as u64),
                want,
                "{a}..{b}"
            );
        }
        assert_eq!(indices_between(&[], 0..1), vec![Vec::<u64>::new()]);
    }

    #[test]
    fn prefix_reaches_the_last_element_of_the_part() {
        // A (1, 6, 5) chunk at time 3: rows 0..2 end at element 10; rows 2..4, column 1..3
        // end at row 3, column 2: element 18.
        let chunk = Region {
            start: vec![3, 0, 0],
            shape: vec![1, 6, 5],
        };
        let rows = Region {
            start: vec![3, 0, 0],
            shape: vec![1, 2, 5],
        };
        assert_eq!(chunk.c_prefix_len(&rows), 10);
        let window = Region {
            start: vec![3, 2, 1],
            shape: vec![1, 2, 2],
        };
        assert_eq!(chunk.c_prefix_len(&window), 18);
        assert_eq!(chunk.c_prefix_len(&chunk), 30);
        let empty = Region {
            start: vec![3, 0, 0],
            shape: vec![1, 0, 5],
        };
        assert_eq!(chunk.c_prefix_len(&empty), 0);
    }

    #[test]
    fn regular_axis_has_short_last_chunk() {
        let a = AxisChunks::regular(10, 4).unwrap();
        assert_eq!(a.sizes(), vec![4, 4, 2]);
        assert_eq!(a.overlapping(3, 2), 0..2);
        assert_eq!(a.overlapping(4, 4), 1..2);
        assert_eq!(a.overlapping(9, 1), 2..3);
    }

    #[test]
    fn overlapping_chunks_in_c_order() {
        let g = ChunkGrid::regular(&[10, 10], &[4, 4]).unwrap();
        let r = Region {
            start: vec![3, 7],
            shape: vec![2, 2],
        };
        assert_eq!(
            g.chunks_overlapping(&r),
            vec![vec![0, 1], vec![0, 2], vec![1, 1], vec![1, 2]]
        );
    }

    #[test]
    fn coarsening() {
        let fine = AxisChunks::regular(12, 2).unwrap();
        let coarse = AxisChunks::regular(12, 6).unwrap();
        assert!(coarse.is_coarsening_of(&fine));
        assert!(!fine.is_coarsening_of(&coarse));
    }

    #[test]
    fn rank_zero_grid_has_one_chunk() {
        let g = ChunkGrid::regular(&[], &[]).unwrap();
        assert_eq!(g.chunk_indices(), vec![Vec::<u64>::new()]);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn grid_and_region() -> impl Strategy<Value = (Vec<u64>, Vec<u64>, Region)> {
        prop::collection::vec((1u64..20, 1u64..8), 1..4).prop_flat_map(|dims| {
            let shape: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let chunks: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let region = shape
                .iter()
                .map(|&n| (0..n).prop_flat_map(move |s| (Just(s), 1..=n - s)))
                .collect::<Vec<_>>()
                .prop_map(|v| Region {
                    start: v.iter().map(|x| x.0).collect(),
                    shape: v.iter().map(|x| x.1).collect(),
                });
            (Just(shape), Just(chunks), region)
        })
    }

    proptest! {
        #[test]
        fn a_regular_axis_computes_what_its_listed_bounds_give(
            len in 1u64..200, size in 1u64..40, other in 1u64..40, start in 0u64..220,
            n in 0u64..60,
        ) {
            let regular = AxisChunks::regular(len, size).unwrap();
            let listed = AxisChunks::from_sizes(&regular.sizes()).unwrap();
            prop_assert_eq!(regular.count(), len.div_ceil(size) as usize);
            prop_assert_eq!(regular.len(), listed.len());
            prop_assert_eq!(regular.max_size(), listed.max_size());
            for i in 0..regular.count() {
                prop_assert_eq!(regular.chunk(i), listed.chunk(i));
            }
            prop_assert_eq!(regular.overlapping(start, n), listed.overlapping(start, n));
            let finer = AxisChunks::regular(len, other).unwrap();
            let finer_listed = AxisChunks::from_sizes(&finer.sizes()).unwrap();
            prop_assert_eq!(
                regular.is_coarsening_of(&finer),
                listed.is_coarsening_of(&finer_listed)
            );
            prop_assert_eq!(
                regular.is_coarsening_of(&finer_listed),
                listed.is_coarsening_of(&finer)
            );
        }

        #[test]
        fn overlapping_chunks_match_brute_force((shape, chunks, region) in grid_and_region()) {
            let g = ChunkGrid::regular(&shape, &chunks).unwrap();
            let brute: Vec<Vec<u64>> = g
                .chunk_indices()
                .into_iter()
                .filter(|i| g.chunk_region(i).intersect(&region).is_some())
                .collect();
            prop_assert_eq!(g.chunks_overlapping(&region), brute);
        }

        #[test]
        fn chunks_tile_the_array((shape, chunks, _r) in grid_and_region()) {
            let g = ChunkGrid::regular(&shape, &chunks).unwrap();
            let total: u64 = g.chunk_indices().iter().map(|i| g.chunk_region(i).len()).sum();
            prop_assert_eq!(total, shape.iter().product::<u64>());
        }

        #[test]
        fn copy_region_matches_elementwise_copy((shape, chunks, region) in grid_and_region()) {
            // Copy `region` out of a whole-array buffer into a buffer of its first chunk's
            // bounding box, and compare element by element.
            let whole = Region::whole(&shape);
            let src: Vec<u8> = (0..whole.len()).map(|i| (i % 251) as u8).collect();
            let g = ChunkGrid::regular(&shape, &chunks).unwrap();
            let first = g.chunks_overlapping(&region)[0].clone();
            let dst_region = g.chunk_region(&first);
            let Some(overlap) = region.intersect(&dst_region) else { return Ok(()) };
            let mut dst = vec![0u8; dst_region.len() as usize];
            crate::array::buffer::copy_region(&src, &whole, &mut dst, &dst_region, &overlap, 1);
            let ws = c_strides(&shape);
            let ds = c_strides(&dst_region.shape);
            for idx in indices_in(&overlap.shape) {
                let abs: Vec<u64> = idx.iter().zip(&overlap.start).map(|(i, s)| i + s).collect();
                let so: u64 = abs.iter().zip(&ws).map(|(a, s)| a * s).sum();
                let doff: u64 = abs.iter().zip(&dst_region.start).zip(&ds).map(|((a, s), st)| (a - s) * st).sum();
                prop_assert_eq!(dst[doff as usize], src[so as usize]);
            }
        }
    }
}
