//! Typing of elementwise ops: numpy broadcasting of the inputs, and the expression typed
//! with numpy's promotion rules (weak Python constants included).

use crate::array::dtype::{Kind, Operand};
use crate::array::{AxisChunks, ChunkGrid, DType};
use crate::error::{Error, Result};
use crate::plan::expr::{resolve, Typed};
use crate::plan::node::{Node, NodeId, NodeKind, TExpr};
use crate::plan::{Expr, Func, Scalar};
use crate::plan_bail;

/// numpy broadcasting of several shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[u64]]) -> std::result::Result<Vec<u64>, String> {
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

/// The node computing `expr` over `inputs` broadcast together (numpy rules), typed with
/// numpy's promotion; each axis is chunked as the first input that spans it.
pub(crate) fn elementwise(
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
