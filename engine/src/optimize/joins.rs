//! Joins (concatenations) read without intermediates. A joined value is a set of parts, boxes
//! of materials that tile it; a join of joined values (along any axis) is the union of their
//! parts, moved to where each input lies, and parts that continue each other in one array
//! merge. Frontends that build an array from its blocks (Dask's `roll`, `concatenate` of
//! slices, `fftshift` over one axis or several) join joins per block; these rules keep such a
//! value a few parts over its source, whatever the number of blocks.

use crate::array::{ChunkGrid, DType};
use crate::physical::fused::{ConcatPart, Fused, LeafConcat};
use crate::physical::material::Material;
use crate::plan::graph::Graph;
use crate::plan::node::{NodeId, NodeKind};
use crate::plan::view::{View, ViewAxis};

/// The view from coordinates to the same coordinates moved by `by`.
fn moved(by: &[u64]) -> View {
    View {
        axes: by
            .iter()
            .enumerate()
            .map(|(d, &start)| ViewAxis::Mapped {
                out_axis: d,
                start,
                step: 1,
            })
            .collect(),
    }
}

/// `b` is `a`'s array read on past `a`'s end along `axis` (the two alike on every other
/// axis), and one box view reads both.
fn continues(a: &ConcatPart, b: &ConcatPart, axis: usize) -> bool {
    let rank = a.start.len();
    let alike = (0..rank)
        .filter(|&d| d != axis)
        .all(|d| a.start[d] == b.start[d] && a.shape[d] == b.shape[d]);
    let mut by = vec![0; rank];
    by[axis] = a.shape[axis];
    let mut joint = a.shape.clone();
    joint[axis] += b.shape[axis];
    a.mat == b.mat
        && alike
        && a.start[axis] + a.shape[axis] == b.start[axis]
        && a.view.compose(&moved(&by)) == b.view
        && a.view.is_box(&joint)
}

/// `parts` with every run of parts that continue each other (along any axis) merged into one,
/// in C order of their origins.
pub fn merged(mut parts: Vec<ConcatPart>) -> Vec<ConcatPart> {
    let rank = parts.first().map_or(0, |p| p.start.len());
    loop {
        let before = parts.len();
        for axis in 0..rank {
            // Parts of one row along `axis` next to each other, in order along it.
            parts.sort_by_cached_key(|p| {
                let mut key: Vec<u64> = (0..rank)
                    .filter(|&d| d != axis)
                    .map(|d| p.start[d])
                    .collect();
                key.push(p.start[axis]);
                key
            });
            let mut out: Vec<ConcatPart> = Vec::with_capacity(parts.len());
            for p in parts {
                match out.last_mut() {
                    Some(last) if continues(last, &p, axis) => last.shape[axis] += p.shape[axis],
                    _ => out.push(p),
                }
            }
            parts = out;
        }
        if parts.len() == before {
            break;
        }
    }
    parts.sort_by(|a, b| a.start.cmp(&b.start));
    parts
}

/// `parts` of a joined value moved to where that value starts in a larger one (`origin`).
pub fn placed<'a>(
    parts: &'a [ConcatPart],
    origin: &'a [u64],
) -> impl Iterator<Item = ConcatPart> + 'a {
    parts.iter().map(move |p| ConcatPart {
        start: p.start.iter().zip(origin).map(|(s, o)| s + o).collect(),
        ..p.clone()
    })
}

/// A joined value read through a crop (a view that only shifts each axis along itself), as
/// the join of the cropped parts it meets, read through the identity; `None` for any other
/// value. Slices of a join then stay reads of the joined arrays: a crop inside one part is a
/// box of that part's array, which joins of such slices read as they are (Dask's `fftshift`
/// over several axes slices per block the join the previous axis made).
pub fn cropped(f: &Fused) -> Option<LeafConcat> {
    let leaf = &f.leaves[f.program.as_single_load()?];
    let c = leaf.concat.as_deref()?;
    let rank = f.shape.len();
    // The identity over the whole join is no crop; over its first rows it is one.
    if c.shape.len() != rank || (leaf.view.is_identity(rank) && c.shape == f.shape) {
        return None;
    }
    let mut origin = Vec::with_capacity(rank);
    for (d, a) in leaf.view.axes.iter().enumerate() {
        match *a {
            ViewAxis::Mapped {
                out_axis,
                start,
                step: 1,
            } if out_axis == d => origin.push(start),
            _ => return None,
        }
    }
    let crop = crate::array::Region {
        start: origin.clone(),
        shape: f.shape.clone(),
    };
    let parts = c
        .overlapping(&crop)
        .map(|(_, p, inside)| ConcatPart {
            mat: p.mat,
            view: p.view.compose(&moved(&inside.start)),
            start: (0..rank)
                .map(|d| p.start[d] + inside.start[d] - origin[d])
                .collect(),
            shape: inside.shape,
        })
        .collect();
    Some(LeafConcat {
        shape: f.shape.clone(),
        parts,
    })
}

/// The node `node` slices (through any number of slices; itself when it is no slice) and the
/// view from `node`'s coordinates to that node's.
pub fn sliced_from(graph: &Graph, node: NodeId) -> (NodeId, View) {
    let mut at = node;
    let mut view = View::identity(graph.nodes[node].shape.len());
    while let NodeKind::Slice { input, view: v } = &graph.nodes[at].kind {
        view = v.compose(&view);
        at = *input;
    }
    (at, view)
}

