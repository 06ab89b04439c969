//! The physical plan: materialized arrays and the stages that fill them.

use super::fuse;
use super::{bands, joins, lift, rechunk};
use crate::array::{ChunkGrid, DType};
use crate::error::{Error, Result};
use crate::physical::cost::{block_task_bytes, shard_bytes};
use crate::physical::fused::{ConcatPart, Fused, LeafConcat, MatId};
use crate::physical::material::{Material, MaterialOrigin};
use crate::physical::options::PlanOptions;
use crate::physical::stage::{PhysicalPlan, Stage};
use crate::plan::graph::Graph;
use crate::plan::node::{NodeKind, TExpr};
use crate::plan::view::{View, ViewAxis};
use crate::zarr::{ArraySpec, Codec, ZarrArray};

/// The codec of intermediates: none. Float data compresses about 1.3× with blosc-lz4 and
/// shuffle, which cost more CPU (a third of the ERA5 power spectrum's) than writing and
/// reading the extra bytes through a local work directory's page cache.
pub fn intermediate_codec() -> Codec {
    Codec::None
}

/// Builds the physical plan of `graph`.
pub fn plan(graph: &Graph, opts: PlanOptions) -> Result<PhysicalPlan> {
    let graph = &lift::elementwise_out_of_joins(graph);
    let n = graph.nodes.len();
    let mut consumers = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for &j in node.kind.inputs() {
            consumers[j].push(i);
        }
    }
    let mut materials: Vec<Material> = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    let mut fused: Vec<Option<Fused>> = vec![None; n];
    // Write nodes whose producer wrote straight into their target.
    let mut produced_target: Vec<Option<MatId>> = vec![None; n];
    // Nodes between a reduction and its write that only restate its result (see
    // `reduce_epilogue`): they stand for the target the reduction writes.
    let mut forwarded: Vec<Option<MatId>> = vec![None; n];

    // Nodes stored whole because joins read pieces of them (see `joins::elements_joined`).
    let joined = joins::elements_joined(graph);
    let mut stored_whole: Vec<Option<MatId>> = vec![None; n];

    for (i, node) in graph.nodes.iter().enumerate() {
        if let Some(m) = forwarded[i] {
            fused[i] = Some(material_value(&materials, m));
            continue;
        }
        // The single consumer, when it is a write: producers of materials write there directly.
        let direct_write = match consumers[i].as_slice() {
            [c] if matches!(graph.nodes[*c].kind, NodeKind::Write { .. }) => Some(*c),
            _ => None,
        };
        match &node.kind {
            NodeKind::Source(arr) => {
                materials.push(Material {
                    name: node.id.clone(),
                    shape: node.shape.clone(),
                    dtype: node.dtype,
                    grid: node.grid.clone(),
                    origin: MaterialOrigin::Source(arr.clone()),
                });
                let m = materials.len() - 1;
                fused[i] = Some(Fused::material(
                    m,
                    &node.shape,
                    node.dtype,
                    node.grid.clone(),
                ));
            }
            NodeKind::Elementwise { inputs, expr } => {
                // Over a transform of the same shape, regions follow the transform's grid
                // (chosen for the budget and the write), not the node's logical chunks.
                let grid = inputs
                    .iter()
                    .filter_map(|&j| fused[j].as_ref())
                    .find(|f| f.shape == node.shape && f.leaves.iter().any(|l| l.fft.is_some()))
                    .map_or_else(|| node.grid.clone(), |f| f.grid.clone());
                let ins: Vec<Fused> = inputs
                    .iter()
                    .map(|&j| {
                        let f = fused_of(&fused, j)?;
                        let view = View::broadcast(&f.shape, &node.shape);
                        Ok(f.through(&view, node.shape.clone(), grid.clone()))
                    })
                    .collect::<Result<_>>()?;
                fused[i] = Some(fuse::elementwise(&ins, expr, node.shape.clone(), grid));
            }
            NodeKind::Slice { input, view } => {
                let f = fused_of(&fused, *input)?;
                let through = f.through(view, node.shape.clone(), node.grid.clone());
                // A crop of a join is the join of its cropped parts (one part: a box of it).
                fused[i] = Some(match joins::cropped(&through) {
                    Some(c) => joins::value(c, &materials, node.dtype, node.grid.clone()),
                    None => through,
                });
            }
            NodeKind::Concat { inputs, axis } => {
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
                        &fused,
                        &mut Joins {
                            materials: &mut materials,
                            stages: &mut stages,
                            joined: &joined,
                            stored_whole: &mut stored_whole,
                        },
                        opts,
                    )?);
                    origin[*axis] += graph.nodes[j].shape[*axis];
                }
                let concat = LeafConcat {
                    shape: node.shape.clone(),
                    parts: joins::merged(parts),
                };
                fused[i] = Some(joins::value(
                    concat,
                    &materials,
                    node.dtype,
                    node.grid.clone(),
                ));
            }
            NodeKind::Reduce(spec) => {
                // Written straight into a target when only a write (perhaps after casts and
                // an index dropping the kept axes) consumes it, else into an intermediate.
                let (out, keepdims) =
                    match reduce_epilogue(graph, &consumers, i, &spec.axes, spec.keepdims) {
                        Some(ep) => {
                            let m = target_material(graph, ep.write, &mut materials)?;
                            produced_target[ep.write] = Some(m);
                            for &j in &ep.through {
                                forwarded[j] = Some(m);
                            }
                            (m, ep.keepdims)
                        }
                        None => {
                            let m = intermediate(
                                &mut materials,
                                &node.id,
                                &node.shape,
                                node.dtype,
                                &node.grid.chunk_shape(),
                            )?;
                            (m, spec.keepdims)
                        }
                    };
                let input = fused_of(&fused, spec.input)?.clone().cast_to(spec.compute);
                stages.push(Stage::Reduce {
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
                fused[i] = Some(material_value(&materials, out));
            }
            NodeKind::Fft(spec) => {
                let input = fused_of(&fused, spec.input)?.clone();
                // Chunk the transform as the array it is written to, when that is known, so
                // the write's tasks read whole chunks of it.
                let axes = spec.axes();
                let natural = match written_chunks(graph, &consumers, i) {
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
                let may_band = sole_write(graph, &consumers, i).is_some();
                fused[i] = Some(super::fft::plan_fft(
                    &mut materials,
                    &mut stages,
                    spec,
                    input,
                    &node.id,
                    &node.shape,
                    node.dtype,
                    &natural,
                    opts,
                    may_band,
                )?);
            }
            NodeKind::Rechunk { input }
                if !consumers[i].is_empty()
                    && consumers[i]
                        .iter()
                        .all(|&c| matches!(graph.nodes[c].kind, NodeKind::Fft(_))) =>
            {
                // A rechunk that only feeds FFTs (Cubed makes the transformed axes whole this
                // way): the FFT planner reads the original chunks itself and spills a
                // rechunked copy only when re-reading would cost more.
                fused[i] = Some(fused_of(&fused, *input)?.clone());
            }
            NodeKind::Rechunk { input } => {
                let out = match direct_write {
                    Some(w) => {
                        let m = target_material(graph, w, &mut materials)?;
                        produced_target[w] = Some(m);
                        m
                    }
                    None => intermediate(
                        &mut materials,
                        &node.id,
                        &node.shape,
                        node.dtype,
                        &node.grid.chunk_shape(),
                    )?,
                };
                let src = fused_of(&fused, *input)?.clone();
                plan_copy(&mut materials, &mut stages, src, out, &node.id, opts)?;
                fused[i] = Some(Fused::material(
                    out,
                    &node.shape,
                    node.dtype,
                    materials[out].grid.clone(),
                ));
            }
            NodeKind::Write { input, .. } => {
                let out = match produced_target[i] {
                    Some(m) => m,
                    None => {
                        let m = target_material(graph, i, &mut materials)?;
                        let src = fused_of(&fused, *input)?.clone();
                        plan_copy(&mut materials, &mut stages, src, m, &node.id, opts)?;
                        m
                    }
                };
                fused[i] = Some(Fused::material(
                    out,
                    &node.shape,
                    node.dtype,
                    materials[out].grid.clone(),
                ));
            }
        }
    }
    Ok(PhysicalPlan { materials, stages })
}

