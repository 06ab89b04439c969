//! The typed graph's nodes: what each computes ([`NodeKind`]) over which inputs, with its
//! shape, dtype and chunk grid, and the typed specs the kinds hold.

use std::sync::Arc;

use super::expr::Signature;
use super::fft_params::{FftNorm, FftStep};
use super::view::View;
use super::{Func, ReduceFunc, Scalar, WriteSpec};
use crate::array::{ChunkGrid, DType};
use crate::zarr::ZarrArray;

/// Index of a node in [`Graph::nodes`](super::graph::Graph::nodes).
pub type NodeId = usize;

/// A typed expression: every argument already has its function's compute dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum TExpr {
    /// Input `idx` of the elementwise op, of dtype `dtype`.
    Input {
        /// Which input.
        idx: usize,
        /// Its dtype.
        dtype: DType,
    },
    /// A constant of a concrete dtype.
    Const {
        /// The value.
        value: Scalar,
        /// Its dtype.
        dtype: DType,
    },
    /// A function whose arguments have `sig.compute` (`where`: the condition is bool).
    Call {
        /// The function.
        func: Func,
        /// Compute and result dtypes.
        sig: Signature,
        /// Arguments.
        args: Vec<TExpr>,
    },
    /// A cast to `to`.
    Cast {
        /// Target dtype.
        to: DType,
        /// What is cast.
        arg: Box<TExpr>,
    },
}

impl TExpr {
    /// The dtype of the expression's value.
    pub fn dtype(&self) -> DType {
        match self {
            TExpr::Input { dtype, .. } | TExpr::Const { dtype, .. } => *dtype,
            TExpr::Call { sig, .. } => sig.result,
            TExpr::Cast { to, .. } => *to,
        }
    }
}

/// A typed reduction.
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceSpec {
    /// The input node.
    pub input: NodeId,
    /// The function.
    pub func: ReduceFunc,
    /// Reduced axes of the input, sorted.
    pub axes: Vec<usize>,
    /// Whether reduced axes stay (length 1).
    pub keepdims: bool,
    /// The dtype input values are cast to before accumulating.
    pub compute: DType,
    /// Delta degrees of freedom.
    pub ddof: f64,
}

/// A typed FFT: what the kernels run on each block.
#[derive(Debug, Clone, PartialEq)]
pub struct FftSpec {
    /// The input node.
    pub input: NodeId,
    /// The dtype input values are cast to before the first step.
    pub compute: DType,
    /// Steps in order, one per transformed axis.
    pub steps: Vec<FftStep>,
    /// Normalisation.
    pub norm: FftNorm,
}

impl FftSpec {
    /// The transformed axes.
    pub fn axes(&self) -> Vec<usize> {
        self.steps.iter().map(|s| s.axis).collect()
    }
}

/// What a node computes.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// A Zarr array read from a store.
    Source(Arc<ZarrArray>),
    /// A fused elementwise expression.
    Elementwise {
        /// Input nodes.
        inputs: Vec<NodeId>,
        /// The typed expression.
        expr: TExpr,
    },
    /// A reduction.
    Reduce(ReduceSpec),
    /// New chunking (the node's grid).
    Rechunk {
        /// Input node.
        input: NodeId,
    },
    /// Basic indexing: `view` maps this node's coordinates to the input's.
    Slice {
        /// Input node.
        input: NodeId,
        /// Output → input coordinates.
        view: View,
    },
    /// Inputs joined along `axis`; every input has this node's dtype and, off `axis`, its
    /// shape.
    Concat {
        /// Input nodes, in order.
        inputs: Vec<NodeId>,
        /// The joined axis.
        axis: usize,
    },
    /// A discrete Fourier transform; the transformed axes are whole in each chunk.
    Fft(FftSpec),
    /// Written to a Zarr store; the node's grid is the target's chunk grid.
    Write {
        /// Input node.
        input: NodeId,
        /// Where and how.
        spec: WriteSpec,
    },
}

impl NodeKind {
    /// The nodes this one reads, in order (none for a source).
    pub fn inputs(&self) -> &[NodeId] {
        use std::slice::from_ref;
        match self {
            NodeKind::Source(_) => &[],
            NodeKind::Elementwise { inputs, .. } | NodeKind::Concat { inputs, .. } => inputs,
            NodeKind::Reduce(r) => from_ref(&r.input),
            NodeKind::Fft(f) => from_ref(&f.input),
            NodeKind::Rechunk { input }
            | NodeKind::Slice { input, .. }
            | NodeKind::Write { input, .. } => from_ref(input),
        }
    }

    /// [`inputs`](Self::inputs), to rewrite.
    pub fn inputs_mut(&mut self) -> &mut [NodeId] {
        use std::slice::from_mut;
        match self {
            NodeKind::Source(_) => &mut [],
            NodeKind::Elementwise { inputs, .. } | NodeKind::Concat { inputs, .. } => inputs,
            NodeKind::Reduce(r) => from_mut(&mut r.input),
            NodeKind::Fft(f) => from_mut(&mut f.input),
            NodeKind::Rechunk { input }
            | NodeKind::Slice { input, .. }
            | NodeKind::Write { input, .. } => from_mut(input),
        }
    }
}

/// A validated, typed node.
#[derive(Debug, Clone)]
pub struct Node {
    /// The plan id.
    pub id: String,
    /// JSON path of the declaration.
    pub field: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Natural chunking.
    pub grid: ChunkGrid,
    /// What it computes.
    pub kind: NodeKind,
}
