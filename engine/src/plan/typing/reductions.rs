//! Typing of reductions: the reduced axes, numpy's accumulator and result dtypes, and the
//! reduced shape and chunking.

use crate::array::dtype::Kind;
use crate::array::{AxisChunks, ChunkGrid, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::node::{Node, NodeId, NodeKind, ReduceSpec};
use crate::plan::{OpDecl, ReduceFunc};
use crate::{plan_bail, plan_ensure};

fn normalise_axis(axis: i64, rank: usize, field: &str) -> Result<usize> {
    let r = rank as i64;
    plan_ensure!(
        rank != 0 && axis >= -r && axis < r,
        field,
        "axis {axis} is out of range for an array of rank {rank}"
    );
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// The input axes `func` reduces (all when `axes` is `None`), normalised and sorted: each
/// once, one (or all) for the arg reductions, none of length 0 for those with no identity.
fn reduced_axes(
    src: &Node,
    func: ReduceFunc,
    axes: Option<&[i64]>,
    field: &str,
) -> Result<Vec<usize>> {
    use ReduceFunc::*;
    let rank = src.shape.len();
    let mut axes: Vec<usize> = match axes {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .enumerate()
            .map(|(i, &x)| normalise_axis(x, rank, &format!("{field}.axes[{i}]")))
            .collect::<Result<_>>()?,
    };
    axes.sort_unstable();
    let before = axes.len();
    axes.dedup();
    plan_ensure!(
        axes.len() == before,
        format!("{field}.axes"),
        "duplicate axis"
    );
    if func.is_arg() {
        plan_ensure!(
            axes.len() <= 1 || axes.len() == rank,
            format!("{field}.axes"),
            "{} takes one axis (or none for the flattened array)",
            func.name()
        );
    }
    let reduced: u64 = axes.iter().map(|&a| src.shape[a]).product();
    if reduced == 0 && (func.is_arg() || matches!(func, Min | Max | NanMin | NanMax)) {
        plan_bail!(
            format!("{field}.axes"),
            "zero-size reduction: {} has no identity",
            func.name()
        );
    }
    Ok(axes)
}

/// The function numpy computes for `func` over values of `kind`: a nan-function of values
/// that cannot be NaN is the plain one.
fn without_nan(func: ReduceFunc, kind: Kind) -> ReduceFunc {
    use ReduceFunc::*;
    // numpy's nanvar and nanstd of integers and bools are var and std: no value is NaN, and
    // a lane with no degree of freedom left divides by zero rather than giving NaN.
    match (func, kind) {
        (NanVar, Kind::Bool | Kind::Int) => Var,
        (NanStd, Kind::Bool | Kind::Int) => Std,
        (NanProd, Kind::Bool | Kind::Int) => Prod,
        (NanArgmin, Kind::Bool | Kind::Int) => Argmin,
        (NanArgmax, Kind::Bool | Kind::Int) => Argmax,
        _ => func,
    }
}

/// The accumulator (compute) and result dtypes of `func` over values of dtype `t`, with the
/// requested `dtype` (only the sums, products and means take one).
fn reduce_dtypes(
    func: ReduceFunc,
    t: DType,
    dtype: Option<DType>,
    field: &str,
) -> Result<(DType, DType)> {
    use ReduceFunc::*;
    let kind = t.kind();
    if dtype.is_some() && !matches!(func, Sum | Prod | Mean | NanSum | NanMean | NanProd) {
        plan_bail!(
            format!("{field}.dtype"),
            "dtype is only accepted by sum, prod, mean, nansum, nanprod and nanmean"
        );
    }
    let int_acc = |t: DType| match t {
        DType::Bool | DType::I8 | DType::I16 | DType::I32 => DType::I64,
        DType::U8 | DType::U16 | DType::U32 => DType::U64,
        other => other,
    };
    let (compute, out) = match func {
        Sum | Prod | NanSum | NanProd => {
            let d = dtype.unwrap_or_else(|| int_acc(t));
            (d, d)
        }
        Mean | NanMean => {
            let d = dtype.unwrap_or(if matches!(kind, Kind::Bool | Kind::Int) {
                DType::F64
            } else {
                t
            });
            (d, d)
        }
        Var | Std | NanVar | NanStd => match kind {
            Kind::Complex => (t, t.real()),
            Kind::Bool | Kind::Int => (DType::F64, DType::F64),
            _ => (t, t),
        },
        Min | Max | NanMin | NanMax => (t, t),
        Any | All => (DType::Bool, DType::Bool),
        Argmin | Argmax | NanArgmin | NanArgmax => {
            if kind == Kind::Complex {
                return Err(Error::new(
                    ErrorKind::Plan,
                    format!("{} of complex arrays is not supported yet", func.name()),
                )
                .with_field(format!("{field}.func")));
            }
            (t, DType::I64)
        }
    };
    if matches!(func, Min | Max | NanMin | NanMax) && kind == Kind::Complex {
        return Err(Error::new(
            ErrorKind::Plan,
            format!("{} of complex arrays is not supported yet", func.name()),
        )
        .with_field(format!("{field}.func")));
    }
    Ok((compute, out))
}

/// The node of the reduction `op`: `func` of `input` over `axes` (all when `None`), with
/// numpy's `keepdims`, `dtype` and `ddof`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    nodes: &[Node],
    op: &OpDecl,
    input: NodeId,
    func: ReduceFunc,
    axes: Option<&[i64]>,
    keepdims: bool,
    dtype: Option<DType>,
    ddof: f64,
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let field = &op.field;
    let axes = reduced_axes(src, func, axes, field)?;
    let func = without_nan(func, src.dtype.kind());
    let (compute, out) = reduce_dtypes(func, src.dtype, dtype, field)?;
    let mut shape = Vec::new();
    let mut grid_axes = Vec::new();
    for d in 0..rank {
        if axes.contains(&d) {
            if keepdims {
                shape.push(1);
                grid_axes.push(AxisChunks::regular(1, 1)?);
            }
        } else {
            shape.push(src.shape[d]);
            grid_axes.push(src.grid.axes()[d].clone());
        }
    }
    Ok(Node {
        id: op.id.clone(),
        field: field.clone(),
        shape,
        dtype: out,
        grid: ChunkGrid::new(grid_axes),
        kind: NodeKind::Reduce(ReduceSpec {
            input,
            func,
            axes,
            keepdims,
            compute,
            ddof,
        }),
    })
}
