//! A fused elementwise expression compiled to a register program, evaluated tile by tile.

use std::collections::HashMap;

use super::fast32::{Fast32, SumMode};
use super::inst::Inst;
use super::ufunc;
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::kernels::work::{cast, fill_const, load, Reg, Strided};

/// What identifies an instruction's value: constants by their bits (0.0 is not -0.0, and a
/// NaN is the same NaN).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum InstKey {
    Load(usize, DType),
    Const(u8, u128, u64, DType),
    Call(crate::plan::Func, crate::plan::expr::Signature, Vec<usize>),
    Cast(usize, DType),
}

impl InstKey {
    fn of(inst: &Inst) -> InstKey {
        use crate::plan::Scalar;
        match inst {
            Inst::Load { leaf, dtype } => InstKey::Load(*leaf, *dtype),
            Inst::Const { value, dtype } => {
                let (tag, a, b) = match *value {
                    Scalar::Bool(v) => (0, v as u128, 0),
                    Scalar::Int(v) => (1, v as u128, 0),
                    Scalar::Float(v) => (2, v.to_bits() as u128, 0),
                    Scalar::Complex(re, im) => (3, re.to_bits() as u128, im.to_bits()),
                };
                InstKey::Const(tag, a, b, *dtype)
            }
            Inst::Call { func, sig, args } => InstKey::Call(*func, *sig, args.clone()),
            Inst::Cast { arg, to } => InstKey::Cast(*arg, *to),
        }
    }
}

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
    /// `other`'s result. An instruction this program computes already (the same function
    /// of the same registers, a load of the same leaf, a constant of the same bits) is not
    /// repeated: its register serves, so a value that several inputs share is computed once
    /// and programs grow with the plan's operations, not with the paths through them
    /// (`y = sin(y) + cos(y) + y`, repeated, would double each time).
    pub fn append(&mut self, other: &Program, leaf_map: &[usize]) -> usize {
        let mut known: HashMap<InstKey, usize> = self
            .insts
            .iter()
            .enumerate()
            .map(|(r, inst)| (InstKey::of(inst), r))
            .collect();
        let mut regs: Vec<usize> = Vec::with_capacity(other.insts.len());
        for inst in &other.insts {
            let mapped = match inst {
                Inst::Load { leaf, dtype } => Inst::Load {
                    leaf: leaf_map[*leaf],
                    dtype: *dtype,
                },
                Inst::Const { .. } => inst.clone(),
                Inst::Call { func, sig, args } => Inst::Call {
                    func: *func,
                    sig: *sig,
                    args: args.iter().map(|a| regs[*a]).collect(),
                },
                Inst::Cast { arg, to } => Inst::Cast {
                    arg: regs[*arg],
                    to: *to,
                },
            };
            let r = *known.entry(InstKey::of(&mapped)).or_insert_with(|| {
                self.insts.push(mapped);
                self.insts.len() - 1
            });
            regs.push(r);
        }
        regs.last()
            .copied()
            .unwrap_or(self.insts.len().saturating_sub(1))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::expr::Signature;
    use crate::plan::{Func, Scalar};

    fn call(func: Func, args: Vec<usize>) -> Inst {
        let sig = Signature {
            compute: DType::F64,
            result: DType::F64,
        };
        Inst::Call { func, sig, args }
    }

    #[test]
    fn a_value_several_inputs_share_is_computed_once() {
        // y = sin(y) + cos(y) + y, forty times, each input appended as fusion appends it.
        let mut y = Program {
            insts: vec![Inst::Load {
                leaf: 0,
                dtype: DType::F64,
            }],
        };
        for _ in 0..40 {
            let mut next = Program::default();
            let a = next.append(&y, &[0]);
            next.insts.push(call(Func::Sin, vec![a]));
            let s = next.insts.len() - 1;
            let b = next.append(&y, &[0]);
            next.insts.push(call(Func::Cos, vec![b]));
            let c = next.insts.len() - 1;
            next.insts.push(call(Func::Add, vec![s, c]));
            let sum = next.insts.len() - 1;
            let d = next.append(&y, &[0]);
            next.insts.push(call(Func::Add, vec![sum, d]));
            assert_eq!((a, b, d), (a, a, a));
            y = next;
        }
        assert_eq!(y.insts.len(), 1 + 40 * 4);
    }

    #[test]
    fn constants_are_the_same_only_to_the_bit() {
        let konst = |value| Inst::Const {
            value,
            dtype: DType::F64,
        };
        let zeros = Program {
            insts: vec![konst(Scalar::Float(0.0))],
        };
        let mut p = Program {
            insts: vec![konst(Scalar::Float(-0.0))],
        };
        assert_eq!(p.append(&zeros, &[]), 1, "-0.0 is not 0.0");
        assert_eq!(p.append(&zeros, &[]), 1, "0.0 is 0.0");
        let nan = Program {
            insts: vec![konst(Scalar::Float(f64::NAN))],
        };
        assert_eq!(p.append(&nan, &[]), p.append(&nan, &[]));
        assert_eq!(p.insts.len(), 3);
    }
}
