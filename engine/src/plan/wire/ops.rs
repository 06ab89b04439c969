//! The wire types of ops (tagged by `op`) and of a write's codec (tagged by `name`).

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::expr::ExprWire;
use super::path::{at, take_tag, variant};
use crate::plan::{FftKind, ReduceFunc};

/// One operation, tagged by `op`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpWire {
    /// A fused elementwise expression.
    Elementwise(ElementwiseOp),
    /// A reduction.
    Reduce(ReduceOp),
    /// New chunking, same values.
    Rechunk(RechunkOp),
    /// Basic indexing.
    Slice(SliceOp),
    /// Axes reordered.
    Transpose(TransposeOp),
    /// Inputs joined along one axis.
    Concat(ConcatOp),
    /// A discrete Fourier transform.
    Fft(FftOp),
    /// A write to a Zarr store.
    Write(WriteOp),
}

/// The op names, in the order of [`OpWire`].
const OP_NAMES: [&str; 8] = [
    "elementwise",
    "reduce",
    "rechunk",
    "slice",
    "transpose",
    "concat",
    "fft",
    "write",
];

impl OpWire {
    /// The id of the array the op produces.
    pub fn id(&self) -> &str {
        match self {
            OpWire::Elementwise(o) => &o.id,
            OpWire::Reduce(o) => &o.id,
            OpWire::Rechunk(o) => &o.id,
            OpWire::Slice(o) => &o.id,
            OpWire::Transpose(o) => &o.id,
            OpWire::Concat(o) => &o.id,
            OpWire::Fft(o) => &o.id,
            OpWire::Write(o) => &o.id,
        }
    }
}

impl<'de> Deserialize<'de> for OpWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut map = Map::<String, Value>::deserialize(d)?;
        let name = take_tag(&mut map, "op")?;
        Ok(match name.as_str() {
            "elementwise" => OpWire::Elementwise(variant(map)?),
            "reduce" => OpWire::Reduce(variant(map)?),
            "rechunk" => OpWire::Rechunk(variant(map)?),
            "slice" => OpWire::Slice(variant(map)?),
            "transpose" => OpWire::Transpose(variant(map)?),
            "concat" => OpWire::Concat(variant(map)?),
            "fft" => OpWire::Fft(variant(map)?),
            "write" => OpWire::Write(variant(map)?),
            other => {
                return Err(at(
                    "op",
                    format!(
                        "unknown op \"{other}\"; must be one of {}",
                        OP_NAMES.join(", ")
                    ),
                ))
            }
        })
    }
}

/// `elementwise`: an expression over `inputs`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ElementwiseOp {
    /// The id of the result.
    pub id: String,
    /// Array or op ids, referred to by `{"input": i}`.
    pub inputs: Vec<String>,
    /// The expression.
    pub expr: ExprWire,
}

/// `reduce`: numpy's `np.<func>(x, axis=axes, keepdims=..., dtype=...)`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReduceOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// The reduction.
    #[schemars(schema_with = "reduce_funcs")]
    pub func: String,
    /// Axes (negative count from the end); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<Vec<i64>>,
    /// One axis (instead of `axes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axis: Option<i64>,
    /// Keep reduced axes with length 1 (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepdims: Option<bool>,
    /// Accumulation and result dtype (sum, prod, mean and their NaN-skipping forms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Delta degrees of freedom (var, std and their NaN-skipping forms; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddof: Option<f64>,
}

/// The schema of a string that is one of `names`.
fn one_of(names: Vec<&'static str>) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": names})
}

fn reduce_funcs(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    one_of(ReduceFunc::ALL.iter().map(|(n, _)| *n).collect())
}

/// `rechunk`: same values, new chunks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RechunkOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// Chunk shape: positive sizes, or -1 for the whole axis.
    pub chunks: Vec<i64>,
}

/// `slice`: numpy basic indexing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SliceOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// One item per leading axis.
    pub selection: Vec<SliceItemWire>,
}

/// A selection item: an index, `null` (the whole axis), `[start, stop, step]` (each may be
/// `null`) or `"newaxis"`; checked when the plan is read.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct SliceItemWire(#[schemars(with = "SliceItemSchema")] pub Value);

