//! Inner chunks of sharded Zarr v3 arrays read on their own: a shard's index comes from one
//! ranged read (the last or first bytes, no size lookup first), then only the inner chunks
//! wanted are fetched (ranged reads, which object stores coalesce) and decoded with the
//! inner codecs: `bytes` + `zstd` and `bytes` alone by the engine, others through zarrs.
//! Used by direct reads and by runs over sharded arrays, so inner chunks decode in parallel
//! and a task holds one inner chunk, never a whole shard.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::{ArrayToBytesCodecTraits, CodecChain, CodecOptions};
use zarrs::metadata::v3::MetadataV3;

use crate::error::{Error, ErrorKind, Result};
use crate::store::ByteRange;

/// Where a sharded array's inner chunks lie and how they are encoded.
pub struct ShardLayout {
    /// Inner chunk shape.
    pub inner_chunk: Vec<u64>,
    /// Inner chunks per shard, per axis.
    pub per_shard: Vec<u64>,
    index_at_end: bool,
    checksum: bool,
    /// The inner codecs when the engine decodes them itself, into pooled buffers (zarrs'
    /// chain allocates fresh output each time): `bytes` little-endian alone (a stored inner
    /// chunk is its values as they stand, the whole inner chunk shape, padded at the array's
    /// edge), or then `zstd`.
    fast: Option<super::FastCodec>,
    /// The inner chunks' outermost codec is blosc (its header is checked before decoding).
    blosc_outer: bool,
    codecs: Arc<CodecChain>,
}

impl std::fmt::Debug for ShardLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLayout")
            .field("inner_chunk", &self.inner_chunk)
            .field("per_shard", &self.per_shard)
            .finish()
    }
}

/// The location of one inner chunk inside its shard, or `None` when it is not stored.
pub type InnerRange = Option<ByteRange>;

impl ShardLayout {
    /// The layout of an array whose whole codec list is one `sharding_indexed` codec with the
    /// standard index codecs (`bytes` little-endian, optionally `crc32c`); `None` otherwise
    /// (such arrays are read shard by shard).
    pub fn from_metadata(raw: &serde_json::Value, shard_shape: &[u64]) -> Option<ShardLayout> {
        let codecs = raw.get("codecs")?.as_array()?;
        let [sharding] = codecs.as_slice() else {
            return None;
        };
        if sharding.get("name")?.as_str()? != "sharding_indexed" {
            return None;
        }
        let cfg = sharding.get("configuration")?;
        let inner_chunk: Vec<u64> = serde_json::from_value(cfg.get("chunk_shape")?.clone()).ok()?;
        if inner_chunk.len() != shard_shape.len()
            || inner_chunk.contains(&0)
            || shard_shape
                .iter()
                .zip(&inner_chunk)
                .any(|(s, c)| s % c != 0)
        {
            return None;
        }
        let index_names: Vec<&str> = cfg
            .get("index_codecs")?
            .as_array()?
            .iter()
            .map(|c| c.get("name").and_then(|n| n.as_str()))
            .collect::<Option<_>>()?;
        let checksum = match index_names.as_slice() {
            ["bytes"] => false,
            ["bytes", "crc32c"] => true,
            _ => return None,
        };
        let little = cfg.get("index_codecs")?.as_array()?[0]
            .get("configuration")
            .and_then(|c| c.get("endian"))
            .and_then(|e| e.as_str())
            .is_none_or(|e| e == "little");
        if !little {
            return None;
        }
        let index_at_end = cfg
            .get("index_location")
            .and_then(|l| l.as_str())
            .is_none_or(|l| l == "end");
        // The inner codecs the engine decodes itself, by the rule for whole chunks (the
        // configuration lists them under `codecs`, as an array's metadata does).
        let fast = super::detect_fast_codec(cfg);
        let inner: Vec<MetadataV3> = serde_json::from_value(cfg.get("codecs")?.clone()).ok()?;
        let codecs = CodecChain::from_metadata(&inner).ok()?;
        Some(ShardLayout {
            per_shard: shard_shape
                .iter()
                .zip(&inner_chunk)
                .map(|(s, c)| s / c)
                .collect(),
            inner_chunk,
            index_at_end,
            checksum,
            fast,
            blosc_outer: super::fast_codec::outer_blosc(raw, cfg.get("codecs")),
            codecs: Arc::new(codecs),
        })
    }

    /// True when stored inner chunks are their values as they stand (inner codecs `bytes`
    /// alone, little-endian, on a little-endian machine).
    pub fn is_raw(&self) -> bool {
        self.fast == Some(super::FastCodec::Raw)
    }

    /// True when the index follows the inner chunks (else it precedes them).
    pub fn index_at_end(&self) -> bool {
        self.index_at_end
    }

