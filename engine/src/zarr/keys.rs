//! Chunk keys and the shapes chunks are encoded with, in the stored grid (also through a
//! window).

use super::ZarrArray;
use crate::error::{Error, Result};

impl ZarrArray {
    /// The store key of the chunk at grid index `idx`.
    pub fn chunk_key(&self, idx: &[u64]) -> String {
        match &self.window {
            None => self.stored_key(idx),
            Some(w) => self.stored_key(&w.target_index(idx)),
        }
    }

    /// The store key of stored chunk `t` (an index of the stored grid, also when windowed).
    pub(super) fn stored_key(&self, t: &[u64]) -> String {
        self.meta.chunk_key(t).as_str().to_string()
    }

    /// The shape a chunk is encoded with (edge chunks of regular grids are padded).
    pub fn encoded_chunk_shape(&self, idx: &[u64]) -> Result<Vec<u64>> {
        match &self.window {
            None => self.stored_chunk_shape(idx),
            Some(w) => self.stored_chunk_shape(&w.target_index(idx)),
        }
    }

    /// The shape stored chunk `t` is encoded with.
    pub(super) fn stored_chunk_shape(&self, t: &[u64]) -> Result<Vec<u64>> {
        let shape = self
            .meta
            .chunk_shape(t)
            .map_err(|e| Error::internal(format!("chunk {t:?}: {e}")))?;
        Ok(shape.iter().map(|s| s.get()).collect())
    }
}
