//! The one adapter over the `zarrs` crate: metadata, chunk keys and codec chains.
//!
//! Every call into zarrs lives in this module. IO does not: chunk bytes come from and go to
//! the engine's own [`Store`](crate::store::Store), and zarrs only parses metadata and runs
//! codecs on bytes handed to it, with its internal parallelism switched off (the engine
//! parallelises across chunks itself).

pub mod attrs;
mod create;
pub mod group;
mod metadata;
pub mod shard;
pub mod stream;
pub mod target;
pub mod window;

pub use attrs::ArrayAttrs;
pub use create::{ArraySpec, Codec};
pub use metadata::exists as array_exists;
pub use metadata::ArrayInfo;

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::{
    data_type, Array, ArrayBytes, ArrayMetadata, ArrayToBytesCodecTraits, CodecOptions,
};
use zarrs::storage::store::MemoryStore;

use crate::array::{AxisChunks, Buffer, ChunkGrid, DType, Region};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{ReadRequest, Store};

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
    /// value is null, whose readers cannot fill a missing chunk.
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
}

/// Where each inner chunk of one shard lies (C order within the shard).
type ShardIndex = Arc<Vec<shard::InnerRange>>;

/// zstd settings of a chunk format the engine encodes itself (see `detect_fast_encode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ZstdParams {
    level: i32,
    checksum: bool,
}

/// The zstd settings of `bytes` + `zstd` (v3) or a C-order v2 `zstd` compressor without
/// filters: such chunks are encoded with a reused per-thread compression context into a pooled
/// buffer (a fresh context per chunk costs its tables' page faults, more than the encode).
fn detect_fast_encode(raw: &serde_json::Value) -> Option<ZstdParams> {
    detect_fast_codec(raw)?;
    let config = if raw.get("zarr_format").and_then(|v| v.as_u64()) == Some(2) {
        raw.get("compressor")?
    } else {
        raw.get("codecs")?
            .as_array()?
            .get(1)?
            .get("configuration")?
    };
    let level = config.get("level").and_then(|l| l.as_i64()).unwrap_or(0);
    let checksum = config
        .get("checksum")
        .and_then(|c| c.as_bool())
        .unwrap_or(false);
    Some(ZstdParams {
        level: i32::try_from(level).ok()?,
        checksum,
    })
}

/// A compression context: its parameters, zstd worker threads, and the process generation
/// it was made in (a context with worker threads made before a fork is useless after it).
type EncoderKey = (ZstdParams, u32, u64);

thread_local! {
    static ZSTD_ENCODER: std::cell::RefCell<Option<(EncoderKey, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Smallest input per zstd worker thread (zstd's own minimum job size is 512 KiB).
const ZSTD_MIN_JOB: usize = 1 << 20;

/// zstd-compresses `src` with `params`, reusing this thread's compression context. With
/// `threads` > 1 and an input large enough, zstd's own worker threads compress parts of the
/// one frame at once (for a lone chunk that would otherwise leave every other core idle).
fn zstd_encode(
    src: &[u8],
    params: ZstdParams,
    threads: usize,
) -> std::result::Result<Vec<u8>, String> {
    use zstd::zstd_safe::CParameter;
    let workers = threads.min(src.len() / ZSTD_MIN_JOB).max(1);
    let workers = if workers > 1 { workers as u32 } else { 0 };
    let mut out = crate::array::pool::take(zstd::zstd_safe::compress_bound(src.len()));
    ZSTD_ENCODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let key = (params, workers, crate::fork_safe::generation());
        if slot.as_ref().map(|(k, _)| *k) != Some(key) {
            let mut c = zstd::bulk::Compressor::new(params.level).map_err(|e| e.to_string())?;
            c.set_parameter(CParameter::ChecksumFlag(params.checksum))
                .map_err(|e| e.to_string())?;
            c.set_parameter(CParameter::NbWorkers(workers))
                .map_err(|e| e.to_string())?;
            *slot = Some((key, c));
        }
        match slot.as_mut() {
            Some((_, c)) => {
                if workers > 1 {
                    let job = src.len().div_ceil(workers as usize);
                    c.set_parameter(CParameter::JobSize(job as u32))
                        .map_err(|e| e.to_string())?;
                }
                c.compress_to_buffer(src, &mut out)
                    .map_err(|e| e.to_string())
            }
            None => Err("no zstd compressor".to_string()),
        }
    })?;
    Ok(out)
}

/// Codec chains the engine decodes itself, into pooled buffers, instead of through zarrs'
/// generic chain (which allocates fresh output for every chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FastCodec {
    /// Little-endian bytes compressed with zstd (v3 `bytes` + `zstd`, v2 `zstd` in C order).
    Zstd,
    /// Little-endian bytes, uncompressed (v3 `bytes` alone, v2 without compressor in C order).
    Raw,
}

