//! Float32 programs evaluated in single precision.
//!
//! The general evaluator computes every float in f64 and rounds float32 results after each
//! function. For the IEEE-exact functions (+ − × ÷, sqrt, abs, negation, floor, ceil,
//! maximum, minimum) computing directly in f32 gives the same bits: f64 holds more than
//! 2 × 24 + 2 significand bits, so rounding the f64 result to f32 is the correctly rounded f32
//! result. A program made only of float32 loads, constants and such functions is therefore
//! evaluated here in f32: half the bytes per value, twice the SIMD lanes, no conversions
//! between steps, constants as scalars rather than filled registers, and contiguous leaves
//! read in place rather than copied. The modulus of a complex64 leaf (as in a power spectrum,
//! `abs(z) ** 2`) joins such programs as a load: the general evaluator computes it in f64 and
//! rounds it to float32, and so does this path.

use super::program::Inst;
use super::work::{wrap_int, Strided, TILE};
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::plan::expr::Func;
use crate::plan::Scalar;

/// An operand: the value of an earlier step, or a constant.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Arg {
    Step(usize),
    Scalar(f32),
}

/// One step; its value is the slot with the step's index.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Load {
        leaf: usize,
    },
    /// `|z|` of a complex64 leaf, as the general evaluator computes it (the parts squared
    /// and summed in f64, its square root rounded to float32).
    LoadAbs {
        leaf: usize,
    },
    Unary {
        func: Func,
        a: usize,
    },
    Binary {
        func: Func,
        a: Arg,
        b: Arg,
    },
}

/// How a tile's values go into float32 running sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumMode {
    /// Added to the sums there.
    Add,
    /// Written as the sums' first values (whatever the sums held is dropped).
    Start,
}

/// A program whose values are all float32, compiled to single-precision steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Fast32 {
    steps: Vec<Step>,
    result: Arg,
}

fn is_unary(func: Func) -> bool {
    matches!(
        func,
        Func::Negative | Func::Abs | Func::Sqrt | Func::Floor | Func::Ceil
    )
}

fn is_binary(func: Func) -> bool {
    matches!(
        func,
        Func::Add | Func::Subtract | Func::Multiply | Func::Divide | Func::Maximum | Func::Minimum
    )
}

#[inline(always)]
fn unary_fn(func: Func, x: f32) -> f32 {
    match func {
        Func::Negative => -x,
        Func::Abs => x.abs(),
        Func::Sqrt => x.sqrt(),
        Func::Floor => x.floor(),
        _ => x.ceil(),
    }
}

#[inline(always)]
fn nan_max(x: f32, y: f32) -> f32 {
    // numpy: NaN propagates, and of equal values (`-0.0` and `0.0`) the second.
    if x.is_nan() || x > y {
        x
    } else {
        y
    }
}

#[inline(always)]
fn nan_min(x: f32, y: f32) -> f32 {
    if x.is_nan() || x < y {
        x
    } else {
        y
    }
}

#[inline(always)]
fn binary_fn(func: Func, x: f32, y: f32) -> f32 {
    match func {
        Func::Add => x + y,
        Func::Subtract => x - y,
        Func::Multiply => x * y,
        Func::Divide => x / y,
        Func::Maximum => nan_max(x, y),
        _ => nan_min(x, y),
    }
}

/// The float32 value of a constant that the general evaluator would give after loading it as
/// `dtype` and casting it to float32; `None` for constants this path does not take.
fn const_as_f32(value: Scalar, dtype: DType) -> Option<f32> {
    let v = match (value, dtype) {
        (Scalar::Float(f), DType::F32 | DType::F64) => f,
        (Scalar::Int(i), DType::F32 | DType::F64) => i as f64,
        (
            Scalar::Int(i),
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32,
        ) => wrap_int(i as i64, dtype) as f64,
        _ => return None,
    };
    Some(v as f32)
}

