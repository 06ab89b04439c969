//! Validation and typing: a [`Plan`] becomes a [`Graph`] of nodes with shapes, dtypes and
//! chunk grids, its sources opened and checked. Nothing is written here.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::expr::{resolve, Typed};
use super::node::{Node, NodeId, NodeKind, ReduceSpec, TExpr};
use super::view::{View, ViewAxis};
use super::{Expr, Func, Op, Plan, ReduceFunc, Scalar, SliceItem, WriteSpec};
use crate::array::dtype::{Kind, Operand};
use crate::array::{AxisChunks, ChunkGrid, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::store::open_store;
use crate::zarr::{ArraySpec, ZarrArray};
use crate::{plan_bail, plan_ensure};

/// A validated plan.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Plan name.
    pub name: String,
    /// Nodes in dependency order.
    pub nodes: Vec<Node>,
}

impl Graph {
    /// Validates and types `plan`, opening its sources with `io_threads` IO threads each.
    pub fn build(plan: &Plan, io_threads: usize) -> Result<Graph> {
        let mut nodes: Vec<Node> = Vec::new();
        let mut by_id: HashMap<String, NodeId> = HashMap::new();
        for a in &plan.arrays {
            let store = open_store(&a.url, io_threads)
                .map_err(|e| e.with_field(format!("{}.zarr", a.field)))?;
            // Sharded sources are read inner chunk by inner chunk, like the engine's own
            // intermediates: tasks then decode in parallel and hold one inner chunk each,
            // not a whole shard.
            let arr = ZarrArray::open(store)
                .map_err(|e| e.with_array(&a.id))?
                .with_name(&a.id)
                .with_inner_reads();
            if let Some(shape) = &a.shape {
                plan_ensure!(
                    *shape == arr.shape(),
                    format!("{}.shape", a.field),
                    "declared shape {shape:?} but the store holds {:?}",
                    arr.shape()
                );
            }
            if let Some(dtype) = a.dtype {
                plan_ensure!(
                    dtype == arr.dtype(),
                    format!("{}.dtype", a.field),
                    "declared dtype {dtype} but the store holds {}",
                    arr.dtype()
                );
            }
            by_id.insert(a.id.clone(), nodes.len());
            nodes.push(Node {
                id: a.id.clone(),
                field: a.field.clone(),
                shape: arr.shape(),
                dtype: arr.dtype(),
                // Computation follows the units read: a sharded source's inner chunks.
                grid: arr.read_grid().clone(),
                kind: NodeKind::Source(Arc::new(arr)),
            });
        }
        let source_urls: Vec<String> = plan.arrays.iter().map(|a| normalise_url(&a.url)).collect();
        // Each target written: its URL, the op and, for writes into existing arrays, the
        // chunks written.
        let mut targets: Vec<(String, String, Option<ChunkRanges>)> = Vec::new();
        for op in &plan.ops {
            let lookup = |name: &str, field: String| -> Result<NodeId> {
                let id = by_id.get(name).copied().ok_or_else(|| {
                    Error::plan(
                        &field,
                        format!("no array or op with id \"{name}\" is defined before this op"),
                    )
                })?;
                if let NodeKind::Write { spec, .. } = &nodes[id].kind {
                    plan_ensure!(
                        spec.region.is_none(),
                        field,
                        "\"{name}\" writes a region of \"{}\"; a plan cannot read a region write",
                        spec.target
                    );
                }
                Ok(id)
            };
            let node = match &op.op {
                Op::Elementwise { inputs, expr } => {
                    let ids = inputs
                        .iter()
                        .enumerate()
                        .map(|(i, n)| lookup(n, format!("{}.inputs[{i}]", op.field)))
                        .collect::<Result<Vec<_>>>()?;
                    elementwise(&nodes, op.id.clone(), op.field.clone(), ids, expr)?
                }
                Op::Reduce {
                    input,
                    func,
                    axes,
                    keepdims,
                    dtype,
                    ddof,
                } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    reduce(
                        &nodes,
                        op,
                        input,
                        *func,
                        axes.as_deref(),
                        *keepdims,
                        *dtype,
                        *ddof,
                    )?
                }
                Op::Rechunk { input, chunks } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    let src = &nodes[input];
                    plan_ensure!(
                        chunks.len() == src.shape.len(),
                        format!("{}.chunks", op.field),
                        "chunks {chunks:?} have {} entries but \"{}\" has rank {}",
                        chunks.len(),
                        src.id,
                        src.shape.len()
                    );
                    let sizes: Vec<u64> = chunks
                        .iter()
                        .zip(&src.shape)
                        .map(|(&c, &n)| if c == -1 { n.max(1) } else { c as u64 })
                        .collect();
                    Node {
                        id: op.id.clone(),
                        field: op.field.clone(),
                        shape: src.shape.clone(),
                        dtype: src.dtype,
                        grid: ChunkGrid::regular(&src.shape, &sizes)
                            .map_err(|e| e.with_field(format!("{}.chunks", op.field)))?,
                        kind: NodeKind::Rechunk { input },
                    }
                }
                Op::Slice { input, selection } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    slice(&nodes, op.id.clone(), op.field.clone(), input, selection)?
                }
                Op::Transpose { input, axes } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    transpose(
                        &nodes,
                        op.id.clone(),
                        op.field.clone(),
                        input,
                        axes.as_deref(),
                    )?
                }
                Op::Concat { inputs, axis } => {
                    let ids = inputs
                        .iter()
                        .enumerate()
                        .map(|(i, n)| lookup(n, format!("{}.inputs[{i}]", op.field)))
                        .collect::<Result<Vec<_>>>()?;
                    concat(&nodes, op.id.clone(), op.field.clone(), ids, *axis)?
                }
                Op::Fft { input, fft } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    super::fft::fft_node(&nodes, op.id.clone(), op.field.clone(), input, fft)?
                }
                Op::Write { input, spec } => {
                    let input = lookup(input, format!("{}.input", op.field))?;
                    let url = normalise_url(&spec.target);
                    plan_ensure!(
                        !source_urls.contains(&url),
                        format!("{}.target", op.field),
                        "the target \"{}\" is also an input of this plan",
                        spec.target
                    );
                    let like = match &spec.metadata_from {
                        Some(id) => Some(lookup(id, format!("{}.metadata_from", op.field))?),
                        None => None,
                    };
                    let (node, touched) =
                        write(&nodes, op.id.clone(), op.field.clone(), input, spec, like)?;
                    // Writes into one existing array may share it, never a chunk of it: each
                    // chunk has one writer (a chunk covered in part is read, merged and
                    // rewritten whole).
                    for (other, other_id, other_touched) in &targets {
                        if *other != url {
                            continue;
                        }
                        let (Some(a), Some(b)) = (&touched, other_touched) else {
                            plan_bail!(
                                format!("{}.target", op.field),
                                "\"{}\" is written by two ops",
                                spec.target
                            );
                        };
                        if let Some(chunk) = shared_chunk(a, b) {
                            plan_bail!(
                                format!("{}.region", op.field),
                                "this write and op \"{other_id}\" both write chunk {chunk:?} of \
                                 \"{}\"; each chunk of a target may have only one writer in a plan",
                                spec.target
                            );
                        }
                    }
                    targets.push((url, op.id.clone(), touched));
                    node
                }
            };
            by_id.insert(op.id.clone(), nodes.len());
            nodes.push(node);
        }
        plan_ensure!(
            nodes
                .iter()
                .any(|n| matches!(n.kind, NodeKind::Write { .. })),
            "ops",
            "the plan writes nothing: add a \"write\" op"
        );
        Ok(Graph {
            name: plan.name.clone(),
            nodes,
        })
    }
}