/// The fused value that reads material `m` whole.
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

fn material_value(materials: &[Material], m: MatId) -> Fused {
    let mat = &materials[m];
    Fused::material(m, &mat.shape, mat.dtype, mat.grid.clone())
}

/// Nodes after a reduction that change nothing but its rank, ending in a write.
#[derive(Debug)]
struct Epilogue {
    /// The nodes between the reduction and the write (none when the write reads it).
    through: Vec<usize>,
    /// The write node.
    write: usize,
    /// Whether the reduction, writing the target itself, keeps its reduced axes.
    keepdims: bool,
}

/// The chain after reduction `i` (each node the only consumer of the one before) of casts to
/// the dtype the values already have and, when the reduction keeps its reduced axes, an
/// indexing that drops exactly those axes, ending in a write: Cubed's plans end reductions
/// this way. The reduction then writes the target itself (without the kept axes) instead of
/// an intermediate that a second stage copies.
fn reduce_epilogue(
    graph: &Graph,
    consumers: &[Vec<usize>],
    i: usize,
    axes: &[usize],
    keepdims: bool,
) -> Option<Epilogue> {
    let mut at = i;
    let mut keepdims = keepdims;
    let mut through = Vec::new();
    loop {
        let [next] = consumers[at].as_slice() else {
            return None;
        };
        let (prev, node) = (&graph.nodes[at], &graph.nodes[*next]);
        match &node.kind {
            NodeKind::Write { .. } => {
                return Some(Epilogue {
                    through,
                    write: *next,
                    keepdims,
                })
            }
            NodeKind::Elementwise { inputs, expr }
                if inputs.len() == 1
                    && node.shape == prev.shape
                    && node.dtype == prev.dtype
                    && restates_input(expr) => {}
            NodeKind::Slice { view, .. }
                if keepdims && drops_axes(view, &prev.shape, &node.shape, axes) =>
            {
                keepdims = false
            }
            _ => return None,
        }
        through.push(*next);
        at = *next;
    }
}

