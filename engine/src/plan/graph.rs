//! Validation and typing: a [`Plan`] becomes a [`Graph`] of nodes with shapes, dtypes and
//! chunk grids, its sources opened and checked. Nothing is written here. This file walks the
//! plan in order; each op family's typing is in `typing/`.

use std::collections::HashMap;
use std::sync::Arc;

use super::node::{Node, NodeId, NodeKind};
use super::typing::{elementwise, fft, joins, rechunk, reductions, slices, stores};
use super::{ArrayDecl, Op, OpDecl, Plan, WriteSpec};
use crate::error::{Error, Result};
use crate::store::open_store;
use crate::zarr::ZarrArray;
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
        Self::build_part(plan, io_threads, false)
    }

    /// [`Graph::build`] for the part of a job the engine types; with `written_beside` (the
    /// job writes arrays outside the graph: arrays of strings), a graph that writes nothing
    /// is no error.
    pub fn build_part(plan: &Plan, io_threads: usize, written_beside: bool) -> Result<Graph> {
        let mut nodes: Vec<Node> = Vec::new();
        let mut by_id: HashMap<String, NodeId> = HashMap::new();
        for a in &plan.arrays {
            let node = source(a, io_threads)?;
            by_id.insert(a.id.clone(), nodes.len());
            nodes.push(node);
        }
        let source_urls = plan
            .arrays
            .iter()
            .map(|a| stores::normalise_url(&a.url))
            .collect();
        let mut builder = Builder {
            nodes,
            by_id,
            source_urls,
            targets: Vec::new(),
        };
        for op in &plan.ops {
            let node = builder.op(op)?;
            builder.by_id.insert(op.id.clone(), builder.nodes.len());
            builder.nodes.push(node);
        }
        // A group the plan writes is created over whatever is at its target: it must hold
        // none of the sources (nor lie inside one).
        for g in &plan.groups {
            let url = stores::normalise_url(&g.target);
            let sources = builder.source_urls.iter();
            let from = g.metadata_from.as_deref().map(stores::normalise_url);
            if let Some(source) = sources.chain(&from).find(|s| stores::overlap(s, &url)) {
                plan_bail!(
                    format!("{}.target", g.field),
                    "the group \"{}\" and the input \"{source}\" hold one another: a plan \
                     never writes into its sources' stores; write elsewhere",
                    g.target
                );
            }
        }
        let nodes = builder.nodes;
        plan_ensure!(
            written_beside
                || nodes
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

/// The source node of the plan array `a`: its store opened with `io_threads` IO threads, and
/// its declared shape and dtype checked against the store.
fn source(a: &ArrayDecl, io_threads: usize) -> Result<Node> {
    let store =
        open_store(&a.url, io_threads).map_err(|e| e.with_field(format!("{}.zarr", a.field)))?;
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
    Ok(Node {
        id: a.id.clone(),
        field: a.field.clone(),
        shape: arr.shape(),
        dtype: arr.dtype(),
        // Computation follows the units read: a sharded source's inner chunks.
        grid: arr.read_grid().clone(),
        kind: NodeKind::Source(Arc::new(arr)),
    })
}

/// What typing the plan's ops in order knows so far.
struct Builder {
    /// The nodes typed so far, sources first.
    nodes: Vec<Node>,
    /// Node of each array or op id.
    by_id: HashMap<String, NodeId>,
    /// The sources' URLs, normalised.
    source_urls: Vec<String>,
    /// Each target written: its URL, the op and, for writes into existing arrays, the chunks
    /// written.
    targets: Vec<(String, String, Option<stores::ChunkRanges>)>,
}

impl Builder {
    /// The node that `name` names, for the op's input at `field`.
    fn lookup(&self, name: &str, field: String) -> Result<NodeId> {
        let id = self.by_id.get(name).copied().ok_or_else(|| {
            Error::plan(
                &field,
                format!("no array or op with id \"{name}\" is defined before this op"),
            )
        })?;
        if let NodeKind::Write { spec, .. } = &self.nodes[id].kind {
            plan_ensure!(
                spec.region.is_none(),
                field,
                "\"{name}\" writes a region of \"{}\"; a plan cannot read a region write",
                spec.target
            );
        }
        Ok(id)
    }

    /// The nodes of an op's `inputs` (the op at `field`).
    fn lookup_all(&self, inputs: &[String], field: &str) -> Result<Vec<NodeId>> {
        inputs
            .iter()
            .enumerate()
            .map(|(i, n)| self.lookup(n, format!("{field}.inputs[{i}]")))
            .collect()
    }

    /// Types `op` over the nodes so far.
    fn op(&mut self, op: &OpDecl) -> Result<Node> {
        let (id, field) = (op.id.clone(), op.field.clone());
        let input_field = format!("{}.input", op.field);
        let nodes = &self.nodes;
        Ok(match &op.op {
            Op::Elementwise { inputs, expr } => {
                let ids = self.lookup_all(inputs, &op.field)?;
                elementwise::elementwise(nodes, id, field, ids, expr)?
            }
            Op::Reduce {
                input,
                func,
                axes,
                keepdims,
                dtype,
                ddof,
            } => {
                let input = self.lookup(input, input_field)?;
                reductions::reduce(
                    nodes,
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
                let input = self.lookup(input, input_field)?;
                rechunk::rechunk(nodes, id, field, input, chunks)?
            }
            Op::Slice { input, selection } => {
                let input = self.lookup(input, input_field)?;
                slices::slice(nodes, id, field, input, selection)?
            }
            Op::Transpose { input, axes } => {
                let input = self.lookup(input, input_field)?;
                slices::transpose(nodes, id, field, input, axes.as_deref())?
            }
            Op::Concat { inputs, axis } => {
                let ids = self.lookup_all(inputs, &op.field)?;
                joins::concat(nodes, id, field, ids, *axis)?
            }
            Op::Fft { input, fft } => {
                let input = self.lookup(input, input_field)?;
                fft::fft_node(nodes, id, field, input, fft)?
            }
            Op::Write { input, spec } => {
                let input = self.lookup(input, input_field)?;
                return self.write(op, input, spec);
            }
        })
    }

    /// Types the write `op` of `input`, checking that it reads none of the plan's sources
    /// and that no chunk of its target has another writer in the plan.
    fn write(&mut self, op: &OpDecl, input: NodeId, spec: &WriteSpec) -> Result<Node> {
        let url = stores::normalise_url(&spec.target);
        plan_ensure!(
            !self.source_urls.contains(&url),
            format!("{}.target", op.field),
            "the target \"{}\" is also an input of this plan",
            spec.target
        );
        if let Some(source) = self.source_urls.iter().find(|s| stores::overlap(s, &url)) {
            plan_bail!(
                format!("{}.target", op.field),
                "the target \"{}\" and the input \"{source}\" hold one another: a plan never \
                 writes into its sources' stores; write elsewhere",
                spec.target
            );
        }
        let like = match &spec.metadata_from {
            Some(id) => Some(self.lookup(id, format!("{}.metadata_from", op.field))?),
            None => None,
        };
        let (node, touched) = stores::write(
            &self.nodes,
            op.id.clone(),
            op.field.clone(),
            input,
            spec,
            like,
        )?;
        // Writes into one existing array may share it, never a chunk of it: each
        // chunk has one writer (a chunk covered in part is read, merged and
        // rewritten whole).
        for (other, other_id, other_touched) in &self.targets {
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
            if let Some(chunk) = stores::shared_chunk(a, b) {
                plan_bail!(
                    format!("{}.region", op.field),
                    "this write and op \"{other_id}\" both write chunk {chunk:?} of \
                     \"{}\"; each chunk of a target may have only one writer in a plan",
                    spec.target
                );
            }
        }
        self.targets.push((url, op.id.clone(), touched));
        Ok(node)
    }
}
