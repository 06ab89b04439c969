//! Drives a register program over an n-dimensional region, tile by tile, with broadcasting.
//!
//! Every operand (each leaf buffer and the sink) addresses the region through element strides
//! (0 on broadcast axes). Adjacent axes that are contiguous for every operand merge into one,
//! so a chunk of a plain array is one long run split into cache-sized tiles.

use super::program::{Program, Registers};
use crate::array::Buffer;
use crate::error::Result;
use crate::kernels::work::{Reg, Strided, TILE};

/// A leaf buffer and how the region's coordinates address it.
#[derive(Debug, Clone)]
pub struct LeafInput<'a> {
    /// The values.
    pub buf: &'a Buffer,
    /// Element offset of the region's origin.
    pub offset: usize,
    /// Element stride per region axis (0: broadcast along that axis).
    pub strides: Vec<usize>,
}

/// Where one tile's results go: element `offset` of the sink, then `stride` apart (0: every
/// value of the tile lands on the same sink element), and the region index of the tile's
/// first value (only filled when axis merging is off).
#[derive(Debug, Clone, Copy)]
pub struct TileTarget<'a> {
    /// Sink element offset.
    pub offset: usize,
    /// Sink element stride (0: the tile reduces onto one element; 1: contiguous; more for
    /// a piece narrower than the accumulator it folds into).
    pub stride: usize,
    /// Region index of the tile's first value (empty when axes were merged).
    pub index: &'a [u64],
}

/// Evaluates `prog` over a region of `shape`, handing each tile's result register to `sink`.
/// With `merge` off, axes are kept as they are and `TileTarget::index` is filled, so sinks
/// can tell where each value lies (arg-reductions need this).
pub fn drive(
    prog: &Program,
    regs: &mut Registers,
    leaves: &[LeafInput],
    shape: &[u64],
    sink_strides: &[usize],
    merge: bool,
    mut sink: impl FnMut(&Reg, usize, TileTarget) -> Result<()>,
) -> Result<()> {
    drive_tiles(
        leaves,
        shape,
        sink_strides,
        merge,
        |tile_leaves, n, target| {
            let r = prog.eval_tile(regs, tile_leaves, n)?;
            sink(&regs.regs[r], n, target)
        },
    )
}

/// Walks a region of `shape` tile by tile (as [`drive`] does), handing `tile` each tile's
/// leaf positions, its length and where its results go; `tile` evaluates it.
pub fn drive_tiles(
    leaves: &[LeafInput],
    shape: &[u64],
    sink_strides: &[usize],
    merge: bool,
    mut tile: impl FnMut(&[(&Buffer, Strided)], usize, TileTarget) -> Result<()>,
) -> Result<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let n_ops = leaves.len() + 1;
    let mut dims: Vec<u64> = shape.to_vec();
    let mut strides: Vec<Vec<usize>> = (0..shape.len())
        .map(|d| {
            leaves
                .iter()
                .map(|l| l.strides[d])
                .chain(std::iter::once(sink_strides[d]))
                .collect()
        })
        .collect();
    if merge {
        let mut md: Vec<u64> = Vec::new();
        let mut ms: Vec<Vec<usize>> = Vec::new();
        for (d, s) in dims.iter().zip(strides) {
            if *d == 1 {
                continue;
            }
            if let (Some(pd), Some(ps)) = (md.last_mut(), ms.last_mut()) {
                if (0..n_ops).all(|k| ps[k] == s[k] * *d as usize) {
                    *pd *= d;
                    *ps = s;
                    continue;
                }
            }
            md.push(*d);
            ms.push(s);
        }
        dims = md;
        strides = ms;
    }
    if dims.is_empty() {
        dims.push(1);
        strides.push(vec![0; n_ops]);
    }
    let rank = dims.len();
    let inner = dims[rank - 1] as usize;
    let inner_strides = &strides[rank - 1];
    let outer_total: u64 = dims[..rank - 1].iter().product();
    let mut idx = vec![0u64; rank];
    let mut bases = vec![0usize; n_ops];
    let mut tile_leaves: Vec<(&Buffer, Strided)> = leaves
        .iter()
        .map(|l| {
            (
                l.buf,
                Strided {
                    offset: 0,
                    stride: 0,
                },
            )
        })
        .collect();
    for _ in 0..outer_total {
        for (k, b) in bases.iter_mut().enumerate() {
            let origin = if k < leaves.len() {
                leaves[k].offset
            } else {
                0
            };
            *b = origin
                + (0..rank - 1)
                    .map(|d| idx[d] as usize * strides[d][k])
                    .sum::<usize>();
        }
        let mut t = 0;
        while t < inner {
            let n = TILE.min(inner - t);
            for (k, tl) in tile_leaves.iter_mut().enumerate() {
                tl.1 = Strided {
                    offset: bases[k] + t * inner_strides[k],
                    stride: inner_strides[k],
                };
            }
            idx[rank - 1] = t as u64;
            let target = TileTarget {
                offset: bases[n_ops - 1] + t * inner_strides[n_ops - 1],
                stride: inner_strides[n_ops - 1],
                index: if merge { &[] } else { &idx },
            };
            tile(&tile_leaves, n, target)?;
            t += n;
        }
        idx[rank - 1] = 0;
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(())
}

