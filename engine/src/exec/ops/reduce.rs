//! Reduce stage: for each output chunk, groups of input pieces are folded into partial
//! accumulators (each piece streamed: read, decode, evaluate tile by tile, fold), and the
//! partials merge in group order, so results do not depend on timing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::region::assemble::Assembler;
use super::region::read::RegionRead;
use crate::array::grid::{c_strides, indices_in};
use crate::array::{ChunkGrid, Region};
use crate::error::{Error, Result};
use crate::exec::memory::Reservation;
use crate::exec::task::{Processor, Task, TaskContext, WriteOp};
use crate::kernels::cascade::{self, PartialSums};
use crate::kernels::eval::drive_tiles;
use crate::kernels::eval::SumMode;
use crate::kernels::Accumulator;
use crate::physical::fused::Fused;
use crate::plan::ReduceFunc;
use crate::zarr::ZarrArray;

/// What a reduction computes.
#[derive(Debug, Clone)]
pub struct ReduceParams {
    /// The function.
    pub func: ReduceFunc,
    /// Reduced input axes.
    pub axes: Vec<usize>,
    /// Whether the output keeps reduced axes.
    pub keepdims: bool,
    /// Delta degrees of freedom.
    pub ddof: f64,
}

/// What one group of pieces hands to the merge.
enum GroupResult {
    /// Its accumulator.
    Acc(Accumulator),
    /// Its float32 partial sums, when every value it added fits them: the merge adds them
    /// to the merged f64 sums, so the group never makes an f64 accumulator of its own (one
    /// less 8-byte-per-element buffer to fault in, fill and merge per group).
    Partial(PartialSums),
}

struct Merge {
    groups: usize,
    next: usize,
    merged: Option<(Accumulator, Option<Reservation>)>,
    waiting: BTreeMap<usize, (GroupResult, Option<Reservation>)>,
}

impl Merge {
    /// Merges the waiting results that come next in group order. Float32 partial sums of
    /// groups 2k and 2k + 1 are added to the merged sums together, in one pass over them
    /// (the pairs are fixed, so results still do not depend on timing): partial sums of an
    /// even group wait for the next group's.
    fn merge_ready(&mut self) -> Result<()> {
        while let Some((result, held)) = self.waiting.remove(&self.next) {
            let pairs = self.next.is_multiple_of(2) && self.next + 1 < self.groups;
            let second = match (&result, pairs) {
                (GroupResult::Partial(_), true) => match self.waiting.remove(&(self.next + 1)) {
                    Some((GroupResult::Partial(p), its_held)) => Some((p, its_held)),
                    Some(other) => {
                        self.waiting.insert(self.next + 1, other);
                        None
                    }
                    None => {
                        self.waiting.insert(self.next, (result, held));
                        return Ok(());
                    }
                },
                _ => None,
            };
            let merged_groups = 1 + usize::from(second.is_some());
            match (self.merged.as_mut(), result) {
                (None, GroupResult::Acc(acc)) => self.merged = Some((acc, held)),
                (None, GroupResult::Partial(partial)) => {
                    let acc = Accumulator::from_partials(&partial, second.as_ref().map(|s| &s.0))?;
                    self.merged = Some((acc, held));
                }
                (Some((merged, _)), GroupResult::Acc(acc)) => merged.merge(&acc)?,
                (Some((merged, _)), GroupResult::Partial(partial)) => {
                    merged.add_partials(&partial, second.as_ref().map(|s| &s.0))?
                }
            }
            // The second group's partial sums and reservation go only now.
            drop(second);
            self.next += merged_groups;
        }
        Ok(())
    }
}

/// Partial results of one output chunk, merged in group order.
struct OutputChunk {
    idx: Vec<u64>,
    /// Threads to encode the chunk on: all workers when it is the stage's only output chunk
    /// (nothing else runs while it is encoded), else one.
    encode_threads: usize,
    merge: Mutex<Merge>,
    count: u64,
}

struct ReduceProcessor {
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    params: Arc<ReduceParams>,
    pieces: Vec<RegionRead>,
    /// Input region of the whole output chunk.
    chunk_input: Region,
    group: usize,
    /// Made at the first fold, not when the task is built: a stage's tasks all exist at
    /// once, their accumulators should not.
    acc: Option<Accumulator>,
    /// Float32 partial sums of a single-precision sum or mean (`cascade`), made at the first
    /// fold.
    partial: Option<PartialSums>,
    /// Whether the reduction adds values in float32 partial sums first.
    cascade: bool,
    acc_len: usize,
    acc_bytes: u64,
    shared: Arc<OutputChunk>,
    /// Decoded pieces waiting to be folded together.
    pending: Vec<(Region, Assembler)>,
    /// Pieces folded together.
    fold_every: usize,
}

