//! A reduction stage run whole on a GPU (see [`super::device_form`]): its input is read onto
//! the device slab by slab along the first axis (zstd chunks decoded there by nvCOMP; a slab
//! takes at most a quarter of the device's free memory and, by its stored bytes, a quarter of
//! the task budget), each slab folded into accumulators kept on the device, and the finished
//! values come back once; tasks then encode and write the output chunks from them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rayon::prelude::*;

use super::device_form::DeviceReduce;
use crate::array::buffer::copy_region;
use crate::array::grid::indices_in;
use crate::array::{Buffer, Region};
use crate::error::{Error, Result};
use crate::exec::progress::Progress;
use crate::exec::task::{Processor, Task, TaskContext, WriteOp};
use crate::kernels::eval::gpu::{DeviceReduction, Gpu};
use crate::physical::stage::Stage;
use crate::read::read_windows_to_device;
use crate::zarr::ZarrArray;

/// The share of the device's free memory one slab's values take at most: the read's
/// batches inside a slab overlap their reads with the device's decode, slabs do not.
const SLAB_SHARE: u64 = 4;
/// Decoded bytes of output chunks one write task encodes.
const WRITE_TASK_BYTES: u64 = 64 << 20;

/// The slabs of `shape` (the stage's value, at `start` of a material chunked as `grid`) along
/// axis 0: cut at the material's chunk boundaries, each at most `limit` bytes of values
/// (`elem` bytes each) or one chunk row. Each is `(first index, length)` in the value.
pub fn slabs(
    shape: &[u64],
    start: &[u64],
    grid: &crate::array::ChunkGrid,
    elem: u64,
    limit: u64,
) -> Vec<(u64, u64)> {
    let Some((&n, rest)) = shape.split_first() else {
        return vec![(0, 1)];
    };
    let row = rest.iter().product::<u64>() * elem;
    let (first, end) = (start[0], start[0] + n);
    let rows = grid.grid_shape().first().copied().unwrap_or(1);
    let mut cuts = vec![first];
    for i in 0..rows {
        let mut idx = vec![0u64; shape.len()];
        idx[0] = i;
        let b = grid.chunk_region(&idx).start[0];
        if b > first && b < end {
            cuts.push(b);
        }
    }
    cuts.push(end);
    let mut out: Vec<(u64, u64)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0] - first, w[1] - first);
        match out.last_mut() {
            Some((s, len)) if (b - *s) * row <= limit => *len = b - *s,
            _ => out.push((a, b - a)),
        }
    }
    out
}

/// Runs the reduction `stage` (placed by `form`) on `gpu` over its input `input`, reading
/// with `threads` CPU threads, at most `stored_limit` stored bytes per slab; returns the
/// tasks that write its output `out`.
#[allow(clippy::too_many_arguments)]
pub fn run_on_device(
    stage: &Stage,
    form: &DeviceReduce<'_>,
    input: &ZarrArray,
    out: &Arc<ZarrArray>,
    gpu: &'static Gpu,
    threads: usize,
    stored_limit: u64,
    progress: &Progress,
) -> Result<Vec<Task>> {
    let Stage::Reduce {
        input: value,
        func,
        axes,
        ddof,
        label,
        ..
    } = stage
    else {
        return Err(Error::internal(
            "a device reduction of a stage that is not one",
        ));
    };
    let mut red = DeviceReduction::start(
        gpu,
        *func,
        &value.program,
        form.leaf.dtype,
        out.dtype(),
        &value.shape,
        axes,
    )
    .map_err(|e| e.with_array(out.name()))?;
    let elem = input.dtype().size() as u64;
    let ratio = input.sampled_compression().unwrap_or(1.0).max(1.0);
    let free = gpu.free_bytes()?;
    let limit = (free / SLAB_SHARE)
        .min((stored_limit as f64 * ratio) as u64)
        .max(1);
    for (first, len) in slabs(&value.shape, &form.start, input.grid(), elem, limit) {
        let mut start = vec![0u64; value.shape.len()];
        let mut shape = value.shape.clone();
        if let Some(s) = start.first_mut() {
            (*s, shape[0]) = (first, len);
        }
        let at: Vec<u64> = start.iter().zip(&form.start).map(|(a, b)| a + b).collect();
        let (mut slab, stats) = read_windows_to_device(input, &[at], &shape, gpu, threads)?;
        slab.reshape(&shape)?;
        red.fold(&slab, &start)
            .and_then(|()| red.sync())
            .map_err(|e| e.with_array(input.name()))?;
        progress
            .bytes_read
            .fetch_add(stats.stored_bytes, Ordering::Relaxed);
        progress
            .decoded_bytes
            .fetch_add(stats.output_bytes, Ordering::Relaxed);
        progress.gpu_blocks.fetch_add(1, Ordering::Relaxed);
    }
    let count: u64 = axes.iter().map(|&a| value.shape[a]).product();
    let values = Arc::new(red.finish(out.dtype(), count, *ddof)?);
    Ok(write_tasks(values, out, label))
}

