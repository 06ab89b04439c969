//! FFT stage: each task reads the input region one output chunk needs (transformed axes
//! whole), evaluates the fused input over it, runs the FFT kernels, encodes the chunk and
//! writes it.

use std::sync::Arc;

use super::region::{Arrays, Assembler, RegionRead};
use crate::array::grid::indices_in;
use crate::array::Buffer;
use crate::error::{Error, Result};
use crate::exec::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::kernels::eval_into;
use crate::kernels::fft::{transform, Block, FftNorm, FftStep};
use crate::optimize::fft::{input_region, task_bytes};
use crate::optimize::fuse::Fused;
use crate::zarr::ZarrArray;

struct FftProcessor {
    fused: Arc<Fused>,
    arrays: Arrays,
    out: Arc<ZarrArray>,
    chunk: Vec<u64>,
    steps: Arc<Vec<FftStep>>,
    norm: FftNorm,
    assembler: Assembler,
    read_batches: usize,
}

impl FftProcessor {
    /// The input region's values in the compute dtype.
    fn input_values(&mut self) -> Result<Buffer> {
        let region = self.assembler.region().clone();
        let dtype = self.fused.dtype();
        Ok(match self.fused.plain_leaf(dtype) {
            Some(l) => {
                let _ = self.assembler.leaf_inputs(&self.arrays);
                self.assembler
                    .take_leaf(l)
                    .unwrap_or_else(|| Buffer::zeros(dtype, region.len() as usize))
            }
            None => {
                let mut out = Buffer::zeros(dtype, region.len() as usize);
                let leaves = self.assembler.leaf_inputs(&self.arrays);
                eval_into(&self.fused.program, &leaves, &region.shape, &mut out)?;
                out
            }
        })
    }

    fn transform_chunk(&mut self) -> Result<WriteOp> {
        let region = self.assembler.region().clone();
        let values = self.input_values()?;
        let block = Block {
            values,
            shape: region.shape.iter().map(|&n| n as usize).collect(),
        };
        let result = transform(block, &self.steps, self.norm)?;
        let chunk_region = self.out.grid().chunk_region(&self.chunk);
        let want: Vec<usize> = chunk_region.shape.iter().map(|&n| n as usize).collect();
        if result.shape != want {
            return Err(Error::internal(format!(
                "FFT of chunk {:?} gave shape {:?}, expected {want:?}",
                self.chunk, result.shape
            )));
        }
        Ok(WriteOp {
            store: self.out.store().clone(),
            key: self.out.chunk_key(&self.chunk),
            value: self.out.encode_chunk(&self.chunk, &result.values)?,
        })
    }
}

impl Processor for FftProcessor {
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
        Ok(vec![self.transform_chunk()?])
    }

    fn finish(self: Box<Self>, _ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(Vec::new())
    }
}

/// The tasks of an FFT stage: one per chunk of `out`.
pub fn tasks(
    fused: Arc<Fused>,
    arrays: Arrays,
    out: Arc<ZarrArray>,
    steps: &[FftStep],
    norm: FftNorm,
    label: &str,
    batch_limit_bytes: u64,
) -> Vec<Task> {
    let steps = Arc::new(steps.to_vec());
    let leaf_itemsize = fused
        .leaves
        .iter()
        .map(|l| l.dtype.size() as u64)
        .sum::<u64>()
        .max(1);
    indices_in(&out.grid().grid_shape())
        .into_iter()
        .map(|chunk| {
            let out_region = out.grid().chunk_region(&chunk);
            let region = input_region(&steps, &fused.shape, &out_region);
            let read = RegionRead::plan(&fused, &arrays, &region);
            let ops: Vec<ReadOp> = read.read_ops(&arrays);
            let per_chunk = (read.chunk_bytes(&arrays) / ops.len().max(1) as u64).max(1);
            let per_batch = (batch_limit_bytes / per_chunk).max(1) as usize;
            let mut batches: Vec<Vec<ReadOp>> = ops.chunks(per_batch).map(|c| c.to_vec()).collect();
            let read_batches = batches.len();
            batches.push(Vec::new());
            let memory = task_bytes(
                &steps,
                &fused.shape,
                &out_region,
                leaf_itemsize,
                fused.dtype(),
                out.dtype(),
                per_chunk * per_batch.min(ops.len()) as u64,
            );
            Task {
                label: format!("{label}: chunk {chunk:?}"),
                memory,
                batches,
                outputs: vec![out.chunk_key(&chunk)],
                processor: Box::new(FftProcessor {
                    fused: fused.clone(),
                    arrays: arrays.clone(),
                    out: out.clone(),
                    chunk,
                    steps: steps.clone(),
                    norm,
                    assembler: Assembler::new(read),
                    read_batches,
                }),
            }
        })
        .collect()
}
