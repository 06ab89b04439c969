//! Typing of joins: `concat` of arrays along an axis.

use crate::array::{AxisChunks, ChunkGrid};
use crate::error::Result;
use crate::plan::node::{Node, NodeId, NodeKind};
use crate::plan_ensure;

/// The node joining `inputs` along `axis`: same rank and dtype, equal lengths off `axis`;
/// its chunks are the inputs' chunks along `axis` one after another, the first input's
/// elsewhere.
pub(crate) fn concat(
    nodes: &[Node],
    id: String,
    field: String,
    inputs: Vec<NodeId>,
    axis: i64,
) -> Result<Node> {
    let first = &nodes[inputs[0]];
    let rank = first.shape.len();
    plan_ensure!(
        rank > 0,
        format!("{field}.inputs[0]"),
        "\"{}\" is a scalar (rank 0): there is no axis to join along",
        first.id
    );
    let r = rank as i64;
    plan_ensure!(
        (-r..r).contains(&axis),
        format!("{field}.axis"),
        "axis {axis} is out of range for arrays of rank {rank}"
    );
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    let mut sizes: Vec<u64> = Vec::new();
    for (i, &j) in inputs.iter().enumerate() {
        let n = &nodes[j];
        let path = format!("{field}.inputs[{i}]");
        plan_ensure!(
            n.dtype == first.dtype,
            &path,
            "\"{}\" has dtype {} but \"{}\" has {}: cast the inputs to one dtype first",
            n.id,
            n.dtype,
            first.id,
            first.dtype
        );
        let same =
            n.shape.len() == rank && (0..rank).all(|d| d == axis || n.shape[d] == first.shape[d]);
        plan_ensure!(
            same,
            &path,
            "\"{}\" has shape {:?}, which cannot join {:?} of \"{}\" along axis {axis}",
            n.id,
            n.shape,
            first.shape,
            first.id
        );
        shape[axis] += n.shape[axis];
        sizes.extend(n.grid.axes()[axis].sizes());
    }
    let mut grid_axes = first.grid.axes().to_vec();
    grid_axes[axis] = AxisChunks::from_sizes(&sizes)?;
    Ok(Node {
        id,
        field,
        dtype: first.dtype,
        shape,
        grid: ChunkGrid::new(grid_axes),
        kind: NodeKind::Concat { inputs, axis },
    })
}