/// True when `expr` is its only input, cast (if at all) to the dtype it has.
fn restates_input(expr: &TExpr) -> bool {
    match expr {
        TExpr::Input { idx, .. } => *idx == 0,
        TExpr::Cast { to, arg } => arg.dtype() == *to && restates_input(arg),
        _ => false,
    }
}

/// True when `view` (from `out_shape` to `in_shape`) takes index 0 of each of `axes` (length 1
/// in the input) and every other input axis whole, in order.
fn drops_axes(view: &View, in_shape: &[u64], out_shape: &[u64], axes: &[usize]) -> bool {
    if view.axes.len() != in_shape.len() || out_shape.len() + axes.len() != in_shape.len() {
        return false;
    }
    let mut k = 0;
    view.axes.iter().enumerate().all(|(d, a)| {
        if axes.contains(&d) {
            in_shape[d] == 1 && *a == ViewAxis::Fixed(0)
        } else {
            let whole =
                *a == ViewAxis::Mapped {
                    out_axis: k,
                    start: 0,
                    step: 1,
                } && out_shape[k] == in_shape[d];
            k += 1;
            whole
        }
    })
}

/// The write node that node `i`'s value flows into through elementwise ops of its shape alone
/// (each the only consumer of the one before), if any.
fn sole_write(graph: &Graph, consumers: &[Vec<usize>], i: usize) -> Option<usize> {
    let shape = &graph.nodes[i].shape;
    let mut at = i;
    loop {
        // One consumer (which may read the value more than once, as `a * a` does).
        let mut next_nodes = consumers[at].clone();
        next_nodes.dedup();
        let [next] = next_nodes.as_slice() else {
            return None;
        };
        let node = &graph.nodes[*next];
        if node.shape != *shape {
            return None;
        }
        match &node.kind {
            NodeKind::Elementwise { .. } => at = *next,
            NodeKind::Write { .. } => return Some(*next),
            _ => return None,
        }
    }
}

/// The chunks of the array node `i` ends up written to, when it flows through elementwise
/// ops of its own shape (each its only consumer) into a write that names its chunks.
fn written_chunks(graph: &Graph, consumers: &[Vec<usize>], i: usize) -> Option<Vec<u64>> {
    let w = &graph.nodes[sole_write(graph, consumers, i)?];
    match &w.kind {
        NodeKind::Write { spec, .. } => spec.chunks.as_ref().map(|_| w.grid.chunk_shape()),
        _ => None,
    }
}

