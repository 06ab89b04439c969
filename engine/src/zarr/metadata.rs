//! Reading, parsing and describing Zarr v2 and v3 array metadata.

use serde::Serialize;
use zarrs::array::{Array, ArrayMetadata, ArrayMetadataV2, ArrayMetadataV3};
use zarrs::storage::store::MemoryStore;

use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{ReadRequest, Store};

/// The metadata keys of an array at the store root.
const V3_KEY: &str = "zarr.json";
const V2_KEY: &str = ".zarray";
const V2_ATTRS_KEY: &str = ".zattrs";

/// True when the store root holds array metadata of either version.
pub fn exists(store: &dyn Store) -> Result<bool> {
    Ok(store.size_of(V3_KEY)?.is_some() || store.size_of(V2_KEY)?.is_some())
}

/// Reads and parses the metadata at the store root, v3 first.
pub fn read(store: &dyn Store) -> Result<(ArrayMetadata, serde_json::Value)> {
    // Zarr v3 first: one request for the common case (a round trip on object storage);
    // the v2 documents only when there is no zarr.json.
    let v3 = store
        .get_many(vec![ReadRequest::whole(V3_KEY)])?
        .pop()
        .flatten();
    let (v2, attrs) = if v3.is_some() {
        (None, None)
    } else {
        let mut docs = store
            .get_many(vec![
                ReadRequest::whole(V2_KEY),
                ReadRequest::whole(V2_ATTRS_KEY),
            ])?
            .into_iter();
        (docs.next().flatten(), docs.next().flatten())
    };
    let (doc, key) = match (v3, v2) {
        (Some(d), _) => (d, V3_KEY),
        (None, Some(d)) => (d, V2_KEY),
        (None, None) => {
            let root = std::path::Path::new(store.url());
            let v2_group = store.size_of(".zgroup").ok().flatten().is_some();
            let msg = if v2_group {
                GROUP_NOT_ARRAY
            } else if store.url().contains("://") || root.exists() {
                "no Zarr array here (neither zarr.json nor .zarray found)"
            } else {
                "no such file or directory"
            };
            return Err(Error::store(store.url(), msg));
        }
    };
    let mut metadata = parse(&doc, key).map_err(|e| e.with_store(store.url()))?;
    if let (ArrayMetadata::V2(m), Some(attrs)) = (&mut metadata, attrs) {
        m.attributes = serde_json::from_slice(&attrs).map_err(|e| {
            Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}"))
                .with_chunk_key(V2_ATTRS_KEY)
        })?;
    }
    let raw = serde_json::from_slice(&doc).map_err(|e| {
        Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}")).with_chunk_key(key)
    })?;
    Ok((metadata, raw))
}

/// Parses the documents of one array as [`create::metadata_documents`](super::create) makes
/// them (`zarr.json`, or `.zarray` then `.zattrs`): the metadata, with a v2 array's
/// attributes, and the raw array document.
pub fn parse_documents(docs: &[(String, Vec<u8>)]) -> Result<(ArrayMetadata, serde_json::Value)> {
    let Some((key, doc)) = docs.first() else {
        return Err(Error::internal("no metadata document"));
    };
    let mut metadata = parse(doc, key)?;
    if let (ArrayMetadata::V2(m), Some((attrs_key, attrs))) = (&mut metadata, docs.get(1)) {
        m.attributes = serde_json::from_slice(attrs).map_err(|e| {
            Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}")).with_chunk_key(attrs_key)
        })?;
    }
    let raw = serde_json::from_slice(doc).map_err(|e| {
        Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}")).with_chunk_key(key)
    })?;
    Ok((metadata, raw))
}

/// What opening a group as an array says.
const GROUP_NOT_ARRAY: &str = "this is a Zarr group, not an array; name the array inside it";

/// Parses a metadata document stored under `key` (`zarr.json` or `.zarray`).
pub fn parse(doc: &[u8], key: &str) -> Result<ArrayMetadata> {
    let corrupt = |e: serde_json::Error| {
        Error::new(ErrorKind::Corrupt, format!("invalid array metadata: {e}")).with_chunk_key(key)
    };
    if key == V3_KEY {
        let value: serde_json::Value = serde_json::from_slice(doc).map_err(corrupt)?;
        if value.get("node_type").and_then(|v| v.as_str()) == Some("group") {
            return Err(Error::new(ErrorKind::Store, GROUP_NOT_ARRAY));
        }
        let m: ArrayMetadataV3 = serde_json::from_value(value).map_err(corrupt)?;
        Ok(ArrayMetadata::V3(m))
    } else {
        let mut m: ArrayMetadataV2 = serde_json::from_slice(doc).map_err(corrupt)?;
        null_fill_as_default(&mut m).map_err(|e| e.with_chunk_key(key))?;
        Ok(ArrayMetadata::V2(m))
    }
}

