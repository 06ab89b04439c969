//! Encoding chunks: through zarrs' codec chain or the engine's own zstd and raw paths, and
//! whole raw shards with their index.

use std::borrow::Cow;

use zarrs::array::{ArrayBytes, ArrayToBytesCodecTraits};

use super::fast_codec::{zstd_encode, FastCodec};
use super::{nonzero_shape, shard, ZarrArray};
use crate::array::{Buffer, Region};
use crate::error::{Error, ErrorKind, Result};

impl ZarrArray {
    /// The raw shard layout of this array, when the engine writes its shards itself (see
    /// [`encode_raw_shard`](Self::encode_raw_shard)).
    pub fn raw_shard_layout(&self) -> Option<&shard::ShardLayout> {
        // A window's shards are encoded whole through the codecs (parts are merged).
        if self.window.is_some() {
            return None;
        }
        self.shard_layout().filter(|l| l.is_raw())
    }

    /// Encodes shard `shard_idx` of an array with a raw shard layout: `fill(region, dst)`
    /// writes the values of each inner chunk's region inside the array into `dst` (C order,
    /// exactly that region's size); inner chunks are stored whole (padded with the fill value
    /// at the array's edge) one after another in C order, those wholly outside the array not
    /// at all, and the index goes where the layout says.
    pub fn encode_raw_shard(
        &self,
        shard_idx: &[u64],
        fill: impl Fn(&Region, &mut [u8]),
    ) -> Result<Vec<u8>> {
        let layout = self
            .raw_shard_layout()
            .ok_or_else(|| Error::internal("raw shard write of an array without raw shards"))?;
        let inner_grid = self.inner_grid();
        let inner_shape = &layout.inner_chunk;
        let itemsize = self.dtype.size();
        let inner_bytes = inner_shape.iter().product::<u64>() as usize * itemsize;
        let n = layout.chunks_per_shard() as usize;
        let inner_counts = inner_grid.grid_shape();
        let positions = crate::array::grid::indices_in(&layout.per_shard);
        let stored: Vec<Option<Vec<u64>>> = positions
            .iter()
            .map(|rel| {
                let idx: Vec<u64> = rel
                    .iter()
                    .zip(&layout.per_shard)
                    .zip(shard_idx)
                    .map(|((r, p), s)| s * p + r)
                    .collect();
                idx.iter()
                    .zip(&inner_counts)
                    .all(|(i, c)| i < c)
                    .then_some(idx)
            })
            .collect();
        let index_len = layout.index_len();
        let data_len = stored.iter().flatten().count() * inner_bytes;
        let head = if layout.index_at_end() { 0 } else { index_len };
        // Every byte is written below: the inner chunks in turn, then the index.
        let mut out = crate::array::pool::take_filled(head + data_len + index_len);
        let mut ranges = Vec::with_capacity(n);
        let mut at = head;
        for idx in &stored {
            let Some(idx) = idx else {
                ranges.push(None);
                continue;
            };
            let dst = &mut out[at..at + inner_bytes];
            let region = inner_grid.chunk_region(idx);
            if region.shape == *inner_shape {
                fill(&region, dst);
            } else {
                // An edge chunk: its part inside the array, the fill value around it.
                for v in dst.chunks_exact_mut(itemsize) {
                    v.copy_from_slice(&self.fill);
                }
                let mut part = Buffer::for_overwrite(self.dtype, region.len() as usize);
                fill(&region, part.bytes_mut());
                let padded = Region {
                    start: region.start.clone(),
                    shape: inner_shape.clone(),
                };
                crate::array::buffer::copy_region(
                    part.bytes(),
                    &region,
                    dst,
                    &padded,
                    &region,
                    itemsize,
                );
            }
            ranges.push(Some(crate::store::ByteRange::new(
                at as u64,
                Some(inner_bytes as u64),
            )));
            at += inner_bytes;
        }
        let index = layout.encode_index(&ranges);
        let index_at = if layout.index_at_end() { at } else { 0 };
        out[index_at..index_at + index_len].copy_from_slice(&index);
        Ok(out)
    }