impl ReduceProcessor {
    fn acc_strides(&self, piece: &Region) -> Vec<usize> {
        // Accumulator layout: C order over the non-reduced axes of the chunk's input region.
        let kept: Vec<u64> = (0..piece.rank())
            .filter(|d| !self.params.axes.contains(d))
            .map(|d| self.chunk_input.shape[d])
            .collect();
        let ks = c_strides(&kept);
        let mut k = 0;
        (0..piece.rank())
            .map(|d| {
                if self.params.axes.contains(&d) {
                    0
                } else {
                    let s = ks[k] as usize;
                    k += 1;
                    s
                }
            })
            .collect()
    }
}

/// `slot`'s accumulator, made when it has none.
fn accumulator_in(
    slot: &mut Option<Accumulator>,
    func: ReduceFunc,
    compute: crate::array::DType,
    len: usize,
) -> Result<&mut Accumulator> {
    if slot.is_none() {
        *slot = Some(Accumulator::new(func, compute, len)?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::internal("reduction accumulator missing"))
}

/// Float32 running sums (and nanmean's counts) that one fold adds its values to.
struct FoldSums<'a> {
    sums: &'a mut [f32],
    counts: Option<&'a mut [u8]>,
    /// How the fold's first piece goes in (the others add).
    first: SumMode,
}

/// The float32 partial sums of `len` elements in `slot` (made when it has none) to fold
/// `terms` more values per element into, when they fit [`cascade::TERMS`]; flushed into
/// `acc` first when they are full. `covers_all`: the fold's first piece gives every element
/// exactly one value (so it may start the sums rather than add to zeroed ones).
fn partial_for<'a>(
    slot: &'a mut Option<PartialSums>,
    acc: &mut Option<Accumulator>,
    func: ReduceFunc,
    len: usize,
    terms: u64,
    covers_all: bool,
) -> Result<Option<FoldSums<'a>>> {
    if terms > cascade::TERMS {
        return Ok(None);
    }
    let partial = slot.get_or_insert_with(|| PartialSums::new(func, len));
    let first = partial.start_fold(acc, terms, covers_all)?;
    let (sums, counts) = partial.parts_mut()?;
    Ok(Some(FoldSums {
        sums,
        counts,
        first,
    }))
}

impl ReduceProcessor {
    /// The task's accumulator, made on first use.
    fn accumulator(&mut self) -> Result<&mut Accumulator> {
        accumulator_in(
            &mut self.acc,
            self.params.func,
            self.fused.dtype(),
            self.acc_len,
        )
    }

