//! Walking the graph into stages: each node in order becomes a fused value, and the nodes
//! that must be stored (reductions, rechunks, writes, FFT spills, joined pieces) add
//! materials and the stages that fill them. The rules live beside it: fusion (`fuse`),
//! epilogues (`epilogue`), materials (`materials`), copies (`copy`), FFTs (`fft`), joins.

use std::sync::Arc;

use super::copy::plan_copy;
use super::epilogue::{reduce_epilogue, sole_write, written_chunks};
use super::materials::{intermediate, material_value, target_material};
use super::{fft, fuse, joins, lift};
use crate::array::ChunkGrid;
use crate::error::{Error, Result};
use crate::physical::fused::{ConcatPart, Fused, LeafConcat, MatId};
use crate::physical::material::{Material, MaterialOrigin};
use crate::physical::options::PlanOptions;
use crate::physical::stage::{PhysicalPlan, Stage};
use crate::plan::graph::Graph;
use crate::plan::node::{FftSpec, Node, NodeKind, ReduceSpec, TExpr};
use crate::plan::view::View;
use crate::zarr::ZarrArray;

/// Builds the physical plan of `graph`.
pub fn plan(graph: &Graph, opts: PlanOptions) -> Result<PhysicalPlan> {
    let graph = &lift::elementwise_out_of_joins(graph);
    let mut walk = Walk::new(graph, opts);
    for i in 0..graph.nodes.len() {
        walk.node(i)?;
    }
    Ok(PhysicalPlan {
        materials: walk.materials,
        stages: walk.stages,
    })
}

/// The walk over the graph's nodes in order: each node's fused value, and the materials and
/// stages planned so far.
struct Walk<'g> {
    graph: &'g Graph,
    opts: PlanOptions,
    /// Per node, the nodes that read it.
    consumers: Vec<Vec<usize>>,
    materials: Vec<Material>,
    stages: Vec<Stage>,
    fused: Vec<Option<Fused>>,
    /// Write nodes whose producer wrote straight into their target.
    produced_target: Vec<Option<MatId>>,
    /// Nodes between a reduction and its write that only restate its result (see
    /// `reduce_epilogue`): they stand for the target the reduction writes.
    forwarded: Vec<Option<MatId>>,
    /// Per node, the elements joins read of it (see `joins::elements_joined`).
    joined: Vec<u64>,
    /// Nodes stored whole because joins read pieces of them.
    stored_whole: Vec<Option<MatId>>,
}

impl<'g> Walk<'g> {
    fn new(graph: &'g Graph, opts: PlanOptions) -> Walk<'g> {
        let n = graph.nodes.len();
        let mut consumers = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for &j in node.kind.inputs() {
                consumers[j].push(i);
            }
        }
        Walk {
            graph,
            opts,
            consumers,
            materials: Vec::new(),
            stages: Vec::new(),
            fused: vec![None; n],
            produced_target: vec![None; n],
            forwarded: vec![None; n],
            joined: joins::elements_joined(graph),
            stored_whole: vec![None; n],
        }
    }

    /// Plans node `i`: its fused value, and the materials and stages it needs.
    fn node(&mut self, i: usize) -> Result<()> {
        let graph = self.graph;
        let node = &graph.nodes[i];
        if let Some(m) = self.forwarded[i] {
            self.fused[i] = Some(material_value(&self.materials, m));
            return Ok(());
        }
        // The single consumer, when it is a write: producers of materials write there directly.
        let direct_write = match self.consumers[i].as_slice() {
            [c] if matches!(graph.nodes[*c].kind, NodeKind::Write { .. }) => Some(*c),
            _ => None,
        };
        let value = match &node.kind {
            NodeKind::Source(arr) => self.source(node, arr),
            NodeKind::Elementwise { inputs, expr } => self.elementwise(node, inputs, expr)?,
            NodeKind::Slice { input, view } => self.slice(node, *input, view)?,
            NodeKind::Concat { inputs, axis } => self.concat(node, inputs, *axis)?,
            NodeKind::Reduce(spec) => self.reduce(i, spec)?,
            NodeKind::Fft(spec) => self.fft(i, spec)?,
            NodeKind::Rechunk { input }
                if !self.consumers[i].is_empty()
                    && self.consumers[i]
                        .iter()
                        .all(|&c| matches!(graph.nodes[c].kind, NodeKind::Fft(_))) =>
            {
                // A rechunk that only feeds FFTs (Cubed makes the transformed axes whole this
                // way): the FFT planner reads the original chunks itself and spills a
                // rechunked copy only when re-reading would cost more.
                fused_of(&self.fused, *input)?.clone()
            }
            NodeKind::Rechunk { input } => self.rechunk(node, *input, direct_write)?,
            NodeKind::Write { input, .. } => self.write(i, *input)?,
        };
        self.fused[i] = Some(value);
        Ok(())
    }