/// The material of write node `node_idx`'s target.
fn target_material(graph: &Graph, node_idx: usize, materials: &mut Vec<Material>) -> Result<MatId> {
    let node = &graph.nodes[node_idx];
    let NodeKind::Write { spec, .. } = &node.kind else {
        return Err(Error::internal(format!("node {} is not a write", node.id)));
    };
    let chunks = spec
        .chunks
        .clone()
        .unwrap_or_else(|| node.grid.chunk_shape());
    materials.push(Material {
        name: node.id.clone(),
        shape: node.shape.clone(),
        dtype: node.dtype,
        grid: node.grid.clone(),
        origin: MaterialOrigin::Target {
            url: spec.target.clone(),
            spec: ArraySpec {
                shape: node.shape.clone(),
                dtype: node.dtype,
                chunks,
                shards: spec.shards.clone(),
                codec: spec.codec.clone(),
                zarr_format: spec.zarr_format,
                fill: spec.copied.fill.clone(),
                overwrite: spec.overwrite,
                existing: spec.existing,
                region: spec.region.clone(),
            },
            attrs: spec.copied.attrs.clone(),
        },
    });
    Ok(materials.len() - 1)
}

fn fused_of(fused: &[Option<Fused>], i: usize) -> Result<&Fused> {
    fused[i]
        .as_ref()
        .ok_or_else(|| Error::internal(format!("node {i} used before it was planned")))
}

/// An intermediate array of `chunks`, uncompressed, that the run creates in its work
/// directory and removes when it ends.
pub(crate) fn intermediate(
    materials: &mut Vec<Material>,
    name: &str,
    shape: &[u64],
    dtype: DType,
    chunks: &[u64],
) -> Result<MatId> {
    sharded_intermediate(materials, name, shape, dtype, chunks, None)
}

/// An intermediate array like [`intermediate`], stored in shards of `shards` elements per
/// axis (multiples of `chunks`) when given: one file per shard instead of one per chunk, its
/// inner chunks read one by one (ranged reads) by the stages that read it. A stage writing it
/// should write whole shards (its blocks are shards).
pub(crate) fn sharded_intermediate(
    materials: &mut Vec<Material>,
    name: &str,
    shape: &[u64],
    dtype: DType,
    chunks: &[u64],
    shards: Option<Vec<u64>>,
) -> Result<MatId> {
    let chunks: Vec<u64> = chunks.iter().map(|&c| c.max(1)).collect();
    let shards = shards.filter(|s| *s != chunks);
    let storage = shards.as_deref().unwrap_or(&chunks);
    materials.push(Material {
        name: format!("{name} (intermediate)"),
        shape: shape.to_vec(),
        dtype,
        grid: ChunkGrid::regular(shape, storage)?,
        origin: MaterialOrigin::Intermediate {
            spec: ArraySpec {
                shape: shape.to_vec(),
                dtype,
                chunks,
                shards,
                codec: intermediate_codec(),
                zarr_format: 3,
                fill: None,
                overwrite: true,
                existing: false,
                region: None,
            },
        },
    });
    Ok(materials.len() - 1)
}

/// Most passes over the input a stream copy may take (one per group of output chunks): each
/// decodes the input again, and already two cost more than an intermediate array (ERA5
/// rechunk at 400–600 MB: 6.4–7.1 s in two passes, 5.9 s through an intermediate, 5.0–5.5 s
/// in one pass at 1 GB).
const MAX_STREAM_PASSES: u64 = 1;

/// Most decoded input a stream copy's batch holds, in multiples of the usual batch: each
/// stream takes the rows of a whole batch at once, and the more rows, the less its encoder's
/// tables and window are fetched back into cache per row (ERA5 rechunk: 16 rows per batch
/// cost about 10% more time than 64).
const MAX_STREAM_BATCHES: u64 = 4;