fn detect_fast_codec(raw: &serde_json::Value) -> Option<FastCodec> {
    let name = |c: &serde_json::Value| c.get("name").and_then(|n| n.as_str()).map(String::from);
    if raw.get("zarr_format").and_then(|v| v.as_u64()) == Some(2) {
        let dtype = raw.get("dtype")?.as_str()?;
        let little = dtype.starts_with('<') || dtype.starts_with('|');
        let no_filters = raw
            .get("filters")
            .is_none_or(|f| f.is_null() || f.as_array().is_some_and(|a| a.is_empty()));
        let c_order = raw.get("order").and_then(|o| o.as_str()) != Some("F");
        let fast = match raw.get("compressor")? {
            serde_json::Value::Null => FastCodec::Raw,
            c if c.get("id")?.as_str()? == "zstd" => FastCodec::Zstd,
            _ => return None,
        };
        return (little && no_filters && c_order && cfg!(target_endian = "little")).then_some(fast);
    }
    let codecs = raw.get("codecs")?.as_array()?;
    if name(codecs.first()?).as_deref() != Some("bytes") {
        return None;
    }
    let fast = match codecs.get(1).map(name) {
        None => FastCodec::Raw,
        Some(Some(n)) if n == "zstd" && codecs.len() == 2 => FastCodec::Zstd,
        _ => return None,
    };
    let endian = codecs[0]
        .get("configuration")
        .and_then(|c| c.get("endian"))
        .and_then(|e| e.as_str())
        .unwrap_or("little");
    (endian == "little" && cfg!(target_endian = "little")).then_some(fast)
}

thread_local! {
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// zstd-decompresses `src` into a pooled buffer of exactly `len` bytes.
fn zstd_decode(src: &[u8], len: usize) -> std::result::Result<Vec<u8>, String> {
    let mut out = crate::array::pool::take(len);
    let n = with_zstd_decompressor(|d| d.decompress_to_buffer(src, &mut out));
    match n {
        Ok(n) if n == len => Ok(out),
        other => {
            crate::array::pool::give(out);
            Err(zstd_size_error(other, len))
        }
    }
}

thread_local! {
    static ZSTD_STREAM: std::cell::RefCell<Option<zstd::stream::raw::Decoder<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// zstd-decompresses only the first `dst.len()` bytes of the frame `src` into `dst`,
/// stopping there (a window near the start of a chunk costs part of its decode).
fn zstd_decode_prefix(src: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    ZSTD_STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::stream::raw::Decoder::new().map_err(|e| e.to_string())?);
        }
        let Some(d) = slot.as_mut() else {
            return Err("no zstd decompressor".to_string());
        };
        d.reinit().map_err(|e| e.to_string())?;
        let mut input = InBuffer::around(src);
        let mut output = OutBuffer::around(dst);
        while output.pos() < output.capacity() {
            let before = (input.pos(), output.pos());
            d.run(&mut input, &mut output).map_err(|e| e.to_string())?;
            if (input.pos(), output.pos()) == before {
                return Err(format!(
                    "zstd frame ends after {} bytes, before the {} wanted",
                    output.pos(),
                    output.capacity()
                ));
            }
        }
        Ok(())
    })
}

/// zstd-decompresses `src` into exactly `dst` (an error unless the frame fills it).
fn zstd_decode_into(src: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
    let len = dst.len();
    match with_zstd_decompressor(|d| d.decompress_to_buffer(src, dst)) {
        Ok(n) if n == len => Ok(()),
        other => Err(zstd_size_error(other, len)),
    }
}

fn zstd_size_error(got: std::result::Result<usize, String>, len: usize) -> String {
    match got {
        Ok(n) => format!("zstd frame holds {n} bytes, the chunk needs {len}"),
        Err(e) => e,
    }
}

/// Runs `f` with this thread's zstd decompression context.
fn with_zstd_decompressor(
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<usize>,
) -> std::result::Result<usize, String> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        match slot.as_mut() {
            Some(d) => f(d).map_err(|e| e.to_string()),
            None => Err("no zstd decompressor".to_string()),
        }
    })
}

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

