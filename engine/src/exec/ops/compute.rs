//! Compute stage: evaluate a fused value over a block of output chunks, encode each chunk and
//! write it.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::region::assemble::Assembler;
use super::region::read::RegionRead;
use crate::array::buffer::copy_region;
use crate::array::grid::{indices_between, indices_in};
use crate::array::{Buffer, ChunkGrid, Region};
use crate::error::Result;
use crate::exec::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::kernels::device::DeviceKernel;
use crate::kernels::eval_into;
use crate::physical::fused::Fused;
use crate::zarr::ZarrArray;

/// The output chunks of block `b` (of `block` chunks per axis) and the region they cover.
pub fn block_region(grid: &ChunkGrid, block: &[u64], b: &[u64]) -> (Vec<Vec<u64>>, Region) {
    let gshape = grid.grid_shape();
    let first: Vec<u64> = b.iter().zip(block).map(|(i, k)| i * k).collect();
    let counts: Vec<u64> = first
        .iter()
        .zip(block)
        .zip(&gshape)
        .map(|((f, k), g)| (*k).min(g - f))
        .collect();
    let chunks: Vec<Vec<u64>> = indices_in(&counts)
        .into_iter()
        .map(|rel| rel.iter().zip(&first).map(|(r, f)| r + f).collect())
        .collect();
    let start_region = grid.chunk_region(&first);
    let last: Vec<u64> = first.iter().zip(&counts).map(|(f, c)| f + c - 1).collect();
    let end_region = grid.chunk_region(&last);
    let region = Region {
        start: start_region.start.clone(),
        shape: (0..grid.rank())
            .map(|d| end_region.end(d) - start_region.start[d])
            .collect(),
    };
    (chunks, region)
}

/// Number of blocks along each axis.
pub fn block_grid(grid: &ChunkGrid, block: &[u64]) -> Vec<u64> {
    grid.grid_shape()
        .iter()
        .zip(block)
        .map(|(g, k)| g.div_ceil(*k))
        .collect()
}

struct ComputeProcessor {
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    chunks: Vec<Vec<u64>>,
    assembler: Assembler,
    /// Batches that carry reads; the batches after them encode output chunks.
    read_batches: usize,
    /// Output chunks encoded per encode batch.
    per_encode: usize,
    /// The block's values, once computed.
    values: Option<Buffer>,
    /// The program compiled for the run's device, when it runs elsewhere than the CPU.
    kernel: Option<Arc<DeviceKernel>>,
}

