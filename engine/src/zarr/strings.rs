//! Arrays of strings, which the engine does not compute on: variable-length ones (Zarr v3
//! `string`, v2 `|O` with the `vlen-utf8` filter, as xarray writes object arrays) and
//! fixed-width ones (v3 `fixed_length_utf32`, v2 `<U`n, as xarray writes numpy unicode
//! arrays). They are recognised and rechunked value by value through zarrs' codecs, so that
//! a rechunked dataset keeps its string coordinates and labels (ERA5's `expver`, station
//! names); a target keeps its source's kind of string.
//!
//! One target chunk at a time: the source chunks it overlaps are decoded (held only while it
//! is built), its values gathered in C order, and it is encoded and written whole. Targets are
//! never sharded.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use zarrs::array::{
    data_type, Array, ArrayBytes, ArrayBytesOffsets, ArrayMetadata, ArrayToBytesCodecTraits,
};
use zarrs::storage::store::MemoryStore;

use super::attrs::{ArrayAttrs, FILL_ATTR, JOB_ATTR, V2_DIMENSIONS};
use super::create::{Codec, Documents};
use super::metadata;
use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{ReadRequest, Store};

/// How an array stores its strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Variable-length UTF-8.
    Utf8,
    /// Fixed-width UTF-32 (little-endian), this many bytes per value.
    Utf32(u64),
}

/// An open array of strings.
pub struct StringArray {
    url: String,
    kind: Kind,
    store: Arc<dyn Store>,
    meta: Array<MemoryStore>,
    attrs: ArrayAttrs,
    /// The (regular) grid's chunk shape.
    chunks: Vec<u64>,
}

/// What a string array is rechunked into: the target's chunks, compressor and format.
#[derive(Debug, Clone, PartialEq)]
pub struct StringTarget {
    /// Chunk shape.
    pub chunks: Vec<u64>,
    /// Compressor.
    pub codec: Codec,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Whether the target takes the source's attributes and dimension names (a write's
    /// `metadata_from`); its fill value it always takes.
    pub keep_attrs: bool,
}

/// What a rechunk of strings did: target chunks written, bytes read and written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Target chunks written.
    pub chunks: u64,
    /// Encoded source bytes read.
    pub read: u64,
    /// Encoded target bytes written.
    pub written: u64,
}

/// The values of one decoded chunk: C-order strings as bytes and their offsets.
struct Values {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Values {
    /// The bytes of value `i`, if the chunk holds it.
    fn get(&self, i: usize) -> Option<&[u8]> {
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.bytes.get(start..end)
    }
}

fn corrupt(msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, msg.to_string())
}

/// The next index of an odometer over `extent` (C order); false after the last.
fn advance(index: &mut [u64], extent: &[u64]) -> bool {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < extent[d] {
            return true;
        }
        index[d] = 0;
    }
    false
}

impl StringArray {
    /// Opens the array at the root of `store` when it holds strings; `None` for any other
    /// data type (the engine's own arrays).
    pub fn open(store: Arc<dyn Store>) -> Result<Option<StringArray>> {
        let (metadata, raw) = metadata::read(store.as_ref())?;
        Self::from_metadata(store, metadata, raw)
    }

