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
        chunks_field(&field),
        "chunks {chunks:?} have {} entries but \"{}\" has rank {}",
        chunks.len(),
        src.id,
        src.shape.len()
    );
    let sizes = chunk_sizes(chunks, &src.shape).ok_or_else(|| {
        let bad = chunks.iter().find(|&&c| c <= 0 && c != -1).copied();
        crate::error::Error::plan(
            chunks_field(&field),
            format!(
                "chunk sizes must be positive (or -1 for the whole axis), got {}",
                bad.unwrap_or_default()
            ),
        )
    })?;
    Ok(Node {
        id,
        field: field.clone(),
        shape: src.shape.clone(),
        dtype: src.dtype,
        grid: ChunkGrid::regular(&src.shape, &sizes)
            .map_err(|e| e.with_field(chunks_field(&field)))?,
        kind: NodeKind::Rechunk { input },
    })
}

/// Where a rechunk's sizes are: its `chunks`, or the command-line option a rechunk job
/// was built from (`--chunks`), which is the sizes itself.
fn chunks_field(field: &str) -> String {
    if field.starts_with("--") {
        field.to_string()
    } else {
        format!("{field}.chunks")
    }
}

/// The chunk shape `chunks` (one size per axis, -1 for the whole axis) gives an array of
/// `shape`; `None` when the rank differs or a size is neither positive nor -1.
pub fn chunk_sizes(chunks: &[i64], shape: &[u64]) -> Option<Vec<u64>> {
    if chunks.len() != shape.len() {
        return None;
    }
    chunks
        .iter()
        .zip(shape)
        .map(|(&c, &s)| match c {
            -1 => Some(s.max(1)),
            c if c > 0 => Some(c as u64),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rechunk_sizes_resolve_against_the_shape() {
        assert_eq!(chunk_sizes(&[-1, 5], &[48, 12]), Some(vec![48, 5]));
        assert_eq!(chunk_sizes(&[-1], &[0]), Some(vec![1]));
        assert_eq!(chunk_sizes(&[0], &[4]), None);
        assert_eq!(chunk_sizes(&[-2], &[4]), None);
        assert_eq!(chunk_sizes(&[4], &[4, 4]), None);
    }
}