impl ComputeProcessor {
    /// Evaluates the fused program over the block (or takes the leaf itself for a copy), on
    /// the run's device; counts blocks evaluated on a GPU in `progress`.
    fn compute_values(&mut self, progress: &crate::exec::progress::Progress) -> Result<Buffer> {
        let region = self.assembler.region().clone();
        let dtype = self.out.dtype();
        Ok(match self.fused.plain_leaf(dtype) {
            Some(l) => {
                self.assembler.leaf_inputs(&self.arrays)?;
                self.assembler
                    .take_leaf(l, &self.arrays)
                    .unwrap_or_else(|| Buffer::zeros(dtype, region.len() as usize))
            }
            None => {
                let mut out = Buffer::for_overwrite(dtype, region.len() as usize);
                let leaves = self.assembler.leaf_inputs(&self.arrays)?;
                match &self.kernel {
                    Some(kernel) if kernel.accepts(&leaves, &region.shape, &out) => {
                        kernel.eval_into(&leaves, &region.shape, &mut out)?;
                        progress
                            .gpu_blocks
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => eval_into(&self.fused.program, &leaves, &region.shape, &mut out)?,
                }
                out
            }
        })
    }

    /// Encodes output chunks `chunks` of a plain copy straight from the decoded input chunks
    /// (in parallel): one copy per value instead of two.
    fn encode_from_chunks(&self, chunks: &[Vec<u64>]) -> Result<Vec<WriteOp>> {
        let dtype = self.out.dtype();
        let out = &self.out;
        chunks
            .par_iter()
            .map(|idx| {
                if out.raw_shard_layout().is_some() {
                    // A shard written inner chunk by inner chunk from the decoded chunks.
                    let shard = out.encode_raw_shard(idx, |region, dst| {
                        self.assembler.copy_into_bytes(region, dtype.size(), dst)
                    })?;
                    return Ok(WriteOp::whole(
                        out.store().clone(),
                        out.chunk_key(idx),
                        Some(shard),
                    ));
                }
                let values = self
                    .assembler
                    .copy_into(&out.grid().chunk_region(idx), dtype);
                let value = match values {
                    std::borrow::Cow::Owned(b) => out.encode_chunk_owned(idx, b)?,
                    std::borrow::Cow::Borrowed(b) => out.encode_chunk(idx, b)?,
                };
                Ok(WriteOp::whole(
                    out.store().clone(),
                    out.chunk_key(idx),
                    value,
                ))
            })
            .collect()
    }

    /// Encodes output chunks `chunks` of the block (in parallel).
    fn encode(&self, values: &Buffer, chunks: &[Vec<u64>]) -> Result<Vec<WriteOp>> {
        let region = self.assembler.region();
        let dtype = self.out.dtype();
        let out = &self.out;
        chunks
            .par_iter()
            .map(|idx| {
                let chunk_region = out.grid().chunk_region(idx);
                let encoded = if out.raw_shard_layout().is_some() {
                    Some(out.encode_raw_shard(idx, |inner, dst| {
                        copy_region(values.bytes(), region, dst, inner, inner, dtype.size())
                    })?)
                } else if chunk_region == *region {
                    out.encode_chunk(idx, values)?
                } else {
                    let mut c = Buffer::for_overwrite(dtype, chunk_region.len() as usize);
                    copy_region(
                        values.bytes(),
                        region,
                        c.bytes_mut(),
                        &chunk_region,
                        &chunk_region,
                        dtype.size(),
                    );
                    out.encode_chunk_owned(idx, c)?
                };
                Ok(WriteOp::whole(
                    out.store().clone(),
                    out.chunk_key(idx),
                    encoded,
                ))
            })
            .collect()
    }
}

impl Processor for ComputeProcessor {
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        if batch < self.read_batches {
            self.assembler.accept(data, &self.arrays, ctx)?;
            return Ok(Vec::new());
        }
        // Encode batches: their writes start while the next batch is encoded.
        let k = batch - self.read_batches;
        let start = (k * self.per_encode).min(self.chunks.len());
        let end = (start + self.per_encode).min(self.chunks.len());
        if self.assembler.keeps_chunks() {
            return self.encode_from_chunks(&self.chunks[start..end]);
        }
        let values = match self.values.take() {
            Some(v) => v,
            None => self.compute_values(ctx.progress)?,
        };
        let writes = self.encode(&values, &self.chunks[start..end]);
        self.values = Some(values);
        writes
    }

    fn finish(self: Box<Self>, _ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(Vec::new())
    }

    fn keep_existing(&mut self, existing: &std::collections::HashSet<String>) {
        let out = &self.out;
        self.chunks
            .retain(|c| !existing.contains(&out.chunk_key(c)));
    }
}

/// How one block's task reads, encodes and what it holds.
struct BlockPlan {
    /// Read batches, then one empty batch per encode batch.
    batches: Vec<Vec<ReadOp>>,
    /// Batches that carry reads.
    read_batches: usize,
    /// Output chunks encoded per encode batch.
    per_encode: usize,
    /// Bytes the task holds.
    memory: u64,
    /// Whether decoded chunks are kept whole (a plain copy).
    keep_chunks: bool,
}

impl BlockPlan {
    /// The plan of the block over `region` (`n_chunks` output chunks) reading `read`.
    #[allow(clippy::too_many_arguments)]
    fn new(
        fused: &Fused,
        arrays: &[Arc<ZarrArray>],
        out: &ZarrArray,
        read: &RegionRead,
        region: &Region,
        n_chunks: usize,
        batch_limit_bytes: u64,
        threads: usize,
    ) -> Result<Self> {
        let ops: Vec<ReadOp> = read.read_ops(arrays)?;
        let per_chunk = (read.chunk_bytes(arrays) / ops.len().max(1) as u64).max(1);
        let per_batch = (batch_limit_bytes / per_chunk).max(1) as usize;
        let mut batches: Vec<Vec<ReadOp>> = ops.chunks(per_batch).map(|c| c.to_vec()).collect();
        let read_batches = batches.len();
        // Encoding is split in batches of a few chunks per thread so writes overlap it.
        let per_encode = crate::physical::cost::chunks_per_encode(threads);
        batches.extend((0..n_chunks.div_ceil(per_encode)).map(|_| Vec::new()));
        let batch_bytes = per_chunk * per_batch.min(ops.len()) as u64;
        let out_bytes = region.len() * out.dtype().size() as u64;
        let plain = fused.plain_leaf(out.dtype()).is_some();
        let chunk_bytes =
            out.grid().chunk_shape().iter().product::<u64>() * out.dtype().size() as u64;
        // A plain copy keeps whole decoded chunks, which may reach past the block.
        let keep_chunks = plain && fused.leaves.len() == 1;
        let leaf_bytes = if keep_chunks {
            read.chunk_bytes(arrays).max(read.leaf_bytes(arrays))
        } else {
            read.leaf_bytes(arrays)
        };
        let memory = crate::physical::cost::compute_task_bytes(
            leaf_bytes,
            out_bytes,
            plain,
            batch_bytes,
            crate::physical::cost::encoded_in_flight(out_bytes, chunk_bytes, threads),
        );
        Ok(BlockPlan {
            batches,
            read_batches,
            per_encode,
            memory,
            keep_chunks,
        })
    }
}

