//! Typing of `rechunk`: the same values on a new regular chunk grid.

use crate::array::ChunkGrid;
use crate::error::Result;
use crate::plan::node::{Node, NodeId, NodeKind};
use crate::plan_ensure;

/// The node rechunking `input` to `chunks` (one size per axis; -1 for the whole axis).
pub(crate) fn rechunk(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    chunks: &[i64],
) -> Result<Node> {
    let src = &nodes[input];
    plan_ensure!(
        chunks.len() == src.shape.len(),
        format!("{field}.chunks"),
        "chunks {chunks:?} have {} entries but \"{}\" has rank {}",
        chunks.len(),
        src.id,
        src.shape.len()
    );
    if let Some(bad) = chunks.iter().find(|&&c| c <= 0 && c != -1) {
        return Err(crate::error::Error::plan(
            format!("{field}.chunks"),
            format!("chunk sizes must be positive (or -1 for the whole axis), got {bad}"),
        ));
    }
    let sizes: Vec<u64> = chunks
        .iter()
        .zip(&src.shape)
        .map(|(&c, &n)| if c == -1 { n.max(1) } else { c as u64 })
        .collect();
    Ok(Node {
        id,
        field: field.clone(),
        shape: src.shape.clone(),
        dtype: src.dtype,
        grid: ChunkGrid::regular(&src.shape, &sizes)
            .map_err(|e| e.with_field(format!("{field}.chunks")))?,
        kind: NodeKind::Rechunk { input },
    })
}
