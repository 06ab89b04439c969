//! Folding decoded pieces into a group's accumulator (or its float32 partial sums), tile by
//! tile, slab by slab.

use std::collections::BTreeMap;
use std::ops::Range;

use super::processor::ReduceProcessor;
use crate::array::grid::c_strides;
use crate::array::Buffer;
use crate::array::Region;
use crate::error::{Error, Result};
use crate::exec::ops::region::assemble::Assembler;
use crate::kernels::cascade::{self, PartialSums};
use crate::kernels::eval::drive_tiles;
use crate::kernels::eval::{Program, Registers, SumMode};
use crate::kernels::work::Strided;
use crate::kernels::Accumulator;
use crate::plan::ReduceFunc;

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
    pub(super) fn accumulator(&mut self) -> Result<&mut Accumulator> {
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
    pub(super) fn fold_pending(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let Some((first, _)) = pending.first() else {
            return Ok(());
        };
        let rank = first.rank();
        let strides = self.acc_strides(first);
        let positions = self.params.func.is_arg();
        let axes = &self.params.axes;
        let (terms, covers_all) = self.fold_terms(&pending);
        let (offsets, axis, slab, extent) = self.slabs(&pending, &strides);
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
                                if p.add_tile(
                                    program,
                                    &mut regs,
                                    tile_leaves,
                                    range,
                                    skip_nan,
                                    mode,
                                )? {
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
                        let index = match positions {
                            true => tile_index(axes, rank, piece, at.index, &full_strides),
                            false => (0, 0),
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

impl ReduceProcessor {
    /// How many values each element of the output takes from the pending pieces, at most
    /// (pieces over the same kept region add up), and whether the first piece gives each
    /// element of the accumulator exactly one value.
    fn fold_terms(&self, pending: &[(Region, Assembler)]) -> (u64, bool) {
        let Some((first, _)) = pending.first() else {
            return (0, false);
        };
        let rank = first.rank();
        let axes = &self.params.axes;
        let mut per_region: BTreeMap<Vec<u64>, u64> = BTreeMap::new();
        for (piece, _) in pending {
            let kept = (0..rank)
                .filter(|d| !axes.contains(d))
                .map(|d| piece.start[d]);
            let values: u64 = axes.iter().map(|&a| piece.shape[a]).product();
            *per_region.entry(kept.collect()).or_default() += values;
        }
        let terms = per_region.values().copied().max().unwrap_or(0);
        let covers_all = (0..rank).all(|d| match axes.contains(&d) {
            true => first.shape[d] == 1,
            false => {
                first.start[d] == self.chunk_input.start[d]
                    && first.shape[d] == self.chunk_input.shape[d]
            }
        });
        (terms, covers_all)
    }

    /// Where each pending piece's part of the accumulator starts, and the slabs they are
    /// folded in: the slab axis (the first kept axis longer than 1, if any; none for
    /// arg-reductions), the slab length along it (`u64::MAX`: one pass, no slabs) and the
    /// extent the slabs cover.
    fn slabs(
        &self,
        pending: &[(Region, Assembler)],
        strides: &[usize],
    ) -> (Vec<usize>, usize, u64, u64) {
        let Some((first, _)) = pending.first() else {
            return (Vec::new(), 0, u64::MAX, 1);
        };
        let rank = first.rank();
        let positions = self.params.func.is_arg();
        let axes = &self.params.axes;
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
        (offsets, axis, slab, extent)
    }
}

impl FoldSums<'_> {
    /// Adds one tile of a single-precision program straight into the float32 running sums
    /// over `range`; false when the program cannot add it this way.
    fn add_tile(
        &mut self,
        program: &Program,
        regs: &mut Registers,
        tile_leaves: &[(&Buffer, Strided)],
        range: Range<usize>,
        skip_nan: bool,
        mode: SumMode,
    ) -> Result<bool> {
        let n = range.len();
        let sums = &mut self.sums[range.clone()];
        if skip_nan {
            let counts = self.counts.as_deref_mut().map(|c| &mut c[range]);
            program.eval_tile_add_f32_skip_nan(regs, tile_leaves, n, sums, counts, mode)
        } else {
            program.eval_tile_add_f32(regs, tile_leaves, n, sums, mode)
        }
    }
}

/// The global reduction index of an arg-reduction tile's first value (the tile at `index`
/// in `piece`) and the step between its values.
fn tile_index(
    axes: &[usize],
    rank: usize,
    piece: &Region,
    index: &[u64],
    full_strides: &[u64],
) -> (i64, i64) {
    if axes.len() == 1 && rank > 1 {
        let a = axes[0];
        let b = (piece.start[a] + index[a]) as i64;
        (b, if a == rank - 1 { 1 } else { 0 })
    } else {
        let b: u64 = (0..rank)
            .map(|d| (piece.start[d] + index[d]) * full_strides[d])
            .sum();
        (b as i64, 1)
    }
}

/// Bytes of accumulator state assumed per element when sizing slabs.
const ACC_BYTES_PER_ELEMENT: u64 = 8;
/// Accumulator bytes per slab: about the size of L2.
const SLAB_BYTES: u64 = 256 * 1024;
