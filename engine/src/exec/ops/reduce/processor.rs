//! The task of one group: its pieces read and decoded in turn, folded (see [`super::fold`]),
//! and its result handed to the output chunk's merge, the last of which encodes the chunk.

use std::sync::Arc;

use super::merge::{GroupResult, OutputChunk};
use super::ReduceParams;
use crate::array::grid::c_strides;
use crate::array::Region;
use crate::error::{Error, Result};
use crate::exec::ops::region::assemble::Assembler;
use crate::exec::ops::region::read::RegionRead;
use crate::exec::task::{Processor, TaskContext, WriteOp};
use crate::kernels::cascade::PartialSums;
use crate::kernels::Accumulator;
use crate::physical::fused::Fused;
use crate::zarr::ZarrArray;

pub(super) struct ReduceProcessor {
    pub(super) fused: Arc<Fused>,
    pub(super) arrays: crate::exec::ops::region::read::Arrays,
    pub(super) out: Arc<ZarrArray>,
    pub(super) params: Arc<ReduceParams>,
    pub(super) pieces: Vec<RegionRead>,
    /// Input region of the whole output chunk.
    pub(super) chunk_input: Region,
    pub(super) group: usize,
    /// Made at the first fold, not when the task is built: a stage's tasks all exist at
    /// once, their accumulators should not.
    pub(super) acc: Option<Accumulator>,
    /// Float32 partial sums of a single-precision sum or mean (`cascade`), made at the first
    /// fold.
    pub(super) partial: Option<PartialSums>,
    /// Whether the reduction adds values in float32 partial sums first.
    pub(super) cascade: bool,
    pub(super) acc_len: usize,
    pub(super) acc_bytes: u64,
    pub(super) shared: Arc<OutputChunk>,
    /// Decoded pieces waiting to be folded together.
    pub(super) pending: Vec<(Region, Assembler)>,
    /// Pieces folded together.
    pub(super) fold_every: usize,
}

impl ReduceProcessor {
    pub(super) fn acc_strides(&self, piece: &Region) -> Vec<usize> {
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
        if let Some((store, key)) = &shared.sink {
            return Ok(vec![WriteOp::whole(
                store.clone(),
                key.clone(),
                Some(acc.to_bytes()),
            )]);
        }
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
