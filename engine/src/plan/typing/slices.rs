//! Typing of views: basic indexing (`slice`) and `transpose`, each a [`View`] of its input,
//! with the chunking the result takes.

use crate::array::{AxisChunks, ChunkGrid};
use crate::error::Result;
use crate::plan::node::{Node, NodeId, NodeKind};
use crate::plan::view::{View, ViewAxis};
use crate::plan::SliceItem;
use crate::plan_ensure;

/// numpy's `start:stop:step` over an axis of `n`: the first index it takes and how many.
fn range_of(start: Option<i64>, stop: Option<i64>, step: i64, n: i64) -> (u64, u64) {
    // Bounds clamp to [0, n] walking forwards, to [-1, n - 1] walking backwards (-1 standing
    // for "before the first index").
    let (lo, hi) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let clamp = |v: i64| (if v < 0 { v + n } else { v }).clamp(lo, hi);
    let (s, e) = match step > 0 {
        true => (start.map(clamp).unwrap_or(0), stop.map(clamp).unwrap_or(n)),
        false => (
            start.map(clamp).unwrap_or(n - 1),
            stop.map(clamp).unwrap_or(-1),
        ),
    };
    let len = match step > 0 {
        true if e > s => (e - s + step - 1) / step,
        false if s > e => (s - e - step - 1) / -step,
        _ => 0,
    };
    (s.max(0) as u64, len as u64)
}

/// The chunks along an axis sliced from `first` by `step` (`len` indices) of an input axis
/// chunked as `input`. A backwards walk of single steps takes the input's chunks in reverse
/// (each output chunk lies in one input chunk); any other slice is chunked regularly, as
/// many indices per chunk as the input chunk's length holds at that step.
fn sliced_chunks(input: &AxisChunks, first: u64, step: i64, len: u64) -> Result<AxisChunks> {
    if len == 0 {
        return AxisChunks::from_sizes(&[]);
    }
    if step == -1 {
        let low = first + 1 - len;
        let sizes: Vec<u64> = input
            .overlapping(low, len)
            .rev()
            .map(|k| {
                let (s, l) = input.chunk(k);
                (s + l).min(first + 1) - s.max(low)
            })
            .collect();
        return AxisChunks::from_sizes(&sizes);
    }
    if step > 0 {
        // Each input chunk's selected indices make one chunk (as Dask slices): every chunk of
        // the selection then lies inside one input chunk, which its readers read in place.
        let step = step as u64;
        let last = first + step * (len - 1);
        let sizes: Vec<u64> = input
            .overlapping(first, last + 1 - first)
            .map(|k| {
                let (s, l) = input.chunk(k);
                // Selected positions i (first + step * i) inside [s, s + l).
                let lo = s.saturating_sub(first).div_ceil(step);
                let hi = (s + l).saturating_sub(first).div_ceil(step).min(len);
                hi.saturating_sub(lo)
            })
            .filter(|&n| n > 0)
            .collect();
        return AxisChunks::from_sizes(&sizes);
    }
    let nominal = input.regular_size().unwrap_or(input.max_size());
    let c = (nominal / step.unsigned_abs()).max(1);
    AxisChunks::regular(len, c.min(len))
}

/// numpy's basic indexing `x[selection]` of `input`: a view whose integer indices fix input
/// axes, ranges map output axes, and new axes have length 1.
pub(crate) fn slice(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    sel: &[SliceItem],
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let indexed = sel
        .iter()
        .filter(|s| !matches!(s, SliceItem::NewAxis))
        .count();
    plan_ensure!(
        indexed <= rank,
        format!("{field}.selection"),
        "{indexed} indices for an array of rank {rank}"
    );
    let all = SliceItem::Range {
        start: None,
        stop: None,
        step: 1,
    };
    let items = sel
        .iter()
        .copied()
        .chain(std::iter::repeat_n(all, rank - indexed));
    let mut view_axes = Vec::with_capacity(rank);
    let mut shape = Vec::new();
    let mut grid_axes = Vec::new();
    // The input axis the next index or range takes.
    let mut d = 0;
    for (k, item) in items.enumerate() {
        let path = format!("{field}.selection[{k}]");
        if item == SliceItem::NewAxis {
            shape.push(1);
            grid_axes.push(AxisChunks::regular(1, 1)?);
            continue;
        }
        let n = src.shape[d] as i64;
        match item {
            SliceItem::Index(i) => {
                let j = if i < 0 { i + n } else { i };
                plan_ensure!(
                    (0..n).contains(&j),
                    &path,
                    "index {i} is out of bounds for axis {d} with size {n}"
                );
                view_axes.push(ViewAxis::Fixed(j as u64));
            }
            SliceItem::Range { start, stop, step } => {
                let (s, len) = range_of(start, stop, step, n);
                let out_axis = shape.len();
                view_axes.push(ViewAxis::Mapped {
                    out_axis,
                    start: s,
                    step,
                });
                shape.push(len);
                grid_axes.push(sliced_chunks(&src.grid.axes()[d], s, step, len)?);
            }
            SliceItem::NewAxis => {}
        }
        d += 1;
    }
    Ok(Node {
        id,
        field,
        dtype: src.dtype,
        shape,
        grid: ChunkGrid::new(grid_axes),
        kind: NodeKind::Slice {
            input,
            view: View { axes: view_axes },
        },
    })
}

