//! The one adapter over the `zarrs` crate: metadata, chunk keys and codec chains.
//!
//! Every call into zarrs lives in this module. IO does not: chunk bytes come from and go to
//! the engine's own [`Store`](crate::store::Store), and zarrs only parses metadata and runs
//! codecs on bytes handed to it, with its internal parallelism switched off (the engine
//! parallelises across chunks itself).

pub mod attrs;
mod create;
mod decode;
mod encode;
mod fast_codec;
pub mod group;
mod inner;
mod keys;
mod metadata;
pub mod shard;
pub mod stream;
pub mod strings;
pub mod target;
pub mod window;

pub use attrs::ArrayAttrs;
pub use create::{ArraySpec, Codec};
pub use metadata::exists as array_exists;
pub use metadata::ArrayInfo;

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::{data_type, Array, ArrayMetadata, CodecOptions};
use zarrs::storage::store::MemoryStore;

use crate::array::{AxisChunks, ChunkGrid, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::store::Store;
use fast_codec::{
    check_blosc_header, detect_fast_codec, detect_fast_encode, outer_blosc, zstd_decode, FastCodec,
    ZstdParams,
};

/// An open Zarr array: its metadata, chunk grid and codecs, and the store holding its chunks.
pub struct ZarrArray {
    url: String,
    name: String,
    store: Arc<dyn Store>,
    meta: Array<MemoryStore>,
    dtype: DType,
    grid: ChunkGrid,
    fill: Vec<u8>,
    /// Store chunks whose values all equal the fill value too: a Zarr v2 array whose fill
    /// value is null, whose readers cannot fill a missing chunk, and the engine's
    /// intermediates, where a missing chunk means one removed.
    store_fill_chunks: bool,
    /// Attributes and dimension names.
    attrs: ArrayAttrs,
    /// For the target of an unfinished job: the metadata documents (with their keys) that
    /// complete it, written over its marked ones when the job ends (see `target`).
    finished_docs: std::sync::Mutex<Option<create::Documents>>,
    info: ArrayInfo,
    options: CodecOptions,
    fast: Option<FastCodec>,
    fast_encode: Option<ZstdParams>,
    /// The outermost codec is blosc: its header's decoded size is checked before decoding.
    blosc_outer: bool,
    /// Where inner chunks lie in shards, for arrays whose inner chunks can be read alone,
    /// and the grid of those inner chunks.
    shard: Option<(Arc<shard::ShardLayout>, ChunkGrid)>,
    /// True when compute tasks read this array's inner chunks one by one (ranged reads of
    /// their shards) rather than whole shards: sharded sources and intermediates.
    inner_reads: bool,
    /// Parsed shard indexes, by shard, for inner reads (`None`: the shard is not stored).
    shard_indexes: std::sync::Mutex<HashMap<Vec<u64>, Option<ShardIndex>>>,
    /// The box of the array a region write fills, when this array stands for one (see
    /// [`window`]): `grid` is then the window's.
    window: Option<window::Window>,
    /// For an intermediate of a job run in batches: the key of its metadata, checked when a
    /// chunk is missing. A batch that outlives its job (a backup copy still running when the
    /// job finished) then fails instead of reading the removed chunks as the fill value.
    removal_guard: Option<&'static str>,
}

/// Where each inner chunk of one shard lies (C order within the shard).
type ShardIndex = Arc<Vec<shard::InnerRange>>;

impl std::fmt::Debug for ZarrArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZarrArray")
            .field("url", &self.url)
            .field("dtype", &self.dtype)
            .field("shape", &self.grid.shape())
            .finish()
    }
}

fn dtype_from_zarrs(dt: &zarrs::array::DataType) -> Option<DType> {
    let table: [(fn() -> zarrs::array::DataType, DType); 13] = [
        (data_type::bool, DType::Bool),
        (data_type::int8, DType::I8),
        (data_type::int16, DType::I16),
        (data_type::int32, DType::I32),
        (data_type::int64, DType::I64),
        (data_type::uint8, DType::U8),
        (data_type::uint16, DType::U16),
        (data_type::uint32, DType::U32),
        (data_type::uint64, DType::U64),
        (data_type::float32, DType::F32),
        (data_type::float64, DType::F64),
        (data_type::complex64, DType::C64),
        (data_type::complex128, DType::C128),
    ];
    table.iter().find(|(f, _)| &f() == dt).map(|(_, d)| *d)
}

