//! Decoding stored chunks: through zarrs' codec chain or the engine's own zstd and raw paths,
//! whole, into a caller's buffer, or only their first bytes.

use std::borrow::Cow;

use zarrs::array::ArrayToBytesCodecTraits;

use super::fast_codec::{zstd_decode, zstd_decode_into, zstd_decode_prefix, FastCodec};
use super::{nonzero_shape, ZarrArray};
use crate::array::{Buffer, Region};
use crate::error::{Error, ErrorKind, Result};

impl ZarrArray {
    /// Decodes the stored bytes of chunk `idx` (or the fill value when `bytes` is `None`)
    /// into a buffer covering exactly the chunk's region inside the array.
    pub fn decode_chunk(&self, idx: &[u64], bytes: Option<crate::store::Value>) -> Result<Buffer> {
        match &self.window {
            None => self.decode_stored(idx, &self.grid.chunk_region(idx), bytes),
            Some(w) => self.decode_window_chunk(w, idx, bytes),
        }
    }

    /// Decodes stored chunk `t` over `region` (its region in the stored array).
    pub(super) fn decode_stored(
        &self,
        t: &[u64],
        region: &Region,
        bytes: Option<crate::store::Value>,
    ) -> Result<Buffer> {
        let Some(bytes) = bytes else {
            self.check_missing_chunk(&self.stored_key(t))?;
            return Ok(Buffer::filled(
                self.dtype,
                region.len() as usize,
                &self.fill,
            ));
        };
        let encoded_shape = self.stored_chunk_shape(t)?;
        let corrupt = |msg: String| {
            Error::new(ErrorKind::Corrupt, format!("cannot decode chunk: {msg}"))
                .with_array(&self.name)
                .with_chunk_key(self.stored_key(t))
                .with_store(&self.url)
        };
        let len = encoded_shape.iter().product::<u64>() as usize * self.dtype.size();
        if self.fast == Some(FastCodec::Zstd) {
            let out = zstd_decode(&bytes, len).map_err(corrupt);
            bytes.recycle();
            let full = Buffer::from_bytes(self.dtype, out?)?;
            return self.crop(full, region, encoded_shape);
        }
        if self.fast == Some(FastCodec::Raw) {
            if bytes.len() != len {
                let msg = format!("{} bytes stored, the chunk needs {len}", bytes.len());
                bytes.recycle();
                return Err(corrupt(msg));
            }
            // The bytes read are the values: no copy when they were read into memory.
            let full = Buffer::from_bytes(self.dtype, bytes.into_vec())?;
            return self.crop(full, region, encoded_shape);
        }
        if self.blosc_outer {
            if let Err(msg) = super::check_blosc_header(&bytes, len) {
                bytes.recycle();
                return Err(corrupt(msg));
            }
        }
        let decoded = self
            .meta
            .codecs()
            .decode(
                Cow::Borrowed(&bytes),
                &nonzero_shape(&encoded_shape)?,
                self.meta.data_type(),
                self.meta.fill_value(),
                &self.options,
            )
            .and_then(|b| {
                b.into_fixed()
                    .map_err(|e| zarrs::array::CodecError::Other(e.to_string()))
            })
            .map_err(|e| corrupt(e.to_string()))?;
        let full = Buffer::from_bytes(self.dtype, decoded.into_owned())?;
        bytes.recycle();
        self.crop(full, region, encoded_shape)
    }

    /// Decodes chunk `idx` into `dst`, which holds exactly the chunk's region (C order):
    /// zstd and uncompressed interior chunks decode in place, others through a buffer.
    pub fn decode_chunk_into(
        &self,
        idx: &[u64],
        bytes: Option<crate::store::Value>,
        dst: &mut [u8],
    ) -> Result<()> {
        let region = self.grid.chunk_region(idx);
        let interior = self.encoded_chunk_shape(idx)? == region.shape;
        match (bytes, self.fast) {
            (Some(bytes), Some(FastCodec::Zstd)) if interior => {
                let r = zstd_decode_into(&bytes, dst);
                bytes.recycle();
                r.map_err(|msg| self.corrupt_chunk(idx, msg))
            }
            (bytes, _) => {
                let buf = self.decode_chunk(idx, bytes)?;
                if buf.bytes().len() != dst.len() {
                    return Err(Error::internal(format!(
                        "chunk {} decodes to {} bytes, not the {} asked for",
                        self.chunk_key(idx),
                        buf.bytes().len(),
                        dst.len()
                    )));
                }
                dst.copy_from_slice(buf.bytes());
                crate::array::pool::give(buf.into_bytes());
                Ok(())
            }
        }
    }

