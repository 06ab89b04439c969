//! Reduce stage: for each output chunk, groups of input pieces are folded into partial
//! accumulators (each piece streamed: read, decode, evaluate tile by tile, fold), and the
//! partials merge in group order, so results do not depend on timing.

#[cfg(feature = "cuda")]
pub mod device;
pub mod device_form;
mod fold;
mod grouping;
mod merge;
pub mod partials;
mod processor;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::region::read::RegionRead;
use crate::array::grid::indices_in;
use crate::array::{ChunkGrid, Region};
use crate::error::Result;
use crate::exec::task::Task;
use crate::kernels::cascade;
use crate::kernels::Accumulator;
use crate::physical::fused::Fused;
use crate::plan::ReduceFunc;
use crate::zarr::ZarrArray;
use grouping::{fit_groups, fold_count, group_sizes, GroupBytes, GROUP_BYTES};
use merge::{Merge, OutputChunk};
use processor::ReduceProcessor;

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

/// What sizes the tasks of one reduce stage (see [`tasks`]).
struct Sizing<'a> {
    fused: &'a Fused,
    arrays: &'a [Arc<ZarrArray>],
    func: ReduceFunc,
    /// Bytes per element of the output.
    out_itemsize: u64,
    /// Whether the sums cascade through float32 partial sums.
    cascade: bool,
    max_task_bytes: u64,
    budget: u64,
    workers: usize,
    /// Groups each output chunk's pieces are spread over at least, where it has them (a
    /// job run in batches spreads a reduction over every batch running at once).
    spread: usize,
}

/// How one output chunk's reduction runs: the sizes of the groups its pieces are folded in,
/// the pieces each task folds together, what each task reserves, and its accumulator.
struct ChunkSizing {
    sizes: Vec<usize>,
    fold_every: usize,
    memory: u64,
    acc_len: usize,
    acc_bytes: u64,
}

impl Sizing<'_> {
    /// Sizes the reduction of the output chunk over `out_region`, read as `reads`, with
    /// `later` pieces of other output chunks still to come.
    fn size(&self, reads: &[RegionRead], out_region: &Region, later: usize) -> ChunkSizing {
        let (arrays, fused, func, cascade) = (self.arrays, self.fused, self.func, self.cascade);
        let (max_task_bytes, budget, workers) = (self.max_task_bytes, self.budget, self.workers);
        let piece_bytes = reads
            .iter()
            .map(|r| r.leaf_bytes(arrays))
            .max()
            .unwrap_or(0)
            .max(1);
        let piece_read = reads
            .iter()
            .map(|r| r.chunk_bytes(arrays))
            .max()
            .unwrap_or(0);
        let per_group = (GROUP_BYTES / piece_bytes).clamp(1, reads.len().max(1) as u64) as usize;
        let out_bytes = out_region.len() * self.out_itemsize;
        let acc_len = out_region.len() as usize;
        let state_bytes = acc_len as u64 * Accumulator::bytes_per_element(func, fused.dtype());
        // The f64 accumulator and, when the sum cascades, its float32 partial sums, which the
        // folds touch instead (the accumulator only once per flush).
        let partial_bytes = match cascade {
            true => acc_len as u64 * cascade::bytes_per_element(func),
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
            group_sizes(reads.len(), per_group, later, workers.max(self.spread)),
            fold_every,
            bytes,
            budget,
        );
        let memory = bytes.memory(fold_every);
        ChunkSizing {
            sizes,
            fold_every,
            memory,
            acc_len,
            acc_bytes,
        }
    }
}

/// `reads` cut into consecutive groups of `sizes` (one empty group when there are none).
fn split_groups(reads: &[RegionRead], sizes: Vec<usize>) -> Vec<Vec<RegionRead>> {
    if reads.is_empty() {
        vec![Vec::new()]
    } else {
        let mut rest = reads;
        sizes
            .into_iter()
            .map(|size| {
                let (group, tail) = rest.split_at(size);
                rest = tail;
                group.to_vec()
            })
            .collect()
    }
}

/// The tasks of a reduce stage, for `workers` running them at once (each output chunk's
/// pieces folded in at least `spread` groups where it has them), and how many the stage
/// has: all of them, or those in `window` (an output chunk whose groups the window cuts
/// leaves its partial state, see [`partials`]). `max_task_bytes` is the share of the budget
/// one task may take to fold several pieces together; `budget` is what the stage's tasks may
/// reserve in all, which each must fit together with the partial results of other groups it
/// waits beside (see [`fit_groups`]).
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
    spread: usize,
    window: Option<&partials::Window>,
) -> Result<(Vec<Task>, usize)> {
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
    let sizing = Sizing {
        fused: &fused,
        arrays: &arrays,
        func: params.func,
        out_itemsize: out.dtype().size() as u64,
        cascade,
        max_task_bytes,
        budget,
        workers,
        spread,
    };
    // The stage's index of the next output chunk's first group.
    let mut first = 0;
    for (part, (idx, out_region, chunk_input, regions)) in chunk_pieces.into_iter().enumerate() {
        later -= regions.len();
        let reads: Vec<RegionRead> = regions
            .iter()
            .map(|p| RegionRead::plan(&fused, &arrays, p))
            .collect();
        let ChunkSizing {
            sizes,
            fold_every,
            memory,
            acc_len,
            acc_bytes,
        } = sizing.size(&reads, &out_region, later);
        let groups = split_groups(&reads, sizes);
        let chunk_tasks = first..first + groups.len();
        first = chunk_tasks.end;
        let Some((held, sink)) = partials::held_groups(window, &chunk_tasks, &idx) else {
            continue;
        };
        let shared = Arc::new(OutputChunk {
            idx: idx.clone(),
            encode_threads: if output_chunks == 1 { workers } else { 1 },
            merge: Mutex::new(Merge {
                groups: held.len(),
                next: 0,
                merged: None,
                waiting: BTreeMap::new(),
            }),
            count,
            sink,
        });
        let skip = held.start;
        for (g, group) in groups.into_iter().enumerate().skip(skip).take(held.len()) {
            // Groups merge in order from the first the task list holds.
            let g = g - skip;
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
    partials::check_window(window, first, label)?;
    Ok((tasks, first))
}

#[cfg(test)]
mod tests;