impl Fast32 {
    /// Compiles `insts` when every value is float32 and every function exact in f32.
    pub fn compile(insts: &[Inst]) -> Option<Fast32> {
        let mut steps = Vec::new();
        let mut vals: Vec<Arg> = Vec::with_capacity(insts.len());
        let push = |steps: &mut Vec<Step>, s: Step| {
            steps.push(s);
            Arg::Step(steps.len() - 1)
        };
        for inst in insts {
            let v = match inst {
                Inst::Load {
                    leaf,
                    dtype: DType::F32,
                } => push(&mut steps, Step::Load { leaf: *leaf }),
                // A complex64 leaf is only usable through `abs` (calls below check their
                // arguments are float32, casts that they cast float32 or constants).
                Inst::Load {
                    dtype: DType::C64, ..
                } => Arg::Scalar(f32::NAN),
                Inst::Call {
                    func: Func::Abs,
                    sig,
                    args,
                } if sig.compute == DType::C64 && sig.result == DType::F32 => match args[..] {
                    [a] => match insts.get(a)? {
                        Inst::Load {
                            leaf,
                            dtype: DType::C64,
                        } => push(&mut steps, Step::LoadAbs { leaf: *leaf }),
                        _ => return None,
                    },
                    _ => return None,
                },
                // A constant of another dtype is only usable through a cast to float32 (calls
                // below take float32 arguments only), which gives this value.
                Inst::Const { value, dtype } => Arg::Scalar(const_as_f32(*value, *dtype)?),
                Inst::Cast {
                    arg,
                    to: DType::F32,
                } => match (insts.get(*arg)?, *vals.get(*arg)?) {
                    (from, v) if from.dtype() == DType::F32 => v,
                    (Inst::Const { .. }, v) => v,
                    _ => return None,
                },
                Inst::Call { func, sig, args }
                    if sig.compute == DType::F32
                        && sig.result == DType::F32
                        && args
                            .iter()
                            .all(|a| insts.get(*a).map(Inst::dtype) == Some(DType::F32)) =>
                {
                    match (args.as_slice(), is_unary(*func), is_binary(*func)) {
                        // x ** 2 is x * x, exactly (numpy squares too).
                        ([a, b], _, _)
                            if *func == Func::Power
                                && *vals.get(*b)? == Arg::Scalar(2.0)
                                && matches!(vals.get(*a)?, Arg::Step(_)) =>
                        {
                            let x = *vals.get(*a)?;
                            push(
                                &mut steps,
                                Step::Binary {
                                    func: Func::Multiply,
                                    a: x,
                                    b: x,
                                },
                            )
                        }
                        ([a], true, _) => match *vals.get(*a)? {
                            Arg::Scalar(x) => Arg::Scalar(unary_fn(*func, x)),
                            Arg::Step(a) => push(&mut steps, Step::Unary { func: *func, a }),
                        },
                        ([a, b], _, true) => match (*vals.get(*a)?, *vals.get(*b)?) {
                            (Arg::Scalar(x), Arg::Scalar(y)) => Arg::Scalar(binary_fn(*func, x, y)),
                            (a, b) => push(&mut steps, Step::Binary { func: *func, a, b }),
                        },
                        _ => return None,
                    }
                }
                _ => return None,
            };
            vals.push(v);
        }
        if insts.last()?.dtype() != DType::F32 {
            return None;
        }
        let result = *vals.last()?;
        Some(Fast32 { steps, result })
    }

    /// Scratch slots for one tile per step.
    pub fn scratch(&self) -> Vec<Vec<f32>> {
        vec![vec![0.0; TILE]; self.steps.len()]
    }

    /// Evaluates `n` values (n ≤ TILE) into `out` as f64 (exactly the float32 values).
    pub fn eval(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        out: &mut [f64],
    ) -> Result<()> {
        self.dispatch(scratch, leaves, n, Write(out))
    }

