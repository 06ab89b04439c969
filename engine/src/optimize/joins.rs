//! Joins (concatenations) read without intermediates: parts of one material that continue
//! each other along the joined axis merge into one part, and a join of joins along another
//! axis, all cut alike, becomes one join of columns. Frontends that build an array from its
//! blocks (Dask's `roll`, `concatenate` of slices, `fftshift`) join a join per block; these
//! rules keep such a value one leaf over its source, whatever the number of blocks.

use super::fuse::{ConcatPart, Fused, LeafConcat};
use super::stages::Material;
use crate::array::{ChunkGrid, DType};
use crate::plan::graph::{View, ViewAxis};

/// The view from coordinates to the same coordinates moved by `by` along `axis`.
fn shift(rank: usize, axis: usize, by: u64) -> View {
    let mut v = View::identity(rank);
    v.axes[axis] = ViewAxis::Mapped {
        out_axis: axis,
        start: by,
        step: 1,
    };
    v
}

/// `b`'s values are `a`'s array read on past `a`'s end along `axis`: one view of that array
/// reads both.
fn continues(a: &ConcatPart, b: &ConcatPart, axis: usize, rank: usize) -> bool {
    a.mat == b.mat && a.view.compose(&shift(rank, axis, a.len)) == b.view
}

/// `parts` (in order along `axis`, of the joined values of `shape`) with each run of parts
/// that continue each other merged into one, where the merged view is still a box view.
pub fn merged(parts: Vec<ConcatPart>, axis: usize, shape: &[u64]) -> Vec<ConcatPart> {
    let rank = shape.len();
    let mut out: Vec<ConcatPart> = Vec::with_capacity(parts.len());
    for p in parts {
        if let Some(last) = out.last_mut() {
            let mut joint = shape.to_vec();
            joint[axis] = last.len + p.len;
            if continues(last, &p, axis, rank) && last.view.is_box(&joint) {
                last.len += p.len;
                continue;
            }
        }
        out.push(p);
    }
    out
}

/// The join along `axis` (into `shape`) of `inputs`, each itself materials joined along one
/// other axis `b` with the same cuts, as one join along `b` whose parts are the columns of
/// the inputs' parts, when each column merges into one part (see [`merged`]); `None`
/// otherwise.
pub fn transposed(inputs: &[&Fused], axis: usize, shape: &[u64]) -> Option<LeafConcat> {
    let (b, first) = inputs.first()?.joined()?;
    if b == axis {
        return None;
    }
    let mut columns: Vec<Vec<ConcatPart>> = vec![Vec::with_capacity(inputs.len()); first.len()];
    for f in inputs {
        let (ax, parts) = f.joined()?;
        let cut_alike = parts.len() == first.len()
            && parts
                .iter()
                .zip(first)
                .all(|(p, q)| (p.start, p.len) == (q.start, q.len));
        if ax != b || !cut_alike {
            return None;
        }
        for (column, p) in columns.iter_mut().zip(parts) {
            // Along `axis` each part is as long as its input.
            column.push(ConcatPart {
                len: f.shape[axis],
                start: 0,
                ..p.clone()
            });
        }
    }
    let mut parts = Vec::with_capacity(first.len());
    for (column, q) in columns.into_iter().zip(first) {
        let mut part_shape = shape.to_vec();
        part_shape[b] = q.len;
        let [one] = <[ConcatPart; 1]>::try_from(merged(column, axis, &part_shape)).ok()?;
        parts.push(ConcatPart {
            start: q.start,
            len: q.len,
            ..one
        });
    }
    Some(LeafConcat {
        axis: b,
        shape: shape.to_vec(),
        parts: merged(parts, b, shape),
    })
}

/// The fused value of `concat` (of dtype `dtype`, chunked `grid`): one box leaf of its
/// material when it is one part, else the joined leaf.
pub fn value(concat: LeafConcat, materials: &[Material], dtype: DType, grid: ChunkGrid) -> Fused {
    let shape = concat.shape.clone();
    match concat.parts.as_slice() {
        [one] if materials[one.mat].dtype == dtype => {
            let m = &materials[one.mat];
            Fused::material(one.mat, &m.shape, m.dtype, m.grid.clone())
                .through(&one.view, shape, grid)
        }
        _ => Fused::concat(concat, shape, dtype, grid),
    }
}

#[cfg(test)]
mod tests {
    use super::{merged, shift, transposed, ConcatPart, LeafConcat};
    use crate::array::{ChunkGrid, DType};
    use crate::optimize::fuse::Fused;
    use crate::plan::graph::View;

    /// The part of material 0 (rank 3) cropped from `origin`, placed at `start` along the
    /// joined axis with length `len`.
    fn crop(origin: [u64; 3], start: u64, len: u64) -> ConcatPart {
        let mut v = View::identity(3);
        for (d, o) in origin.iter().enumerate() {
            v = v.compose(&shift(3, d, *o));
        }
        ConcatPart {
            mat: 0,
            view: v,
            start,
            len,
        }
    }

    #[test]
    fn adjacent_crops_merge_and_wrapped_ones_do_not() {
        // x[0:1], x[1:2], x[2:3] along axis 0: one crop of three steps.
        let parts = vec![
            crop([0, 0, 72], 0, 1),
            crop([1, 0, 72], 1, 1),
            crop([2, 0, 72], 2, 1),
        ];
        let m = merged(parts, 0, &[3, 73, 72]);
        assert_eq!(m, vec![crop([0, 0, 72], 0, 3)]);
        // x[..., 72:] then x[..., :72] (a roll): no single view reads both.
        let rolled = vec![crop([0, 0, 72], 0, 72), crop([0, 0, 0], 72, 72)];
        assert_eq!(merged(rolled.clone(), 2, &[1, 73, 144]), rolled);
    }

    #[test]
    fn a_join_of_rolled_blocks_is_one_join_of_two_columns() {
        let grid = ChunkGrid::regular(&[1, 73, 144], &[1, 73, 144]).unwrap();
        let block = |t: u64| {
            Fused::concat(
                LeafConcat {
                    axis: 2,
                    shape: vec![1, 73, 144],
                    parts: vec![crop([t, 0, 72], 0, 72), crop([t, 0, 0], 72, 72)],
                },
                vec![1, 73, 144],
                DType::F32,
                grid.clone(),
            )
        };
        let blocks: Vec<Fused> = (0..730).map(block).collect();
        let refs: Vec<&Fused> = blocks.iter().collect();
        let joined = transposed(&refs, 0, &[730, 73, 144]).unwrap();
        assert_eq!(joined.axis, 2);
        assert_eq!(
            joined.parts,
            vec![crop([0, 0, 72], 0, 72), crop([0, 0, 0], 72, 72)]
        );
        // Blocks out of order along the joined axis stay as they are.
        let mut shuffled = refs.clone();
        shuffled.swap(3, 4);
        assert!(transposed(&shuffled, 0, &[730, 73, 144]).is_none());
    }
}
