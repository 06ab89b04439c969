//! Elementwise programs lifted out of joins: a join whose inputs all apply one elementwise
//! expression to inputs of their own shape is the expression applied to the joins of those
//! inputs. Frontends that apply a ufunc block by block before joining the blocks back (Dask's
//! `abs(fftshift(...))`, a rechunk after a per-block map) then join what the blocks read, which
//! the join rules (see [`super::joins`]) read as one leaf, instead of computing every block's
//! program into an intermediate of its own.

use crate::plan::graph::Graph;
use crate::plan::node::{Node, NodeId, NodeKind, TExpr};

/// `graph` with every join of like elementwise nodes rewritten as the elementwise expression
/// of joins (see the module doc). The nodes keep their ids; the joins made for the inputs of
/// a lifted expression are named after the join they replace (`ID/input K`).
pub fn elementwise_out_of_joins(graph: &Graph) -> Graph {
    let mut nodes: Vec<Node> = Vec::with_capacity(graph.nodes.len());
    let mut moved: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let mut node = node.clone();
        for i in node.kind.inputs_mut() {
            *i = moved[*i];
        }
        if let NodeKind::Concat { inputs, axis } = &node.kind {
            if let Some((expr, columns)) = like_programs(&nodes, inputs) {
                let axis = *axis;
                let joined: Vec<NodeId> = columns
                    .into_iter()
                    .enumerate()
                    .map(|(k, column)| {
                        nodes.push(Node {
                            id: format!("{}/input {k}", node.id),
                            field: node.field.clone(),
                            shape: node.shape.clone(),
                            dtype: nodes[column[0]].dtype,
                            grid: node.grid.clone(),
                            kind: NodeKind::Concat {
                                inputs: column,
                                axis,
                            },
                        });
                        nodes.len() - 1
                    })
                    .collect();
                node.kind = NodeKind::Elementwise {
                    inputs: joined,
                    expr,
                };
            }
        }
        nodes.push(node);
        moved.push(nodes.len() - 1);
    }
    Graph {
        name: graph.name.clone(),
        nodes,
    }
}

/// When every node of `inputs` is an elementwise node of one expression whose inputs have
/// its shape and, input by input, one dtype: the expression and, for each of its inputs, the
/// nodes it reads in the join's order.
fn like_programs(nodes: &[Node], inputs: &[NodeId]) -> Option<(TExpr, Vec<Vec<NodeId>>)> {
    let (first_expr, first_inputs) = elementwise(nodes.get(*inputs.first()?)?)?;
    if first_inputs.is_empty() {
        return None;
    }
    let mut columns: Vec<Vec<NodeId>> = vec![Vec::with_capacity(inputs.len()); first_inputs.len()];
    for &i in inputs {
        let node = &nodes[i];
        let (expr, ins) = elementwise(node)?;
        if expr != first_expr || ins.len() != first_inputs.len() {
            return None;
        }
        for (k, (&j, column)) in ins.iter().zip(&mut columns).enumerate() {
            let same_dtype = nodes[j].dtype == nodes[first_inputs[k]].dtype;
            if nodes[j].shape != node.shape || !same_dtype {
                return None;
            }
            column.push(j);
        }
    }
    Some((first_expr.clone(), columns))
}

fn elementwise(node: &Node) -> Option<(&TExpr, &[NodeId])> {
    match &node.kind {
        NodeKind::Elementwise { inputs, expr } => Some((expr, inputs)),
        _ => None,
    }
}