/// zarr-python and xarray write `fill_value: null` (no fill value) for numpy unicode (`<U`n)
/// and complex arrays in Zarr v2, which zarrs refuses for those types: they read as
/// zarr-python reads them, the empty string and 0. (The raw document keeps the null, so a
/// v2 copy keeps it too.)
fn null_fill_as_default(m: &mut ArrayMetadataV2) -> Result<()> {
    if !serde_json::to_value(&m.fill_value).is_ok_and(|v| v.is_null()) {
        return Ok(());
    }
    let dtype = serde_json::to_value(&m.dtype).unwrap_or_default();
    let default = match dtype.as_str().and_then(|d| d.get(1..2)) {
        Some("U") => serde_json::json!(""),
        Some("c") => serde_json::json!([0.0, 0.0]),
        _ => return Ok(()),
    };
    m.fill_value = serde_json::from_value(default)
        .map_err(|e| Error::internal(format!("a default fill value: {e}")))?;
    Ok(())
}

/// A summary of an array for `chunkfuse info`.
#[derive(Debug, Clone, Serialize)]
pub struct ArrayInfo {
    /// 2 or 3.
    pub zarr_format: u8,
    /// Shape.
    pub shape: Vec<u64>,
    /// numpy dtype name.
    pub dtype: String,
    /// Chunk shape (the inner chunk shape for sharded arrays).
    pub chunks: Vec<u64>,
    /// Shard shape, for sharded arrays.
    pub shards: Option<Vec<u64>>,
    /// Codec names in order (v2: filters then compressor).
    pub codecs: Vec<String>,
    /// The fill value as written in the metadata.
    pub fill_value: serde_json::Value,
    /// Bytes of the decoded array.
    pub nbytes: u64,
}

/// Describes an array from its parsed metadata and the raw JSON document.
pub fn describe(meta: &Array<MemoryStore>, raw: &serde_json::Value, dtype: DType) -> ArrayInfo {
    let shape = meta.shape().to_vec();
    let storage_chunks: Vec<u64> = meta
        .chunk_shape(&vec![0; shape.len()])
        .map(|s| s.iter().map(|v| v.get()).collect())
        .unwrap_or_else(|_| shape.clone());
    let nbytes = shape.iter().product::<u64>() * dtype.size() as u64;
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.get("name").and_then(|n| n.as_str()).map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    if raw.get("zarr_format").and_then(|v| v.as_u64()) == Some(2) {
        let mut codecs: Vec<String> = raw
            .get("filters")
            .and_then(|f| f.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.get("id").and_then(|n| n.as_str()).map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(c) = raw.get("compressor").filter(|c| !c.is_null()) {
            let id = c.get("id").and_then(|n| n.as_str()).unwrap_or("?");
            let detail = c
                .get("cname")
                .and_then(|n| n.as_str())
                .map(|cn| format!("{id}({cn})"))
                .unwrap_or_else(|| id.to_string());
            codecs.push(detail);
        }
        if raw.get("order").and_then(|o| o.as_str()) == Some("F") {
            codecs.insert(0, "order F".to_string());
        }
        return ArrayInfo {
            zarr_format: 2,
            shape,
            dtype: dtype.name().to_string(),
            chunks: storage_chunks,
            shards: None,
            codecs,
            fill_value: raw.get("fill_value").cloned().unwrap_or_default(),
            nbytes,
        };
    }
    let codecs_json = raw.get("codecs").cloned().unwrap_or_default();
    let sharding = codecs_json.as_array().and_then(|a| {
        a.iter()
            .find(|c| c.get("name").and_then(|n| n.as_str()) == Some("sharding_indexed"))
            .cloned()
    });
    let (chunks, shards, codecs) = match sharding {
        Some(s) => {
            let cfg = s.get("configuration").cloned().unwrap_or_default();
            let inner: Vec<u64> = cfg
                .get("chunk_shape")
                .and_then(|c| serde_json::from_value(c.clone()).ok())
                .unwrap_or_else(|| storage_chunks.clone());
            let mut codecs = names(&codecs_json);
            codecs.extend(
                names(cfg.get("codecs").unwrap_or(&serde_json::Value::Null))
                    .into_iter()
                    .map(|n| format!("inner {n}")),
            );
            (inner, Some(storage_chunks), codecs)
        }
        None => (storage_chunks, None, names(&codecs_json)),
    };
    ArrayInfo {
        zarr_format: 3,
        shape,
        dtype: dtype.name().to_string(),
        chunks,
        shards,
        codecs,
        fill_value: raw.get("fill_value").cloned().unwrap_or_default(),
        nbytes,
    }
}
