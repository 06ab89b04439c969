//! The plan IR: what to compute, as data. Parsed from JSON (`plans/*.json`), parameters
//! substituted, then validated and typed into a [`graph::Graph`] before anything runs.

pub mod expr;
pub mod fft_params;
pub mod graph;
pub mod node;
mod params;
mod parse;
mod typing;
pub mod view;
pub mod wire;

pub use expr::{Expr, Func, Scalar};
pub use params::substitute;
pub use typing::rechunk::chunk_sizes;

use crate::array::DType;
use crate::zarr::{ArrayAttrs, Codec};
use fft_params::FftNorm;

/// A parsed, untyped plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Shown in progress and errors.
    pub name: String,
    /// Input arrays.
    pub arrays: Vec<ArrayDecl>,
    /// Operations, in order.
    pub ops: Vec<OpDecl>,
    /// Groups the plan writes (the arrays in them are `write` targets).
    pub groups: Vec<GroupDecl>,
}

/// A Zarr group a plan writes: created before its arrays, marked unfinished until the run
/// completes, then (optionally) given consolidated metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDecl {
    /// Store URL or path of the group.
    pub target: String,
    /// A group whose attributes the target takes (and whose consolidation, by default).
    pub metadata_from: Option<String>,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Write consolidated metadata; `None`: when `metadata_from` has some.
    pub consolidated: Option<bool>,
    /// Replace whatever is at `target` (otherwise only the same job's unfinished output).
    pub overwrite: bool,
    /// JSON path of the declaration (`groups[0]`).
    pub field: String,
}

/// An input array read from a Zarr store.
#[derive(Debug, Clone)]
pub struct ArrayDecl {
    /// The id ops refer to.
    pub id: String,
    /// Store URL or path.
    pub url: String,
    /// Expected shape, checked against the store.
    pub shape: Option<Vec<u64>>,
    /// Expected dtype, checked against the store.
    pub dtype: Option<DType>,
    /// JSON path of the declaration (`arrays[0]`).
    pub field: String,
}

/// One operation and the id of the array it produces.
#[derive(Debug, Clone)]
pub struct OpDecl {
    /// The id of the result.
    pub id: String,
    /// What it computes.
    pub op: Op,
    /// JSON path of the op (`ops[2]`).
    pub field: String,
}

/// A reduction function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceFunc {
    /// `np.sum`
    Sum,
    /// `np.prod`
    Prod,
    /// `np.min`
    Min,
    /// `np.max`
    Max,
    /// `np.mean`
    Mean,
    /// `np.var`
    Var,
    /// `np.std`
    Std,
    /// `np.any`
    Any,
    /// `np.all`
    All,
    /// `np.argmin`
    Argmin,
    /// `np.argmax`
    Argmax,
    /// `np.nansum`
    NanSum,
    /// `np.nanmean`
    NanMean,
    /// `np.nanmin`
    NanMin,
    /// `np.nanmax`
    NanMax,
    /// `np.nanvar`
    NanVar,
    /// `np.nanstd`
    NanStd,
    /// `np.nanprod`
    NanProd,
    /// `np.nanargmin`: NaN values are skipped; a lane of NaN values only is an error.
    NanArgmin,
    /// `np.nanargmax`: NaN values are skipped; a lane of NaN values only is an error.
    NanArgmax,
}

impl ReduceFunc {
    /// Every function with its plan name.
    pub const ALL: [(&'static str, ReduceFunc); 20] = [
        ("sum", ReduceFunc::Sum),
        ("prod", ReduceFunc::Prod),
        ("min", ReduceFunc::Min),
        ("max", ReduceFunc::Max),
        ("mean", ReduceFunc::Mean),
        ("var", ReduceFunc::Var),
        ("std", ReduceFunc::Std),
        ("any", ReduceFunc::Any),
        ("all", ReduceFunc::All),
        ("argmin", ReduceFunc::Argmin),
        ("argmax", ReduceFunc::Argmax),
        ("nansum", ReduceFunc::NanSum),
        ("nanmean", ReduceFunc::NanMean),
        ("nanmin", ReduceFunc::NanMin),
        ("nanmax", ReduceFunc::NanMax),
        ("nanvar", ReduceFunc::NanVar),
        ("nanprod", ReduceFunc::NanProd),
        ("nanstd", ReduceFunc::NanStd),
        ("nanargmin", ReduceFunc::NanArgmin),
        ("nanargmax", ReduceFunc::NanArgmax),
    ];

    /// True for the functions that give indices (argmin, argmax and their NaN-skipping forms).
    pub fn is_arg(self) -> bool {
        matches!(
            self,
            ReduceFunc::Argmin | ReduceFunc::Argmax | ReduceFunc::NanArgmin | ReduceFunc::NanArgmax
        )
    }

    /// The plan name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// One entry of a slice selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceItem {
    /// An integer index (drops the axis); negative counts from the end.
    Index(i64),
    /// `start:stop:step`, each optional, as in numpy (a negative step walks backwards).
    Range {
        /// Start (negative counts from the end).
        start: Option<i64>,
        /// Stop (negative counts from the end).
        stop: Option<i64>,
        /// Step, not 0.
        step: i64,
    },
    /// A new axis of length 1 (numpy's `None`); it takes no input axis.
    NewAxis,
}

/// Which FFT of numpy's `fft` module an `fft` op computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FftKind {
    /// `fft` / `fftn`: complex forward.
    Fft,
    /// `ifft` / `ifftn`: complex inverse.
    Ifft,
    /// `rfft` / `rfftn`: real forward, the last axis halved.
    Rfft,
    /// `irfft` / `irfftn`: Hermitian inverse to real values.
    Irfft,
}