impl ZarrArray {
    /// Opens the array whose metadata (`zarr.json`, or `.zarray` + `.zattrs`) is at the root of
    /// `store`.
    pub fn open(store: Arc<dyn Store>) -> Result<Self> {
        let url = store.url().to_string();
        let (metadata, raw) = metadata::read(store.as_ref())?;
        Self::from_metadata(store, metadata, raw).map_err(|e| e.with_store(&url))
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
            .map_err(|e| Error::new(ErrorKind::Corrupt, format!("invalid array metadata: {e}")))?;
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
        for d in 0..rank {
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
            shard,
            inner_reads: false,
            shard_indexes: std::sync::Mutex::new(HashMap::new()),
            window: None,
        })
    }

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
    fn inner_layout(&self) -> Option<&shard::ShardLayout> {
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
        let decoded = self.decode_inner(idx, bytes.as_deref().filter(|b| !b.is_empty()));
        if let Some(bytes) = bytes {
            bytes.recycle();
        }
        decoded
    }

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

    /// The store key of the chunk at grid index `idx`.
    pub fn chunk_key(&self, idx: &[u64]) -> String {
        match &self.window {
            None => self.stored_key(idx),
            Some(w) => self.stored_key(&w.target_index(idx)),
        }
    }

    /// The store key of stored chunk `t` (an index of the stored grid, also when windowed).
    fn stored_key(&self, t: &[u64]) -> String {
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
    fn stored_chunk_shape(&self, t: &[u64]) -> Result<Vec<u64>> {
        let shape = self
            .meta
            .chunk_shape(t)
            .map_err(|e| Error::internal(format!("chunk {t:?}: {e}")))?;
        Ok(shape.iter().map(|s| s.get()).collect())
    }

    /// Decodes the stored bytes of chunk `idx` (or the fill value when `bytes` is `None`)
    /// into a buffer covering exactly the chunk's region inside the array.
    pub fn decode_chunk(&self, idx: &[u64], bytes: Option<crate::store::Value>) -> Result<Buffer> {
        match &self.window {
            None => self.decode_stored(idx, &self.grid.chunk_region(idx), bytes),
            Some(w) => self.decode_window_chunk(w, idx, bytes),
        }
    }

    /// Decodes stored chunk `t` over `region` (its region in the stored array).
    fn decode_stored(
        &self,
        t: &[u64],
        region: &Region,
        bytes: Option<crate::store::Value>,
    ) -> Result<Buffer> {
        let Some(bytes) = bytes else {
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

    /// The part of a decoded (padded) chunk that lies inside the array.
    fn crop(&self, full: Buffer, region: &Region, encoded_shape: Vec<u64>) -> Result<Buffer> {
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
    fn encode_stored(
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

    /// Checks that this (existing) array has the shape (or, for a region write, holds the
    /// box `spec.region` starts, of `spec.shape`), dtype, chunks and shards `spec` asks for,
    /// so tasks planned for `spec` may write its chunks.
    pub fn check_matches(&self, spec: &ArraySpec) -> Result<()> {
        let info = self.info();
        let problem = if let Some(start) = &spec.region {
            window::check_box(start, &spec.shape, &self.shape()).err()
        } else if self.shape() != spec.shape {
            Some(format!(
                "its shape is {:?}, not {:?}",
                self.shape(),
                spec.shape
            ))
        } else {
            None
        };
        let problem = problem.or_else(|| {
            if self.dtype() != spec.dtype {
                Some(format!("its dtype is {}, not {}", self.dtype(), spec.dtype))
            } else if info.chunks != spec.chunks {
                Some(format!(
                    "its chunks are {:?}, not {:?}",
                    info.chunks, spec.chunks
                ))
            } else if info.shards != spec.shards {
                Some(format!(
                    "its shards are {:?}, not {:?}",
                    info.shards, spec.shards
                ))
            } else {
                None
            }
        });
        match problem {
            Some(p) => Err(Error::new(
                ErrorKind::Plan,
                format!("cannot write into the existing array: {p}"),
            )
            .with_store(self.url())),
            None => Ok(()),
        }
    }

    /// Creates (or replaces, when `spec.overwrite`) an array in `store` and writes its metadata.
    pub fn create(store: Arc<dyn Store>, spec: &ArraySpec) -> Result<Self> {
        Self::create_with(store, spec, &ArrayAttrs::default(), None)
    }
}

#[cfg(test)]
mod tests;
