//! Epilogue recognition: the nodes after a reduction or transform that fuse onto the write
//! they flow into, so it writes the target itself instead of an intermediate.

use crate::plan::graph::Graph;
use crate::plan::node::{NodeKind, TExpr};
use crate::plan::view::{View, ViewAxis};

/// Nodes after a reduction that change nothing but its rank, ending in a write.
#[derive(Debug)]
pub(super) struct Epilogue {
    /// The nodes between the reduction and the write (none when the write reads it).
    pub(super) through: Vec<usize>,
    /// The write node.
    pub(super) write: usize,
    /// Whether the reduction, writing the target itself, keeps its reduced axes.
    pub(super) keepdims: bool,
}

/// The chain after reduction `i` (each node the only consumer of the one before) of casts to
/// the dtype the values already have and, when the reduction keeps its reduced axes, an
/// indexing that drops exactly those axes, ending in a write: Cubed's plans end reductions
/// this way. The reduction then writes the target itself (without the kept axes) instead of
/// an intermediate that a second stage copies.
pub(super) fn reduce_epilogue(
    graph: &Graph,
    consumers: &[Vec<usize>],
    i: usize,
    axes: &[usize],
    keepdims: bool,
) -> Option<Epilogue> {
    let mut at = i;
    let mut keepdims = keepdims;
    let mut through = Vec::new();
    loop {
        let [next] = consumers[at].as_slice() else {
            return None;
        };
        let (prev, node) = (&graph.nodes[at], &graph.nodes[*next]);
        match &node.kind {
            NodeKind::Write { .. } => {
                return Some(Epilogue {
                    through,
                    write: *next,
                    keepdims,
                })
            }
            NodeKind::Elementwise { inputs, expr }
                if inputs.len() == 1
                    && node.shape == prev.shape
                    && node.dtype == prev.dtype
                    && restates_input(expr) => {}
            NodeKind::Slice { view, .. }
                if keepdims && drops_axes(view, &prev.shape, &node.shape, axes) =>
            {
                keepdims = false
            }
            _ => return None,
        }
        through.push(*next);
        at = *next;
    }
}

/// True when `expr` is its only input, cast (if at all) to the dtype it has.
fn restates_input(expr: &TExpr) -> bool {
    match expr {
        TExpr::Input { idx, .. } => *idx == 0,
        TExpr::Cast { to, arg } => arg.dtype() == *to && restates_input(arg),
        _ => false,
    }
}

/// True when `view` (from `out_shape` to `in_shape`) takes index 0 of each of `axes` (length 1
/// in the input) and every other input axis whole, in order.
fn drops_axes(view: &View, in_shape: &[u64], out_shape: &[u64], axes: &[usize]) -> bool {
    if view.axes.len() != in_shape.len() || out_shape.len() + axes.len() != in_shape.len() {
        return false;
    }
    let mut k = 0;
    view.axes.iter().enumerate().all(|(d, a)| {
        if axes.contains(&d) {
            in_shape[d] == 1 && *a == ViewAxis::Fixed(0)
        } else {
            let whole =
                *a == ViewAxis::Mapped {
                    out_axis: k,
                    start: 0,
                    step: 1,
                } && out_shape[k] == in_shape[d];
            k += 1;
            whole
        }
    })
}

/// The write node that node `i`'s value flows into through elementwise ops of its shape alone
/// (each the only consumer of the one before), if any.
pub(super) fn sole_write(graph: &Graph, consumers: &[Vec<usize>], i: usize) -> Option<usize> {
    let shape = &graph.nodes[i].shape;
    let mut at = i;
    loop {
        // One consumer (which may read the value more than once, as `a * a` does).
        let mut next_nodes = consumers[at].clone();
        next_nodes.dedup();
        let [next] = next_nodes.as_slice() else {
            return None;
        };
        let node = &graph.nodes[*next];
        if node.shape != *shape {
            return None;
        }
        match &node.kind {
            NodeKind::Elementwise { .. } => at = *next,
            NodeKind::Write { .. } => return Some(*next),
            _ => return None,
        }
    }
}

/// The chunks of the array node `i` ends up written to, when it flows through elementwise
/// ops of its own shape (each its only consumer) into a write that names its chunks.
pub(super) fn written_chunks(
    graph: &Graph,
    consumers: &[Vec<usize>],
    i: usize,
) -> Option<Vec<u64>> {
    let w = &graph.nodes[sole_write(graph, consumers, i)?];
    match &w.kind {
        NodeKind::Write { spec, .. } => spec.chunks.as_ref().map(|_| w.grid.chunk_shape()),
        _ => None,
    }
}