/// An error of zarrs reading array metadata: a data type or codec zarrs does not know is
/// unsupported (the metadata may be valid); anything else is invalid metadata.
pub(crate) fn metadata_error(e: zarrs::array::ArrayCreateError) -> Error {
    use zarrs::array::ArrayCreateError::{
        CodecsCreateError, DataTypeCreateError, UnsupportedZarrV2Array,
    };
    use zarrs::plugin::PluginCreateError::Unsupported;
    match &e {
        DataTypeCreateError(Unsupported(_))
        | CodecsCreateError(Unsupported(_))
        | UnsupportedZarrV2Array(_) => Error::new(ErrorKind::Unsupported, format!("{e}")),
        _ => Error::new(ErrorKind::Corrupt, format!("invalid array metadata: {e}")),
    }
}

fn codec_options() -> CodecOptions {
    // The engine runs many chunks at once on its own pool; nested zarrs parallelism would
    // oversubscribe the cores.
    CodecOptions::default().with_concurrent_target(1)
}

fn nonzero_shape(shape: &[u64]) -> Result<Vec<NonZeroU64>> {
    shape
        .iter()
        .map(|&s| NonZeroU64::new(s).ok_or_else(|| Error::internal("zero-sized chunk")))
        .collect()
}

/// The most chunks an irregular axis may list (a regular axis has no limit).
const MAX_LISTED_CHUNKS: u64 = 1 << 24;

/// An array at the root of a store, its metadata read once: one the engine computes on, or
/// one of strings, which it only copies (see [`strings`]).
pub enum AnyArray {
    /// An array of a numeric or bool data type.
    Typed(Box<ZarrArray>),
    /// An array of strings.
    Strings(Box<strings::StringArray>),
}

impl AnyArray {
    /// Opens the array at the root of `store`; an error is [`ZarrArray::open`]'s.
    pub fn open(store: Arc<dyn Store>) -> Result<AnyArray> {
        let url = store.url().to_string();
        let (metadata, raw) = metadata::read(store.as_ref())?;
        let strings =
            strings::StringArray::from_metadata(store.clone(), metadata.clone(), raw.clone());
        if let Ok(Some(s)) = strings {
            return Ok(AnyArray::Strings(Box::new(s)));
        }
        ZarrArray::from_metadata(store, metadata, raw)
            .map(|a| AnyArray::Typed(Box::new(a)))
            .map_err(|e| e.with_store(&url))
    }
}

impl ZarrArray {
    /// Opens the array whose metadata (`zarr.json`, or `.zarray` + `.zattrs`) is at the root of
    /// `store`.
    /// An array of strings is an `unsupported` error saying what the engine does with them.
    pub fn open(store: Arc<dyn Store>) -> Result<Self> {
        let url = store.url().to_string();
        let (metadata, raw) = metadata::read(store.as_ref())?;
        Self::from_metadata(store.clone(), metadata.clone(), raw.clone())
            .map_err(
                |e| match strings::StringArray::from_metadata(store, metadata, raw) {
                    Ok(Some(_)) => Error::new(
                        ErrorKind::Unsupported,
                        "an array of strings: the engine copies these in rechunks and writes, \
                         but does not read or compute on them",
                    ),
                    _ => e,
                },
            )
            .map_err(|e| e.with_store(&url))
    }