    /// Evaluates `n` values (n ≤ TILE) and adds them, as f64, to `sums` (a sum's fold without
    /// a register in between: the same additions [`eval`](Self::eval) and a fold make).
    pub fn eval_add(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f64],
    ) -> Result<()> {
        self.dispatch(scratch, leaves, n, Add(sums))
    }

    /// Evaluates `n` values (n ≤ TILE) and adds them to the float32 running sums `sums`, or
    /// with [`SumMode::Start`] writes them there (the sums' first values).
    pub fn eval_add_f32(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f32],
        mode: SumMode,
    ) -> Result<()> {
        match mode {
            SumMode::Add => self.dispatch(scratch, leaves, n, Add(sums)),
            SumMode::Start => self.dispatch(scratch, leaves, n, Write(sums)),
        }
    }

    /// Evaluates `n` values (n ≤ TILE) and adds those that are not NaN to the float32 running
    /// sums `sums`, counting them in `counts` when given (nansum, nanmean); with
    /// [`SumMode::Start`] the sums and counts start from those values instead.
    pub fn eval_add_f32_skip_nan(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sums: &mut [f32],
        counts: Option<&mut [u8]>,
        mode: SumMode,
    ) -> Result<()> {
        self.dispatch(scratch, leaves, n, SkipNan(sums, counts, mode))
    }

    /// [`eval_impl`](Self::eval_impl) compiled for AVX2 where the CPU has it.
    fn dispatch<S: Sink>(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sink: S,
    ) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { self.eval_avx2(scratch, leaves, n, sink) };
        }
        self.eval_impl(scratch, leaves, n, sink)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn eval_avx2<S: Sink>(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sink: S,
    ) -> Result<()> {
        self.eval_impl(scratch, leaves, n, sink)
    }

    /// Evaluates `n` values and hands them to `sink`.
    #[inline(always)]
    fn eval_impl<S: Sink>(
        &self,
        scratch: &mut [Vec<f32>],
        leaves: &[(&Buffer, Strided)],
        n: usize,
        sink: S,
    ) -> Result<()> {
        // Contiguous leaves are read where they lie (on the stack for short programs: this
        // runs once per tile).
        let mut on_stack: [Option<&[f32]>; 16] = [None; 16];
        let mut on_heap: Vec<Option<&[f32]>>;
        let direct: &mut [Option<&[f32]>] = if self.steps.len() <= on_stack.len() {
            &mut on_stack[..self.steps.len()]
        } else {
            on_heap = vec![None; self.steps.len()];
            &mut on_heap
        };
        // The result's own step, when it is the last and a function, goes straight to the
        // sink: one pass over the tile fewer.
        let last = self.steps.len().saturating_sub(1);
        let fused = self.result == Arg::Step(last)
            && matches!(
                self.steps.get(last),
                Some(Step::Unary { .. } | Step::Binary { .. })
            );
        let stored = if fused { last } else { self.steps.len() };
        for (k, step) in self.steps[..stored].iter().enumerate() {
            let (before, rest) = scratch.split_at_mut(k);
            let dst = &mut rest[0][..n];
            match *step {
                Step::Load { leaf } => {
                    let (buf, at) = leaves[leaf];
                    let src = buf.as_slice::<f32>()?;
                    match at.stride {
                        1 => direct[k] = Some(&src[at.offset..at.offset + n]),
                        _ => gather(src, at, dst, |x| *x),
                    }
                }
                Step::LoadAbs { leaf } => {
                    let (buf, at) = leaves[leaf];
                    let src = buf.as_slice::<[f32; 2]>()?;
                    gather(src, at, dst, |z| {
                        super::ops::complex64_modulus(z[0] as f64, z[1] as f64) as f32
                    });
                }
                Step::Unary { func, a } => {
                    let a = direct[a].unwrap_or(&before[a][..n]);
                    match func {
                        Func::Negative => map(a, dst, |x| -x),
                        Func::Abs => map(a, dst, f32::abs),
                        Func::Sqrt => map(a, dst, f32::sqrt),
                        Func::Floor => map(a, dst, f32::floor),
                        _ => map(a, dst, f32::ceil),
                    }
                }
                Step::Binary { func, a, b } => {
                    let view = |arg: Arg| match arg {
                        Arg::Step(j) => Ok(direct[j].unwrap_or(&before[j][..n])),
                        Arg::Scalar(x) => Err(x),
                    };
                    match func {
                        Func::Add => zip(view(a), view(b), dst, |x, y| x + y),
                        Func::Subtract => zip(view(a), view(b), dst, |x, y| x - y),
                        Func::Multiply => zip(view(a), view(b), dst, |x, y| x * y),
                        Func::Divide => zip(view(a), view(b), dst, |x, y| x / y),
                        Func::Maximum => zip(view(a), view(b), dst, nan_max),
                        _ => zip(view(a), view(b), dst, nan_min),
                    }
                }
            }
        }
        if fused {
            let before = &scratch[..last];
            match self.steps[last] {
                Step::Unary { func, a } => {
                    let a = &direct[a].unwrap_or(&before[a][..n])[..n];
                    match func {
                        Func::Negative => sink.put(n, a.iter().map(|x| -x)),
                        Func::Abs => sink.put(n, a.iter().map(|x| x.abs())),
                        Func::Sqrt => sink.put(n, a.iter().map(|x| x.sqrt())),
                        Func::Floor => sink.put(n, a.iter().map(|x| x.floor())),
                        _ => sink.put(n, a.iter().map(|x| x.ceil())),
                    }
                }
                Step::Binary { func, a, b } => {
                    let view = |arg: Arg| match arg {
                        Arg::Step(j) => Ok(direct[j].unwrap_or(&before[j][..n])),
                        Arg::Scalar(x) => Err(x),
                    };
                    let (a, b) = (view(a), view(b));
                    match func {
                        Func::Add => put_zip(sink, n, a, b, |x, y| x + y),
                        Func::Subtract => put_zip(sink, n, a, b, |x, y| x - y),
                        Func::Multiply => put_zip(sink, n, a, b, |x, y| x * y),
                        Func::Divide => put_zip(sink, n, a, b, |x, y| x / y),
                        Func::Maximum => put_zip(sink, n, a, b, nan_max),
                        _ => put_zip(sink, n, a, b, nan_min),
                    }
                }
                _ => return Err(crate::error::Error::internal("fused float32 step")),
            }
            return Ok(());
        }
        match self.result {
            Arg::Scalar(x) => sink.put(n, std::iter::repeat_n(x, n)),
            Arg::Step(k) => sink.put(
                n,
                direct[k].unwrap_or(&scratch[k][..n])[..n].iter().copied(),
            ),
        }
        Ok(())
    }
}

