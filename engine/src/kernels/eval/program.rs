//! A fused elementwise expression compiled to a register program, evaluated tile by tile.

use super::fast32::{Fast32, SumMode};
use super::inst::Inst;
use super::ufunc;
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::kernels::work::{cast, fill_const, load, Reg, Strided};

/// A register program; the value is the last instruction's register.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Program {
    /// Instructions in evaluation order.
    pub insts: Vec<Inst>,
}

impl Program {
    /// The result dtype.
    pub fn dtype(&self) -> DType {
        self.insts.last().map(|i| i.dtype()).unwrap_or(DType::F64)
    }

    /// The leaf this program merely loads, if it is a single `Load`.
    pub fn as_single_load(&self) -> Option<usize> {
        match self.insts.as_slice() {
            [Inst::Load { leaf, .. }] => Some(*leaf),
            _ => None,
        }
    }

    /// Appends `other`, whose leaves are renumbered by `leaf_map`; returns the register of
    /// `other`'s result.
    pub fn append(&mut self, other: &Program, leaf_map: &[usize]) -> usize {
        let base = self.insts.len();
        for inst in &other.insts {
            self.insts.push(match inst {
                Inst::Load { leaf, dtype } => Inst::Load {
                    leaf: leaf_map[*leaf],
                    dtype: *dtype,
                },
                Inst::Const { .. } => inst.clone(),
                Inst::Call { func, sig, args } => Inst::Call {
                    func: *func,
                    sig: *sig,
                    args: args.iter().map(|a| a + base).collect(),
                },
                Inst::Cast { arg, to } => Inst::Cast {
                    arg: arg + base,
                    to: *to,
                },
            });
        }
        self.insts.len() - 1
    }

    /// Registers sized for one tile, constants filled, and the single-precision form of the
    /// program when it has one.
    pub fn registers(&self) -> Registers {
        let regs = self
            .insts
            .iter()
            .map(|inst| {
                let mut r = Reg::for_dtype(inst.dtype());
                if let Inst::Const { value, dtype } = inst {
                    fill_const(&mut r, *value, *dtype);
                }
                r
            })
            .collect();
        let fast32 = Fast32::compile(&self.insts).map(|f| {
            let scratch = f.scratch();
            (f, scratch)
        });
        Registers { regs, fast32 }
    }

    /// Evaluates `n` values (n ≤ TILE); `leaves[i]` gives leaf i's buffer and where the tile's
    /// values lie in it. Returns the index of the result register in `regs.regs`.
    pub fn eval_tile(
        &self,
        regs: &mut Registers,
        leaves: &[(&Buffer, Strided)],
        n: usize,
    ) -> Result<usize> {
        let last = self.insts.len() - 1;
        if let (Some((fast, scratch)), Some(Reg::F(out))) =
            (regs.fast32.as_mut(), regs.regs.get_mut(last))
        {
            fast.eval(scratch, leaves, n, out)?;
            return Ok(last);
        }
        self.eval_general(&mut regs.regs, leaves, n)
    }

    /// Adds `n` values (n ≤ TILE) to `sums` when the program runs in single precision (as
    /// [`Program::eval_tile`] and a sum's fold would, without the register in between);
    /// `Ok(false)`, touching nothing, when it does not.
    pub fn eval_tile_add(
        &self,
        regs: &mut Registers,
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f64],
    ) -> Result<bool> {
        match regs.fast32.as_mut() {
            Some((fast, scratch)) => fast.eval_add(scratch, leaves, n, sums).map(|()| true),
            None => Ok(false),
        }
    }

    /// Adds `n` values (n ≤ TILE) to the float32 running sums `sums` (or starts them, by
    /// `mode`) when the program runs in single precision; `Ok(false)`, touching nothing, when
    /// it does not.
    pub fn eval_tile_add_f32(
        &self,
        regs: &mut Registers,
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f32],
        mode: SumMode,
    ) -> Result<bool> {
        match regs.fast32.as_mut() {
            Some((fast, scratch)) => fast
                .eval_add_f32(scratch, leaves, n, sums, mode)
                .map(|()| true),
            None => Ok(false),
        }
    }

    /// Adds the `n` values (n ≤ TILE) that are not NaN to the float32 running sums `sums`,
    /// counting them in `counts` when given (or starts both, by `mode`), when the program runs
    /// in single precision; `Ok(false)`, touching nothing, when it does not.
    pub fn eval_tile_add_f32_skip_nan(
        &self,
        regs: &mut Registers,
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f32],
        counts: Option<&mut [u8]>,
        mode: SumMode,
    ) -> Result<bool> {
        match regs.fast32.as_mut() {
            Some((fast, scratch)) => fast
                .eval_add_f32_skip_nan(scratch, leaves, n, sums, counts, mode)
                .map(|()| true),
            None => Ok(false),
        }
    }

    /// Whether the program runs in single precision (float32 values throughout).
    pub fn is_single_precision(&self) -> bool {
        Fast32::compile(&self.insts).is_some()
    }

    /// [`Program::eval_tile`] by the general evaluator: every float in f64.
    pub fn eval_general(
        &self,
        regs: &mut [Reg],
        leaves: &[(&Buffer, Strided)],
        n: usize,
    ) -> Result<usize> {
        for (i, inst) in self.insts.iter().enumerate() {
            match inst {
                Inst::Load { leaf, .. } => {
                    let (buf, at) = leaves[*leaf];
                    load(buf, at, n, &mut regs[i])?;
                }
                Inst::Const { .. } => {}
                Inst::Call { func, sig, args } => {
                    let (before, rest) = regs.split_at_mut(i);
                    let arg_regs: Vec<&Reg> = args.iter().map(|&a| &before[a]).collect();
                    ufunc::call(*func, *sig, &arg_regs, &mut rest[0], n)?;
                }
                Inst::Cast { arg, to } => {
                    let (before, rest) = regs.split_at_mut(i);
                    cast(&before[*arg], &mut rest[0], *to, n);
                }
            }
        }
        Ok(self.insts.len() - 1)
    }
}

/// A program's working registers for one tile.
#[derive(Debug)]
pub struct Registers {
    /// One register per instruction.
    pub regs: Vec<Reg>,
    /// The single-precision form of the program and its scratch slots, when it has one.
    fast32: Option<(Fast32, Vec<Vec<f32>>)>,
}