    /// The stored bytes of chunk `idx` when they are its values as they stand: an uncompressed
    /// little-endian chunk inside the array, of the length its region needs. `None` for every
    /// other chunk, which [`decode_chunk`](Self::decode_chunk) decodes (and reports when
    /// corrupt).
    pub fn raw_values<'a>(&self, idx: &[u64], bytes: &'a [u8]) -> Option<&'a [u8]> {
        let (region, stored_shape) = match self.inner_layout() {
            Some(layout) if layout.is_raw() => (
                self.inner_grid().chunk_region(idx),
                layout.inner_chunk.clone(),
            ),
            Some(_) => return None,
            None if self.fast == Some(FastCodec::Raw) && cfg!(target_endian = "little") => (
                self.grid.chunk_region(idx),
                self.encoded_chunk_shape(idx).ok()?,
            ),
            None => return None,
        };
        let len = region.len() as usize * self.dtype.size();
        (stored_shape == region.shape && bytes.len() == len).then_some(bytes)
    }

    /// The shape chunk `idx` is encoded with when its stored bytes are one zstd frame of
    /// little-endian values (a GPU decodes those with nvCOMP); `None` for other codecs, for
    /// windows of arrays and for sharded arrays, whose chunks are decoded on the CPU.
    pub fn zstd_frame_shape(&self, idx: &[u64]) -> Option<Vec<u64>> {
        let plain = self.window.is_none() && self.shard.is_none();
        if self.fast != Some(FastCodec::Zstd) || !plain || !cfg!(target_endian = "little") {
            return None;
        }
        self.stored_chunk_shape(idx).ok()
    }

    /// True when the first bytes of chunk `idx` can be decoded alone (see
    /// [`decode_chunk_prefix`](Self::decode_chunk_prefix)): zstd chunks inside the array.
    pub fn prefix_decodable(&self, idx: &[u64]) -> bool {
        self.fast == Some(FastCodec::Zstd)
            && self
                .encoded_chunk_shape(idx)
                .is_ok_and(|s| s == self.grid.chunk_region(idx).shape)
    }

    /// Whether decoding only the first `prefix` bytes of chunk `idx` pays: the codec can stop
    /// there (see [`prefix_decodable`](Self::prefix_decodable)) and that saves a tenth of the
    /// chunk's decode or more.
    fn head_decodes_alone(&self, idx: &[u64], prefix: usize) -> bool {
        let whole = self.grid.chunk_region(idx).len() as usize * self.dtype.size();
        prefix * 10 < whole * 9 && self.prefix_decodable(idx)
    }

    /// Decodes only the first `prefix` bytes of chunk `idx` (C order) from its stored bytes.
    pub fn decode_chunk_prefix(&self, idx: &[u64], bytes: &[u8], prefix: usize) -> Result<Vec<u8>> {
        let mut out = crate::array::pool::take(prefix);
        out.resize(prefix, 0);
        zstd_decode_prefix(bytes, &mut out).map_err(|msg| self.corrupt_chunk(idx, msg))?;
        Ok(out)
    }

    /// Decodes the first `dst.len()` bytes (C order) of chunk `idx` from its stored bytes (the
    /// fill value for `None`) straight into `dst`: only those where that pays (as
    /// [`decode_chunk_through`](Self::decode_chunk_through) does), else the whole chunk, whose
    /// head is copied. Returns the bytes decoded.
    pub fn decode_chunk_head_into(
        &self,
        idx: &[u64],
        bytes: Option<crate::store::Value>,
        dst: &mut [u8],
    ) -> Result<usize> {
        let whole = self.grid.chunk_region(idx).len() as usize * self.dtype.size();
        if dst.len() == whole {
            self.decode_chunk_into(idx, bytes, dst)?;
            return Ok(whole);
        }
        match bytes {
            Some(b) if self.head_decodes_alone(idx, dst.len()) => {
                let decoded =
                    zstd_decode_prefix(&b, dst).map_err(|msg| self.corrupt_chunk(idx, msg));
                b.recycle();
                decoded.map(|()| dst.len())
            }
            bytes => {
                let buf = self.decode_chunk(idx, bytes)?;
                let head = buf.bytes().get(..dst.len()).ok_or_else(|| {
                    Error::internal(format!(
                        "chunk {} decodes to {} bytes, fewer than the {} asked for",
                        self.chunk_key(idx),
                        buf.bytes().len(),
                        dst.len()
                    ))
                })?;
                dst.copy_from_slice(head);
                crate::array::pool::give(buf.into_bytes());
                Ok(whole)
            }
        }
    }

    /// How many times smaller than its values the array's first chunk is stored: a sample of
    /// how compressible the values are. `None` when that chunk is not stored (or is empty).
    pub fn sampled_compression(&self) -> Option<f64> {
        let first = vec![0; self.grid.rank()];
        let stored = self.store.size_of(&self.chunk_key(&first)).ok()??;
        let values = self.grid.chunk_region(&first).len() * self.dtype.size() as u64;
        (stored > 0).then(|| values as f64 / stored as f64)
    }

    /// Decodes chunk `idx` from its stored bytes (the fill value for `None`) at least through
    /// its first `prefix` bytes in C order: only those when the codec can stop there and that
    /// saves a tenth of the decode or more, else the whole chunk.
    pub fn decode_chunk_through(
        &self,
        idx: &[u64],
        bytes: Option<crate::store::Value>,
        prefix: usize,
    ) -> Result<Vec<u8>> {
        match bytes {
            Some(b) if self.head_decodes_alone(idx, prefix) => {
                let out = self.decode_chunk_prefix(idx, &b, prefix);
                b.recycle();
                out
            }
            bytes => Ok(self.decode_chunk(idx, bytes)?.into_bytes()),
        }
    }

    /// The error for chunk `idx` whose stored bytes do not decode.
    fn corrupt_chunk(&self, idx: &[u64], msg: String) -> Error {
        Error::new(ErrorKind::Corrupt, format!("cannot decode chunk: {msg}"))
            .with_array(&self.name)
            .with_chunk_key(self.chunk_key(idx))
            .with_store(&self.url)
    }

    /// The part of a decoded (padded) chunk that lies inside the array.
    pub(super) fn crop(
        &self,
        full: Buffer,
        region: &Region,
        encoded_shape: Vec<u64>,
    ) -> Result<Buffer> {
        if encoded_shape == region.shape {
            return Ok(full);
        }
        // An edge chunk: keep the part inside the array.
        let mut out = Buffer::zeros(self.dtype, region.len() as usize);
        let padded = Region {
            start: region.start.clone(),
            shape: encoded_shape,
        };
        crate::array::buffer::copy_region(
            full.bytes(),
            &padded,
            out.bytes_mut(),
            region,
            region,
            self.dtype.size(),
        );
        Ok(out)
    }
}
