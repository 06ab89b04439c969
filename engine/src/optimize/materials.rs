//! Materials the planner adds: write targets, intermediates in the run's work directory, and
//! the fused value that reads a material whole.

use crate::array::{ChunkGrid, DType};
use crate::error::{Error, Result};
use crate::physical::fused::{Fused, MatId};
use crate::physical::material::{Material, MaterialOrigin};
use crate::plan::graph::Graph;
use crate::plan::node::NodeKind;
use crate::zarr::{ArraySpec, Codec};

/// The codec of intermediates: none. Float data compresses about 1.3× with blosc-lz4 and
/// shuffle, which cost more CPU (a third of the ERA5 power spectrum's) than writing and
/// reading the extra bytes through a local work directory's page cache.
pub fn intermediate_codec() -> Codec {
    Codec::None
}

/// The fused value that reads material `m` whole.
pub(super) fn material_value(materials: &[Material], m: MatId) -> Fused {
    let mat = &materials[m];
    Fused::material(m, &mat.shape, mat.dtype, mat.grid.clone())
}

/// The material of write node `node_idx`'s target.
pub(super) fn target_material(
    graph: &Graph,
    node_idx: usize,
    materials: &mut Vec<Material>,
) -> Result<MatId> {
    let node = &graph.nodes[node_idx];
    let NodeKind::Write { spec, .. } = &node.kind else {
        return Err(Error::internal(format!("node {} is not a write", node.id)));
    };
    let chunks = spec
        .chunks
        .clone()
        .unwrap_or_else(|| node.grid.chunk_shape());
    materials.push(Material {
        name: node.id.clone(),
        shape: node.shape.clone(),
        dtype: node.dtype,
        grid: node.grid.clone(),
        origin: MaterialOrigin::Target {
            url: spec.target.clone(),
            spec: ArraySpec {
                shape: node.shape.clone(),
                dtype: node.dtype,
                chunks,
                shards: spec.shards.clone(),
                codec: spec.codec.clone(),
                zarr_format: spec.zarr_format,
                fill: spec.copied.fill.clone(),
                overwrite: spec.overwrite,
                existing: spec.existing,
                region: spec.region.clone(),
            },
            attrs: spec.copied.attrs.clone(),
        },
    });
    Ok(materials.len() - 1)
}

/// An intermediate array of `chunks`, uncompressed, that the run creates in its work
/// directory and removes when it ends.
pub(super) fn intermediate(
    materials: &mut Vec<Material>,
    name: &str,
    shape: &[u64],
    dtype: DType,
    chunks: &[u64],
) -> Result<MatId> {
    sharded_intermediate(materials, name, shape, dtype, chunks, None)
}

/// An intermediate array like [`intermediate`], stored in shards of `shards` elements per
/// axis (multiples of `chunks`) when given: one file per shard instead of one per chunk, its
/// inner chunks read one by one (ranged reads) by the stages that read it. A stage writing it
/// should write whole shards (its blocks are shards).
pub(super) fn sharded_intermediate(
    materials: &mut Vec<Material>,
    name: &str,
    shape: &[u64],
    dtype: DType,
    chunks: &[u64],
    shards: Option<Vec<u64>>,
) -> Result<MatId> {
    let chunks: Vec<u64> = chunks.iter().map(|&c| c.max(1)).collect();
    let shards = shards.filter(|s| *s != chunks);
    let storage = shards.as_deref().unwrap_or(&chunks);
    materials.push(Material {
        name: format!("{name} (intermediate)"),
        shape: shape.to_vec(),
        dtype,
        grid: ChunkGrid::regular(shape, storage)?,
        origin: MaterialOrigin::Intermediate {
            spec: ArraySpec {
                shape: shape.to_vec(),
                dtype,
                chunks,
                shards,
                codec: intermediate_codec(),
                zarr_format: 3,
                fill: None,
                overwrite: true,
                existing: false,
                region: None,
            },
        },
    });
    Ok(materials.len() - 1)
}
