//! Metadata documents for arrays the engine writes (Zarr v3, sharded or not; or Zarr v2).

use serde_json::{json, Value};

use super::attrs::{fill_json, ArrayAttrs};
use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};

/// The compressor of arrays the engine writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Codec {
    /// zstd at `level` (zarr-python's default is level 0, which zstd treats as 3).
    Zstd {
        /// Compression level.
        level: i32,
    },
    /// Blosc with a compressor name (`lz4`, `zstd`, `blosclz`, `zlib`), level and shuffle
    /// (`noshuffle`, `shuffle`, `bitshuffle`).
    Blosc {
        /// Inner compressor.
        cname: String,
        /// Level 0–9.
        clevel: u8,
        /// Shuffle mode.
        shuffle: String,
    },
    /// gzip at `level`.
    Gzip {
        /// Level 0–9.
        level: u32,
    },
    /// No compression.
    None,
}

impl Default for Codec {
    fn default() -> Self {
        Codec::Zstd { level: 3 }
    }
}

impl Codec {
    /// Parses the CLI form: `zstd[:LEVEL]`, `blosc[:CNAME[:CLEVEL[:SHUFFLE]]]`, `gzip[:LEVEL]`,
    /// `none`.
    pub fn parse_cli(text: &str) -> Result<Codec> {
        let parts: Vec<&str> = text.split(':').collect();
        let bad = || {
            Error::new(
                ErrorKind::Plan,
                format!(
                    "invalid codec \"{text}\"; must be zstd[:LEVEL], blosc[:CNAME[:CLEVEL[:SHUFFLE]]], gzip[:LEVEL] or none"
                ),
            )
        };
        let num = |i: usize, default: i64| -> Result<i64> {
            parts
                .get(i)
                .map_or(Ok(default), |p| p.parse().map_err(|_| bad()))
        };
        let codec = match parts[0] {
            "zstd" => Codec::Zstd {
                level: num(1, 3)? as i32,
            },
            "gzip" => Codec::Gzip {
                level: num(1, 5)? as u32,
            },
            "blosc" => Codec::Blosc {
                cname: parts.get(1).unwrap_or(&"lz4").to_string(),
                clevel: num(2, 5)? as u8,
                shuffle: parts.get(3).unwrap_or(&"shuffle").to_string(),
            },
            "none" => Codec::None,
            _ => return Err(bad()),
        };
        codec.validate()?;
        Ok(codec)
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::new(ErrorKind::Plan, m));
        match self {
            Codec::Zstd { level } if !(-7..=22).contains(level) => {
                bad(format!("zstd level must be in -7..=22, got {level}"))
            }
            Codec::Gzip { level } if *level > 9 => {
                bad(format!("gzip level must be in 0..=9, got {level}"))
            }
            Codec::Blosc {
                cname,
                clevel,
                shuffle,
            } => {
                if !["lz4", "lz4hc", "blosclz", "zstd", "zlib", "snappy"].contains(&cname.as_str())
                {
                    return bad(format!("unknown blosc cname \"{cname}\""));
                }
                if *clevel > 9 {
                    return bad(format!("blosc clevel must be in 0..=9, got {clevel}"));
                }
                if !["noshuffle", "shuffle", "bitshuffle"].contains(&shuffle.as_str()) {
                    return bad(format!(
                        "blosc shuffle must be noshuffle, shuffle or bitshuffle, got \"{shuffle}\""
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn v3(&self, dtype: DType) -> Option<Value> {
        match self {
            Codec::Zstd { level } => {
                Some(json!({"name": "zstd", "configuration": {"level": level, "checksum": false}}))
            }
            Codec::Gzip { level } => {
                Some(json!({"name": "gzip", "configuration": {"level": level}}))
            }
            Codec::Blosc {
                cname,
                clevel,
                shuffle,
            } => Some(json!({"name": "blosc", "configuration": {
                "cname": cname, "clevel": clevel, "shuffle": shuffle,
                "typesize": dtype.size(), "blocksize": 0}})),
            Codec::None => None,
        }
    }

    pub(super) fn v2(&self) -> Value {
        match self {
            Codec::Zstd { level } => json!({"id": "zstd", "level": level}),
            Codec::Gzip { level } => json!({"id": "gzip", "level": level}),
            Codec::Blosc {
                cname,
                clevel,
                shuffle,
            } => {
                let s = match shuffle.as_str() {
                    "noshuffle" => 0,
                    "shuffle" => 1,
                    _ => 2,
                };
                json!({"id": "blosc", "cname": cname, "clevel": clevel, "shuffle": s, "blocksize": 0})
            }
            Codec::None => Value::Null,
        }
    }
}

/// Everything needed to create an array.
#[derive(Debug, Clone)]
pub struct ArraySpec {
    /// Shape.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Chunk shape (inner chunks when sharded).
    pub chunks: Vec<u64>,
    /// Shard shape (v3 only): each entry a multiple of the chunk's.
    pub shards: Option<Vec<u64>>,
    /// Compressor.
    pub codec: Codec,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Native-endian bytes of the fill value (zero when `None`). A Zarr v2 array with
    /// dimension names takes its `_FillValue` attribute instead (see `zarr::attrs`).
    pub fill: Option<Vec<u8>>,
    /// Replace an existing array.
    pub overwrite: bool,
    /// Open the array already there (its shape, dtype and chunks must match) instead of
    /// creating one.
    pub existing: bool,
    /// With `existing`: write the box of the array there that starts here (one start per
    /// axis), of `shape`, instead of the whole array (see [`window`](super::window)).
    pub region: Option<Vec<u64>>,
}

fn v2_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "|b1",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
    }
}

/// Metadata documents of one node, each with its store key.
pub type Documents = Vec<(String, Vec<u8>)>;

/// The metadata documents of `spec` with `attrs` (and the job marker's value `marker` among
/// the attributes), each with its key: `zarr.json`, or `.zarray` then `.zattrs`.
pub fn metadata_documents(
    spec: &ArraySpec,
    attrs: &ArrayAttrs,
    marker: Option<&Value>,
) -> Result<Documents> {
    spec.codec.validate()?;
    let rank = spec.shape.len();
    let plan_err = |m: String| Err(Error::new(ErrorKind::Plan, m));
    if spec.chunks.len() != rank {
        return plan_err(format!(
            "chunks {:?} have {} entries but the array has rank {rank}",
            spec.chunks,
            spec.chunks.len()
        ));
    }
    if spec.chunks.contains(&0) {
        return plan_err(format!(
            "chunk sizes must be positive, got {:?}",
            spec.chunks
        ));
    }
    if let Some(names) = &attrs.dimension_names {
        if names.len() != rank {
            return plan_err(format!(
                "dimension names {names:?} have {} entries but the array has rank {rank}",
                names.len()
            ));
        }
    }
    let fill = spec
        .fill
        .clone()
        .unwrap_or_else(|| vec![0u8; spec.dtype.size()]);
    let fill_value = fill_json(spec.dtype, &fill);
    let (v2_attrs, v2_fill) = attrs.v2_fields(spec.dtype, &fill, marker);
    let compressor_v3 = spec.codec.v3(spec.dtype);
    let mut inner = vec![json!({"name": "bytes", "configuration": {"endian": "little"}})];
    if spec.dtype.size() == 1 {
        inner[0] = json!({"name": "bytes"});
    }
    inner.extend(compressor_v3);
    let doc = match (spec.zarr_format, &spec.shards) {
        (2, Some(_)) => return plan_err("shards need Zarr v3 (zarr_format 3)".to_string()),
        (2, None) => json!({
            "zarr_format": 2,
            "shape": spec.shape,
            "chunks": spec.chunks,
            "dtype": v2_dtype(spec.dtype),
            "compressor": spec.codec.v2(),
            "fill_value": v2_fill,
            "order": "C",
            "filters": null,
            "dimension_separator": ".",
        }),
        (3, shards) => {
            let (grid_chunks, codecs) = match shards {
                None => (spec.chunks.clone(), Value::Array(inner)),
                Some(shards) => {
                    if shards.len() != rank {
                        return plan_err(format!(
                            "shards {shards:?} have {} entries but the array has rank {rank}",
                            shards.len()
                        ));
                    }
                    for (s, c) in shards.iter().zip(&spec.chunks) {
                        if *s == 0 || s % c != 0 {
                            return plan_err(format!(
                                "each shard size must be a positive multiple of the chunk size: shards {shards:?}, chunks {:?}",
                                spec.chunks
                            ));
                        }
                    }
                    (
                        shards.clone(),
                        json!([{"name": "sharding_indexed", "configuration": {
                            "chunk_shape": spec.chunks,
                            "codecs": inner,
                            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                            "index_location": "end"}}]),
                    )
                }
            };
            let (attributes, names) = attrs.v3_fields(marker);
            let mut doc = json!({
                "zarr_format": 3,
                "node_type": "array",
                "shape": spec.shape,
                "data_type": spec.dtype.name(),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid_chunks}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": fill_value,
                "codecs": codecs,
                "attributes": attributes,
            });
            if let (Some(names), Some(map)) = (names, doc.as_object_mut()) {
                map.insert("dimension_names".to_string(), names);
            }
            doc
        }
        (v, _) => return plan_err(format!("zarr_format must be 2 or 3, got {v}")),
    };
    let json = |v: &Value| serde_json::to_vec_pretty(v).map_err(|e| Error::internal(e.to_string()));
    Ok(if spec.zarr_format == 2 {
        vec![
            (".zarray".to_string(), json(&doc)?),
            (".zattrs".to_string(), json(&v2_attrs)?),
        ]
    } else {
        vec![("zarr.json".to_string(), json(&doc)?)]
    })
}