/// Bytes the task of the block over `region` (`n_chunks` output chunks) holds when it reads
/// `read` (see [`tasks_for_blocks`]).
#[allow(clippy::too_many_arguments)]
pub fn block_memory(
    fused: &Fused,
    arrays: &[Arc<ZarrArray>],
    out: &ZarrArray,
    read: &RegionRead,
    region: &Region,
    n_chunks: usize,
    batch_limit_bytes: u64,
    threads: usize,
) -> Result<u64> {
    let plan = BlockPlan::new(
        fused,
        arrays,
        out,
        read,
        region,
        n_chunks,
        batch_limit_bytes,
        threads.max(1),
    )?;
    Ok(plan.memory)
}

/// The tasks `range` (all without one; a range past them is cut to them) of a compute stage
/// run by `threads` compute threads (the planner's count: their projected memory must match
/// its), evaluating on `kernel`'s device when given, and how many the stage has. Task `i` is
/// part `i`.
#[allow(clippy::too_many_arguments)]
pub fn tasks(
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    block: &[u64],
    label: &str,
    batch_limit_bytes: u64,
    threads: usize,
    kernel: Option<Arc<DeviceKernel>>,
    range: Option<Range<usize>>,
) -> Result<(Vec<Task>, usize)> {
    let grid = block_grid(out.grid(), block);
    let total = grid.iter().product::<u64>() as usize;
    let range = cut_to(range, total);
    let blocks = indices_between(&grid, range.start as u64..range.end as u64);
    let mut tasks = tasks_for_blocks(
        fused,
        arrays,
        out,
        block,
        blocks,
        label,
        batch_limit_bytes,
        threads,
        kernel,
    )?;
    for t in &mut tasks {
        t.part += range.start;
    }
    Ok((tasks, total))
}

/// `range` within `0..total` (all of it without one).
pub fn cut_to(range: Option<Range<usize>>, total: usize) -> Range<usize> {
    let r = range.unwrap_or(0..total);
    r.start.min(total)..r.end.clamp(r.start.min(total), total)
}

/// The tasks of blocks `blocks` (indices in the grid of `block` output chunks per axis) of a
/// compute stage (see [`tasks`]).
#[allow(clippy::too_many_arguments)]
pub fn tasks_for_blocks(
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    block: &[u64],
    blocks: Vec<Vec<u64>>,
    label: &str,
    batch_limit_bytes: u64,
    threads: usize,
    kernel: Option<Arc<DeviceKernel>>,
) -> Result<Vec<Task>> {
    let threads = threads.max(1);
    blocks
        .into_iter()
        .enumerate()
        .map(|(part, b)| {
            let (chunks, region) = block_region(out.grid(), block, &b);
            let read = RegionRead::plan(&fused, &arrays, &region);
            let BlockPlan {
                batches,
                read_batches,
                per_encode,
                memory,
                keep_chunks,
            } = BlockPlan::new(
                &fused,
                &arrays,
                &out,
                &read,
                &region,
                chunks.len(),
                batch_limit_bytes,
                threads,
            )?;
            let label = format!("{label}: block {b:?}");
            let outputs = chunks.iter().map(|c| out.chunk_key(c)).collect();
            Ok(Task {
                label,
                memory,
                batches,
                outputs,
                part,
                processor: Box::new(ComputeProcessor {
                    fused: fused.clone(),
                    arrays: arrays.clone(),
                    out: out.clone(),
                    chunks,
                    assembler: if keep_chunks {
                        Assembler::new(read).keeping_chunks(&arrays)
                    } else {
                        Assembler::new(read)
                    },
                    read_batches,
                    per_encode,
                    values: None,
                    kernel: kernel.clone(),
                }),
            })
        })
        .collect()
}