impl FftKind {
    /// Every 1-d kind with its plan name (the n-d names add an `n`).
    pub const ALL: [(&'static str, FftKind); 4] = [
        ("fft", FftKind::Fft),
        ("ifft", FftKind::Ifft),
        ("rfft", FftKind::Rfft),
        ("irfft", FftKind::Irfft),
    ];

    /// The 1-d name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, k)| *k == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// An `fft` op's transform.
#[derive(Debug, Clone, PartialEq)]
pub struct FftDecl {
    /// Which transform.
    pub kind: FftKind,
    /// Whether it is the n-d variant (`fftn`, ...).
    pub nd: bool,
    /// Axes (negative count from the end); `[-1]` for 1-d kinds and all axes for n-d kinds
    /// when `None`.
    pub axes: Option<Vec<i64>>,
    /// Transform lengths, one per axis (numpy's `n` / `s`); from the input when `None`.
    pub lengths: Option<Vec<i64>>,
    /// Normalisation.
    pub norm: FftNorm,
}

/// Where and how a `write` op stores its array.
#[derive(Debug, Clone)]
pub struct WriteSpec {
    /// Store URL or path.
    pub target: String,
    /// Chunk shape; the input's chunks when `None`.
    pub chunks: Option<Vec<u64>>,
    /// Shard shape (Zarr v3).
    pub shards: Option<Vec<u64>>,
    /// Compressor.
    pub codec: Codec,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Replace an existing array at the target.
    pub overwrite: bool,
    /// Write into the array already at the target, keeping its metadata (chunks, codecs,
    /// fill value, attributes): for arrays made by other tools (xarray, Cubed).
    pub existing: bool,
    /// With `existing`: where the box the input fills starts in the target (one start per
    /// axis; the box has the input's shape). Target chunks the box covers in part are read,
    /// merged and written whole; chunks outside it are not touched.
    pub region: Option<Vec<u64>>,
    /// The id of a plan array whose fill value, attributes and dimension names the target
    /// takes.
    pub metadata_from: Option<String>,
    /// What the target takes from `metadata_from`, set when the plan is validated.
    pub copied: Box<CopiedMetadata>,
}

/// The fill value, attributes and dimension names a `write` target takes from its
/// `metadata_from` array.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CopiedMetadata {
    /// The fill value (native-endian bytes; zero when `None`).
    pub fill: Option<Vec<u8>>,
    /// Attributes and dimension names.
    pub attrs: ArrayAttrs,
}

/// An operation.
#[derive(Debug, Clone)]
pub enum Op {
    /// A fused elementwise expression over `inputs`.
    Elementwise {
        /// Input array ids, referred to by `{"input": i}`.
        inputs: Vec<String>,
        /// The expression.
        expr: Expr,
    },
    /// A reduction.
    Reduce {
        /// Input array id.
        input: String,
        /// The function.
        func: ReduceFunc,
        /// Axes (negative count from the end); all when `None`.
        axes: Option<Vec<i64>>,
        /// Keep reduced axes with length 1.
        keepdims: bool,
        /// Accumulation and result dtype (sum, prod, mean).
        dtype: Option<DType>,
        /// Delta degrees of freedom (var, std).
        ddof: f64,
    },
    /// New chunking, same values.
    Rechunk {
        /// Input array id.
        input: String,
        /// New chunk shape; -1 means the whole axis.
        chunks: Vec<i64>,
    },
    /// Basic indexing.
    Slice {
        /// Input array id.
        input: String,
        /// One item per leading axis.
        selection: Vec<SliceItem>,
    },
    /// The input's axes reordered (numpy's `transpose`).
    Transpose {
        /// Input array id.
        input: String,
        /// Output axis k is input axis `axes[k]` (negative counts from the end); `None`
        /// reverses the axes.
        axes: Option<Vec<i64>>,
    },
    /// Inputs joined end to end along one axis (numpy's `concatenate`); they share a dtype
    /// and every other axis's length.
    Concat {
        /// Input array ids, in order.
        inputs: Vec<String>,
        /// The axis (negative counts from the end).
        axis: i64,
    },
    /// A discrete Fourier transform along whole axes.
    Fft {
        /// Input array id.
        input: String,
        /// The transform.
        fft: FftDecl,
    },
    /// Write to a Zarr store.
    Write {
        /// Input array id.
        input: String,
        /// Target and format.
        spec: WriteSpec,
    },
}

impl Op {
    /// The op's name as written in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Elementwise { .. } => "elementwise",
            Op::Reduce { .. } => "reduce",
            Op::Rechunk { .. } => "rechunk",
            Op::Slice { .. } => "slice",
            Op::Transpose { .. } => "transpose",
            Op::Concat { .. } => "concat",
            Op::Fft { .. } => "fft",
            Op::Write { .. } => "write",
        }
    }

    /// The ids of the arrays the op reads.
    pub fn inputs(&self) -> Vec<&str> {
        match self {
            Op::Elementwise { inputs, .. } | Op::Concat { inputs, .. } => {
                inputs.iter().map(String::as_str).collect()
            }
            Op::Reduce { input, .. }
            | Op::Rechunk { input, .. }
            | Op::Slice { input, .. }
            | Op::Transpose { input, .. }
            | Op::Fft { input, .. }
            | Op::Write { input, .. } => vec![input.as_str()],
        }
    }
}

impl Plan {
    /// Parses a plan from JSON text, substituting `params` first.
    pub fn from_json(
        text: &str,
        params: &std::collections::BTreeMap<String, String>,
    ) -> crate::error::Result<Plan> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            crate::error::Error::plan(
                format!("line {} column {}", e.line(), e.column()),
                format!("not valid JSON: {e}"),
            )
        })?;
        params::check_known(&value, params)?;
        let value = substitute(value, params)?;
        parse::plan(&value)
    }
}