/// The group shape, per-stream bytes, batch bytes and codec of a stream copy of `src` into target
/// `out`, when
/// `src` is a plain copy of one array whose chunks hold whole output chunks along every axis
/// but the first, the target is unsharded Zarr v3 in a store that writes values in parts
/// with a codec that streams (zstd or none), and the streams fit `limit` in at most
/// [`MAX_STREAM_PASSES`] groups per row of output chunks.
fn stream_plan(
    materials: &[Material],
    src: &Fused,
    out: MatId,
    batch: u64,
    limit: u64,
) -> Option<(Vec<u64>, u64, u64, Codec)> {
    use crate::physical::cost;
    let mat = &materials[out];
    let MaterialOrigin::Target { url, spec, .. } = &mat.origin else {
        return None;
    };
    // A region write merges the target chunks it covers in part: no streams.
    if !crate::store::writes_in_parts(url) || spec.region.is_some() {
        return None;
    }
    // A target already there (Cubed creates its arrays) streams as its own codecs allow.
    let codec = if spec.existing {
        let store = crate::store::open_store(url, 1).ok()?;
        ZarrArray::open(store).ok()?.stream_codec()?
    } else if spec.shards.is_none() && spec.zarr_format == 3 {
        spec.codec.clone()
    } else {
        return None;
    };
    let [leaf] = src.leaves.as_slice() else {
        return None;
    };
    if !leaf.is_plain() || src.plain_leaf(mat.dtype).is_none() {
        return None;
    }
    if !cost::rows_of_single_chunks(&materials[leaf.mat].grid, &mat.grid) {
        return None;
    }
    let chunk_bytes = mat.chunk_bytes();
    let stream_bytes = match &codec {
        Codec::None => 0,
        Codec::Zstd { level } => crate::zarr::stream::zstd_stream_bytes(*level, chunk_bytes)?,
        _ => return None,
    };
    // A batch holds at least one input chunk along the first axis across the group: at most
    // a whole slab of the array that thick.
    let input = &materials[leaf.mat].grid;
    let slab = input.axes()[0].max_size()
        * mat.shape[1..].iter().product::<u64>()
        * materials[leaf.mat].dtype.size() as u64;
    let batch = batch.max(slab);
    let per_stream = cost::task_bytes(1, stream_bytes, chunk_bytes, 0);
    let streams = limit.checked_sub(cost::task_bytes(0, 0, 0, batch))? / per_stream;
    if streams == 0 {
        return None;
    }
    let group = cost::group_shape(&mat.grid, streams);
    let per_row: u64 = mat.grid.grid_shape()[1..].iter().product();
    let per_group: u64 = group.iter().product();
    if per_row.div_ceil(per_group.max(1)) > MAX_STREAM_PASSES {
        return None;
    }
    // Larger batches where the budget has room beside the streams.
    let room = limit.saturating_sub(cost::task_bytes(per_group, stream_bytes, chunk_bytes, 0));
    let batch_bytes = (room / 3).clamp(batch, MAX_STREAM_BATCHES * batch);
    Some((group, stream_bytes, batch_bytes, codec))
}

/// `src`, a plain copy of a source, read from the source held in memory band by band (see
/// [`LeafBand`](fuse::LeafBand)) when the bands fit the budget and cost less than the other
/// way to copy it: a stream copy encoding with `stream` (see [`bands::most_band_cost`]: the
/// source's first chunk tells how compressible its values are), or else an intermediate
/// array.
fn banded_copy(
    materials: &[Material],
    src: &Fused,
    out: MatId,
    stream: Option<&Codec>,
    opts: PlanOptions,
) -> Option<Fused> {
    let mat = src.plain_material()?;
    let leaf = src.plain_leaf(materials[out].dtype)?;
    let MaterialOrigin::Source(arr) = &materials[mat].origin else {
        return None;
    };
    let compression = stream.and_then(|_| arr.sampled_compression());
    let most = bands::most_band_cost(stream, compression)?;
    // A task holds its output chunk's values and the chunk encoded.
    let task = 3 * materials[out].chunk_bytes();
    let room = bands::room_for_band(task, materials[mat].chunk_bytes(), opts)?;
    let out_chunks = materials[out].grid.chunk_shape();
    let (band, cost) = bands::copy_bands(arr, &out_chunks, room)?;
    if cost > most {
        return None;
    }
    let mut banded = src.clone();
    banded.leaves[leaf].band = Some(band);
    Some(banded)
}