fn normalise_url(url: &str) -> String {
    let p = url.strip_prefix("file://").unwrap_or(url);
    let p = p.trim_end_matches('/');
    std::fs::canonicalize(p)
        .map(|c| c.display().to_string())
        .unwrap_or_else(|_| p.to_string())
}

/// numpy broadcasting of several shapes.
pub fn broadcast_shapes(shapes: &[&[u64]]) -> std::result::Result<Vec<u64>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1u64; rank];
    for s in shapes {
        let off = rank - s.len();
        for (j, &n) in s.iter().enumerate() {
            let o = &mut out[off + j];
            if *o == 1 {
                *o = n;
            } else if n != 1 && n != *o {
                return Err(format!(
                    "shapes {:?} cannot be broadcast together",
                    shapes.iter().map(|s| s.to_vec()).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(out)
}

fn elementwise(
    nodes: &[Node],
    id: String,
    field: String,
    inputs: Vec<NodeId>,
    expr: &Expr,
) -> Result<Node> {
    let shapes: Vec<&[u64]> = inputs.iter().map(|&i| nodes[i].shape.as_slice()).collect();
    let shape = broadcast_shapes(&shapes).map_err(|m| Error::plan(format!("{field}.inputs"), m))?;
    let dtypes: Vec<DType> = inputs.iter().map(|&i| nodes[i].dtype).collect();
    let (texpr, ty) = type_expr(expr, &dtypes, &format!("{field}.expr"))?;
    let texpr = concretize(texpr, ty, ty.dtype(), &format!("{field}.expr"))?;
    // Chunking: each axis from the first input that spans it.
    let mut axes = Vec::with_capacity(shape.len());
    for (o, &n) in shape.iter().enumerate() {
        let from = inputs.iter().find_map(|&i| {
            let node = &nodes[i];
            let off = shape.len() - node.shape.len();
            (o >= off && node.shape[o - off] == n).then(|| node.grid.axes()[o - off].clone())
        });
        axes.push(match from {
            Some(a) => a,
            None => AxisChunks::regular(n, n.max(1))?,
        });
    }
    Ok(Node {
        id,
        field,
        dtype: texpr.dtype(),
        shape,
        grid: ChunkGrid::new(axes),
        kind: NodeKind::Elementwise {
            inputs,
            expr: texpr,
        },
    })
}

/// Types `expr`; weak constants are left for the parent to concretize.
fn type_expr(expr: &Expr, inputs: &[DType], path: &str) -> Result<(TExpr, Typed)> {
    match expr {
        Expr::Input(i) => Ok((
            TExpr::Input {
                idx: *i,
                dtype: inputs[*i],
            },
            Operand::Strong(inputs[*i]),
        )),
        Expr::Const(v, Some(d)) => {
            v.check_fits(*d).map_err(|m| Error::plan(path, m))?;
            check_const_kind(*v, *d, path)?;
            Ok((
                TExpr::Const {
                    value: *v,
                    dtype: *d,
                },
                Operand::Strong(*d),
            ))
        }
        Expr::Const(v, None) => Ok((
            TExpr::Const {
                value: *v,
                dtype: v.weak_kind().default_dtype(),
            },
            Operand::Weak(v.weak_kind()),
        )),
        Expr::AsType(d, arg) => {
            let (t, ty) = type_expr(arg, inputs, &format!("{path}.args[0]"))?;
            let t = concretize(t, ty, ty.dtype(), &format!("{path}.args[0]"))?;
            // A cast to the dtype it already has is no cast: a plain copy stays a plain copy.
            let t = if t.dtype() == *d {
                t
            } else {
                TExpr::Cast {
                    to: *d,
                    arg: Box::new(t),
                }
            };
            Ok((t, Operand::Strong(*d)))
        }
        Expr::Call(func, args) => {
            let typed = args
                .iter()
                .enumerate()
                .map(|(i, a)| type_expr(a, inputs, &format!("{path}.args[{i}]")))
                .collect::<Result<Vec<_>>>()?;
            let tys: Vec<Typed> = typed.iter().map(|(_, t)| *t).collect();
            let sig = resolve(*func, &tys).map_err(|e| e.with_field(format!("{path}.op")))?;
            let mut out_args = Vec::with_capacity(typed.len());
            for (i, (t, ty)) in typed.into_iter().enumerate() {
                let to = if *func == Func::Where && i == 0 {
                    DType::Bool
                } else {
                    sig.compute
                };
                out_args.push(concretize(t, ty, to, &format!("{path}.args[{i}]"))?);
            }
            // A call whose arguments are all weak constants is itself weak (Python arithmetic).
            let all_weak = tys.iter().all(|t| matches!(t, Operand::Weak(_)));
            let ty = if all_weak && !func.is_predicate() {
                match promote_weak(&tys) {
                    Some(w) => Operand::Weak(w),
                    None => Operand::Strong(sig.result),
                }
            } else {
                Operand::Strong(sig.result)
            };
            Ok((
                TExpr::Call {
                    func: *func,
                    sig,
                    args: out_args,
                },
                ty,
            ))
        }
    }
}

fn promote_weak(tys: &[Typed]) -> Option<crate::array::dtype::WeakKind> {
    tys.iter()
        .filter_map(|t| match t {
            Operand::Weak(w) => Some(*w),
            Operand::Strong(_) => None,
        })
        .max_by_key(|w| *w as u8)
}

fn check_const_kind(v: Scalar, d: DType, path: &str) -> Result<()> {
    if matches!(v, Scalar::Complex(..)) && d.kind() != Kind::Complex {
        plan_bail!(path, "a complex constant cannot have dtype {d}");
    }
    Ok(())
}

/// Gives weak constants the dtype `to` and casts strong values whose dtype differs.
fn concretize(t: TExpr, ty: Typed, to: DType, path: &str) -> Result<TExpr> {
    match (t, ty) {
        (TExpr::Const { value, .. }, Operand::Weak(_)) => {
            value.check_fits(to).map_err(|m| Error::plan(path, m))?;
            Ok(TExpr::Const { value, dtype: to })
        }
        (t, Operand::Weak(_)) if t.dtype() != to => {
            // A weak sub-expression (arithmetic on constants) computed in its default type.
            Ok(TExpr::Cast {
                to,
                arg: Box::new(t),
            })
        }
        (t, _) if t.dtype() == to => Ok(t),
        (t, _) => Ok(TExpr::Cast {
            to,
            arg: Box::new(t),
        }),
    }
}

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

#[allow(clippy::too_many_arguments)]
fn reduce(
    nodes: &[Node],
    op: &super::OpDecl,
    input: NodeId,
    func: ReduceFunc,
    axes: Option<&[i64]>,
    keepdims: bool,
    dtype: Option<DType>,
    ddof: f64,
) -> Result<Node> {
    use ReduceFunc::*;
    let src = &nodes[input];
    let rank = src.shape.len();
    let field = &op.field;
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
    let t = src.dtype;
    let kind = t.kind();
    // numpy's nanvar and nanstd of integers and bools are var and std: no value is NaN, and
    // a lane with no degree of freedom left divides by zero rather than giving NaN.
    let func = match (func, kind) {
        (NanVar, Kind::Bool | Kind::Int) => Var,
        (NanStd, Kind::Bool | Kind::Int) => Std,
        (NanProd, Kind::Bool | Kind::Int) => Prod,
        (NanArgmin, Kind::Bool | Kind::Int) => Argmin,
        (NanArgmax, Kind::Bool | Kind::Int) => Argmax,
        _ => func,
    };
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

/// The node joining `inputs` along `axis`: same rank and dtype, equal lengths off `axis`;
/// its chunks are the inputs' chunks along `axis` one after another, the first input's
/// elsewhere.
fn concat(
    nodes: &[Node],
    id: String,
    field: String,
    inputs: Vec<NodeId>,
    axis: i64,
) -> Result<Node> {
    let first = &nodes[inputs[0]];
    let rank = first.shape.len();
    plan_ensure!(
        rank > 0,
        format!("{field}.inputs[0]"),
        "\"{}\" is a scalar (rank 0): there is no axis to join along",
        first.id
    );
    let r = rank as i64;
    plan_ensure!(
        (-r..r).contains(&axis),
        format!("{field}.axis"),
        "axis {axis} is out of range for arrays of rank {rank}"
    );
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    let mut sizes: Vec<u64> = Vec::new();
    for (i, &j) in inputs.iter().enumerate() {
        let n = &nodes[j];
        let path = format!("{field}.inputs[{i}]");
        plan_ensure!(
            n.dtype == first.dtype,
            &path,
            "\"{}\" has dtype {} but \"{}\" has {}: cast the inputs to one dtype first",
            n.id,
            n.dtype,
            first.id,
            first.dtype
        );
        let same =
            n.shape.len() == rank && (0..rank).all(|d| d == axis || n.shape[d] == first.shape[d]);
        plan_ensure!(
            same,
            &path,
            "\"{}\" has shape {:?}, which cannot join {:?} of \"{}\" along axis {axis}",
            n.id,
            n.shape,
            first.shape,
            first.id
        );
        shape[axis] += n.shape[axis];
        sizes.extend(n.grid.axes()[axis].sizes());
    }
    let mut grid_axes = first.grid.axes().to_vec();
    grid_axes[axis] = AxisChunks::from_sizes(&sizes)?;
    Ok(Node {
        id,
        field,
        dtype: first.dtype,
        shape,
        grid: ChunkGrid::new(grid_axes),
        kind: NodeKind::Concat { inputs, axis },
    })
}

/// numpy's `start:stop:step` over an axis of `n`: the first index it takes and how many.
fn range_of(start: Option<i64>, stop: Option<i64>, step: i64, n: i64) -> (u64, u64) {
    // Bounds clamp to [0, n] walking forwards, to [-1, n - 1] walking backwards (-1 standing
    // for "before the first index").
    let (lo, hi) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let clamp = |v: i64| (if v < 0 { v + n } else { v }).clamp(lo, hi);
    let (s, e) = match step > 0 {
        true => (start.map(clamp).unwrap_or(0), stop.map(clamp).unwrap_or(n)),
        false => (
            start.map(clamp).unwrap_or(n - 1),
            stop.map(clamp).unwrap_or(-1),
        ),
    };
    let len = match step > 0 {
        true if e > s => (e - s + step - 1) / step,
        false if s > e => (s - e - step - 1) / -step,
        _ => 0,
    };
    (s.max(0) as u64, len as u64)
}

/// The chunks along an axis sliced from `first` by `step` (`len` indices) of an input axis
/// chunked as `input`. A backwards walk of single steps takes the input's chunks in reverse
/// (each output chunk lies in one input chunk); any other slice is chunked regularly, as
/// many indices per chunk as the input chunk's length holds at that step.
fn sliced_chunks(input: &AxisChunks, first: u64, step: i64, len: u64) -> Result<AxisChunks> {
    if len == 0 {
        return AxisChunks::from_sizes(&[]);
    }
    if step == -1 {
        let low = first + 1 - len;
        let sizes: Vec<u64> = input
            .overlapping(low, len)
            .rev()
            .map(|k| {
                let (s, l) = input.chunk(k);
                (s + l).min(first + 1) - s.max(low)
            })
            .collect();
        return AxisChunks::from_sizes(&sizes);
    }
    if step > 0 {
        // Each input chunk's selected indices make one chunk (as Dask slices): every chunk of
        // the selection then lies inside one input chunk, which its readers read in place.
        let step = step as u64;
        let last = first + step * (len - 1);
        let sizes: Vec<u64> = input
            .overlapping(first, last + 1 - first)
            .map(|k| {
                let (s, l) = input.chunk(k);
                // Selected positions i (first + step * i) inside [s, s + l).
                let lo = s.saturating_sub(first).div_ceil(step);
                let hi = (s + l).saturating_sub(first).div_ceil(step).min(len);
                hi.saturating_sub(lo)
            })
            .filter(|&n| n > 0)
            .collect();
        return AxisChunks::from_sizes(&sizes);
    }
    let nominal = input.regular_size().unwrap_or(input.max_size());
    let c = (nominal / step.unsigned_abs()).max(1);
    AxisChunks::regular(len, c.min(len))
}

fn slice(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    sel: &[SliceItem],
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let indexed = sel
        .iter()
        .filter(|s| !matches!(s, SliceItem::NewAxis))
        .count();
    plan_ensure!(
        indexed <= rank,
        format!("{field}.selection"),
        "{indexed} indices for an array of rank {rank}"
    );
    let all = SliceItem::Range {
        start: None,
        stop: None,
        step: 1,
    };
    let items = sel
        .iter()
        .copied()
        .chain(std::iter::repeat_n(all, rank - indexed));
    let mut view_axes = Vec::with_capacity(rank);
    let mut shape = Vec::new();
    let mut grid_axes = Vec::new();
    // The input axis the next index or range takes.
    let mut d = 0;
    for (k, item) in items.enumerate() {
        let path = format!("{field}.selection[{k}]");
        if item == SliceItem::NewAxis {
            shape.push(1);
            grid_axes.push(AxisChunks::regular(1, 1)?);
            continue;
        }
        let n = src.shape[d] as i64;
        match item {
            SliceItem::Index(i) => {
                let j = if i < 0 { i + n } else { i };
                plan_ensure!(
                    (0..n).contains(&j),
                    &path,
                    "index {i} is out of bounds for axis {d} with size {n}"
                );
                view_axes.push(ViewAxis::Fixed(j as u64));
            }
            SliceItem::Range { start, stop, step } => {
                let (s, len) = range_of(start, stop, step, n);
                let out_axis = shape.len();
                view_axes.push(ViewAxis::Mapped {
                    out_axis,
                    start: s,
                    step,
                });
                shape.push(len);
                grid_axes.push(sliced_chunks(&src.grid.axes()[d], s, step, len)?);
            }
            SliceItem::NewAxis => {}
        }
        d += 1;
    }
    Ok(Node {
        id,
        field,
        dtype: src.dtype,
        shape,
        grid: ChunkGrid::new(grid_axes),
        kind: NodeKind::Slice {
            input,
            view: View { axes: view_axes },
        },
    })
}

/// numpy's `transpose(x, axes)`: a view whose output axis k reads input axis `axes[k]`.
fn transpose(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    axes: Option<&[i64]>,
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let path = format!("{field}.axes");
    let order: Vec<usize> = match axes {
        None => (0..rank).rev().collect(),
        Some(axes) => {
            plan_ensure!(
                axes.len() == rank,
                &path,
                "{} axes for an array of rank {rank}",
                axes.len()
            );
            let mut seen = vec![false; rank];
            let mut order = Vec::with_capacity(rank);
            for &a in axes {
                let d = if a < 0 { a + rank as i64 } else { a };
                plan_ensure!(
                    (0..rank as i64).contains(&d),
                    &path,
                    "axis {a} is out of range for an array of rank {rank}"
                );
                plan_ensure!(!seen[d as usize], &path, "axis {a} appears twice");
                seen[d as usize] = true;
                order.push(d as usize);
            }
            order
        }
    };
    let mut view_axes = vec![ViewAxis::Fixed(0); rank];
    for (k, &d) in order.iter().enumerate() {
        view_axes[d] = ViewAxis::Mapped {
            out_axis: k,
            start: 0,
            step: 1,
        };
    }
    Ok(Node {
        id,
        field,
        dtype: src.dtype,
        shape: order.iter().map(|&d| src.shape[d]).collect(),
        grid: ChunkGrid::new(order.iter().map(|&d| src.grid.axes()[d].clone()).collect()),
        kind: NodeKind::Slice {
            input,
            view: View { axes: view_axes },
        },
    })
}

/// A write node, with the target chunks it writes (their index ranges along each axis) when
/// it writes into an existing array.
fn write(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    spec: &WriteSpec,
    like: Option<NodeId>,
) -> Result<(Node, Option<ChunkRanges>)> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let existing_spec;
    let mut existing = None;
    let spec = if spec.existing {
        let (s, target) = existing_target(src, &field, spec)?;
        existing_spec = s;
        existing = Some(target);
        &existing_spec
    } else {
        spec
    };
    let chunks: Vec<u64> = match &spec.chunks {
        Some(c) => {
            plan_ensure!(
                c.len() == rank,
                format!("{field}.chunks"),
                "chunks {c:?} have {} entries but \"{}\" has rank {rank}",
                c.len(),
                src.id
            );
            c.iter()
                .zip(&src.shape)
                .map(|(&c, &n)| if c == 0 { n.max(1) } else { c })
                .collect()
        }
        None => src.grid.chunk_shape().iter().map(|&c| c.max(1)).collect(),
    };
    let storage = match &spec.shards {
        Some(s) => {
            plan_ensure!(
                s.len() == rank,
                format!("{field}.shards"),
                "shards {s:?} have {} entries but \"{}\" has rank {rank}",
                s.len(),
                src.id
            );
            let s: Vec<u64> = s
                .iter()
                .zip(&src.shape)
                .map(|(&c, &n)| if c == 0 { n.max(1) } else { c })
                .collect();
            for (d, (sh, c)) in s.iter().zip(&chunks).enumerate() {
                plan_ensure!(
                    sh % c == 0,
                    format!("{field}.shards[{d}]"),
                    "shard size {sh} is not a multiple of the chunk size {c}"
                );
            }
            s
        }
        None => chunks.clone(),
    };
    // Whether the target may be replaced (overwrite, or this job's unfinished output) is
    // checked when the job's fingerprint is known, before anything is written.
    let mut spec = spec.clone();
    if let Some(like) = like {
        let (fill, attrs) = metadata_of(&nodes[like], src, &field)?;
        spec.copied = Box::new(super::CopiedMetadata {
            fill: Some(fill),
            attrs,
        });
    }
    spec.chunks = Some(chunks);
    if spec.shards.is_some() {
        spec.shards = Some(storage.clone());
    }
    // A region write's tasks fill the window of its box (target chunks cut to the box).
    let (grid, touched) = match existing {
        Some(ExistingTarget { window, touched }) => (window, Some(touched)),
        None => (None, None),
    };
    let grid = match grid {
        Some(g) => g,
        None => ChunkGrid::regular(&src.shape, &storage)
            .map_err(|e| e.with_field(format!("{field}.chunks")))?,
    };
    let node = Node {
        id,
        field: field.clone(),
        shape: src.shape.clone(),
        dtype: src.dtype,
        grid,
        kind: NodeKind::Write { input, spec },
    };
    Ok((node, touched))
}

/// Target chunks: index ranges along each axis.
type ChunkRanges = Vec<Range<usize>>;

/// What a write into an existing array learns of its target.
struct ExistingTarget {
    /// The grid of a region write's window (see `zarr::window`).
    window: Option<ChunkGrid>,
    /// The target chunks written.
    touched: ChunkRanges,
}

/// The fill value and attributes that a write of `src` takes from the plan array `like` (its
/// `metadata_from`), which must have `src`'s rank and dtype.
fn metadata_of(like: &Node, src: &Node, field: &str) -> Result<(Vec<u8>, crate::zarr::ArrayAttrs)> {
    let path = format!("{field}.metadata_from");
    let NodeKind::Source(arr) = &like.kind else {
        plan_bail!(
            path,
            "\"{}\" is an op; metadata_from names an array of \"arrays\"",
            like.id
        );
    };
    plan_ensure!(
        like.shape.len() == src.shape.len() && like.dtype == src.dtype,
        path,
        "\"{}\" ({} of rank {}) cannot give its fill value and dimension names to \"{}\" ({} of rank {}): they need the same dtype and rank",
        like.id,
        like.dtype,
        like.shape.len(),
        src.id,
        src.dtype,
        src.shape.len()
    );
    Ok((arr.fill_bytes().to_vec(), arr.attrs().clone()))
}

/// The write spec for writing into the array already at `spec.target` (into the box at
/// `spec.region` when given): its chunks, shards and format, after checking that it can hold
/// `src`.
fn existing_target(
    src: &Node,
    field: &str,
    spec: &WriteSpec,
) -> Result<(WriteSpec, ExistingTarget)> {
    let store = open_store(&spec.target, 1).map_err(|e| e.with_field(format!("{field}.target")))?;
    let arr = ZarrArray::open(store).map_err(|e| e.with_field(format!("{field}.target")))?;
    let info = arr.info();
    if let Some(start) = &spec.region {
        crate::zarr::window::check_box(start, &src.shape, &arr.shape()).map_err(|m| {
            Error::plan(
                format!("{field}.region"),
                format!("the box \"{}\" fills does not fit the target: {m}", src.id),
            )
        })?;
    }
    let want = ArraySpec {
        shape: src.shape.clone(),
        dtype: src.dtype,
        chunks: info.chunks.clone(),
        shards: info.shards.clone(),
        codec: spec.codec.clone(),
        zarr_format: info.zarr_format,
        fill: None,
        overwrite: false,
        existing: true,
        region: spec.region.clone(),
    };
    arr.check_matches(&want)
        .map_err(|e| e.with_field(format!("{field}.target")))?;
    let zeros = vec![0; src.shape.len()];
    let start = spec.region.as_deref().unwrap_or(&zeros);
    let touched = crate::zarr::window::touched_chunks(arr.grid(), start, &src.shape);
    let window = match &spec.region {
        Some(start) => Some(
            crate::zarr::window::box_grid(arr.grid(), start, &src.shape)
                .map_err(|e| e.with_field(format!("{field}.region")))?,
        ),
        None => None,
    };
    let mut out = spec.clone();
    out.chunks = Some(info.chunks.clone());
    out.shards = info.shards.clone();
    out.zarr_format = info.zarr_format;
    Ok((out, ExistingTarget { window, touched }))
}

/// The first target chunk (index ranges along each axis) that both `a` and `b` write, if any.
fn shared_chunk(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<usize>> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let lo = x.start.max(y.start);
            (lo < x.end.min(y.end)).then_some(lo)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes(&[&[3, 1, 5], &[4, 1]]).unwrap(),
            vec![3, 4, 5]
        );
        assert!(broadcast_shapes(&[&[3], &[4]]).is_err());
    }

    #[test]
    fn slices_clamp_like_numpy_and_take_their_input_chunks() {
        // numpy's bounds: walking backwards, a start past the end clamps to the last index
        // and a stop before the start clamps to "before index 0".
        assert_eq!(range_of(None, None, -1, 10), (9, 10));
        assert_eq!(range_of(Some(100), Some(-100), -4, 10), (9, 3));
        assert_eq!(range_of(Some(-1), Some(-20), -4, 9), (8, 3));
        assert_eq!(range_of(Some(2), Some(2), -1, 10).1, 0);
        assert_eq!(range_of(Some(0), None, -1, 10), (0, 1));
        assert_eq!(range_of(None, None, -1, 0).1, 0);
        assert_eq!(range_of(Some(-3), None, 2, 10), (7, 2));
        // A reversed axis takes the input's chunks in reverse.
        let axis = AxisChunks::from_sizes(&[4, 4, 2]).unwrap();
        let chunks = sliced_chunks(&axis, 8, -1, 7).unwrap();
        assert_eq!(chunks.sizes(), vec![1, 4, 2]);
        // A forward selection takes each input chunk's selected indices as one chunk.
        let axis = AxisChunks::from_sizes(&[181, 181, 181, 178]).unwrap();
        // Rows 100, 102, ..., 598: 41 in the first chunk, then 90, 91 and 28.
        assert_eq!(
            sliced_chunks(&axis, 100, 2, 250).unwrap().sizes(),
            vec![41, 90, 91, 28]
        );
        // A step past the chunk size skips chunks that hold no selected index.
        let axis = AxisChunks::regular(20, 3).unwrap();
        assert_eq!(
            sliced_chunks(&axis, 1, 7, 3).unwrap().sizes(),
            vec![1, 1, 1]
        );
        assert_eq!(
            sliced_chunks(&axis, 0, 1, 20).unwrap().sizes(),
            axis.sizes()
        );
        assert_eq!(sliced_chunks(&axis, 4, 1, 5).unwrap().sizes(), vec![2, 3]);
    }

    #[test]
    fn weak_constants_take_the_array_dtype() {
        let e = Expr::Call(
            Func::Add,
            vec![Expr::Input(0), Expr::Const(Scalar::Int(1), None)],
        );
        let (t, ty) = type_expr(&e, &[DType::F32], "expr").unwrap();
        assert_eq!(ty, Operand::Strong(DType::F32));
        let TExpr::Call { args, .. } = t else {
            panic!()
        };
        assert_eq!(
            args[1],
            TExpr::Const {
                value: Scalar::Int(1),
                dtype: DType::F32
            }
        );
    }

    #[test]
    fn out_of_range_python_int_is_an_error() {
        let e = Expr::Call(
            Func::Add,
            vec![Expr::Input(0), Expr::Const(Scalar::Int(300), None)],
        );
        let err = type_expr(&e, &[DType::U8], "expr").unwrap_err();
        assert_eq!(err.context.field.as_deref(), Some("expr.args[1]"));
    }
}