/// The write tasks of a device reduction's output `out`: each task's output chunks and the
/// bytes it reserves.
pub fn write_plan(out: &ZarrArray) -> Vec<(Vec<Vec<u64>>, u64)> {
    let grid = out.grid();
    let chunks = indices_in(&grid.grid_shape());
    let elem = out.dtype().size() as u64;
    let chunk_bytes = grid.chunk_shape().iter().product::<u64>().max(1) * elem;
    let per_task = (WRITE_TASK_BYTES / chunk_bytes).max(1) as usize;
    chunks
        .chunks(per_task)
        .map(|group| (group.to_vec(), 2 * group.len() as u64 * chunk_bytes))
        .collect()
}

/// Tasks that encode and write every chunk of `out` from `values` (all of it, C order).
fn write_tasks(values: Arc<Buffer>, out: &Arc<ZarrArray>, label: &str) -> Vec<Task> {
    write_plan(out)
        .into_iter()
        .enumerate()
        .map(|(part, (chunks, memory))| Task {
            label: format!(
                "{label}: write {} chunk(s) computed on the device",
                chunks.len()
            ),
            memory,
            batches: vec![Vec::new()],
            outputs: chunks.iter().map(|idx| out.chunk_key(idx)).collect(),
            processor: Box::new(WriteValues {
                values: values.clone(),
                out: out.clone(),
                chunks,
            }),
            part,
        })
        .collect()
}

/// Encodes output chunks from the whole output's values.
struct WriteValues {
    values: Arc<Buffer>,
    out: Arc<ZarrArray>,
    chunks: Vec<Vec<u64>>,
}

impl Processor for WriteValues {
    fn process(
        &mut self,
        _batch: usize,
        _data: Vec<Option<crate::store::Value>>,
        _ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let out = &self.out;
        let whole = Region::whole(&out.shape());
        let dtype = out.dtype();
        self.chunks
            .par_iter()
            .map(|idx| {
                let region = out.grid().chunk_region(idx);
                let mut chunk = Buffer::for_overwrite(dtype, region.len() as usize);
                copy_region(
                    self.values.bytes(),
                    &whole,
                    chunk.bytes_mut(),
                    &region,
                    &region,
                    dtype.size(),
                );
                let encoded = out.encode_chunk_owned(idx, chunk)?;
                Ok(WriteOp::whole(
                    out.store().clone(),
                    out.chunk_key(idx),
                    encoded,
                ))
            })
            .collect()
    }

    fn finish(self: Box<Self>, _ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::ChunkGrid;

    #[test]
    fn slabs_cut_at_chunk_boundaries_within_their_bytes() {
        let grid = ChunkGrid::regular(&[10, 4], &[3, 4]).unwrap();
        // 16 bytes a row: three rows (one chunk row) fit in 48.
        assert_eq!(
            slabs(&[10, 4], &[0, 0], &grid, 4, 48),
            vec![(0, 3), (3, 3), (6, 3), (9, 1)]
        );
        assert_eq!(
            slabs(&[10, 4], &[0, 0], &grid, 4, 100),
            vec![(0, 6), (6, 4)]
        );
        // A value shifted by 2 rows: its first slab ends at the material's boundary 3.
        assert_eq!(
            slabs(&[7, 4], &[2, 0], &grid, 4, 48),
            vec![(0, 1), (1, 3), (4, 3)]
        );
        // A chunk row larger than the limit is one slab.
        assert_eq!(slabs(&[10, 4], &[0, 0], &grid, 4, 8).len(), 4);
        assert_eq!(slabs(&[], &[], &grid, 4, 8), vec![(0, 1)]);
    }
}