    /// [`StringArray::open`] with the metadata already read (`raw`: the array document).
    pub(super) fn from_metadata(
        store: Arc<dyn Store>,
        metadata: ArrayMetadata,
        raw: Value,
    ) -> Result<Option<StringArray>> {
        let url = store.url().to_string();
        // A v2 document's null fill value (read as the empty string: see metadata::parse).
        let null_fill = matches!(metadata, ArrayMetadata::V2(_))
            && raw.get("fill_value").is_none_or(Value::is_null);
        let mut attrs = match &metadata {
            ArrayMetadata::V3(_) => ArrayAttrs::from_v3(&raw),
            ArrayMetadata::V2(m) => ArrayAttrs::from_v2(&m.attributes, None),
        };
        attrs.null_v2_fill = null_fill;
        let meta = Array::new_with_metadata(Arc::new(MemoryStore::new()), "/", metadata)
            .map_err(|e| super::metadata_error(e).with_store(&url))?;
        let kind = match meta.data_type().fixed_size() {
            None if meta.data_type() == &data_type::string() => Kind::Utf8,
            Some(n) => {
                let utf32 = std::num::NonZeroU64::new(n as u64)
                    .and_then(|n| data_type::fixed_length_utf32(n).ok());
                match utf32 {
                    Some(dt) if &dt == meta.data_type() => Kind::Utf32(n as u64),
                    _ => return Ok(None),
                }
            }
            None => return Ok(None),
        };
        let rank = meta.shape().len();
        let chunks: Vec<u64> = meta
            .chunk_shape(&vec![0; rank])
            .map_err(|e| corrupt(e).with_store(&url))?
            .iter()
            .map(|c| c.get())
            .collect();
        let regular = (0..rank).all(|d| {
            let len = meta.shape()[d];
            len == 0 || len.div_ceil(chunks[d]) == meta.chunk_grid_shape()[d]
        });
        if !regular {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "an array of strings with an irregular chunk grid",
            )
            .with_store(&url));
        }
        Ok(Some(StringArray {
            url,
            kind,
            store,
            meta,
            attrs,
            chunks,
        }))
    }

    /// The array's shape.
    pub fn shape(&self) -> &[u64] {
        self.meta.shape()
    }

    /// The array's chunk shape.
    pub fn chunks(&self) -> &[u64] {
        &self.chunks
    }

    /// Attributes and dimension names.
    pub fn attrs(&self) -> &ArrayAttrs {
        &self.attrs
    }

    /// The store URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The fill value's bytes (UTF-8, or for fixed-width strings UTF-32).
    fn fill(&self) -> &[u8] {
        self.meta.fill_value().as_ne_bytes()
    }

    /// The fill value as text.
    fn fill_text(&self) -> String {
        match self.kind {
            Kind::Utf8 => String::from_utf8_lossy(self.fill()).into_owned(),
            Kind::Utf32(_) => self
                .fill()
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&c| c != 0)
                .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect(),
        }
    }

    /// The decoded values of chunk `idx`; `None` when it is not stored (all fill values).
    /// Counts the bytes read in `copied`.
    fn chunk_values(&self, idx: &[u64], copied: &mut Copied) -> Result<Option<Values>> {
        let key = self.meta.chunk_key(idx).as_str().to_string();
        let bytes = self
            .store
            .get_many(vec![ReadRequest::whole(key.clone())])?
            .pop()
            .flatten();
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        copied.read += bytes.len() as u64;
        let context = |e: Error| e.with_chunk_key(&key).with_store(&self.url);
        let decoded = self
            .meta
            .codecs()
            .decode(
                Cow::Borrowed(&bytes),
                &super::nonzero_shape(&self.chunks)?,
                self.meta.data_type(),
                self.meta.fill_value(),
                &super::codec_options(),
            )
            .map_err(|e| context(corrupt(e)))?;
        let n: u64 = self.chunks.iter().product();
        let (bytes, offsets) = match self.kind {
            Kind::Utf8 => {
                let (bytes, offsets) = decoded
                    .into_variable()
                    .map_err(|e| context(corrupt(e)))?
                    .into_parts();
                (bytes.into_owned(), offsets.to_vec())
            }
            Kind::Utf32(width) => {
                let bytes = decoded.into_fixed().map_err(|e| context(corrupt(e)))?;
                let offsets = (0..=n).map(|i| (i * width) as usize).collect();
                (bytes.into_owned(), offsets)
            }
        };
        if offsets.len() as u64 != n + 1 {
            return Err(context(corrupt(format!(
                "the chunk holds {} strings, not {n}",
                offsets.len().saturating_sub(1)
            ))));
        }
        if offsets.last().is_some_and(|&end| end > bytes.len()) {
            return Err(context(corrupt("the chunk's strings run past its bytes")));
        }
        Ok(Some(Values { bytes, offsets }))
    }

    /// The metadata documents of the target `spec` describes, with `marker` (the job marker)
    /// among its attributes when given.
    pub fn target_documents(
        &self,
        spec: &StringTarget,
        marker: Option<&Value>,
    ) -> Result<Documents> {
        spec.codec.validate()?;
        let rank = self.shape().len();
        if spec.chunks.len() != rank || spec.chunks.contains(&0) {
            return Err(Error::new(
                ErrorKind::Plan,
                format!(
                    "chunks {:?} for an array of strings of shape {:?}",
                    spec.chunks,
                    self.shape()
                ),
            )
            .with_store(&self.url));
        }
        let fill = self.fill_text();
        let none = ArrayAttrs::default();
        let attrs = if spec.keep_attrs { &self.attrs } else { &none };
        match spec.zarr_format {
            2 => {
                let mut attributes: Map<String, Value> = attrs.attributes.clone();
                // xarray's arrays (those with dimension names) hold their _FillValue as the
                // v2 fill value, null without one; any other keeps its own, null staying null.
                let fill_value = match &attrs.dimension_names {
                    Some(names) => {
                        attributes.insert(V2_DIMENSIONS.to_string(), json!(names));
                        match attributes.remove(FILL_ATTR) {
                            Some(Value::String(f)) => json!(f),
                            Some(other) => {
                                attributes.insert(FILL_ATTR.to_string(), other);
                                Value::Null
                            }
                            // Missing chunks read as the fill value: one other than "" stays.
                            None if fill.is_empty() => Value::Null,
                            None => json!(fill),
                        }
                    }
                    None if attrs.null_v2_fill => Value::Null,
                    None => match self.kind {
                        Kind::Utf8 if fill.is_empty() => Value::Null,
                        _ => json!(fill),
                    },
                };
                if let Some(m) = marker {
                    attributes.insert(JOB_ATTR.to_string(), m.clone());
                }
                let doc = json!({
                    "zarr_format": 2,
                    "shape": self.shape(),
                    "chunks": spec.chunks,
                    "dtype": match self.kind {
                        Kind::Utf8 => "|O".to_string(),
                        Kind::Utf32(width) => format!("<U{}", width / 4),
                    },
                    "compressor": spec.codec.v2(),
                    "fill_value": fill_value,
                    "order": "C",
                    "filters": match self.kind {
                        Kind::Utf8 => json!([{"id": "vlen-utf8"}]),
                        Kind::Utf32(_) => Value::Null,
                    },
                    "dimension_separator": ".",
                });
                Ok(vec![
                    (".zarray".to_string(), super::target::pretty(&doc)?),
                    (
                        ".zattrs".to_string(),
                        super::target::pretty(&Value::Object(attributes))?,
                    ),
                ])
            }
            3 => {
                let (attributes, names) = attrs.v3_fields(marker);
                let (data_type, mut codecs) = match self.kind {
                    Kind::Utf8 => (
                        json!("string"),
                        vec![json!({"name": "vlen-utf8", "configuration": {}})],
                    ),
                    Kind::Utf32(width) => (
                        json!({"name": "fixed_length_utf32",
                               "configuration": {"length_bytes": width}}),
                        vec![json!({"name": "bytes", "configuration": {"endian": "little"}})],
                    ),
                };
                // Blosc shuffles by code unit: bytes of UTF-8, four-byte units of UTF-32.
                codecs.extend(spec.codec.v3(match self.kind {
                    Kind::Utf8 => DType::U8,
                    Kind::Utf32(_) => DType::U32,
                }));
                let mut doc = json!({
                    "zarr_format": 3,
                    "node_type": "array",
                    "shape": self.shape(),
                    "data_type": data_type,
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": spec.chunks}},
                    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                    "fill_value": fill,
                    "codecs": codecs,
                    "attributes": attributes,
                });
                if let Some(names) = names {
                    doc["dimension_names"] = names;
                }
                Ok(vec![(
                    "zarr.json".to_string(),
                    super::target::pretty(&doc)?,
                )])
            }
            f => Err(Error::new(
                ErrorKind::Plan,
                format!("zarr_format must be 2 or 3, got {f}"),
            )),
        }
    }

    /// Rechunks this array into `target` (whose store holds nothing the job may not
    /// replace): what is there goes, the metadata is written with `marker`, then every chunk,
    /// then the metadata without the marker. Stops with `Cancelled` between chunks once this
    /// thread's cancel flag is raised.
    pub fn rechunk_into(
        &self,
        target: &Arc<dyn Store>,
        spec: &StringTarget,
        marker: &Value,
    ) -> Result<Copied> {
        let marked = self.target_documents(spec, Some(marker))?;
        let finished = self.target_documents(spec, None)?;
        let turl = target.url().to_string();
        let (tmeta, _) = metadata::parse_documents(&finished)?;
        let tmeta = Array::new_with_metadata(Arc::new(MemoryStore::new()), "/", tmeta)
            .map_err(|e| Error::internal(format!("target metadata: {e}")))?;
        target.erase_prefix("")?;
        for (key, doc) in marked {
            target.set(&key, doc).map_err(|e| e.with_store(&turl))?;
        }
        let mut copied = Copied::default();
        let shape = self.shape().to_vec();
        let grid: Vec<u64> = shape
            .iter()
            .zip(&spec.chunks)
            .map(|(&s, &c)| s.div_ceil(c))
            .collect();
        if grid.iter().all(|&g| g > 0) {
            let mut at = vec![0u64; grid.len()];
            loop {
                if crate::cancel::requested() {
                    return Err(Error::cancelled());
                }
                let key = tmeta.chunk_key(&at).as_str().to_string();
                let bytes = self
                    .target_chunk(&tmeta, &at, &spec.chunks, &mut copied)
                    .map_err(|e| e.with_chunk_key(&key).with_store(&turl))?;
                copied.chunks += 1;
                copied.written += bytes.len() as u64;
                target.set(&key, bytes).map_err(|e| e.with_store(&turl))?;
                if !advance(&mut at, &grid) {
                    break;
                }
            }
        }
        for (key, doc) in finished {
            target.set(&key, doc).map_err(|e| e.with_store(&turl))?;
        }
        Ok(copied)
    }

    /// The encoded target chunk `at` of the grid of `chunks` (edge chunks padded with the
    /// fill value, as Zarr's regular grids store them); counts the bytes read in `copied`.
    fn target_chunk(
        &self,
        tmeta: &Array<MemoryStore>,
        at: &[u64],
        chunks: &[u64],
        copied: &mut Copied,
    ) -> Result<Vec<u8>> {
        let shape = self.shape();
        let rank = shape.len();
        let n: u64 = chunks.iter().product();
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n as usize + 1);
        offsets.push(0usize);
        let mut decoded: HashMap<Vec<u64>, Option<Values>> = HashMap::new();
        let mut pos = vec![0u64; rank];
        for _ in 0..n {
            let global: Vec<u64> = (0..rank).map(|d| at[d] * chunks[d] + pos[d]).collect();
            if global.iter().zip(shape).any(|(g, s)| g >= s) {
                bytes.extend_from_slice(self.fill());
            } else {
                let source: Vec<u64> = (0..rank).map(|d| global[d] / self.chunks[d]).collect();
                let within =
                    (0..rank).fold(0u64, |i, d| i * self.chunks[d] + global[d] % self.chunks[d]);
                if !decoded.contains_key(&source) {
                    let values = self.chunk_values(&source, copied)?;
                    decoded.insert(source.clone(), values);
                }
                match decoded.get(&source).and_then(Option::as_ref) {
                    None => bytes.extend_from_slice(self.fill()),
                    Some(values) => {
                        let value = values.get(within as usize).ok_or_else(|| {
                            corrupt(format!("chunk {source:?} lacks string {within}"))
                        })?;
                        bytes.extend_from_slice(value);
                    }
                }
            }
            offsets.push(bytes.len());
            advance(&mut pos, chunks);
        }
        let values = match self.kind {
            Kind::Utf8 => {
                let offsets =
                    ArrayBytesOffsets::new(offsets).map_err(|e| Error::internal(e.to_string()))?;
                ArrayBytes::new_vlen(bytes, offsets).map_err(|e| Error::internal(e.to_string()))?
            }
            Kind::Utf32(_) => ArrayBytes::new_flen(bytes),
        };
        let encoded = tmeta
            .codecs()
            .encode(
                values,
                &super::nonzero_shape(chunks)?,
                tmeta.data_type(),
                tmeta.fill_value(),
                &super::codec_options(),
            )
            .map_err(|e| Error::internal(format!("cannot encode strings: {e}")))?;
        Ok(encoded.into_owned())
    }
}
