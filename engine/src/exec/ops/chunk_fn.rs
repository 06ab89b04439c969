//! Chunk-function stage: for each output chunk, read and decode the input chunks it names, hand
//! them to a caller-supplied function (Python code, through the bindings), then encode and write
//! what it returns. The engine does the IO and the codecs; only the function is foreign.

use std::sync::Arc;

use rayon::prelude::*;

use crate::array::Buffer;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::zarr::ZarrArray;

/// Computes one output chunk from its decoded input chunks.
///
/// Called on compute threads, several at a time; an implementation that needs a lock (the
/// Python GIL) takes it itself.
pub trait ChunkFunction: Send + Sync {
    /// `inputs` are the chunks task `task` asked for, in its order, each covering exactly its
    /// chunk's region (for a sharded input, an inner chunk's). Returns the output chunk's values: `out`'s dtype, its region's length.
    fn call(&self, task: usize, inputs: Vec<Buffer>) -> Result<Buffer>;
}

/// One output chunk and the input chunks it needs: `(input number, chunk index)`.
#[derive(Debug, Clone)]
pub struct ChunkTask {
    /// The output chunk's index in the target's grid.
    pub out: Vec<u64>,
    /// Input chunks, in the order the function receives them (inner chunks of a sharded
    /// input).
    pub reads: Vec<(usize, Vec<u64>)>,
}

struct ChunkFnProcessor {
    task: usize,
    spec: ChunkTask,
    inputs: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    function: Arc<dyn ChunkFunction>,
}

impl Processor for ChunkFnProcessor {
    fn process(
        &mut self,
        _batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let inputs = &self.inputs;
        let decoded: Vec<Buffer> = data
            .into_par_iter()
            .zip(self.spec.reads.par_iter())
            .map(|(bytes, (i, idx))| inputs[*i].decode_read(idx, bytes))
            .collect::<Result<_>>()?;
        for b in &decoded {
            ctx.add_decoded(b.bytes().len() as u64);
        }
        let values = self.function.call(self.task, decoded)?;
        let region = self.out.grid().chunk_region(&self.spec.out);
        if values.dtype() != self.out.dtype() || values.len() as u64 != region.len() {
            return Err(Error::new(
                ErrorKind::Plan,
                format!(
                    "the function returned {} {} values for a chunk of {} {}",
                    values.len(),
                    values.dtype(),
                    region.len(),
                    self.out.dtype()
                ),
            )
            .with_array(self.out.name())
            .with_chunk_key(self.out.chunk_key(&self.spec.out)));
        }
        let encoded = self.out.encode_chunk(&self.spec.out, &values)?;
        Ok(vec![WriteOp::whole(
            self.out.store().clone(),
            self.out.chunk_key(&self.spec.out),
            encoded,
        )])
    }

    fn finish(self: Box<Self>, _ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(Vec::new())
    }
}

/// The tasks writing every chunk of `specs` into `out`.
pub fn tasks(
    specs: Vec<ChunkTask>,
    inputs: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    function: Arc<dyn ChunkFunction>,
) -> Result<Vec<Task>> {
    specs
        .into_iter()
        .enumerate()
        .map(|(task, spec)| {
            let rank = out.grid().rank();
            if spec.out.len() != rank
                || spec
                    .out
                    .iter()
                    .zip(out.grid().grid_shape())
                    .any(|(i, n)| *i >= n)
            {
                return Err(Error::plan(
                    format!("tasks[{task}].out"),
                    format!("{:?} is not a chunk of {}", spec.out, out.name()),
                ));
            }
            let mut reads = Vec::with_capacity(spec.reads.len());
            let mut in_bytes = 0u64;
            for (k, (i, idx)) in spec.reads.iter().enumerate() {
                let arr = inputs.get(*i).ok_or_else(|| {
                    Error::plan(format!("tasks[{task}].reads[{k}]"), format!("no input {i}"))
                })?;
                // Chunks as the array is read: inner chunks of a sharded input.
                let grid = arr.read_grid();
                let g = grid.grid_shape();
                if idx.len() != g.len() || idx.iter().zip(&g).any(|(c, n)| c >= n) {
                    return Err(Error::plan(
                        format!("tasks[{task}].reads[{k}]"),
                        format!("{idx:?} is not a chunk of {}", arr.name()),
                    ));
                }
                in_bytes += grid.chunk_region(idx).len() * arr.dtype().size() as u64;
                reads.push(ReadOp {
                    store: arr.store().clone(),
                    req: arr.read_request(idx)?,
                });
            }
            let out_bytes = out.grid().chunk_region(&spec.out).len() * out.dtype().size() as u64;
            Ok(Task {
                label: format!("{}: chunk {}", out.name(), out.chunk_key(&spec.out)),
                // The encoded inputs and their decoded copies; the function's result, the
                // engine's copy of it and the encoded chunk.
                memory: 2 * in_bytes + 3 * out_bytes,
                batches: vec![reads],
                outputs: Vec::new(),
                part: task,
                processor: Box::new(ChunkFnProcessor {
                    task,
                    spec,
                    inputs: inputs.clone(),
                    out: out.clone(),
                    function: function.clone(),
                }),
            })
        })
        .collect()
}