/// Evaluates `prog` over a region of `shape` into `out`, a C-ordered buffer of the region.
pub fn eval_into(
    prog: &Program,
    leaves: &[LeafInput],
    shape: &[u64],
    out: &mut Buffer,
) -> Result<()> {
    let mut regs = prog.registers();
    let strides: Vec<usize> = crate::array::grid::c_strides(shape)
        .into_iter()
        .map(|s| s as usize)
        .collect();
    drive(
        prog,
        &mut regs,
        leaves,
        shape,
        &strides,
        true,
        |reg, n, at| crate::kernels::work::store(reg, n, out, at.offset),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::DType;
    use crate::kernels::eval::inst::Inst;
    use crate::plan::expr::Signature;
    use crate::plan::{Func, Scalar};

    fn f32_buf(v: &[f32]) -> Buffer {
        let mut b = Buffer::zeros(DType::F32, v.len());
        b.as_slice_mut::<f32>().unwrap().copy_from_slice(v);
        b
    }

    #[test]
    fn broadcast_add_over_a_region() {
        // out[i, j] = a[i, j] + b[j] for a 3x4 region.
        let a = f32_buf(&(0..12).map(|x| x as f32).collect::<Vec<_>>());
        let b = f32_buf(&[100.0, 200.0, 300.0, 400.0]);
        let sig = Signature {
            compute: DType::F32,
            result: DType::F32,
        };
        let prog = Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: DType::F32,
                },
                Inst::Load {
                    leaf: 1,
                    dtype: DType::F32,
                },
                Inst::Call {
                    func: Func::Add,
                    sig,
                    args: vec![0, 1],
                },
            ],
        };
        let leaves = [
            LeafInput {
                buf: &a,
                offset: 0,
                strides: vec![4, 1],
            },
            LeafInput {
                buf: &b,
                offset: 0,
                strides: vec![0, 1],
            },
        ];
        let mut out = Buffer::zeros(DType::F32, 12);
        eval_into(&prog, &leaves, &[3, 4], &mut out).unwrap();
        let v = out.as_slice::<f32>().unwrap();
        assert_eq!(v[0], 100.0);
        assert_eq!(v[5], 205.0);
        assert_eq!(v[11], 411.0);
    }

    #[test]
    fn int8_arithmetic_wraps() {
        let mut a = Buffer::zeros(DType::I8, 2);
        a.as_slice_mut::<i8>()
            .unwrap()
            .copy_from_slice(&[127, -128]);
        let sig = Signature {
            compute: DType::I8,
            result: DType::I8,
        };
        let prog = Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: DType::I8,
                },
                Inst::Const {
                    value: Scalar::Int(1),
                    dtype: DType::I8,
                },
                Inst::Call {
                    func: Func::Add,
                    sig,
                    args: vec![0, 1],
                },
            ],
        };
        let leaves = [LeafInput {
            buf: &a,
            offset: 0,
            strides: vec![1],
        }];
        let mut out = Buffer::zeros(DType::I8, 2);
        eval_into(&prog, &leaves, &[2], &mut out).unwrap();
        assert_eq!(out.as_slice::<i8>().unwrap(), &[-128, -127]);
    }
}