/// `f` over two operands, each `n` values (`Ok`) or a scalar (`Err`), into `sink`.
#[inline(always)]
fn put_zip<S: Sink>(
    sink: S,
    n: usize,
    a: std::result::Result<&[f32], f32>,
    b: std::result::Result<&[f32], f32>,
    f: impl Fn(f32, f32) -> f32,
) {
    match (a, b) {
        (Ok(a), Ok(b)) => sink.put(n, a[..n].iter().zip(&b[..n]).map(|(x, y)| f(*x, *y))),
        (Ok(a), Err(y)) => sink.put(n, a[..n].iter().map(|x| f(*x, y))),
        (Err(x), Ok(b)) => sink.put(n, b[..n].iter().map(|y| f(x, *y))),
        (Err(x), Err(y)) => sink.put(n, std::iter::repeat_n(f(x, y), n)),
    }
}

/// Where a program's `n` float32 results of a tile go, given in order.
trait Sink {
    fn put(self, n: usize, values: impl Iterator<Item = f32>);
}

/// Written to a slice, exactly (f32, or f64 which holds every f32).
struct Write<'a, T>(&'a mut [T]);

/// Added to a slice's running sums.
struct Add<'a, T>(&'a mut [T]);

/// Added to float32 running sums unless NaN, and counted when counts are given; with
/// [`SumMode::Start`], written as the sums' first values (0 for NaN) and counts (1, or 0).
struct SkipNan<'a>(&'a mut [f32], Option<&'a mut [u8]>, SumMode);