/// Plans the stages that copy (and compute) `src` into material `out`: one stage of blocks
/// when a block fits the budget, else through an intermediate, else chunk by chunk.
pub(crate) fn plan_copy(
    materials: &mut Vec<Material>,
    stages: &mut Vec<Stage>,
    src: Fused,
    out: MatId,
    name: &str,
    opts: PlanOptions,
) -> Result<()> {
    let out_grid = materials[out].grid.clone();
    let itemsize = materials[out].dtype.size() as u64;
    // Bytes per output element of the leaf buffers; an FFT leaf also holds its complex
    // blocks before and after each step (as `RegionRead::leaf_bytes` counts them).
    let in_itemsize: u64 = src
        .leaves
        .iter()
        .map(|l| {
            let own = l.dtype.size() as u64;
            match &l.fft {
                Some(f) => own + 3 * f.compute.to_complex().size() as u64,
                None => own,
            }
        })
        .sum::<u64>()
        .max(1);
    let plain = src.plain_leaf(materials[out].dtype).is_some();
    let in_chunk_bytes = src.grid.chunk_shape().iter().product::<u64>().max(1) * in_itemsize;
    let batch = opts.batch_bytes.max(in_chunk_bytes);
    let limit = opts.budget;
    let ones = vec![1u64; out_grid.rank()];
    let label = format!("write {name}");
    // Chunk-aligned outputs (each output chunk inside one input chunk, or equal): no blocks needed.
    let block = rechunk::block_chunks(&src.grid, &out_grid);
    let block_elems = rechunk::block_elements(&out_grid, &block);
    let out_chunk_elems = out_grid.chunk_shape().iter().product::<u64>().max(1);
    if block == ones
        || block_task_bytes(
            block_elems,
            out_chunk_elems,
            itemsize,
            in_itemsize,
            plain,
            batch,
            opts.threads,
        ) <= limit
    {
        stages.push(Stage::Compute {
            input: src,
            out,
            block,
            label,
        });
        return Ok(());
    }
    // Output chunks that each gather rows of many input chunks: encoded as streams (each
    // input chunk decoded once, no intermediate), or at once from the source held in memory
    // band by band, whichever costs less.
    let stream = stream_plan(materials, &src, out, batch, limit);
    if let Some(banded) = banded_copy(materials, &src, out, stream.as_ref().map(|s| &s.3), opts) {
        stages.push(Stage::Compute {
            input: banded,
            out,
            block: ones,
            label,
        });
        return Ok(());
    }
    if let Some((group, stream_bytes, batch_bytes, _)) = stream {
        stages.push(Stage::Stream {
            input: src,
            out,
            group,
            stream_bytes,
            batch_bytes,
            label: format!("{label} (streamed)"),
        });
        return Ok(());
    }
    // Two stages through an intermediate whose chunks keep both blocks small.
    let shape = materials[out].shape.clone();
    let per_elem = 2 * itemsize + in_itemsize;
    let max_block = (limit.saturating_sub(2 * batch) / per_elem).max(1);
    let src_chunks = src.grid.chunk_shape();
    let out_chunks = out_grid.chunk_shape();
    let inter_chunks = rechunk::intermediate_chunks(&src_chunks, &out_chunks, &shape, max_block);
    let inter_grid = ChunkGrid::regular(&shape, &inter_chunks)?;
    let b1 = rechunk::block_chunks(&src.grid, &inter_grid);
    let b2 = rechunk::block_chunks(&inter_grid, &out_grid);
    let fits = |g: &ChunkGrid, b: &[u64], in_size: u64, plain: bool| {
        block_task_bytes(
            rechunk::block_elements(g, b),
            g.chunk_shape().iter().product::<u64>().max(1),
            itemsize,
            in_size,
            plain,
            batch,
            opts.threads,
        ) <= limit
    };
    if fits(&inter_grid, &b1, in_itemsize, plain) && fits(&out_grid, &b2, itemsize, true) {
        let dtype = materials[out].dtype;
        // Stored in shards of stage 1's blocks (a few files rather than one per chunk);
        // stage 1 writes whole shards, stage 2 reads inner chunks.
        let shards = rechunk::shard_shape(&inter_chunks, &b1, itemsize, shard_bytes(opts.budget));
        let b1_shards: Vec<u64> = b1
            .iter()
            .zip(&shards)
            .zip(&inter_chunks)
            .map(|((b, s), c)| b / (s / c).max(1))
            .collect();
        let mid =
            sharded_intermediate(materials, name, &shape, dtype, &inter_chunks, Some(shards))?;
        stages.push(Stage::Compute {
            input: src,
            out: mid,
            block: b1_shards,
            label: format!("{label} (stage 1 of 2)"),
        });
        let mid_fused = Fused::material(mid, &shape, dtype, inter_grid);
        stages.push(Stage::Compute {
            input: mid_fused,
            out,
            block: b2,
            label: format!("{label} (stage 2 of 2)"),
        });
        return Ok(());
    }
    // Chunk by chunk: each output chunk reads the input chunks it overlaps.
    stages.push(Stage::Compute {
        input: src,
        out,
        block: ones,
        label,
    });
    Ok(())
}