    /// Folds every pending piece into the accumulator. Without positions (every function
    /// but arg-reductions) the pieces are folded slab by slab along the first kept axis, all
    /// pieces per slab, so the slab of the accumulator stays in cache instead of streaming
    /// the whole accumulator through memory once per piece.
    fn fold_pending(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let Some((first, _)) = pending.first() else {
            return Ok(());
        };
        let rank = first.rank();
        let strides = self.acc_strides(first);
        let positions = self.params.func.is_arg();
        let axes = &self.params.axes;
        // Values each element of the output takes from the pending pieces, at most: pieces
        // over the same kept region add up.
        let mut per_region: BTreeMap<Vec<u64>, u64> = BTreeMap::new();
        for (piece, _) in &pending {
            let kept = (0..rank)
                .filter(|d| !axes.contains(d))
                .map(|d| piece.start[d]);
            let values: u64 = axes.iter().map(|&a| piece.shape[a]).product();
            *per_region.entry(kept.collect()).or_default() += values;
        }
        let terms = per_region.values().copied().max().unwrap_or(0);
        // Whether the first piece gives each element of the accumulator exactly one value.
        let covers_all = (0..rank).all(|d| match axes.contains(&d) {
            true => first.shape[d] == 1,
            false => {
                first.start[d] == self.chunk_input.start[d]
                    && first.shape[d] == self.chunk_input.shape[d]
            }
        });
        let (func, compute, acc_len) = (self.params.func, self.fused.dtype(), self.acc_len);
        let skip_nan = cascade::skips_nan(func);
        let mut partial = match self.cascade {
            true => partial_for(
                &mut self.partial,
                &mut self.acc,
                func,
                acc_len,
                terms,
                covers_all,
            )?,
            false => None,
        };
        let acc_slot = &mut self.acc;
        let mut regs = self.fused.program.registers();
        let full_strides = c_strides(&self.fused.shape);
        // Where each piece's part of the accumulator starts.
        let offsets: Vec<usize> = pending
            .iter()
            .map(|(piece, _)| {
                (0..rank)
                    .filter(|d| !axes.contains(d))
                    .map(|d| (piece.start[d] - self.chunk_input.start[d]) as usize * strides[d])
                    .sum()
            })
            .collect();
        // The slab axis: the first kept axis longer than 1, if any.
        let slab_axis = (0..rank).find(|d| !axes.contains(d) && first.shape[*d] > 1);
        let (axis, slab) = match (slab_axis, positions) {
            (Some(a), false) => {
                let per_index = strides[a].max(1) as u64 * ACC_BYTES_PER_ELEMENT;
                (a, (SLAB_BYTES / per_index).max(1))
            }
            _ => (0, u64::MAX),
        };
        let extent = if slab == u64::MAX {
            1
        } else {
            pending
                .iter()
                .map(|(p, _)| p.shape[axis])
                .max()
                .unwrap_or(0)
        };
        let mut start = 0u64;
        let mut assembled: Vec<(Region, Assembler)> = pending;
        while start < extent {
            let len = if slab == u64::MAX {
                0
            } else {
                slab.min(extent - start)
            };
            for (i, ((piece, asm), offset)) in assembled.iter_mut().zip(&offsets).enumerate() {
                let mode = match &partial {
                    Some(p) if i == 0 => p.first,
                    _ => SumMode::Add,
                };
                let mut leaves = asm.leaf_inputs(&self.arrays)?;
                let mut shape = piece.shape.clone();
                let mut base = *offset;
                if slab != u64::MAX {
                    if start >= piece.shape[axis] {
                        continue;
                    }
                    shape[axis] = len.min(piece.shape[axis] - start);
                    for l in leaves.iter_mut() {
                        l.offset += start as usize * l.strides[axis];
                    }
                    base += start as usize * strides[axis];
                }
                let piece = &*piece;
                let program = &self.fused.program;
                drive_tiles(
                    &leaves,
                    &shape,
                    &strides,
                    !positions,
                    |tile_leaves, n, at| {
                        let at = crate::kernels::eval::TileTarget {
                            offset: at.offset + base,
                            ..at
                        };
                        // Sums of single-precision programs add each tile straight in (a lone value
                        // lies where it lies, whatever the stride).
                        if at.stride == 1 || n == 1 {
                            if let Some(p) = partial.as_mut() {
                                let range = at.offset..at.offset + n;
                                let sums = &mut p.sums[range.clone()];
                                let added = if skip_nan {
                                    let counts = p.counts.as_deref_mut().map(|c| &mut c[range]);
                                    program.eval_tile_add_f32_skip_nan(
                                        &mut regs,
                                        tile_leaves,
                                        n,
                                        sums,
                                        counts,
                                        mode,
                                    )?
                                } else {
                                    program.eval_tile_add_f32(
                                        &mut regs,
                                        tile_leaves,
                                        n,
                                        sums,
                                        mode,
                                    )?
                                };
                                if added {
                                    return Ok(());
                                }
                            }
                        }
                        // A piece that starts the running sums writes every element of them.
                        if mode == SumMode::Start {
                            return Err(Error::internal(
                                "a tile that starts float32 running sums did not reach them",
                            ));
                        }
                        let acc = accumulator_in(acc_slot, func, compute, acc_len)?;
                        if at.stride == 1 {
                            if let Some(sums) = acc.plain_sums() {
                                let sums = &mut sums[at.offset..at.offset + n];
                                if program.eval_tile_add(&mut regs, tile_leaves, n, sums)? {
                                    return Ok(());
                                }
                            }
                        }
                        let r = program.eval_tile(&mut regs, tile_leaves, n)?;
                        let reg = &regs.regs[r];
                        let index = if positions {
                            // Global reduction index of the tile's first value and the step.
                            if axes.len() == 1 && rank > 1 {
                                let a = axes[0];
                                let b = (piece.start[a] + at.index[a]) as i64;
                                (b, if a == rank - 1 { 1 } else { 0 })
                            } else {
                                let b: u64 = (0..rank)
                                    .map(|d| (piece.start[d] + at.index[d]) * full_strides[d])
                                    .sum();
                                (b as i64, 1)
                            }
                        } else {
                            (0, 0)
                        };
                        acc.fold(reg, n, at, index)
                    },
                )?;
            }
            start += len.max(1);
        }
        Ok(())
    }
}

