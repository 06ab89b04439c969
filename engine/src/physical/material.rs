//! Materialized arrays: the sources, targets and intermediates a physical plan reads and fills.

use std::sync::Arc;

use crate::array::{ChunkGrid, DType};
use crate::zarr::{ArraySpec, ZarrArray};

/// Where a materialized array comes from.
#[derive(Debug, Clone)]
pub enum MaterialOrigin {
    /// An input array, already open.
    Source(Arc<ZarrArray>),
    /// A `write` target, created before the run.
    Target {
        /// Store URL.
        url: String,
        /// Format.
        spec: ArraySpec,
        /// Attributes and dimension names.
        attrs: crate::zarr::ArrayAttrs,
    },
    /// An intermediate in the run's work directory, removed afterwards.
    Intermediate {
        /// Format.
        spec: ArraySpec,
    },
}

/// A materialized array.
#[derive(Debug, Clone)]
pub struct Material {
    /// For messages: the plan id (and a suffix for intermediates).
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Storage grid (shards for sharded arrays).
    pub grid: ChunkGrid,
    /// Where it comes from.
    pub origin: MaterialOrigin,
}

impl Material {
    /// Decoded bytes of its largest chunk.
    pub fn chunk_bytes(&self) -> u64 {
        self.grid.chunk_shape().iter().product::<u64>() * self.dtype.size() as u64
    }
}