    fn from_metadata(
        store: Arc<dyn Store>,
        metadata: ArrayMetadata,
        raw: serde_json::Value,
    ) -> Result<Self> {
        let url = store.url().to_string();
        let v2_attributes = match &metadata {
            ArrayMetadata::V2(m) => Some(m.attributes.clone()),
            _ => None,
        };
        let meta = Array::new_with_metadata(Arc::new(MemoryStore::new()), "/", metadata)
            .map_err(metadata_error)?;
        let dtype = dtype_from_zarrs(meta.data_type()).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!(
                    "data type {} is not supported by the engine",
                    meta.data_type()
                ),
            )
        })?;
        let grid_shape = meta.chunk_grid_shape().to_vec();
        let rank = grid_shape.len();
        let mut axes = Vec::with_capacity(rank);
        let zeros = vec![0u64; rank];
        let nominal = meta
            .chunk_shape(&zeros)
            .map_err(|e| Error::new(ErrorKind::Corrupt, e.to_string()))?;
        for d in 0..rank {
            let (len, size) = (meta.shape()[d], nominal[d].get());
            if len > 0 && len.div_ceil(size) == grid_shape[d] {
                // A regular axis: its chunks computed, never listed (a sparse array may
                // declare more chunks than memory holds boundaries).
                axes.push(AxisChunks::regular(len, size)?);
                continue;
            }
            if grid_shape[d] > MAX_LISTED_CHUNKS {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "an irregular chunk grid of {} chunks along axis {d}: at most \
                         {MAX_LISTED_CHUNKS} are supported",
                        grid_shape[d]
                    ),
                ));
            }
            let mut sizes = Vec::with_capacity(grid_shape[d] as usize);
            for i in 0..grid_shape[d] {
                let mut idx = vec![0u64; rank];
                idx[d] = i;
                let subset = meta
                    .chunk_subset_bounded(&idx)
                    .map_err(|e| Error::new(ErrorKind::Corrupt, e.to_string()))?;
                sizes.push(subset.shape()[d]);
            }
            let axis = if meta.shape()[d] == 0 {
                AxisChunks::from_sizes(&[])?
            } else {
                AxisChunks::from_sizes(&sizes)?
            };
            axes.push(axis);
        }
        let fill = meta.fill_value().as_ne_bytes().to_vec();
        let null_fill = raw.get("fill_value").is_none_or(serde_json::Value::is_null);
        let attrs = match &v2_attributes {
            None => ArrayAttrs::from_v3(&raw),
            Some(a) => ArrayAttrs::from_v2(a, (!null_fill).then_some((dtype, &fill[..]))),
        };
        let info = metadata::describe(&meta, &raw, dtype);
        let fast = detect_fast_codec(&raw);
        let fast_encode = detect_fast_encode(&raw);
        let grid = ChunkGrid::new(axes);
        let shard = match info
            .shards
            .as_ref()
            .and_then(|s| shard::ShardLayout::from_metadata(&raw, s))
        {
            Some(layout) => {
                let inner = ChunkGrid::regular(&grid.shape(), &layout.inner_chunk)?;
                Some((Arc::new(layout), inner))
            }
            None => None,
        };
        Ok(ZarrArray {
            name: url.clone(),
            url,
            store,
            meta,
            dtype,
            grid,
            fill,
            store_fill_chunks: v2_attributes.is_some() && null_fill,
            attrs,
            finished_docs: std::sync::Mutex::new(None),
            info,
            options: codec_options(),
            fast,
            fast_encode,
            blosc_outer: outer_blosc(&raw, raw.get("codecs")),
            shard,
            inner_reads: false,
            shard_indexes: std::sync::Mutex::new(HashMap::new()),
            window: None,
            removal_guard: None,
        })
    }

    /// Makes a missing chunk an error, and has writes store every chunk, fill values
    /// included: for the engine's intermediates, every chunk of which an earlier stage of the
    /// job wrote through this handle, so a missing one was removed while the job ran: its work
    /// directory removed, or, for a job run in batches, the job finished (work directory
    /// removed, metadata first) while a late copy of a batch still read it.
    pub fn with_removal_guard(mut self) -> Self {
        self.store_fill_chunks = true;
        self.removal_guard = Some(match self.meta.metadata() {
            ArrayMetadata::V2(_) => ".zarray",
            _ => "zarr.json",
        });
        self
    }

    /// For chunk `key` that is not stored: an error for an intermediate (see
    /// [`with_removal_guard`](Self::with_removal_guard)); Ok otherwise (a chunk of fill
    /// values).
    pub(crate) fn check_missing_chunk(&self, key: &str) -> Result<()> {
        let Some(meta) = self.removal_guard else {
            return Ok(());
        };
        let why = match self.store.size_of(meta) {
            Ok(Some(_)) => {
                "a chunk of this intermediate array is gone: an earlier stage of the job wrote \
                 it, so something removed it (or the work directory) while the job ran; what \
                 the job read is void: run it again"
            }
            Ok(None) => {
                "the intermediate array was removed while the job read it: its work directory \
                 was removed, or its job finished before this copy of a batch ended; what was \
                 read is void"
            }
            Err(e) => return Err(e.with_array(&self.name).with_chunk_key(key)),
        };
        Err(Error::new(ErrorKind::Store, why)
            .with_array(&self.name)
            .with_chunk_key(key)
            .with_store(&self.url))
    }

    /// The store URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The name errors give the array (the plan id; the URL until one is set).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Names the array for error messages.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> Vec<u64> {
        self.grid.shape()
    }

    /// The storage chunk grid (shards for sharded arrays).
    pub fn grid(&self) -> &ChunkGrid {
        &self.grid
    }

    /// The fill value's native-endian bytes.
    pub fn fill_bytes(&self) -> &[u8] {
        &self.fill
    }

    /// Attributes and dimension names (in Zarr v3's form: see [`attrs`]).
    pub fn attrs(&self) -> &ArrayAttrs {
        &self.attrs
    }

    /// What `chunkfuse info` shows.
    pub fn info(&self) -> &ArrayInfo {
        &self.info
    }
}

#[cfg(test)]
mod tests;