/// Bytes of accumulator state assumed per element when sizing slabs.
const ACC_BYTES_PER_ELEMENT: u64 = 8;
/// Accumulator bytes per slab: about the size of L2.
const SLAB_BYTES: u64 = 256 * 1024;

impl Processor for ReduceProcessor {
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let read = self.pieces[batch].clone();
        let piece = read.region.clone();
        let mut asm = Assembler::new(read).reading_in_place();
        asm.accept(data, &self.arrays, ctx)?;
        self.pending.push((piece, asm));
        if self.pending.len() >= self.fold_every || batch + 1 == self.pieces.len() {
            self.fold_pending()?;
        }
        Ok(Vec::new())
    }

    fn finish(mut self: Box<Self>, ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        let result = match (self.acc.is_none(), self.partial.take()) {
            (true, Some(partial)) if !partial.is_empty() => GroupResult::Partial(partial),
            (_, partial) => {
                if let Some(mut partial) = partial {
                    partial.flush_into(&mut self.acc)?;
                }
                self.accumulator()?;
                GroupResult::Acc(
                    self.acc
                        .take()
                        .ok_or_else(|| Error::internal("reduction accumulator missing"))?,
                )
            }
        };
        let held = ctx.detach(self.acc_bytes);
        let shared = self.shared.clone();
        let mut guard = shared
            .merge
            .lock()
            .map_err(|_| Error::internal("reduction merge lock poisoned"))?;
        let m = &mut *guard;
        m.waiting.insert(self.group, (result, held));
        m.merge_ready()?;
        if m.next < m.groups {
            return Ok(Vec::new());
        }
        let Some((acc, _held)) = m.merged.take() else {
            return Err(Error::internal("reduction finished without a result"));
        };
        drop(guard);
        let values = acc.finish(self.out.dtype(), shared.count, self.params.ddof)?;
        let encoded = self
            .out
            .encode_chunk_on(&shared.idx, &values, shared.encode_threads)?;
        Ok(vec![WriteOp::whole(
            self.out.store().clone(),
            self.out.chunk_key(&shared.idx),
            encoded,
        )])
    }

    /// Groups start in order and merge in order, so when this group waits to start, every
    /// earlier one has ended: their merged result and an even group's partial sums waiting
    /// for their pair (this group) are held, at most two accumulators.
    fn held_by_others(&self) -> u64 {
        self.group.min(2) as u64 * self.acc_bytes
    }
}

/// Maps an output chunk region to the input region it reduces.
fn input_region(params: &ReduceParams, in_shape: &[u64], out_region: &Region) -> Region {
    let rank = in_shape.len();
    let mut start = Vec::with_capacity(rank);
    let mut shape = Vec::with_capacity(rank);
    let mut k = 0;
    for (d, &n) in in_shape.iter().enumerate() {
        if params.axes.contains(&d) {
            start.push(0);
            shape.push(n);
            if params.keepdims {
                k += 1;
            }
        } else {
            start.push(out_region.start[k]);
            shape.push(out_region.shape[k]);
            k += 1;
        }
    }
    Region { start, shape }
}

/// Splits `region` at the chunk boundaries of `grid`: each piece is one input chunk's part
/// of it, so pieces are read and decoded chunk by chunk, never assembled from several.
fn pieces(grid: &ChunkGrid, region: &Region) -> Vec<Region> {
    let per_axis: Vec<Vec<(u64, u64)>> = (0..region.rank())
        .map(|d| {
            let a = &grid.axes()[d];
            let (lo, hi) = (region.start[d], region.start[d] + region.shape[d]);
            a.overlapping(lo, region.shape[d])
                .map(|i| {
                    let (start, len) = a.chunk(i);
                    let (s, e) = (start.max(lo), (start + len).min(hi));
                    (s, e - s)
                })
                .collect()
        })
        .collect();
    let counts: Vec<u64> = per_axis.iter().map(|v| v.len() as u64).collect();
    indices_in(&counts)
        .into_iter()
        .map(|ix| {
            let (start, shape) = ix
                .iter()
                .enumerate()
                .map(|(d, &i)| per_axis[d][i as usize])
                .unzip();
            Region { start, shape }
        })
        .collect()
}

