//! Sharded arrays read inner chunk by inner chunk: the grid of what tasks read, ranged reads
//! located through shard indexes (read once per shard and kept), and inner-chunk decodes.

use std::sync::Arc;

use super::{shard, ShardIndex, ZarrArray};
use crate::array::{Buffer, ChunkGrid};
use crate::error::{Error, ErrorKind, Result};
use crate::store::ReadRequest;

impl ZarrArray {
    /// Makes compute tasks read inner chunks of this sharded array one by one (see
    /// [`read_grid`](Self::read_grid)); no effect on arrays without a standard shard layout.
    pub fn with_inner_reads(mut self) -> Self {
        self.inner_reads = self.shard.is_some();
        self
    }

    /// The grid of what compute tasks read and decode one at a time: inner chunks of a
    /// sharded array read that way (see [`with_inner_reads`](Self::with_inner_reads)), else
    /// the stored chunks.
    pub fn read_grid(&self) -> &ChunkGrid {
        match &self.shard {
            Some((_, inner)) if self.inner_reads => inner,
            _ => &self.grid,
        }
    }

    /// The layout of inner reads, when this array is read that way.
    pub(super) fn inner_layout(&self) -> Option<&shard::ShardLayout> {
        self.shard
            .as_ref()
            .filter(|_| self.inner_reads)
            .map(|(layout, _)| layout.as_ref())
    }

    /// The read of unit `idx` of [`read_grid`](Self::read_grid): a whole chunk, or an inner
    /// chunk's byte range in its shard (the shard's index is read once, on first use). An
    /// inner chunk its shard does not store is an empty range (decoded as the fill value); a
    /// missing shard is a read of its whole key, which finds nothing.
    pub fn read_request(&self, idx: &[u64]) -> Result<ReadRequest> {
        let Some(layout) = self.inner_layout() else {
            return Ok(ReadRequest::whole(self.chunk_key(idx)));
        };
        let (shard_idx, pos) = layout.locate(idx);
        let key = self.chunk_key(&shard_idx);
        let Some(ranges) = self.shard_index(layout, &shard_idx)? else {
            return Ok(ReadRequest::whole(key));
        };
        let range = ranges
            .get(pos)
            .copied()
            .flatten()
            .unwrap_or(crate::store::ByteRange::new(0, Some(0)));
        Ok(ReadRequest {
            key,
            range: Some(range),
        })
    }

    /// The parsed index of shard `shard_idx` (`None` when the shard is not stored), read on
    /// first use and kept.
    fn shard_index(
        &self,
        layout: &shard::ShardLayout,
        shard_idx: &[u64],
    ) -> Result<Option<ShardIndex>> {
        let lock = || {
            self.shard_indexes
                .lock()
                .map_err(|_| Error::internal("shard index cache poisoned"))
        };
        if let Some(known) = lock()?.get(shard_idx) {
            return Ok(known.clone());
        }
        let key = self.chunk_key(shard_idx);
        let mut read = self
            .store
            .get_many(vec![ReadRequest {
                key: key.clone(),
                range: Some(layout.index_range()),
            }])
            .map_err(|e| e.with_array(&self.name))?;
        let parsed = match read.pop().flatten() {
            None => None,
            Some(bytes) => Some(Arc::new(self.parse_shard_index(layout, &key, &bytes)?)),
        };
        lock()?.insert(shard_idx.to_vec(), parsed.clone());
        Ok(parsed)
    }

    /// Where each inner chunk of the shard at `key` lies, from its index bytes; a corrupt
    /// index is an error naming the array, the shard and the store.
    pub(crate) fn parse_shard_index(
        &self,
        layout: &shard::ShardLayout,
        key: &str,
        index: &[u8],
    ) -> Result<Vec<shard::InnerRange>> {
        layout.parse_index(index).map_err(|msg| {
            Error::new(
                ErrorKind::Corrupt,
                format!("cannot read shard index: {msg}"),
            )
            .with_array(&self.name)
            .with_chunk_key(key)
            .with_store(&self.url)
        })
    }

    /// Decodes unit `idx` of [`read_grid`](Self::read_grid) from what
    /// [`read_request`](Self::read_request) read (the fill value for `None` or an empty
    /// inner read) into a buffer over its region in the array.
    pub fn decode_read(&self, idx: &[u64], bytes: Option<crate::store::Value>) -> Result<Buffer> {
        if self.inner_layout().is_none() {
            return self.decode_chunk(idx, bytes);
        }
        if bytes.is_none() {
            // The shard is not stored (an inner chunk its shard does not store reads empty).
            let (shard_idx, _) = self
                .inner_layout()
                .map(|l| l.locate(idx))
                .ok_or_else(|| Error::internal("inner read of an array without shards"))?;
            self.check_missing_chunk(&self.chunk_key(&shard_idx))?;
        }
        let decoded = self.decode_inner(idx, bytes.as_deref().filter(|b| !b.is_empty()));
        if let Some(bytes) = bytes {
            bytes.recycle();
        }
        decoded
    }

    /// Where inner chunks lie in the shards, when they can be read one by one.
    pub fn shard_layout(&self) -> Option<&shard::ShardLayout> {
        self.shard.as_ref().map(|(layout, _)| layout.as_ref())
    }

    /// The grid of inner chunks of a sharded array (the chunk grid otherwise).
    pub fn inner_grid(&self) -> &ChunkGrid {
        self.shard.as_ref().map_or(&self.grid, |(_, grid)| grid)
    }

    /// Decodes inner chunk `inner` (an index of [`inner_grid`](Self::inner_grid)) from its
    /// stored bytes (the fill value when `None`) into a buffer over its region in the array.
    pub fn decode_inner(&self, inner: &[u64], bytes: Option<&[u8]>) -> Result<Buffer> {
        let layout = self
            .shard_layout()
            .ok_or_else(|| Error::internal("inner chunk read of an array without shards"))?;
        let region = self.inner_grid().chunk_region(inner);
        let Some(bytes) = bytes else {
            return Ok(Buffer::filled(
                self.dtype,
                region.len() as usize,
                &self.fill,
            ));
        };
        let (shard_idx, pos) = layout.locate(inner);
        let decoded = layout
            .decode(bytes, self.dtype.size(), &self.meta, &self.options)
            .map_err(|e| {
                e.with_array(&self.name)
                    .with_chunk_key(format!(
                        "{} (inner chunk {pos})",
                        self.chunk_key(&shard_idx)
                    ))
                    .with_store(&self.url)
            })?;
        let full = Buffer::from_bytes(self.dtype, decoded)?;
        self.crop(full, &region, layout.inner_chunk.clone())
    }
}
