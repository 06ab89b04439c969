//! Evaluating a compiled program over one tile: steps into scratch slots (contiguous leaves
//! read where they lie), the last step straight into a [`Sink`].

use super::sink::{Add, Sink, SkipNan, Write};
use super::{nan_max, nan_min, Arg, Fast32, Step, SumMode};
use crate::array::Buffer;
use crate::error::{Error, Result};
use crate::kernels::eval::ufunc::complex64_modulus;
use crate::kernels::work::Strided;
use crate::plan::expr::Func;

impl Fast32 {
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
                        complex64_modulus(z[0] as f64, z[1] as f64) as f32
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
                _ => return Err(Error::internal("fused float32 step")),
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