/// Decoded bytes folded per partial accumulator: enough work per task to amortise the
/// partial, few enough partials to merge cheaply.
const GROUP_BYTES: u64 = 64 << 20;

/// At most this many pieces are folded together.
const FOLD_MAX: usize = 8;

/// Pieces folded together per accumulator pass. Each piece goes straight into the
/// accumulator, while it is still in cache from its decode, when every worker's accumulator
/// and piece fit the last-level cache together: then the accumulator stays there too. Else
/// several pieces are folded slab by slab, so each slab of the accumulator crosses memory
/// once per group rather than once per piece. (ERA5 sum on a 32 MiB-L3 EPYC: one piece at a
/// time is about 6% faster than eight.)
fn fold_count(acc_bytes: u64, piece_bytes: u64, share: u64, workers: usize) -> usize {
    let working_set = (acc_bytes + piece_bytes).saturating_mul(workers.max(1) as u64);
    match crate::exec::cpu_cache::last_level_cache_bytes() {
        Some(cache) if working_set <= cache => 1,
        _ => ((share / piece_bytes.max(1)) as usize).clamp(1, FOLD_MAX),
    }
}

/// Sizes of the groups `pieces` pieces are folded in, in order: `per_group` each, except
/// that near the end of the stage (`later` pieces of other output chunks still follow) groups
/// shrink to a share of what is left, so the last tasks are short and no worker idles long
/// while another finishes a full group.
fn group_sizes(pieces: usize, per_group: usize, later: usize, workers: usize) -> Vec<usize> {
    let per_group = per_group.max(1);
    let share = workers.max(1);
    let mut sizes = Vec::new();
    let mut left = pieces;
    while left > 0 {
        let size = per_group.min((left + later).div_ceil(share)).clamp(1, left);
        sizes.push(size);
        left -= size;
    }
    sizes
}

/// What the tasks of one output chunk's reduction reserve, and what they may wait beside.
#[derive(Debug, Clone, Copy)]
struct GroupBytes {
    /// A task that folds one piece at a time: its accumulator, two pieces read ahead, the
    /// piece being folded and the output.
    one_piece: u64,
    /// What each further piece folded together adds.
    per_piece: u64,
    /// One group's partial result, held from its end until it is merged.
    acc: u64,
}

impl GroupBytes {
    /// A task that folds `fold` pieces together.
    fn memory(&self, fold: usize) -> u64 {
        self.one_piece + (fold.max(1) as u64 - 1) * self.per_piece
    }

    /// The most that the other groups' partial results hold while a task of a reduction in
    /// `groups` groups waits to start (see [`ReduceProcessor::held_by_others`]).
    fn held(&self, groups: usize) -> u64 {
        groups.saturating_sub(1).min(2) as u64 * self.acc
    }
}

/// The sizes of the groups one output chunk's pieces are folded in and how many pieces each
/// task folds together, so that every task fits `budget` together with the partial results
/// it may wait beside: `preferred` and `fold` when they do; else fewer pieces folded
/// together and, when even one at a time does not fit beside two partial results, fewer
/// groups (two hold one partial result while the second waits, one holds none). One group
/// folding one piece at a time is the least any budget can run, the same whatever the budget
/// or the number of workers; when even that does not fit, it is what the budget check
/// refuses, with the bytes it needs.
fn fit_groups(
    preferred: Vec<usize>,
    fold: usize,
    bytes: GroupBytes,
    budget: u64,
) -> (Vec<usize>, usize) {
    let fits = |fold: usize, groups: usize| bytes.memory(fold) + bytes.held(groups) <= budget;
    if fits(fold, preferred.len()) {
        return (preferred, fold);
    }
    let pieces: usize = preferred.iter().sum();
    let most = (1..=preferred.len().min(3))
        .rev()
        .find(|&n| fits(1, n))
        .unwrap_or(1);
    let sizes = match most {
        // Three groups or more hold at most two partial results: any number fits.
        3 => preferred,
        n if n >= preferred.len() => preferred,
        n => (0..n)
            .map(|i| pieces / n + usize::from(i < pieces % n))
            .collect(),
    };
    let fold = (1..=fold.max(1))
        .rev()
        .find(|&f| fits(f, sizes.len()))
        .unwrap_or(1);
    (sizes, fold)
}