    fn source(&mut self, node: &Node, arr: &Arc<ZarrArray>) -> Fused {
        self.materials.push(Material {
            name: node.id.clone(),
            shape: node.shape.clone(),
            dtype: node.dtype,
            grid: node.grid.clone(),
            origin: MaterialOrigin::Source(arr.clone()),
        });
        let m = self.materials.len() - 1;
        Fused::material(m, &node.shape, node.dtype, node.grid.clone())
    }

    fn elementwise(&self, node: &Node, inputs: &[usize], expr: &TExpr) -> Result<Fused> {
        // Over a transform of the same shape, regions follow the transform's grid
        // (chosen for the budget and the write), not the node's logical chunks.
        let grid = inputs
            .iter()
            .filter_map(|&j| self.fused[j].as_ref())
            .find(|f| f.shape == node.shape && f.leaves.iter().any(|l| l.fft.is_some()))
            .map_or_else(|| node.grid.clone(), |f| f.grid.clone());
        let ins: Vec<Fused> = inputs
            .iter()
            .map(|&j| {
                let f = fused_of(&self.fused, j)?;
                let view = View::broadcast(&f.shape, &node.shape);
                Ok(f.through(&view, node.shape.clone(), grid.clone()))
            })
            .collect::<Result<_>>()?;
        Ok(fuse::elementwise(&ins, expr, node.shape.clone(), grid))
    }

    fn slice(&self, node: &Node, input: usize, view: &View) -> Result<Fused> {
        let f = fused_of(&self.fused, input)?;
        let through = f.through(view, node.shape.clone(), node.grid.clone());
        // A crop of a join is the join of its cropped parts (one part: a box of it).
        Ok(match joins::cropped(&through) {
            Some(c) => joins::value(c, &self.materials, node.dtype, node.grid.clone()),
            None => through,
        })
    }

    fn concat(&mut self, node: &Node, inputs: &[usize], axis: usize) -> Result<Fused> {
        let graph = self.graph;
        let mut parts: Vec<ConcatPart> = Vec::new();
        let mut origin = vec![0; node.shape.len()];
        for &j in inputs {
            let part = JoinInput {
                node: j,
                origin: &origin,
            };
            parts.extend(join_parts(
                graph,
                part,
                &self.fused,
                &mut Joins {
                    materials: &mut self.materials,
                    stages: &mut self.stages,
                    joined: &self.joined,
                    stored_whole: &mut self.stored_whole,
                },
                self.opts,
            )?);
            origin[axis] += graph.nodes[j].shape[axis];
        }
        let concat = LeafConcat {
            shape: node.shape.clone(),
            parts: joins::merged(parts),
        };
        Ok(joins::value(
            concat,
            &self.materials,
            node.dtype,
            node.grid.clone(),
        ))
    }

    fn reduce(&mut self, i: usize, spec: &ReduceSpec) -> Result<Fused> {
        let graph = self.graph;
        let node = &graph.nodes[i];
        // Written straight into a target when only a write (perhaps after casts and
        // an index dropping the kept axes) consumes it, else into an intermediate.
        let (out, keepdims) =
            match reduce_epilogue(graph, &self.consumers, i, &spec.axes, spec.keepdims) {
                Some(ep) => {
                    let m = target_material(graph, ep.write, &mut self.materials)?;
                    self.produced_target[ep.write] = Some(m);
                    for &j in &ep.through {
                        self.forwarded[j] = Some(m);
                    }
                    (m, ep.keepdims)
                }
                None => {
                    let m = intermediate(
                        &mut self.materials,
                        &node.id,
                        &node.shape,
                        node.dtype,
                        &node.grid.chunk_shape(),
                    )?;
                    (m, spec.keepdims)
                }
            };
        let input = fused_of(&self.fused, spec.input)?
            .clone()
            .cast_to(spec.compute);
        self.stages.push(Stage::Reduce {
            input,
            out,
            func: spec.func,
            axes: spec.axes.clone(),
            keepdims,
            ddof: spec.ddof,
            label: format!("{} of {}", spec.func.name(), graph.nodes[spec.input].id),
        });
        // Without the kept axes only the forwarded nodes read it, and they stand for
        // the target.
        Ok(material_value(&self.materials, out))
    }