/// numpy's `transpose(x, axes)`: a view whose output axis k reads input axis `axes[k]`.
pub(crate) fn transpose(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    axes: Option<&[i64]>,
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let path = format!("{field}.axes");
    let order: Vec<usize> = match axes {
        None => (0..rank).rev().collect(),
        Some(axes) => {
            plan_ensure!(
                axes.len() == rank,
                &path,
                "{} axes for an array of rank {rank}",
                axes.len()
            );
            let mut seen = vec![false; rank];
            let mut order = Vec::with_capacity(rank);
            for &a in axes {
                let d = if a < 0 { a + rank as i64 } else { a };
                plan_ensure!(
                    (0..rank as i64).contains(&d),
                    &path,
                    "axis {a} is out of range for an array of rank {rank}"
                );
                plan_ensure!(!seen[d as usize], &path, "axis {a} appears twice");
                seen[d as usize] = true;
                order.push(d as usize);
            }
            order
        }
    };
    let mut view_axes = vec![ViewAxis::Fixed(0); rank];
    for (k, &d) in order.iter().enumerate() {
        view_axes[d] = ViewAxis::Mapped {
            out_axis: k,
            start: 0,
            step: 1,
        };
    }
    Ok(Node {
        id,
        field,
        dtype: src.dtype,
        shape: order.iter().map(|&d| src.shape[d]).collect(),
        grid: ChunkGrid::new(order.iter().map(|&d| src.grid.axes()[d].clone()).collect()),
        kind: NodeKind::Slice {
            input,
            view: View { axes: view_axes },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_clamp_like_numpy_and_take_their_input_chunks() {
        // numpy's bounds: walking backwards, a start past the end clamps to the last index
        // and a stop before the start clamps to "before index 0".
        assert_eq!(range_of(None, None, -1, 10), (9, 10));
        assert_eq!(range_of(Some(100), Some(-100), -4, 10), (9, 3));
        assert_eq!(range_of(Some(-1), Some(-20), -4, 9), (8, 3));
        assert_eq!(range_of(Some(2), Some(2), -1, 10).1, 0);
        assert_eq!(range_of(Some(0), None, -1, 10), (0, 1));
        assert_eq!(range_of(None, None, -1, 0).1, 0);
        assert_eq!(range_of(Some(-3), None, 2, 10), (7, 2));
        // A reversed axis takes the input's chunks in reverse.
        let axis = AxisChunks::from_sizes(&[4, 4, 2]).unwrap();
        let chunks = sliced_chunks(&axis, 8, -1, 7).unwrap();
        assert_eq!(chunks.sizes(), vec![1, 4, 2]);
        // A forward selection takes each input chunk's selected indices as one chunk.
        let axis = AxisChunks::from_sizes(&[181, 181, 181, 178]).unwrap();
        // Rows 100, 102, ..., 598: 41 in the first chunk, then 90, 91 and 28.
        assert_eq!(
            sliced_chunks(&axis, 100, 2, 250).unwrap().sizes(),
            vec![41, 90, 91, 28]
        );
        // A step past the chunk size skips chunks that hold no selected index.
        let axis = AxisChunks::regular(20, 3).unwrap();
        assert_eq!(
            sliced_chunks(&axis, 1, 7, 3).unwrap().sizes(),
            vec![1, 1, 1]
        );
        assert_eq!(
            sliced_chunks(&axis, 0, 1, 20).unwrap().sizes(),
            axis.sizes()
        );
        assert_eq!(sliced_chunks(&axis, 4, 1, 5).unwrap().sizes(), vec![2, 3]);
    }
}