impl<T: Copy + From<f32>> Sink for Write<'_, T> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        self.0[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(o, x)| *o = T::from(x));
    }
}

impl<T: Copy + From<f32> + std::ops::AddAssign> Sink for Add<'_, T> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        self.0[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(o, x)| *o += T::from(x));
    }
}

impl Sink for SkipNan<'_> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        match self.2 {
            SumMode::Add => {
                skip_nan_into(self.0, self.1, n, values, |s, x| *s += x, |c, k| *c += k)
            }
            SumMode::Start => {
                skip_nan_into(self.0, self.1, n, values, |s, x| *s = x, |c, k| *c = k)
            }
        }
    }
}

/// Each of `n` values (0 where NaN) into `sums` by `sum`, and 1 (0 where NaN) into `counts`
/// by `count` when given. Branch-free, so the loops vectorize.
#[inline(always)]
fn skip_nan_into(
    sums: &mut [f32],
    counts: Option<&mut [u8]>,
    n: usize,
    values: impl Iterator<Item = f32>,
    sum: impl Fn(&mut f32, f32),
    count: impl Fn(&mut u8, u8),
) {
    match counts {
        None => sums[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(s, x)| sum(s, if x.is_nan() { 0.0 } else { x })),
        Some(counts) => {
            for ((s, c), x) in sums[..n].iter_mut().zip(&mut counts[..n]).zip(values) {
                let seen = !x.is_nan();
                sum(s, if seen { x } else { 0.0 });
                count(c, seen as u8);
            }
        }
    }
}

/// `f` of the tile's values of `src` at `at` (contiguous, broadcast or strided), into `out`.
#[inline(always)]
fn gather<T>(src: &[T], at: Strided, out: &mut [f32], f: impl Fn(&T) -> f32) {
    match at.stride {
        1 => {
            let src = &src[at.offset..at.offset + out.len()];
            out.iter_mut().zip(src).for_each(|(o, x)| *o = f(x));
        }
        0 => out.fill(f(&src[at.offset])),
        s => out
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = f(&src[at.offset + i * s])),
    }
}

#[inline(always)]
fn map(a: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
    out.iter_mut().zip(a).for_each(|(o, x)| *o = f(*x));
}