    fn fft(&mut self, i: usize, spec: &FftSpec) -> Result<Fused> {
        let graph = self.graph;
        let node = &graph.nodes[i];
        let input = fused_of(&self.fused, spec.input)?.clone();
        // Chunk the transform as the array it is written to, when that is known, so
        // the write's tasks read whole chunks of it.
        let axes = spec.axes();
        let natural = match written_chunks(graph, &self.consumers, i) {
            Some(w) => {
                let sizes: Vec<u64> = (0..node.shape.len())
                    .map(|d| {
                        if axes.contains(&d) {
                            node.shape[d].max(1)
                        } else {
                            w[d].max(1)
                        }
                    })
                    .collect();
                ChunkGrid::regular(&node.shape, &sizes)?
            }
            None => node.grid.clone(),
        };
        // Only a write's tasks (a compute stage) run band by band.
        let may_band = sole_write(graph, &self.consumers, i).is_some();
        fft::plan_fft(
            &mut self.materials,
            &mut self.stages,
            spec,
            input,
            &node.id,
            &node.shape,
            node.dtype,
            &natural,
            self.opts,
            may_band,
        )
    }

    fn rechunk(&mut self, node: &Node, input: usize, direct_write: Option<usize>) -> Result<Fused> {
        let out = match direct_write {
            Some(w) => {
                let m = target_material(self.graph, w, &mut self.materials)?;
                self.produced_target[w] = Some(m);
                m
            }
            None => intermediate(
                &mut self.materials,
                &node.id,
                &node.shape,
                node.dtype,
                &node.grid.chunk_shape(),
            )?,
        };
        self.copy_into(node, input, out)?;
        Ok(self.read_whole(node, out))
    }

    fn write(&mut self, i: usize, input: usize) -> Result<Fused> {
        let node = &self.graph.nodes[i];
        let out = match self.produced_target[i] {
            Some(m) => m,
            None => {
                let m = target_material(self.graph, i, &mut self.materials)?;
                self.copy_into(node, input, m)?;
                m
            }
        };
        Ok(self.read_whole(node, out))
    }

    /// Plans the copy of node `input`'s value into material `out` for `node`.
    fn copy_into(&mut self, node: &Node, input: usize, out: MatId) -> Result<()> {
        let src = fused_of(&self.fused, input)?.clone();
        plan_copy(
            &mut self.materials,
            &mut self.stages,
            src,
            out,
            &node.id,
            self.opts,
        )
    }

    /// `node`'s value read whole from material `out`, which holds it.
    fn read_whole(&self, node: &Node, out: MatId) -> Fused {
        Fused::material(
            out,
            &node.shape,
            node.dtype,
            self.materials[out].grid.clone(),
        )
    }
}

/// One input of a join: its node and where it lies in the joined values.
struct JoinInput<'a> {
    node: usize,
    origin: &'a [u64],
}

/// What planning joins updates: the run's materials and stages, and the nodes stored whole
/// because joins read pieces of them.
struct Joins<'a> {
    materials: &'a mut Vec<Material>,
    stages: &'a mut Vec<Stage>,
    /// Per node, the elements joins read of it (see `joins::elements_joined`).
    joined: &'a [u64],
    stored_whole: &'a mut [Option<MatId>],
}

/// The parts a join reads `input` as, placed where it lies. A joined input gives its own
/// parts and a box view of a material one part; anything else is computed into an
/// intermediate first: the whole of the node it slices, once, when joins read most of that
/// node, else the input itself.
fn join_parts(
    graph: &Graph,
    input: JoinInput,
    fused: &[Option<Fused>],
    joins: &mut Joins,
    opts: PlanOptions,
) -> Result<Vec<ConcatPart>> {
    let j = input.node;
    let f = fused_of(fused, j)?;
    let shape = &graph.nodes[j].shape;
    if let Some(parts) = f.joined() {
        return Ok(joins::placed(parts, input.origin).collect());
    }
    let (mat, view) = match f.box_leaf() {
        Some(leaf) => (leaf.mat, leaf.view.clone()),
        None => {
            let (from, through) = joins::sliced_from(graph, j);
            let whole = 2 * joins.joined[from] >= graph.nodes[from].shape.iter().product()
                && through.is_box(shape);
            let (stored, view) = if whole {
                (from, through)
            } else {
                (j, View::identity(shape.len()))
            };
            let m = match joins.stored_whole[stored] {
                Some(m) => m,
                None => {
                    let node = &graph.nodes[stored];
                    let m = intermediate(
                        joins.materials,
                        &node.id,
                        &node.shape,
                        node.dtype,
                        &node.grid.chunk_shape(),
                    )?;
                    let value = fused_of(fused, stored)?.clone();
                    plan_copy(joins.materials, joins.stages, value, m, &node.id, opts)?;
                    joins.stored_whole[stored] = Some(m);
                    m
                }
            };
            (m, view)
        }
    };
    Ok(vec![ConcatPart {
        mat,
        view,
        start: input.origin.to_vec(),
        shape: shape.clone(),
    }])
}

/// The fused value of node `i`, planned before.
fn fused_of(fused: &[Option<Fused>], i: usize) -> Result<&Fused> {
    fused[i]
        .as_ref()
        .ok_or_else(|| Error::internal(format!("node {i} used before it was planned")))
}