    /// The index bytes for inner chunks at `ranges` (C order within the shard; `None` where
    /// an inner chunk is not stored), with its checksum when the layout has one.
    pub fn encode_index(&self, ranges: &[InnerRange]) -> Vec<u8> {
        let mut index = Vec::with_capacity(16 * ranges.len() + 4);
        for r in ranges {
            let (offset, len) = match r {
                Some(r) => (r.offset, r.len.unwrap_or(0)),
                None => (u64::MAX, u64::MAX),
            };
            index.extend_from_slice(&offset.to_le_bytes());
            index.extend_from_slice(&len.to_le_bytes());
        }
        if self.checksum {
            let sum = crc32c::crc32c(&index);
            index.extend_from_slice(&sum.to_le_bytes());
        }
        index
    }

    /// Bytes of a shard's index: an (offset, length) pair per inner chunk, and the checksum.
    pub fn index_len(&self) -> usize {
        16 * self.chunks_per_shard() as usize + if self.checksum { 4 } else { 0 }
    }

    /// Inner chunks per shard.
    pub fn chunks_per_shard(&self) -> u64 {
        self.per_shard.iter().product()
    }

    /// The byte range of a shard's index.
    pub fn index_range(&self) -> ByteRange {
        let len = self.index_len() as u64;
        if self.index_at_end {
            ByteRange::last(len)
        } else {
            ByteRange::new(0, Some(len))
        }
    }

    /// The location of every inner chunk (C order within the shard) from the index bytes.
    pub fn parse_index(&self, index: &[u8]) -> std::result::Result<Vec<InnerRange>, String> {
        let n = self.chunks_per_shard() as usize;
        let want = self.index_len();
        if index.len() != want {
            return Err(format!(
                "shard index holds {} bytes, {want} expected",
                index.len()
            ));
        }
        if self.checksum {
            let stored = u32::from_le_bytes([
                index[16 * n],
                index[16 * n + 1],
                index[16 * n + 2],
                index[16 * n + 3],
            ]);
            let actual = crc32c::crc32c(&index[..16 * n]);
            if stored != actual {
                return Err(format!(
                    "shard index checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
                ));
            }
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&index[8 * i..8 * i + 8]);
            u64::from_le_bytes(b)
        };
        Ok((0..n)
            .map(|i| {
                let (offset, len) = (word(2 * i), word(2 * i + 1));
                (offset != u64::MAX || len != u64::MAX).then_some(ByteRange::new(offset, Some(len)))
            })
            .collect())
    }

    /// Position (C order) of inner chunk `inner` (array-wide inner grid index) within its
    /// shard, and the shard's index.
    pub fn locate(&self, inner: &[u64]) -> (Vec<u64>, usize) {
        let shard: Vec<u64> = inner
            .iter()
            .zip(&self.per_shard)
            .map(|(i, p)| i / p)
            .collect();
        let mut pos = 0u64;
        for (d, i) in inner.iter().enumerate() {
            pos = pos * self.per_shard[d] + i % self.per_shard[d];
        }
        (shard, pos as usize)
    }

    /// Decodes one inner chunk's bytes into its full (unclipped) inner chunk shape, of
    /// `elem`-byte elements: into a pooled buffer when the engine decodes the inner codecs
    /// itself (`bytes` alone, or `bytes` + `zstd`), else through zarrs' codec chain.
    pub fn decode(
        &self,
        bytes: &[u8],
        elem: usize,
        meta: &zarrs::array::Array<zarrs::storage::store::MemoryStore>,
        options: &CodecOptions,
    ) -> Result<Vec<u8>> {
        let len = self.inner_chunk.iter().product::<u64>() as usize * elem;
        let corrupt = |msg: String| {
            Error::new(
                ErrorKind::Corrupt,
                format!("cannot decode inner chunk: {msg}"),
            )
        };
        if self.fast == Some(super::FastCodec::Zstd) {
            return super::zstd_decode(bytes, len).map_err(corrupt);
        }
        if self.is_raw() {
            if bytes.len() != len {
                let msg = format!("{} bytes stored, the inner chunk needs {len}", bytes.len());
                return Err(corrupt(msg));
            }
            let mut out = crate::array::pool::take(len);
            out.extend_from_slice(bytes);
            return Ok(out);
        }
        if self.blosc_outer {
            super::check_blosc_header(bytes, len).map_err(corrupt)?;
        }
        let shape: Vec<NonZeroU64> = self
            .inner_chunk
            .iter()
            .map(|&c| NonZeroU64::new(c).ok_or_else(|| Error::internal("empty inner chunk")))
            .collect::<Result<_>>()?;
        self.codecs
            .decode(
                Cow::Borrowed(bytes),
                &shape,
                meta.data_type(),
                meta.fill_value(),
                options,
            )
            .and_then(|b| {
                b.into_fixed()
                    .map_err(|e| zarrs::array::CodecError::Other(e.to_string()))
            })
            .map(|b| b.into_owned())
            .map_err(|e| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("cannot decode inner chunk: {e}"),
                )
            })
    }
}