    /// [`encode_chunk`](Self::encode_chunk) of a buffer the caller gives up: uncompressed
    /// chunks are the buffer's own bytes, not a copy.
    pub fn encode_chunk_owned(&self, idx: &[u64], data: Buffer) -> Result<Option<Vec<u8>>> {
        let region = self.grid.chunk_region(idx);
        let whole = data.len() as u64 == region.len() && data.dtype() == self.dtype;
        if self.fast == Some(FastCodec::Raw)
            && self.window.is_none()
            && whole
            && self.encoded_chunk_shape(idx)? == region.shape
            && (self.store_fill_chunks || !data.all_equal(&self.fill))
        {
            return Ok(Some(data.into_bytes()));
        }
        self.encode_chunk(idx, &data)
    }

    /// Encodes `data`, which covers exactly chunk `idx`'s region. Returns `None` when every
    /// element equals the fill value (such chunks are not stored, as zarr-python does).
    pub fn encode_chunk(&self, idx: &[u64], data: &Buffer) -> Result<Option<Vec<u8>>> {
        self.encode_chunk_on(idx, data, 1)
    }

    /// [`encode_chunk`](Self::encode_chunk) on `threads` threads where the codec can split one
    /// chunk's work (zstd): for a chunk no other task's work overlaps.
    pub fn encode_chunk_on(
        &self,
        idx: &[u64],
        data: &Buffer,
        threads: usize,
    ) -> Result<Option<Vec<u8>>> {
        match &self.window {
            None => self.encode_stored(idx, &self.grid.chunk_region(idx), data, threads),
            Some(w) => self.encode_window_chunk(w, idx, data, threads),
        }
    }

    /// Encodes `data`, the values of stored chunk `t` over `region` (its region in the stored
    /// array), as [`encode_chunk`](Self::encode_chunk) does.
    pub(super) fn encode_stored(
        &self,
        t: &[u64],
        region: &Region,
        data: &Buffer,
        threads: usize,
    ) -> Result<Option<Vec<u8>>> {
        let idx = t;
        if data.len() as u64 != region.len() || data.dtype() != self.dtype {
            return Err(Error::internal(format!(
                "chunk {idx:?} expects {} {} elements, got {} {}",
                region.len(),
                self.dtype,
                data.len(),
                data.dtype()
            )));
        }
        if !self.store_fill_chunks && data.all_equal(&self.fill) {
            return Ok(None);
        }
        let encoded_shape = self.stored_chunk_shape(idx)?;
        let padded_storage;
        let bytes: &[u8] = if encoded_shape == region.shape {
            data.bytes()
        } else {
            let padded = Region {
                start: region.start.clone(),
                shape: encoded_shape.clone(),
            };
            let mut p = Buffer::filled(self.dtype, padded.len() as usize, &self.fill);
            crate::array::buffer::copy_region(
                data.bytes(),
                region,
                p.bytes_mut(),
                &padded,
                region,
                self.dtype.size(),
            );
            padded_storage = p;
            padded_storage.bytes()
        };
        if self.fast == Some(FastCodec::Raw) {
            let mut out = crate::array::pool::take(bytes.len());
            out.extend_from_slice(bytes);
            return Ok(Some(out));
        }
        if let Some(params) = self.fast_encode {
            return zstd_encode(bytes, params, threads).map(Some).map_err(|e| {
                Error::new(ErrorKind::Internal, format!("cannot encode chunk: {e}"))
                    .with_array(&self.name)
                    .with_chunk_key(self.stored_key(idx))
                    .with_store(&self.url)
            });
        }
        let encoded = self
            .meta
            .codecs()
            .encode(
                ArrayBytes::new_flen(Cow::Borrowed(bytes)),
                &nonzero_shape(&encoded_shape)?,
                self.meta.data_type(),
                self.meta.fill_value(),
                &self.options,
            )
            .map_err(|e| {
                Error::new(ErrorKind::Internal, format!("cannot encode chunk: {e}"))
                    .with_array(&self.name)
                    .with_chunk_key(self.stored_key(idx))
                    .with_store(&self.url)
            })?;
        Ok(Some(encoded.into_owned()))
    }
}