/// The shapes of a selection item (for the schema only).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum SliceItemSchema {
    Index(i64),
    All(()),
    Range(Vec<Option<i64>>),
    NewAxis(NewAxis),
}

/// `"newaxis"` (for the schema only).
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum NewAxis {
    Newaxis,
}

/// `transpose`: numpy's `transpose(x, axes)`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransposeOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// A permutation of the input's axes; the axes reversed when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<Vec<i64>>,
}

/// `concat`: numpy's `concatenate(inputs, axis)`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcatOp {
    /// The id of the result.
    pub id: String,
    /// Array or op ids, in order (at least one).
    pub inputs: Vec<String>,
    /// The axis (default 0; negative counts from the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axis: Option<i64>,
}

/// `fft`: `numpy.fft.<kind>`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FftOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// The transform: a 1-d kind or its n-d form (`fftn`, ...).
    #[schemars(schema_with = "fft_kinds")]
    pub kind: String,
    /// 1-d kinds: the axis (default -1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axis: Option<i64>,
    /// n-d kinds: the axes (default all, or the last `len(s)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<Vec<i64>>,
    /// 1-d kinds: the transform length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// n-d kinds: one transform length per axis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<Vec<i64>>,
    /// Normalisation (default backward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "fft_norms")]
    pub norm: Option<String>,
}

fn fft_kinds(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let one_d = FftKind::ALL.iter().map(|(n, _)| *n);
    let n_d = ["fftn", "ifftn", "rfftn", "irfftn"];
    one_of(one_d.chain(n_d).collect())
}

fn fft_norms(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    one_of(vec!["backward", "ortho", "forward"])
}

/// `write`: the input stored as a Zarr array.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteOp {
    /// The id of the result.
    pub id: String,
    /// Array or op id.
    pub input: String,
    /// Store URL or path.
    pub target: String,
    /// Chunk shape (positive sizes, or -1 for the whole axis); the input's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<i64>>,
    /// Shard shape (Zarr v3), each a multiple of `chunks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<i64>>,
    /// Compressor (default zstd level 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<CodecWire>,
    /// 2 or 3 (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 3))]
    pub zarr_format: Option<u8>,
    /// Replace an existing array at the target (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    /// Write into the array already at the target, keeping its metadata (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing: Option<bool>,
    /// With `existing`: where the input's box starts in the target, one start per axis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Vec<i64>>,
    /// The id of a plan array whose fill value, attributes and dimension names the target
    /// takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_from: Option<String>,
}

/// A write's compressor, tagged by `name`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum CodecWire {
    /// zstd.
    Zstd {
        /// Level (default 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<i64>,
    },
    /// gzip.
    Gzip {
        /// Level 0–9 (default 5).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<i64>,
    },
    /// Blosc.
    Blosc {
        /// Inner compressor (default lz4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cname: Option<String>,
        /// Level 0–9 (default 5).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clevel: Option<i64>,
        /// `noshuffle`, `shuffle` (default) or `bitshuffle`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shuffle: Option<String>,
    },
    /// No compression.
    None {},
}

/// The fields of each codec (for reading; the tagged enum above is the schema).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Level {
    #[serde(default)]
    level: Option<i64>,
}

/// Blosc's fields (for reading).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Blosc {
    #[serde(default)]
    cname: Option<String>,
    #[serde(default)]
    clevel: Option<i64>,
    #[serde(default)]
    shuffle: Option<String>,
}

/// No fields (for reading).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nothing {}

impl<'de> Deserialize<'de> for CodecWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut map = Map::<String, Value>::deserialize(d)?;
        let name = take_tag(&mut map, "name")?;
        Ok(match name.as_str() {
            "zstd" => CodecWire::Zstd {
                level: variant::<Level, _>(map)?.level,
            },
            "gzip" => CodecWire::Gzip {
                level: variant::<Level, _>(map)?.level,
            },
            "blosc" => {
                let b: Blosc = variant(map)?;
                CodecWire::Blosc {
                    cname: b.cname,
                    clevel: b.clevel,
                    shuffle: b.shuffle,
                }
            }
            "none" => {
                variant::<Nothing, _>(map)?;
                CodecWire::None {}
            }
            other => {
                return Err(at(
                    "name",
                    format!("unknown codec \"{other}\"; must be zstd, blosc, gzip or none"),
                ))
            }
        })
    }
}