/// The tasks of a reduce stage, for `workers` running them at once. `max_task_bytes` is the
/// share of the budget one task may take to fold several pieces together; `budget` is what
/// the stage's tasks may reserve in all, which each must fit together with the partial
/// results of other groups it waits beside (see [`fit_groups`]).
#[allow(clippy::too_many_arguments)]
pub fn tasks(
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    params: ReduceParams,
    label: &str,
    max_task_bytes: u64,
    budget: u64,
    workers: usize,
) -> Result<Vec<Task>> {
    let params = Arc::new(params);
    let in_shape = fused.shape.clone();
    let count: u64 = params.axes.iter().map(|&a| in_shape[a]).product();
    let mut tasks = Vec::new();
    let chunk_pieces: Vec<(Vec<u64>, Region, Region, Vec<Region>)> = out
        .grid()
        .chunk_indices()
        .into_iter()
        .map(|idx| {
            let out_region = out.grid().chunk_region(&idx);
            let chunk_input = input_region(&params, &in_shape, &out_region);
            let regions = pieces(&fused.grid, &chunk_input);
            (idx, out_region, chunk_input, regions)
        })
        .collect();
    let mut later: usize = chunk_pieces.iter().map(|(.., p)| p.len()).sum();
    let output_chunks = chunk_pieces.len();
    // Single-precision sums add values in float32 partial sums first (see `cascade`).
    let cascade = cascade::cascades(params.func)
        && fused.dtype() == crate::array::DType::F32
        && fused.program.is_single_precision();
    for (part, (idx, out_region, chunk_input, regions)) in chunk_pieces.into_iter().enumerate() {
        later -= regions.len();
        let reads: Vec<RegionRead> = regions
            .iter()
            .map(|p| RegionRead::plan(&fused, &arrays, p))
            .collect();
        let piece_bytes = reads
            .iter()
            .map(|r| r.leaf_bytes(&arrays))
            .max()
            .unwrap_or(0)
            .max(1);
        let piece_read = reads
            .iter()
            .map(|r| r.chunk_bytes(&arrays))
            .max()
            .unwrap_or(0);
        let per_group = (GROUP_BYTES / piece_bytes).clamp(1, reads.len().max(1) as u64) as usize;
        let out_bytes = out_region.len() * out.dtype().size() as u64;
        let acc_len = out_region.len() as usize;
        let state_bytes =
            acc_len as u64 * Accumulator::bytes_per_element(params.func, fused.dtype());
        // The f64 accumulator and, when the sum cascades, its float32 partial sums, which the
        // folds touch instead (the accumulator only once per flush).
        let partial_bytes = match cascade {
            true => acc_len as u64 * cascade::bytes_per_element(params.func),
            false => 0,
        };
        let acc_bytes = state_bytes + partial_bytes;
        let folded_bytes = if cascade { partial_bytes } else { state_bytes };
        // Fold several pieces together when their buffers fit a share of the budget.
        let share = max_task_bytes.saturating_sub(acc_bytes + 2 * piece_read + 2 * out_bytes);
        let fold_every = fold_count(folded_bytes, piece_bytes, share, workers);
        // Accumulator + two pieces read ahead + the pending pieces' leaf buffers (or the
        // decoded chunks they are read in, see `Assembler::reading_in_place`) + output.
        let bytes = GroupBytes {
            one_piece: acc_bytes + 2 * piece_read + piece_bytes.max(piece_read) + 2 * out_bytes,
            per_piece: piece_bytes.max(piece_read),
            acc: acc_bytes,
        };
        let (sizes, fold_every) = fit_groups(
            group_sizes(reads.len(), per_group, later, workers),
            fold_every,
            bytes,
            budget,
        );
        let memory = bytes.memory(fold_every);
        let groups: Vec<Vec<RegionRead>> = if reads.is_empty() {
            vec![Vec::new()]
        } else {
            let mut rest = reads.as_slice();
            sizes
                .into_iter()
                .map(|size| {
                    let (group, tail) = rest.split_at(size);
                    rest = tail;
                    group.to_vec()
                })
                .collect()
        };
        let shared = Arc::new(OutputChunk {
            idx: idx.clone(),
            encode_threads: if output_chunks == 1 { workers } else { 1 },
            merge: Mutex::new(Merge {
                groups: groups.len(),
                next: 0,
                merged: None,
                waiting: BTreeMap::new(),
            }),
            count,
        });
        for (g, group) in groups.into_iter().enumerate() {
            let batches = group
                .iter()
                .map(|r| r.read_ops(&arrays))
                .collect::<Result<_>>()?;
            // Fail at planning time, not in a task, for a function the dtype cannot take.
            if g == 0 {
                Accumulator::new(params.func, fused.dtype(), 0)?;
            }
            tasks.push(Task {
                label: format!("{label}: output chunk {idx:?}, group {g}"),
                memory,
                batches,
                outputs: Vec::new(),
                part,
                processor: Box::new(ReduceProcessor {
                    fused: fused.clone(),
                    arrays: arrays.clone(),
                    out: out.clone(),
                    params: params.clone(),
                    pieces: group,
                    chunk_input: chunk_input.clone(),
                    group: g,
                    acc: None,
                    partial: None,
                    cascade,
                    acc_len,
                    acc_bytes,
                    shared: shared.clone(),
                    pending: Vec::new(),
                    fold_every,
                }),
            });
        }
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::{fit_groups, group_sizes, GroupBytes, GroupResult, Merge};
    use crate::array::DType;
    use crate::kernels::cascade::PartialSums;
    use crate::kernels::Accumulator;
    use crate::plan::ReduceFunc;
    use std::collections::BTreeMap;

    /// Float32 partial sums holding `values`, one term each.
    fn partial(values: &[f32]) -> GroupResult {
        let mut p = PartialSums::new(ReduceFunc::Sum, values.len());
        p.sums_mut().unwrap().copy_from_slice(values);
        p.added(1);
        GroupResult::Partial(p)
    }

    #[test]
    fn partial_and_whole_group_results_merge_in_group_order() {
        let GroupResult::Partial(first) = partial(&[1e8, 0.5]) else {
            unreachable!()
        };
        let GroupResult::Partial(second) = partial(&[1.0, 0.25]) else {
            unreachable!()
        };
        let mut acc = Accumulator::from_partial(&first).unwrap();
        acc.add_partial(&second).unwrap();
        let mut m = Merge {
            groups: 3,
            next: 0,
            merged: None,
            waiting: BTreeMap::new(),
        };
        // Group 1 finishes first and waits for group 0.
        m.waiting.insert(1, (GroupResult::Acc(acc), None));
        m.merge_ready().unwrap();
        assert!(m.merged.is_none());
        m.waiting.insert(0, (partial(&[3.0, -1.0]), None));
        m.waiting.insert(2, (partial(&[1e-3, 2.0]), None));
        m.merge_ready().unwrap();
        assert_eq!(m.next, 3);
        let (merged, _) = m.merged.take().unwrap();
        let out = merged.finish(DType::F64, 1, 0.0).unwrap();
        // Each partial is widened to f64 before it is added, in group order.
        let first = 3.0f64 + (1e8f32 as f64 + 1.0) + 1e-3f32 as f64;
        assert_eq!(out.as_slice::<f64>().unwrap(), &[first, -1.0 + 0.75 + 2.0]);
    }

    #[test]
    fn partial_sums_of_paired_groups_merge_together_whatever_the_order_they_finish_in() {
        let big = 2f32.powi(53);
        let mut m = Merge {
            groups: 5,
            next: 0,
            merged: None,
            waiting: BTreeMap::new(),
        };
        // Group 0 waits for group 1, its pair.
        m.waiting.insert(0, (partial(&[big, 1.0]), None));
        m.merge_ready().unwrap();
        assert_eq!((m.next, m.merged.is_none()), (0, true));
        m.waiting.insert(3, (partial(&[1.0, 1.0]), None));
        m.waiting.insert(1, (partial(&[1.0, 1.0]), None));
        m.merge_ready().unwrap();
        assert_eq!(m.next, 2);
        m.waiting.insert(4, (partial(&[0.5, 0.5]), None));
        m.waiting.insert(2, (partial(&[1.0, 1.0]), None));
        m.merge_ready().unwrap();
        assert_eq!(m.next, 5);
        let (merged, _) = m.merged.take().unwrap();
        let out = merged.finish(DType::F64, 1, 0.0).unwrap();
        // Pairs (0, 1) and (2, 3) are summed in f64 first: 2^53 + 1 rounds to 2^53, then
        // 1 + 1 adds exactly; added one by one, each 1 would round away. Group 4 has no pair.
        let b = big as f64;
        assert_eq!(out.as_slice::<f64>().unwrap(), &[b + 2.0 + 0.5, 4.5]);
    }

    #[test]
    fn groups_cover_every_piece_in_order() {
        for (pieces, per_group, later, workers) in [
            (256, 15, 0, 2),
            (7, 3, 0, 4),
            (1, 1, 0, 1),
            (40, 8, 1000, 2),
            (10, 64, 0, 2),
        ] {
            let sizes = group_sizes(pieces, per_group, later, workers);
            assert_eq!(sizes.iter().sum::<usize>(), pieces);
            assert!(sizes.iter().all(|&s| (1..=per_group).contains(&s)));
        }
    }

    const MIB: u64 = 1 << 20;

    /// An ERA5-like sum over time: 48 one-step pieces of 1 MiB into an accumulator of 3 MiB.
    const ERA5_SUM: GroupBytes = GroupBytes {
        one_piece: 8 * MIB,
        per_piece: MIB,
        acc: 3 * MIB,
    };

    #[test]
    fn the_preferred_groups_stay_where_they_fit_beside_two_partial_results() {
        let preferred = group_sizes(48, 48, 0, 2);
        assert_eq!(preferred, vec![24, 12, 6, 3, 2, 1]);
        let (sizes, fold) = fit_groups(preferred.clone(), 3, ERA5_SUM, 16 * MIB);
        assert_eq!((sizes, fold), (preferred.clone(), 3));
        // Room for two partial results beside a task folding one piece, not three pieces.
        let (sizes, fold) = fit_groups(preferred.clone(), 3, ERA5_SUM, 15 * MIB);
        assert_eq!((sizes, fold), (preferred, 2));
    }

    #[test]
    fn a_budget_that_holds_fewer_partial_results_gets_fewer_groups() {
        let preferred = group_sizes(48, 48, 0, 2);
        // One partial result beside a task: two groups, halves of the pieces.
        let (sizes, fold) = fit_groups(preferred.clone(), 1, ERA5_SUM, 13 * MIB);
        assert_eq!((sizes, fold), (vec![24, 24], 1));
        // None: one group.
        let (sizes, fold) = fit_groups(preferred.clone(), 4, ERA5_SUM, 10 * MIB);
        assert_eq!((sizes, fold), (vec![48], 3));
        // Not even one task: one group folding one piece at a time, what the check refuses.
        let (sizes, fold) = fit_groups(preferred, 4, ERA5_SUM, 4 * MIB);
        assert_eq!((sizes, fold), (vec![48], 1));
        // Odd counts split as evenly as they go, first groups larger.
        let (sizes, _) = fit_groups(group_sizes(7, 2, 0, 1), 1, ERA5_SUM, 12 * MIB);
        assert_eq!(sizes, vec![4, 3]);
    }

    #[test]
    fn every_budget_that_holds_one_task_fits_every_task_of_its_layout() {
        let shapes = [
            GroupBytes {
                one_piece: 8 * MIB,
                per_piece: MIB,
                acc: 3 * MIB,
            },
            GroupBytes {
                one_piece: 11 * MIB,
                per_piece: MIB,
                acc: 6 * MIB,
            },
            GroupBytes {
                one_piece: 5 * MIB,
                per_piece: 2 * MIB,
                acc: 0,
            },
        ];
        for bytes in shapes {
            for (pieces, per_group, later, workers) in
                [(48, 48, 0, 2), (200, 64, 0, 16), (5, 1, 9, 3)]
            {
                for budget in (1..64).map(|m| m * MIB / 2) {
                    for fold in [1, 3, 8] {
                        let preferred = group_sizes(pieces, per_group, later, workers);
                        let (sizes, f) = fit_groups(preferred.clone(), fold, bytes, budget);
                        assert_eq!(sizes.iter().sum::<usize>(), pieces);
                        assert!(sizes.iter().all(|&s| s > 0) && (1..=fold).contains(&f));
                        assert!(sizes.len() <= preferred.len());
                        let need = bytes.memory(f) + bytes.held(sizes.len());
                        if bytes.memory(1) <= budget {
                            assert!(need <= budget, "{bytes:?} at {budget}: {sizes:?}, {f}");
                        } else {
                            assert_eq!((sizes.len(), need), (1, bytes.memory(1)));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn groups_shrink_only_at_the_end_of_the_stage() {
        // Far from the end: full groups.
        assert_eq!(group_sizes(40, 8, 1000, 2), vec![8; 5]);
        // The stage's last pieces: full groups, then halves of what is left.
        let sizes = group_sizes(256, 15, 0, 2);
        assert_eq!(&sizes[..16], &[15; 16]);
        assert_eq!(&sizes[16..], &[8, 4, 2, 1, 1]);
    }
}