/// `f` over two operands, each a tile (`Ok`) or a scalar (`Err`); never both scalars.
#[inline(always)]
fn zip(
    a: std::result::Result<&[f32], f32>,
    b: std::result::Result<&[f32], f32>,
    out: &mut [f32],
    f: impl Fn(f32, f32) -> f32,
) {
    match (a, b) {
        (Ok(a), Ok(b)) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (x, y))| *o = f(*x, *y)),
        (Ok(a), Err(y)) => out.iter_mut().zip(a).for_each(|(o, x)| *o = f(*x, y)),
        (Err(x), Ok(b)) => out.iter_mut().zip(b).for_each(|(o, y)| *o = f(x, *y)),
        (Err(x), Err(y)) => out.fill(f(x, y)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::program::{Inst, Program};
    use crate::kernels::work::{Reg, Strided};
    use crate::plan::expr::Signature;
    use proptest::prelude::*;

    const F32: Signature = Signature {
        compute: DType::F32,
        result: DType::F32,
    };

    fn call(func: Func, args: Vec<usize>) -> Inst {
        Inst::Call {
            func,
            sig: F32,
            args,
        }
    }

    fn load(leaf: usize) -> Inst {
        Inst::Load {
            leaf,
            dtype: DType::F32,
        }
    }

    /// Every function of this path over two leaves and a constant, both orders of operands.
    fn programs() -> Vec<Program> {
        let c = Inst::Const {
            value: Scalar::Float(1.5),
            dtype: DType::F32,
        };
        let mut out = Vec::new();
        for func in [
            Func::Add,
            Func::Subtract,
            Func::Multiply,
            Func::Divide,
            Func::Maximum,
            Func::Minimum,
        ] {
            out.push(Program {
                insts: vec![load(0), load(1), call(func, vec![0, 1])],
            });
            out.push(Program {
                insts: vec![load(0), c.clone(), call(func, vec![1, 0])],
            });
            out.push(Program {
                insts: vec![load(0), c.clone(), call(func, vec![0, 1])],
            });
        }
        out.push(Program {
            insts: vec![
                load(0),
                Inst::Const {
                    value: Scalar::Int(2),
                    dtype: DType::F32,
                },
                call(Func::Power, vec![0, 1]),
            ],
        });
        for func in [
            Func::Negative,
            Func::Abs,
            Func::Sqrt,
            Func::Floor,
            Func::Ceil,
        ] {
            out.push(Program {
                insts: vec![
                    load(0),
                    load(1),
                    call(func, vec![0]),
                    call(Func::Multiply, vec![2, 1]),
                ],
            });
            // A function as the last step goes straight to the sink: of a contiguous leaf
            // and of a strided one.
            out.push(Program {
                insts: vec![load(0), call(func, vec![0])],
            });
            out.push(Program {
                insts: vec![load(1), call(func, vec![0])],
            });
        }
        // A chain of steps with constants, as `(x + 1) * 2`, and a plain load.
        out.push(Program {
            insts: vec![
                load(0),
                c.clone(),
                call(Func::Add, vec![0, 1]),
                c.clone(),
                call(Func::Multiply, vec![2, 3]),
            ],
        });
        out.push(Program {
            insts: vec![load(1)],
        });
        out
    }

    fn buf(v: &[f32]) -> Buffer {
        let mut b = Buffer::zeros(DType::F32, v.len());
        if let Ok(s) = b.as_slice_mut::<f32>() {
            s.copy_from_slice(v);
        }
        b
    }

    fn general(prog: &Program, leaves: &[(&Buffer, Strided)], n: usize) -> Vec<f64> {
        let mut regs: Vec<Reg> = prog
            .insts
            .iter()
            .map(|i| {
                let mut r = Reg::for_dtype(i.dtype());
                if let Inst::Const { value, dtype } = i {
                    crate::kernels::work::fill_const(&mut r, *value, *dtype);
                }
                r
            })
            .collect();
        let r = prog.eval_general(&mut regs, leaves, n).unwrap();
        match &regs[r] {
            Reg::F(v) => v[..n].to_vec(),
            other => panic!("not a float register: {other:?}"),
        }
    }

    fn same(a: f64, b: f64) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    proptest! {
        /// Bit for bit what the general f64 evaluator gives, contiguous, broadcast and
        /// strided leaves alike.
        #[test]
        fn matches_the_general_evaluator(
            a in proptest::collection::vec(prop_oneof![
                -1e30f32..1e30f32, Just(f32::NAN), Just(0.0f32), Just(-0.0f32),
                Just(f32::INFINITY), Just(3.4e38f32), 1e-40f32..1e-37f32], 1..=TILE),
            b in proptest::collection::vec(-1e6f32..1e6f32, 2 * TILE),
            stride in 0usize..3,
        ) {
            let n = a.len();
            let ab = buf(&a);
            let bb = buf(&b);
            let leaves = [
                (&ab, Strided { offset: 0, stride: 1 }),
                (&bb, Strided { offset: 0, stride }),
            ];
            for prog in programs() {
                let fast = Fast32::compile(&prog.insts).expect("compiles");
                let mut scratch = fast.scratch();
                let mut out = vec![0.0f64; TILE];
                fast.eval(&mut scratch, &leaves, n, &mut out).unwrap();
                let want = general(&prog, &leaves, n);
                for i in 0..n {
                    prop_assert!(same(out[i], want[i]), "{prog:?} at {i}: {} vs {}", out[i], want[i]);
                }
                // Added straight into running sums: the same additions a fold makes.
                let mut sums: Vec<f64> = (0..TILE).map(|i| i as f64 * 0.37 - 20.0).collect();
                fast.eval_add(&mut scratch, &leaves, n, &mut sums).unwrap();
                for i in 0..n {
                    let expected = (i as f64 * 0.37 - 20.0) + want[i];
                    prop_assert!(same(sums[i], expected), "{prog:?} sum at {i}: {} vs {expected}", sums[i]);
                }
                // Added into float32 running sums: one f32 addition of the exact value.
                let mut sums32: Vec<f32> = (0..TILE).map(|i| i as f32 * 0.37 - 20.0).collect();
                fast.eval_add_f32(&mut scratch, &leaves, n, &mut sums32, SumMode::Add).unwrap();
                for i in 0..n {
                    let expected = ((i as f32 * 0.37 - 20.0) as f64 + want[i]) as f32;
                    prop_assert!(same(sums32[i] as f64, expected as f64), "{prog:?} f32 sum at {i}: {} vs {expected}", sums32[i]);
                }
                // Started: the values themselves, whatever the sums held; nothing past `n`.
                let mut started: Vec<f32> = vec![7.5; TILE];
                fast.eval_add_f32(&mut scratch, &leaves, n, &mut started, SumMode::Start).unwrap();
                for i in 0..n {
                    prop_assert!(same(started[i] as f64, want[i]), "{prog:?} started sum at {i}: {} vs {}", started[i], want[i]);
                }
                prop_assert!(started[n..].iter().all(|x| *x == 7.5));
                // NaN-skipping float32 sums, counted (nanmean) and not (nansum).
                let base = |i: usize| i as f32 * 0.37 - 20.0;
                let mut nan_sums: Vec<f32> = (0..TILE).map(base).collect();
                let mut plain_sums = nan_sums.clone();
                let mut counts: Vec<u8> = (0..TILE).map(|i| (i % 7) as u8).collect();
                fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut nan_sums, Some(&mut counts), SumMode::Add).unwrap();
                fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut plain_sums, None, SumMode::Add).unwrap();
                for i in 0..n {
                    let (expected, count) = match want[i].is_nan() {
                        true => (base(i), (i % 7) as u8),
                        false => (((base(i) as f64) + want[i]) as f32, (i % 7) as u8 + 1),
                    };
                    prop_assert!(same(nan_sums[i] as f64, expected as f64), "{prog:?} nan sum at {i}: {} vs {expected}", nan_sums[i]);
                    prop_assert!(same(plain_sums[i] as f64, expected as f64), "{prog:?} uncounted nan sum at {i}");
                    prop_assert_eq!(counts[i], count, "{:?} count at {}", prog, i);
                }
                // Started, skipping NaNs: the value or 0, counted 1 or 0, whatever was there.
                let mut nan_started = vec![7.5f32; TILE];
                let mut plain_started = nan_started.clone();
                let mut started_counts = vec![9u8; TILE];
                fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut nan_started, Some(&mut started_counts), SumMode::Start).unwrap();
                fast.eval_add_f32_skip_nan(&mut scratch, &leaves, n, &mut plain_started, None, SumMode::Start).unwrap();
                for i in 0..n {
                    let (expected, count) = match want[i].is_nan() {
                        true => (0.0, 0),
                        false => (want[i] as f32, 1),
                    };
                    prop_assert!(same(nan_started[i] as f64, expected as f64), "{prog:?} started nan sum at {i}: {} vs {expected}", nan_started[i]);
                    prop_assert!(same(plain_started[i] as f64, expected as f64), "{prog:?} started uncounted nan sum at {i}");
                    prop_assert_eq!(started_counts[i], count, "{:?} started count at {}", prog, i);
                }
                prop_assert!(nan_started[n..].iter().chain(&plain_started[n..]).all(|x| *x == 7.5));
                prop_assert!(started_counts[n..].iter().all(|c| *c == 9));
            }
        }
    }

    fn complex_load(leaf: usize) -> Inst {
        Inst::Load {
            leaf,
            dtype: DType::C64,
        }
    }

    fn complex_abs(arg: usize) -> Inst {
        Inst::Call {
            func: Func::Abs,
            sig: Signature {
                compute: DType::C64,
                result: DType::F32,
            },
            args: vec![arg],
        }
    }

    proptest! {
        /// `abs` of complex64 leaves (a power spectrum is `abs(z) * abs(z)`), bit for bit what
        /// the general evaluator gives.
        #[test]
        fn complex_moduli_match_the_general_evaluator(
            z in proptest::collection::vec(prop_oneof![
                -1e30f32..1e30f32, Just(f32::NAN), Just(0.0f32), Just(-0.0f32),
                Just(f32::INFINITY), Just(3.4e38f32), 1e-40f32..1e-37f32], 2..=2 * TILE),
            stride in 0usize..3,
        ) {
            let n = z.len() / 2;
            let mut zb = Buffer::zeros(DType::C64, n);
            zb.as_slice_mut::<[f32; 2]>().unwrap().iter_mut().enumerate().for_each(|(i, v)| {
                *v = [z[2 * i], z[2 * i + 1]];
            });
            let count = if stride == 0 { 1 } else { n.div_ceil(stride) };
            let leaves = [(&zb, Strided { offset: 0, stride })];
            let squared = Program {
                insts: vec![complex_load(0), complex_abs(0), call(Func::Multiply, vec![1, 1])],
            };
            let plus = Program {
                insts: vec![
                    complex_load(0),
                    complex_abs(0),
                    Inst::Const { value: Scalar::Float(0.25), dtype: DType::F32 },
                    call(Func::Add, vec![1, 2]),
                ],
            };
            for prog in [squared, plus] {
                let fast = Fast32::compile(&prog.insts).expect("compiles");
                let mut scratch = fast.scratch();
                let mut out = vec![0.0f64; TILE];
                fast.eval(&mut scratch, &leaves, count, &mut out).unwrap();
                let want = general(&prog, &leaves, count);
                for i in 0..count {
                    prop_assert!(same(out[i], want[i]), "{prog:?} at {i}: {} vs {}", out[i], want[i]);
                }
            }
        }
    }

    #[test]
    fn complex_leaves_are_only_read_through_abs() {
        // The complex value itself, its cast to float32 or arithmetic on it: general path.
        for insts in [
            vec![complex_load(0)],
            vec![
                complex_load(0),
                Inst::Cast {
                    arg: 0,
                    to: DType::F32,
                },
            ],
            vec![
                complex_load(0),
                Inst::Call {
                    func: Func::Multiply,
                    sig: Signature {
                        compute: DType::C64,
                        result: DType::C64,
                    },
                    args: vec![0, 0],
                },
                complex_abs(1),
            ],
        ] {
            assert!(Fast32::compile(&insts).is_none(), "{insts:?}");
        }
    }

    #[test]
    fn casts_of_constants_fold_and_other_programs_stay_general() {
        let prog = Program {
            insts: vec![
                load(0),
                Inst::Const {
                    value: Scalar::Float(0.1),
                    dtype: DType::F64,
                },
                Inst::Cast {
                    arg: 1,
                    to: DType::F32,
                },
                call(Func::Add, vec![0, 2]),
            ],
        };
        let fast = Fast32::compile(&prog.insts).expect("compiles");
        assert_eq!(
            fast.steps[1],
            Step::Binary {
                func: Func::Add,
                a: Arg::Step(0),
                b: Arg::Scalar(0.1f64 as f32)
            }
        );
        let exp = Program {
            insts: vec![load(0), call(Func::Exp, vec![0])],
        };
        assert!(Fast32::compile(&exp.insts).is_none());
        let f64_load = Program {
            insts: vec![Inst::Load {
                leaf: 0,
                dtype: DType::F64,
            }],
        };
        assert!(Fast32::compile(&f64_load.insts).is_none());
    }
}