/// For each node, how many of its elements the joins of `graph` read through slices (see
/// [`sliced_from`]), counted once per join input. A node whose pieces joins read add up to
/// most of it is worth storing once whole, so that each piece is a crop of it, rather than
/// storing every piece apart (Dask's `fftshift` of a transform joins two halves per block).
pub fn elements_joined(graph: &Graph) -> Vec<u64> {
    let mut joined = vec![0u64; graph.nodes.len()];
    for node in &graph.nodes {
        if let NodeKind::Concat { inputs, .. } = &node.kind {
            for &j in inputs {
                let (from, _) = sliced_from(graph, j);
                let n: u64 = graph.nodes[j].shape.iter().product();
                joined[from] = joined[from].saturating_add(n);
            }
        }
    }
    joined
}

/// The fused value of `concat` (of dtype `dtype`, chunked `grid`): one box leaf of its
/// material when it is one part, else the joined leaf.
pub fn value(concat: LeafConcat, materials: &[Material], dtype: DType, grid: ChunkGrid) -> Fused {
    let shape = concat.shape.clone();
    match concat.parts.as_slice() {
        [one] if materials[one.mat].dtype == dtype && one.shape == shape => {
            let m = &materials[one.mat];
            Fused::material(one.mat, &m.shape, m.dtype, m.grid.clone())
                .through(&one.view, shape, grid)
        }
        _ => Fused::concat(concat, shape, dtype, grid),
    }
}

#[cfg(test)]
mod tests {
    use super::{cropped, merged, moved, placed, ConcatPart, LeafConcat};
    use crate::array::{ChunkGrid, DType};
    use crate::physical::fused::Fused;

    /// The part of material 0 (rank 3) cropped from `origin`, placed at `start` with `shape`.
    fn crop(origin: [u64; 3], start: [u64; 3], shape: [u64; 3]) -> ConcatPart {
        ConcatPart {
            mat: 0,
            view: moved(&origin),
            start: start.to_vec(),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn adjacent_crops_merge_and_wrapped_ones_do_not() {
        // x[0:1], x[1:2], x[2:3] along axis 0: one crop of three steps.
        let parts = vec![
            crop([2, 0, 72], [2, 0, 0], [1, 73, 72]),
            crop([0, 0, 72], [0, 0, 0], [1, 73, 72]),
            crop([1, 0, 72], [1, 0, 0], [1, 73, 72]),
        ];
        assert_eq!(
            merged(parts),
            vec![crop([0, 0, 72], [0, 0, 0], [3, 73, 72])]
        );
        // x[..., 72:] then x[..., :72] (a roll): no single view reads both.
        let rolled = vec![
            crop([0, 0, 72], [0, 0, 0], [1, 73, 72]),
            crop([0, 0, 0], [0, 0, 72], [1, 73, 72]),
        ];
        assert_eq!(merged(rolled.clone()), rolled);
    }

    /// Step `t` of `x` shifted by half along lat and lon (Dask's `fftshift` over both, per
    /// block), as the four quarters it joins, placed at step `t`.
    fn shifted_step(t: u64) -> Vec<ConcatPart> {
        let mut parts = Vec::new();
        for (lat_from, lat_at, nlat) in [(36, 0, 37), (0, 37, 36)] {
            for (lon_from, lon_at) in [(72, 0), (0, 72)] {
                parts.push(crop(
                    [t, lat_from, lon_from],
                    [t, lat_at, lon_at],
                    [1, nlat, 72],
                ));
            }
        }
        parts
    }

    #[test]
    fn joins_of_rolled_blocks_over_one_axis_or_two_merge_to_a_few_parts() {
        let rolled: Vec<ConcatPart> = (0..730)
            .flat_map(|t| {
                placed(
                    &[
                        crop([t, 0, 72], [0, 0, 0], [1, 73, 72]),
                        crop([t, 0, 0], [0, 0, 72], [1, 73, 72]),
                    ],
                    &[t, 0, 0],
                )
                .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            merged(rolled),
            vec![
                crop([0, 0, 72], [0, 0, 0], [730, 73, 72]),
                crop([0, 0, 0], [0, 0, 72], [730, 73, 72]),
            ]
        );
        let quarters: Vec<ConcatPart> = (0..730).flat_map(shifted_step).collect();
        let m = merged(quarters);
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[0], crop([0, 36, 72], [0, 0, 0], [730, 37, 72]));
        assert_eq!(m[3], crop([0, 0, 0], [0, 37, 72], [730, 36, 72]));
    }

    #[test]
    fn a_crop_of_a_join_reads_the_parts_it_meets() {
        let grid = ChunkGrid::regular(&[4, 73, 144], &[1, 73, 144]).unwrap();
        let joined = Fused::concat(
            LeafConcat {
                shape: vec![4, 73, 144],
                parts: merged((0..4).flat_map(shifted_step).collect()),
            },
            vec![4, 73, 144],
            DType::F32,
            grid.clone(),
        );
        // Step 2, longitudes 60..80: two quarters along lon, both lat halves.
        let view = moved(&[2, 0, 60]);
        let one = ChunkGrid::regular(&[1, 73, 20], &[1, 73, 20]).unwrap();
        let c = cropped(&joined.through(&view, vec![1, 73, 20], one.clone())).unwrap();
        assert_eq!(
            c.parts,
            vec![
                crop([2, 36, 132], [0, 0, 0], [1, 37, 12]),
                crop([2, 36, 0], [0, 0, 12], [1, 37, 8]),
                crop([2, 0, 132], [0, 37, 0], [1, 36, 12]),
                crop([2, 0, 0], [0, 37, 12], [1, 36, 8]),
            ]
        );
        // The identity is no crop to normalise; the identity onto the first step is.
        assert!(cropped(&joined).is_none());
        let first = ChunkGrid::regular(&[1, 73, 144], &[1, 73, 144]).unwrap();
        let head = joined.through(&moved(&[0, 0, 0]), vec![1, 73, 144], first);
        assert!(head.joined().is_none());
        assert_eq!(cropped(&head).unwrap().parts.len(), 4);
    }
}
