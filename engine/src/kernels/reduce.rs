//! Streaming reductions: accumulators that fold tiles, merge with each other, and finish into
//! numpy's result.
//!
//! Sums accumulate in f64 (float32 programs add up to 16 values per element in float32
//! first, see [`cascade`](super::cascade)),
//! complex sums in complex f64, integer sums wrap in 64 bits as numpy's do. Variance uses
//! Welford's update per element and Chan's formula to merge partial results.

use num_complex::Complex64;

use super::cascade::PartialSums;
use super::region::TileTarget;
use super::work::{narrow, Reg};
use crate::array::{Buffer, DType};
use crate::error::{Error, Result};
use crate::plan::ReduceFunc;

/// Per-element state of a reduction.
#[derive(Debug, Clone)]
enum State {
    /// Sum, product, min or max of floats, as f64 in a pooled buffer.
    F(Buffer),
    /// Sum or product of complex values.
    C(Vec<Complex64>),
    /// Sum or product of signed (and small unsigned) integers.
    I(Vec<i64>),
    /// Sum or product of uint64.
    U(Vec<u64>),
    /// any / all / min / max of bools.
    B(Vec<bool>),
    /// nanmean: sums and counts of non-NaN values.
    NanMeanF(Vec<f64>, Vec<u64>),
    /// nanmean of complex values.
    NanMeanC(Vec<Complex64>, Vec<u64>),
    /// var/std: count, mean, sum of squared deviations.
    Welford(Vec<f64>, Vec<f64>, Vec<f64>),
    /// var/std of complex values: count, complex mean, sum of squared moduli of deviations.
    WelfordC(Vec<f64>, Vec<Complex64>, Vec<f64>),
    /// argmin/argmax (and their NaN-skipping forms): best value (as f64, i64 or u64 in
    /// `Reg`), its index, and whether seen.
    Arg(Reg, Vec<i64>, Vec<bool>),
}

/// A reduction's running state for every element of one output region.
#[derive(Debug, Clone)]
pub struct Accumulator {
    func: ReduceFunc,
    state: State,
}

/// `len` copies of `v` in pooled memory.
/// `vals` folded into `a` by `f` through `LANES` running values that start at `identity`
/// (f's identity element) and join `a` at the end: independent chains the CPU runs side by
/// side and vectorizes, where a single chain waits on every step. Sums add in another order
/// than one chain would (in f64 either way); min and max give the same result.
#[inline(always)]
fn fold_lanes(a: f64, vals: &[f64], identity: f64, f: impl Fn(f64, f64) -> f64) -> f64 {
    const LANES: usize = 8;
    let mut lanes = [identity; LANES];
    let mut chunks = vals.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = f(*l, *v);
        }
    }
    let a = lanes.into_iter().fold(a, &f);
    chunks.remainder().iter().fold(a, |a, v| f(a, *v))
}

/// Float values `vals` (reduction indices `i0`, `i0 + step`, ...) folded into consecutive
/// elements of an argmax (`MAX`) or argmin state: best values `best`, their indices `idx` and
/// whether each element has a value yet `seen`. The rule of the scalar fold, written without
/// branches so that it vectorizes: a value replaces the best when the element has none, when
/// it is better, or when it ties at an earlier index. Without `SKIP` the first NaN wins (as in
/// numpy), with it NaNs are passed over.
#[inline(always)]
fn arg_fold_run<const MAX: bool, const SKIP: bool>(
    best: &mut [f64],
    idx: &mut [i64],
    seen: &mut [bool],
    vals: &[f64],
    (i0, step): (i64, i64),
) {
    let n = vals.len();
    let (best, idx, seen) = (&mut best[..n], &mut idx[..n], &mut seen[..n]);
    for k in 0..n {
        let (x, cur) = (vals[k], best[k]);
        let i = i0 + k as i64 * step;
        let (gt, lt) = if MAX {
            (x > cur, cur > x)
        } else {
            (x < cur, cur < x)
        };
        let (xn, cn) = (x.is_nan(), cur.is_nan());
        let (better, worse) = if SKIP {
            (cn | gt, !cn & lt)
        } else {
            (!cn & (xn | gt), !xn & (cn | lt))
        };
        let tie = !better & !worse;
        let take = (!seen[k] | better | (tie & (i < idx[k]))) & !(SKIP & xn);
        best[k] = if take { x } else { cur };
        idx[k] = if take { i } else { idx[k] };
        seen[k] |= take;
    }
}

/// `vals` folded by `f` into the elements of `acc` from `o`, `stride` (at least 1) apart:
/// one value per element.
#[inline(always)]
fn fold_spread<T: Copy, V: Copy>(
    acc: &mut [T],
    o: usize,
    stride: usize,
    vals: &[V],
    f: impl Fn(T, V) -> T,
) {
    if stride == 1 {
        for (a, v) in acc[o..o + vals.len()].iter_mut().zip(vals) {
            *a = f(*a, *v);
        }
    } else {
        for (k, v) in vals.iter().enumerate() {
            let a = &mut acc[o + k * stride];
            *a = f(*a, *v);
        }
    }
}

fn f64_state(len: usize, v: f64) -> Buffer {
    Buffer::filled(DType::F64, len, &v.to_ne_bytes())
}

/// `len` copies of `value`, each written here. `vec![0; len]` would come from calloc: fresh
/// pages the accumulator first reads map the shared zero page, so the first write to each takes
/// a second fault that copies the page and interrupts every core to flush its TLB (a quarter of
/// a NaN-mean's time on 1 M-element groups).
fn written<T: Clone>(value: T, len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    v.resize(len, value);
    v
}

/// The error for float32 partial sums of `func` that an accumulator cannot take, and why.
fn partial_mismatch(func: ReduceFunc, why: &str) -> Error {
    Error::internal(format!("float32 partial sums of {}: {why}", func.name()))
}

/// The float32 sums of one or two partials.
type SumParts<'a> = (&'a [f32], Option<&'a [f32]>);

/// The counts of one or two nanmean partials.
type CountParts<'a> = (&'a [u8], Option<&'a [u8]>);

/// The sums (and counts, all or none) of `first` and `second`, partial sums of `func` of
/// one length.
fn widened_parts<'a>(
    func: ReduceFunc,
    first: &'a PartialSums,
    second: Option<&'a PartialSums>,
) -> Result<(SumParts<'a>, Option<CountParts<'a>>)> {
    if let Some(other) = std::iter::once(first)
        .chain(second)
        .find(|p| p.func() != func)
    {
        let why = format!("given to {}", func.name());
        return Err(partial_mismatch(other.func(), &why));
    }
    let sums = (first.sums()?, second.map(|p| p.sums()).transpose()?);
    let counts = (first.counts()?, second.map(|p| p.counts()).transpose()?);
    let len = sums.0.len();
    if sums.1.is_some_and(|s| s.len() != len) {
        return Err(partial_mismatch(func, "partial sums of different lengths"));
    }
    let counts = match counts {
        (None, None | Some(None)) => None,
        (Some(a), None) if a.len() == len => Some((a, None)),
        (Some(a), Some(Some(b))) if a.len() == len && b.len() == len => Some((a, Some(b))),
        _ => {
            return Err(partial_mismatch(
                func,
                "counts missing, unexpected or of another length",
            ))
        }
    };
    Ok((sums, counts))
}

/// Writes (or with `add`, adds) each element's f64 sum of the partial sums to `out`.
fn widen_into(out: &mut [f64], (a, b): SumParts, add: bool) {
    match (b, add) {
        (None, false) => out.iter_mut().zip(a).for_each(|(o, x)| *o = *x as f64),
        (None, true) => out.iter_mut().zip(a).for_each(|(o, x)| *o += *x as f64),
        (Some(b), false) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (x, y))| *o = *x as f64 + *y as f64),
        (Some(b), true) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (x, y))| *o += *x as f64 + *y as f64),
    }
}

/// Adds the partials' counts to `out`.
fn count_into(out: &mut [u64], (a, b): CountParts) {
    match b {
        None => out.iter_mut().zip(a).for_each(|(o, c)| *o += u64::from(*c)),
        Some(b) => out
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (c, d))| *o += u64::from(*c) + u64::from(*d)),
    }
}

fn init_minmax_f(max: bool) -> f64 {
    if max {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    }
}

impl Accumulator {
    /// A fresh accumulator of `len` elements for `func` computing in `compute`.
    pub fn new(func: ReduceFunc, compute: DType, len: usize) -> Result<Self> {
        use super::work::{work_of, Work};
        use ReduceFunc::*;
        let w = work_of(compute);
        let is_max = matches!(func, Max | NanMax);
        let state = match (func, w) {
            (Sum | NanSum | Mean, Work::F) => State::F(f64_state(len, 0.0)),
            (Sum | NanSum | Mean, Work::C) => State::C(written(Complex64::new(0.0, 0.0), len)),
            (Sum | NanSum | Mean, Work::I) => State::I(written(0, len)),
            (Sum | NanSum | Mean, Work::U) => State::U(written(0, len)),
            (Prod | NanProd, Work::F) => State::F(f64_state(len, 1.0)),
            (Prod | NanProd, Work::C) => State::C(written(Complex64::new(1.0, 0.0), len)),
            (Prod | NanProd, Work::I) => State::I(written(1, len)),
            (Prod | NanProd, Work::U) => State::U(written(1, len)),
            (NanMean, Work::F) => State::NanMeanF(written(0.0, len), written(0, len)),
            (NanMean, Work::C) => {
                State::NanMeanC(written(Complex64::new(0.0, 0.0), len), written(0, len))
            }
            (NanMean, Work::I | Work::U) => State::F(f64_state(len, 0.0)),
            (Min | Max, Work::F) => State::F(f64_state(len, init_minmax_f(is_max))),
            (NanMin | NanMax, Work::F) => State::F(f64_state(len, f64::NAN)),
            (Min | Max | NanMin | NanMax, Work::I) => {
                State::I(written(if is_max { i64::MIN } else { i64::MAX }, len))
            }
            (Min | Max | NanMin | NanMax, Work::U) => {
                State::U(written(if is_max { 0 } else { u64::MAX }, len))
            }
            (Min | Max | NanMin | NanMax, Work::B) => State::B(written(!is_max, len)),
            (Any, Work::B) => State::B(written(false, len)),
            (All, Work::B) => State::B(written(true, len)),
            (Var | Std | NanVar | NanStd, Work::F) => {
                State::Welford(written(0.0, len), written(0.0, len), written(0.0, len))
            }
            (Var | Std | NanVar | NanStd, Work::C) => State::WelfordC(
                written(0.0, len),
                written(Complex64::new(0.0, 0.0), len),
                written(0.0, len),
            ),
            (Argmin | Argmax | NanArgmin | NanArgmax, w) if w != Work::C => {
                let reg = match w {
                    Work::I | Work::B => Reg::I(written(0, len)),
                    Work::U => Reg::U(written(0, len)),
                    _ => Reg::F(written(0.0, len)),
                };
                State::Arg(reg, written(0, len), written(false, len))
            }
            _ => {
                return Err(Error::new(
                    crate::error::ErrorKind::Unsupported,
                    format!("{} computing in {compute} is not supported", func.name()),
                ))
            }
        };
        Ok(Accumulator { func, state })
    }

    /// Bytes of state per element, for memory projections.
    pub fn bytes_per_element(func: ReduceFunc, compute: DType) -> u64 {
        use super::work::{work_of, Work};
        use ReduceFunc::*;
        let w = work_of(compute);
        // The element sizes of the state `new` makes.
        let value: u64 = match w {
            Work::C => 16,
            Work::B => 1,
            _ => 8,
        };
        match (func, w) {
            (NanMean, Work::F | Work::C) => value + 8,
            (NanMean, _) => 8,
            (Var | Std | NanVar | NanStd, Work::C) => 8 + 16 + 8,
            (Var | Std | NanVar | NanStd, _) => 24,
            (Argmin | Argmax | NanArgmin | NanArgmax, Work::B) => 8 + 8 + 1,
            (Argmin | Argmax | NanArgmin | NanArgmax, _) => value + 8 + 1,
            _ => value,
        }
    }

    /// The running sums of a float sum or mean, for folds that add values straight in (the
    /// same additions [`fold`](Self::fold) makes); `None` for every other reduction.
    pub fn plain_sums(&mut self) -> Option<&mut [f64]> {
        match (&mut self.state, self.func) {
            (State::F(buf), ReduceFunc::Sum | ReduceFunc::Mean) => buf.as_slice_mut::<f64>().ok(),
            _ => None,
        }
    }

    /// The accumulator of `partial`'s reduction (Sum, Mean, NanSum or NanMean) that starts
    /// from its float32 partial sums (see [`cascade`](super::cascade)).
    pub fn from_partial(partial: &PartialSums) -> Result<Self> {
        Self::from_partials(partial, None)
    }

    /// [`Accumulator::from_partial`] of `first` and `second` (partial sums of the same
    /// elements and reduction) together: each element starts from their f64 sum, made in one
    /// pass.
    pub fn from_partials(first: &PartialSums, second: Option<&PartialSums>) -> Result<Self> {
        use ReduceFunc::*;
        let func = first.func();
        let (sums, counts) = widened_parts(func, first, second)?;
        let len = sums.0.len();
        let state = match (func, counts) {
            (Sum | Mean | NanSum, None) => {
                let mut buf = Buffer::for_overwrite(DType::F64, len);
                widen_into(buf.as_slice_mut::<f64>()?, sums, false);
                State::F(buf)
            }
            (NanMean, Some(counts)) => {
                let mut acc = vec![0.0; len];
                let mut count = vec![0; len];
                widen_into(&mut acc, sums, false);
                count_into(&mut count, counts);
                State::NanMeanF(acc, count)
            }
            _ => return Err(partial_mismatch(func, "counts missing or unexpected")),
        };
        Ok(Accumulator { func, state })
    }

    /// Adds the float32 partial sums (and nanmean's counts) of the same elements and the same
    /// reduction.
    pub fn add_partial(&mut self, partial: &PartialSums) -> Result<()> {
        self.add_partials(partial, None)
    }

    /// [`Accumulator::add_partial`] of `first` then `second`, in one pass: their f64 sum is
    /// added to each element (one pass over the accumulator instead of two).
    pub fn add_partials(
        &mut self,
        first: &PartialSums,
        second: Option<&PartialSums>,
    ) -> Result<()> {
        let func = self.func;
        let (sums, counts) = widened_parts(func, first, second)?;
        let length = |len: usize| {
            let why = format!("{} elements given to an accumulator of {len}", sums.0.len());
            partial_mismatch(func, &why)
        };
        match (&mut self.state, counts) {
            (State::F(buf), None) => {
                let acc = buf.as_slice_mut::<f64>()?;
                if acc.len() != sums.0.len() {
                    return Err(length(acc.len()));
                }
                widen_into(acc, sums, true);
            }
            (State::NanMeanF(acc, count), Some(counts)) => {
                if acc.len() != sums.0.len() || count.len() != sums.0.len() {
                    return Err(length(acc.len()));
                }
                widen_into(acc, sums, true);
                count_into(count, counts);
            }
            (_, _) => return Err(partial_mismatch(func, "the accumulator cannot take them")),
        }
        Ok(())
    }

    /// True when `fold` needs tile positions (`merge` must be off in the driver).
    pub fn needs_positions(&self) -> bool {
        self.func.is_arg()
    }

    /// Folds `n` values of `reg` (of the compute dtype) into the elements at `at`. For
    /// arg-reductions `index` gives the reduction index of the tile's first value and the
    /// step between consecutive values.
    pub fn fold(&mut self, reg: &Reg, n: usize, at: TileTarget, index: (i64, i64)) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { self.fold_avx2(reg, n, at, index) };
        }
        self.fold_impl(reg, n, at, index)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fold_avx2(
        &mut self,
        reg: &Reg,
        n: usize,
        at: TileTarget,
        index: (i64, i64),
    ) -> Result<()> {
        self.fold_impl(reg, n, at, index)
    }

    #[inline(always)]
    fn fold_impl(&mut self, reg: &Reg, n: usize, at: TileTarget, index: (i64, i64)) -> Result<()> {
        use ReduceFunc::*;
        let func = self.func;
        let o = at.offset;
        macro_rules! fold {
            ($acc:expr, $vals:expr, $f:expr) => {{
                let vals = &$vals[..n];
                let acc = $acc;
                let f = $f;
                if at.stride == 0 {
                    let mut a = acc[o];
                    for v in vals {
                        a = f(a, *v);
                    }
                    acc[o] = a;
                } else {
                    fold_spread(acc, o, at.stride, vals, f);
                }
            }};
        }
        // Floats: a tile that lands on one element folds in interleaved lanes started at
        // the function's identity (see `fold_lanes`).
        macro_rules! fold_f {
            ($acc:expr, $vals:expr, $identity:expr, $f:expr) => {{
                let vals = &$vals[..n];
                let acc = $acc;
                let f = $f;
                if at.stride == 0 {
                    acc[o] = fold_lanes(acc[o], vals, $identity, f);
                } else {
                    fold_spread(acc, o, at.stride, vals, f);
                }
            }};
        }
        match (&mut self.state, reg) {
            (State::F(buf), Reg::F(v)) => {
                let acc = buf.as_slice_mut::<f64>()?;
                match func {
                    Sum | Mean => fold_f!(acc, v, 0.0, |a: f64, x: f64| a + x),
                    NanSum | NanMean => {
                        fold_f!(acc, v, 0.0, |a: f64, x: f64| if x.is_nan() {
                            a
                        } else {
                            a + x
                        })
                    }
                    Prod => fold_f!(acc, v, 1.0, |a: f64, x: f64| a * x),
                    NanProd => fold_f!(acc, v, 1.0, |a: f64, x: f64| if x.is_nan() {
                        a
                    } else {
                        a * x
                    }),
                    Min => fold_f!(acc, v, f64::INFINITY, |a: f64, x: f64| if a.is_nan()
                        || x.is_nan()
                    {
                        f64::NAN
                    } else {
                        a.min(x)
                    }),
                    Max => fold_f!(acc, v, f64::NEG_INFINITY, |a: f64, x: f64| if a.is_nan()
                        || x.is_nan()
                    {
                        f64::NAN
                    } else {
                        a.max(x)
                    }),
                    NanMin => fold_f!(acc, v, f64::NAN, |a: f64, x: f64| if x.is_nan() {
                        a
                    } else if a.is_nan() {
                        x
                    } else {
                        a.min(x)
                    }),
                    NanMax => fold_f!(acc, v, f64::NAN, |a: f64, x: f64| if x.is_nan() {
                        a
                    } else if a.is_nan() {
                        x
                    } else {
                        a.max(x)
                    }),
                    _ => return Err(Error::internal("float fold")),
                }
            }
            (State::F(buf), Reg::I(v)) if func == NanMean => {
                let acc = buf.as_slice_mut::<f64>()?;
                fold!(acc, v, |a: f64, x: i64| a + x as f64)
            }
            (State::F(buf), Reg::U(v)) if func == NanMean => {
                let acc = buf.as_slice_mut::<f64>()?;
                fold!(acc, v, |a: f64, x: u64| a + x as f64)
            }
            (State::C(acc), Reg::C(v)) => match func {
                Sum | Mean => fold!(acc, v, |a: Complex64, x: Complex64| a + x),
                NanSum => fold!(acc, v, |a: Complex64, x: Complex64| if x.is_nan() {
                    a
                } else {
                    a + x
                }),
                Prod => fold!(acc, v, |a: Complex64, x: Complex64| a * x),
                NanProd => fold!(acc, v, |a: Complex64, x: Complex64| if x.is_nan() {
                    a
                } else {
                    a * x
                }),
                _ => return Err(Error::internal("complex fold")),
            },
            (State::I(acc), Reg::I(v)) => match func {
                Sum | NanSum | Mean => fold!(acc, v, |a: i64, x: i64| a.wrapping_add(x)),
                Prod | NanProd => fold!(acc, v, |a: i64, x: i64| a.wrapping_mul(x)),
                Min | NanMin => fold!(acc, v, |a: i64, x: i64| a.min(x)),
                Max | NanMax => fold!(acc, v, |a: i64, x: i64| a.max(x)),
                _ => return Err(Error::internal("integer fold")),
            },
            (State::U(acc), Reg::U(v)) => match func {
                Sum | NanSum | Mean => fold!(acc, v, |a: u64, x: u64| a.wrapping_add(x)),
                Prod | NanProd => fold!(acc, v, |a: u64, x: u64| a.wrapping_mul(x)),
                Min | NanMin => fold!(acc, v, |a: u64, x: u64| a.min(x)),
                Max | NanMax => fold!(acc, v, |a: u64, x: u64| a.max(x)),
                _ => return Err(Error::internal("uint64 fold")),
            },
            (State::B(acc), Reg::B(v)) => match func {
                Any | Max | NanMax => fold!(acc, v, |a: bool, x: bool| a | x),
                All | Min | NanMin => fold!(acc, v, |a: bool, x: bool| a & x),
                _ => return Err(Error::internal("bool fold")),
            },
            (State::NanMeanF(sum, count), Reg::F(v)) if at.stride == 1 => {
                // Branch-free, so the loop vectorizes.
                let lanes = sum[o..o + n].iter_mut().zip(&mut count[o..o + n]);
                for ((s, c), x) in lanes.zip(&v[..n]) {
                    let seen = !x.is_nan();
                    *s += if seen { *x } else { 0.0 };
                    *c += seen as u64;
                }
            }
            (State::NanMeanF(sum, count), Reg::F(v)) => {
                for (k, x) in v[..n].iter().enumerate() {
                    if !x.is_nan() {
                        let j = o + k * at.stride;
                        sum[j] += x;
                        count[j] += 1;
                    }
                }
            }
            (State::NanMeanC(sum, count), Reg::C(v)) => {
                for (k, x) in v[..n].iter().enumerate() {
                    if !x.is_nan() {
                        let j = o + k * at.stride;
                        sum[j] += x;
                        count[j] += 1;
                    }
                }
            }
            (State::Welford(cnt, mean, m2), Reg::F(v)) if at.stride == 1 => {
                // Contiguous lanes, branch-free (a NaN that nanvar skips adds 0 to the count
                // and leaves mean and m2 as they were), so the loop vectorizes.
                let skip_nan = matches!(func, NanVar | NanStd);
                let lanes = cnt[o..o + n]
                    .iter_mut()
                    .zip(&mut mean[o..o + n])
                    .zip(&mut m2[o..o + n]);
                for (((c, m), q), x) in lanes.zip(&v[..n]) {
                    let seen = !(skip_nan && x.is_nan());
                    let c1 = *c + if seen { 1.0 } else { 0.0 };
                    let d = if seen { x - *m } else { 0.0 };
                    let m1 = *m + d / c1.max(1.0);
                    *q += d * (if seen { x - m1 } else { 0.0 });
                    *m = m1;
                    *c = c1;
                }
            }
            (State::Welford(cnt, mean, m2), Reg::F(v)) => {
                let skip_nan = matches!(func, NanVar | NanStd);
                for (k, x) in v[..n].iter().enumerate() {
                    if skip_nan && x.is_nan() {
                        continue;
                    }
                    let j = o + k * at.stride;
                    cnt[j] += 1.0;
                    let d = x - mean[j];
                    mean[j] += d / cnt[j];
                    m2[j] += d * (x - mean[j]);
                }
            }
            (State::WelfordC(cnt, mean, m2), Reg::C(v)) => {
                let skip_nan = matches!(func, NanVar | NanStd);
                for (k, x) in v[..n].iter().enumerate() {
                    if skip_nan && x.is_nan() {
                        continue;
                    }
                    let j = o + k * at.stride;
                    cnt[j] += 1.0;
                    let d = x - mean[j];
                    mean[j] += d / cnt[j];
                    m2[j] += (d.conj() * (x - mean[j])).re;
                }
            }
            (State::Arg(best, idx, seen), reg) => {
                let is_max = matches!(func, Argmax | NanArgmax);
                let skip_nan = matches!(func, NanArgmin | NanArgmax);
                macro_rules! arg {
                    ($b:expr, $v:expr, $better:expr) => {{
                        for (k, x) in $v[..n].iter().enumerate() {
                            let j = o + k * at.stride;
                            let i = index.0 + k as i64 * index.1;
                            let tie = !$better(*x, $b[j]) && !$better($b[j], *x);
                            if !seen[j] || $better(*x, $b[j]) || (tie && i < idx[j]) {
                                $b[j] = *x;
                                idx[j] = i;
                                seen[j] = true;
                            }
                        }
                    }};
                }
                match (best, reg) {
                    // Consecutive elements: the branch-free rule, which vectorizes.
                    (Reg::F(b), Reg::F(v)) if at.stride == 1 => {
                        let (b, idx, seen) = (&mut b[o..], &mut idx[o..], &mut seen[o..]);
                        let v = &v[..n];
                        match (is_max, skip_nan) {
                            (true, false) => arg_fold_run::<true, false>(b, idx, seen, v, index),
                            (true, true) => arg_fold_run::<true, true>(b, idx, seen, v, index),
                            (false, false) => arg_fold_run::<false, false>(b, idx, seen, v, index),
                            (false, true) => arg_fold_run::<false, true>(b, idx, seen, v, index),
                        }
                    }
                    (Reg::F(b), Reg::F(v)) if skip_nan => {
                        // NaN values are passed over, as if absent.
                        let better = |x: f64, cur: f64| {
                            !x.is_nan() && (cur.is_nan() || if is_max { x > cur } else { x < cur })
                        };
                        for (k, x) in v[..n].iter().enumerate() {
                            if x.is_nan() {
                                continue;
                            }
                            let j = o + k * at.stride;
                            let i = index.0 + k as i64 * index.1;
                            let tie = !better(*x, b[j]) && !better(b[j], *x);
                            if !seen[j] || better(*x, b[j]) || (tie && i < idx[j]) {
                                b[j] = *x;
                                idx[j] = i;
                                seen[j] = true;
                            }
                        }
                    }
                    (Reg::F(b), Reg::F(v)) => {
                        // The first NaN wins, as in numpy.
                        let better = |x: f64, cur: f64| {
                            !cur.is_nan() && (x.is_nan() || if is_max { x > cur } else { x < cur })
                        };
                        arg!(b, v, better)
                    }
                    (Reg::I(b), Reg::I(v)) => arg!(b, v, |x: i64, cur: i64| if is_max {
                        x > cur
                    } else {
                        x < cur
                    }),
                    (Reg::I(b), Reg::B(v)) => {
                        let vi: Vec<i64> = v[..n].iter().map(|&x| x as i64).collect();
                        arg!(b, vi, |x: i64, cur: i64| if is_max {
                            x > cur
                        } else {
                            x < cur
                        })
                    }
                    (Reg::U(b), Reg::U(v)) => arg!(b, v, |x: u64, cur: u64| if is_max {
                        x > cur
                    } else {
                        x < cur
                    }),
                    _ => return Err(Error::internal("arg fold")),
                }
            }
            _ => {
                return Err(Error::internal(format!(
                    "{} fold of a mismatched register",
                    func.name()
                )))
            }
        }
        Ok(())
    }

    /// Merges `other`, a partial result over other elements of the reduction, into `self`.
    pub fn merge(&mut self, other: &Accumulator) -> Result<()> {
        use ReduceFunc::*;
        let func = self.func;
        fn each<T: Copy>(a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
            for (x, y) in a.iter_mut().zip(b) {
                *x = f(*x, *y);
            }
        }
        match (&mut self.state, &other.state) {
            (State::F(ab), State::F(bb)) => {
                let a = ab.as_slice_mut::<f64>()?;
                let b = bb.as_slice::<f64>()?;
                match func {
                    Sum | Mean | NanSum | NanMean => each(a, b, |x, y| x + y),
                    Prod | NanProd => each(a, b, |x, y| x * y),
                    Min => each(a, b, |x: f64, y: f64| {
                        if x.is_nan() || y.is_nan() {
                            f64::NAN
                        } else {
                            x.min(y)
                        }
                    }),
                    Max => each(a, b, |x: f64, y: f64| {
                        if x.is_nan() || y.is_nan() {
                            f64::NAN
                        } else {
                            x.max(y)
                        }
                    }),
                    NanMin => each(a, b, |x: f64, y: f64| {
                        if y.is_nan() {
                            x
                        } else if x.is_nan() {
                            y
                        } else {
                            x.min(y)
                        }
                    }),
                    NanMax => each(a, b, |x: f64, y: f64| {
                        if y.is_nan() {
                            x
                        } else if x.is_nan() {
                            y
                        } else {
                            x.max(y)
                        }
                    }),
                    _ => return Err(Error::internal("float merge")),
                }
            }
            (State::C(a), State::C(b)) => match func {
                Prod | NanProd => each(a, b, |x, y| x * y),
                _ => each(a, b, |x, y| x + y),
            },
            (State::I(a), State::I(b)) => match func {
                Prod | NanProd => each(a, b, i64::wrapping_mul),
                Min | NanMin => each(a, b, i64::min),
                Max | NanMax => each(a, b, i64::max),
                _ => each(a, b, i64::wrapping_add),
            },
            (State::U(a), State::U(b)) => match func {
                Prod | NanProd => each(a, b, u64::wrapping_mul),
                Min | NanMin => each(a, b, u64::min),
                Max | NanMax => each(a, b, u64::max),
                _ => each(a, b, u64::wrapping_add),
            },
            (State::B(a), State::B(b)) => match func {
                Any | Max | NanMax => each(a, b, |x, y| x | y),
                _ => each(a, b, |x, y| x & y),
            },
            (State::NanMeanF(s, c), State::NanMeanF(s2, c2)) => {
                each(s, s2, |x, y| x + y);
                each(c, c2, |x, y| x + y);
            }
            (State::NanMeanC(s, c), State::NanMeanC(s2, c2)) => {
                each(s, s2, |x, y| x + y);
                each(c, c2, |x, y| x + y);
            }
            (State::Welford(n, m, q), State::Welford(n2, m2, q2)) => {
                for j in 0..n.len() {
                    let (na, nb) = (n[j], n2[j]);
                    let total = na + nb;
                    if nb == 0.0 {
                        continue;
                    }
                    let delta = m2[j] - m[j];
                    m[j] += delta * nb / total;
                    q[j] += q2[j] + delta * delta * na * nb / total;
                    n[j] = total;
                }
            }
            (State::WelfordC(n, m, q), State::WelfordC(n2, m2, q2)) => {
                for j in 0..n.len() {
                    let (na, nb) = (n[j], n2[j]);
                    if nb == 0.0 {
                        continue;
                    }
                    let total = na + nb;
                    let delta = m2[j] - m[j];
                    m[j] += delta * (nb / total);
                    q[j] += q2[j] + delta.norm_sqr() * na * nb / total;
                    n[j] = total;
                }
            }
            (State::Arg(best, idx, seen), State::Arg(best2, idx2, seen2)) => {
                // NaN-skipping forms never keep a NaN, so NaN's rank below does not matter.
                let is_max = matches!(func, Argmax | NanArgmax);
                // Partial results need not cover earlier elements first (an argmin over
                // every axis of an array split along its last): of equal values (or two
                // NaNs) the earlier index wins, as in numpy.
                macro_rules! arg_merge {
                    ($b:expr, $b2:expr, $better:expr) => {{
                        for j in 0..idx.len() {
                            let tie = !$better($b2[j], $b[j]) && !$better($b[j], $b2[j]);
                            let earlier = tie && idx2[j] < idx[j];
                            if seen2[j] && (!seen[j] || $better($b2[j], $b[j]) || earlier) {
                                $b[j] = $b2[j];
                                idx[j] = idx2[j];
                                seen[j] = true;
                            }
                        }
                    }};
                }
                match (best, &best2) {
                    (Reg::F(b), Reg::F(b2)) => arg_merge!(b, b2, |x: f64, cur: f64| {
                        !cur.is_nan() && (x.is_nan() || if is_max { x > cur } else { x < cur })
                    }),
                    (Reg::I(b), Reg::I(b2)) => arg_merge!(b, b2, |x: i64, cur: i64| if is_max {
                        x > cur
                    } else {
                        x < cur
                    }),
                    (Reg::U(b), Reg::U(b2)) => arg_merge!(b, b2, |x: u64, cur: u64| if is_max {
                        x > cur
                    } else {
                        x < cur
                    }),
                    _ => return Err(Error::internal("arg merge")),
                }
            }
            _ => return Err(Error::internal("merge of mismatched accumulators")),
        }
        Ok(())
    }

    /// The result as `out` (dtype `out_dtype`): `count` is the number of values reduced into
    /// each element (for mean), `ddof` the delta degrees of freedom (var, std).
    pub fn finish(self, out_dtype: DType, count: u64, ddof: f64) -> Result<Buffer> {
        use ReduceFunc::*;
        let func = self.func;
        let values = match self.state {
            // Float sums and means convert from their state where it lies (a mean divided in
            // place): no copy of the accumulator in the serial tail of a reduction.
            State::F(mut buf) => {
                if matches!(func, Mean | NanMean) {
                    let n = count as f64;
                    buf.as_slice_mut::<f64>()?.iter_mut().for_each(|s| *s /= n);
                }
                Finished::F64(buf)
            }
            state => Finished::Reg(finished_reg(func, state, count, ddof)?),
        };
        let len = values.len();
        // Every element is stored below.
        let mut out = Buffer::for_overwrite(out_dtype, len);
        let mut converted = super::work::Reg::for_dtype(out_dtype);
        let mut tile = values.empty_tile();
        // Convert in tiles through the cast kernel so results narrow exactly like casts.
        let mut start = 0;
        while start < len {
            let n = super::work::TILE.min(len - start);
            values.copy_tile(start, n, &mut tile)?;
            super::work::cast(&tile, &mut converted, out_dtype, n);
            narrow(&mut converted, out_dtype, n);
            super::work::store(&converted, n, &mut out, start)?;
            start += n;
        }
        Ok(out)
    }
}

/// The values of a finished reduction whose state is not a float sum's or mean's f64 state
/// (those convert where they lie, see [`Accumulator::finish`]).
fn finished_reg(func: ReduceFunc, state: State, count: u64, ddof: f64) -> Result<Reg> {
    use ReduceFunc::*;
    Ok(match state {
        State::F(_) => {
            return Err(Error::internal(
                "float reduction state converted as a register",
            ))
        }
        State::C(v) => match func {
            Mean => Reg::C(v.into_iter().map(|s| s / count as f64).collect()),
            _ => Reg::C(v),
        },
        State::I(v) => match func {
            Mean => Reg::F(v.into_iter().map(|s| s as f64 / count as f64).collect()),
            _ => Reg::I(v),
        },
        State::U(v) => match func {
            Mean => Reg::F(v.into_iter().map(|s| s as f64 / count as f64).collect()),
            _ => Reg::U(v),
        },
        State::B(v) => Reg::B(v),
        State::NanMeanF(s, c) => Reg::F(s.into_iter().zip(c).map(|(s, c)| s / c as f64).collect()),
        State::NanMeanC(s, c) => Reg::C(s.into_iter().zip(c).map(|(s, c)| s / c as f64).collect()),
        State::Welford(n, _, m2) | State::WelfordC(n, _, m2) => Reg::F(
            n.into_iter()
                .zip(m2)
                .map(|(n, m2)| {
                    let v = match func {
                        // numpy's nanvar: NaN where no degree of freedom is left.
                        NanVar | NanStd if n - ddof <= 0.0 => f64::NAN,
                        _ => m2 / (n - ddof).max(0.0),
                    };
                    if matches!(func, Std | NanStd) {
                        v.sqrt()
                    } else {
                        v
                    }
                })
                .collect(),
        ),
        State::Arg(_, idx, seen) => {
            if matches!(func, NanArgmin | NanArgmax) && seen.iter().any(|s| !s) {
                return Err(Error::new(
                    crate::error::ErrorKind::Value,
                    format!("{}: all-NaN slice encountered", func.name()),
                ));
            }
            Reg::I(idx)
        }
    })
}

/// A finished reduction's values before their conversion to the output dtype.
enum Finished {
    /// A float sum's or mean's f64 state.
    F64(Buffer),
    /// Every other result.
    Reg(Reg),
}

impl Finished {
    /// The number of values.
    fn len(&self) -> usize {
        match self {
            Finished::F64(buf) => buf.len(),
            Finished::Reg(Reg::B(v)) => v.len(),
            Finished::Reg(Reg::I(v)) => v.len(),
            Finished::Reg(Reg::U(v)) => v.len(),
            Finished::Reg(Reg::F(v)) => v.len(),
            Finished::Reg(Reg::C(v)) => v.len(),
        }
    }

    /// A register of the values' kind, for [`copy_tile`](Self::copy_tile).
    fn empty_tile(&self) -> Reg {
        let cap = super::work::TILE;
        match self {
            Finished::F64(_) | Finished::Reg(Reg::F(_)) => Reg::F(Vec::with_capacity(cap)),
            Finished::Reg(Reg::B(_)) => Reg::B(Vec::with_capacity(cap)),
            Finished::Reg(Reg::I(_)) => Reg::I(Vec::with_capacity(cap)),
            Finished::Reg(Reg::U(_)) => Reg::U(Vec::with_capacity(cap)),
            Finished::Reg(Reg::C(_)) => Reg::C(Vec::with_capacity(cap)),
        }
    }

    /// Values `start..start + n` into `tile` (made by [`empty_tile`](Self::empty_tile)).
    fn copy_tile(&self, start: usize, n: usize, tile: &mut Reg) -> Result<()> {
        fn put<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
            dst.clear();
            dst.extend_from_slice(src);
        }
        let range = start..start + n;
        match (self, tile) {
            (Finished::F64(buf), Reg::F(t)) => put(t, &buf.as_slice::<f64>()?[range]),
            (Finished::Reg(Reg::F(v)), Reg::F(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::B(v)), Reg::B(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::I(v)), Reg::I(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::U(v)), Reg::U(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::C(v)), Reg::C(t)) => put(t, &v[range]),
            _ => return Err(Error::internal("reduction result tile of another kind")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A tile folded onto one element in lanes gives what one chain gives: the same
        /// min, max and NaN-skipping min and max (NaN where one chain gives NaN), and sums
        /// and products within f64 rounding of it.
        #[test]
        fn folding_in_lanes_matches_one_chain(
            vals in proptest::collection::vec(
                proptest::prop_oneof![8 => -1e3f64..1e3, 1 => proptest::strategy::Just(f64::NAN)],
                0..40,
            ),
            start in -10f64..10.0,
        ) {
            use ReduceFunc::*;
            for func in [Sum, NanSum, Prod, NanProd, Min, Max, NanMin, NanMax] {
                let mut lanes = Accumulator::new(func, DType::F32, 1).unwrap();
                let chain = vals.iter().fold(start, |a, x| match func {
                    Sum => a + x,
                    NanSum => if x.is_nan() { a } else { a + x },
                    Prod => a * x,
                    NanProd => if x.is_nan() { a } else { a * x },
                    Min => if a.is_nan() || x.is_nan() { f64::NAN } else { a.min(*x) },
                    Max => if a.is_nan() || x.is_nan() { f64::NAN } else { a.max(*x) },
                    NanMin => if x.is_nan() { a } else if a.is_nan() { *x } else { a.min(*x) },
                    _ => if x.is_nan() { a } else if a.is_nan() { *x } else { a.max(*x) },
                });
                if let State::F(buf) = &mut lanes.state {
                    buf.as_slice_mut::<f64>().unwrap()[0] = start;
                }
                lanes.fold(&Reg::F(vals.clone()), vals.len(), target(0, 0), (0, 0)).unwrap();
                let got = match &lanes.state {
                    State::F(buf) => buf.as_slice::<f64>().unwrap()[0],
                    _ => unreachable!(),
                };
                if matches!(func, Sum | NanSum | Prod | NanProd) && chain.is_finite() {
                    let scale: f64 = vals.iter().filter(|x| !x.is_nan()).map(|x| x.abs()).sum::<f64>() + start.abs();
                    let tol = match func {
                        Prod | NanProd => 1e-12 * chain.abs().max(f64::MIN_POSITIVE),
                        _ => 1e-12 * scale,
                    };
                    proptest::prop_assert!((got - chain).abs() <= tol, "{func:?}: {got} vs {chain}");
                } else {
                    proptest::prop_assert!(
                        got == chain || (got.is_nan() && chain.is_nan()),
                        "{func:?}: {got} vs {chain}"
                    );
                }
            }
        }
    }

    proptest::proptest! {
        /// Float arg-reductions folded over consecutive elements (the branch-free rule) end
        /// where folding each element alone (the scalar rule) ends: same indices, NaNs and
        /// ties included, whatever order the tiles come in.
        #[test]
        fn consecutive_arg_folds_match_element_by_element(
            tiles in proptest::collection::vec(
                (
                    proptest::collection::vec(
                        proptest::prop_oneof![
                            6 => proptest::strategy::Strategy::prop_map(-3i32..3, f64::from),
                            1 => proptest::strategy::Just(f64::NAN),
                        ],
                        4,
                    ),
                    0i64..20,
                ),
                1..8,
            ),
        ) {
            use ReduceFunc::*;
            for func in [Argmax, Argmin, NanArgmax, NanArgmin] {
                let mut run = Accumulator::new(func, DType::F64, 4).unwrap();
                let mut single = Accumulator::new(func, DType::F64, 4).unwrap();
                for (vals, at) in &tiles {
                    run.fold(&Reg::F(vals.clone()), 4, target(0, 1), (*at, 0)).unwrap();
                    for (k, v) in vals.iter().enumerate() {
                        // One value on one element: the scalar rule.
                        single.fold(&Reg::F(vec![*v]), 1, target(k, 0), (*at, 0)).unwrap();
                    }
                }
                let (State::Arg(Reg::F(b1), i1, s1), State::Arg(Reg::F(b2), i2, s2)) =
                    (&run.state, &single.state)
                else {
                    unreachable!()
                };
                proptest::prop_assert_eq!(i1, i2, "{:?}", func);
                proptest::prop_assert_eq!(s1, s2, "{:?}", func);
                for (x, y) in b1.iter().zip(b2) {
                    proptest::prop_assert!(x == y || (x.is_nan() && y.is_nan()), "{:?}", func);
                }
            }
        }
    }

    fn target(offset: usize, stride: usize) -> TileTarget<'static> {
        TileTarget {
            offset,
            stride,
            index: &[],
        }
    }

    #[test]
    fn welford_merge_equals_one_pass() {
        let xs = [1.0, 2.0, 4.0, 7.0, 11.0];
        let mut a = Accumulator::new(ReduceFunc::Var, DType::F64, 1).unwrap();
        a.fold(&Reg::F(xs[..2].to_vec()), 2, target(0, 0), (0, 0))
            .unwrap();
        let mut b = Accumulator::new(ReduceFunc::Var, DType::F64, 1).unwrap();
        b.fold(&Reg::F(xs[2..].to_vec()), 3, target(0, 0), (0, 0))
            .unwrap();
        a.merge(&b).unwrap();
        let v = a.finish(DType::F64, 5, 1.0).unwrap();
        let mean = xs.iter().sum::<f64>() / 5.0;
        let expect = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((v.as_slice::<f64>().unwrap()[0] - expect).abs() < 1e-12);
    }

    #[test]
    fn argmax_keeps_the_first_maximum_and_first_nan() {
        let mut a = Accumulator::new(ReduceFunc::Argmax, DType::F64, 1).unwrap();
        a.fold(&Reg::F(vec![1.0, 5.0, 5.0, 2.0]), 4, target(0, 0), (0, 1))
            .unwrap();
        assert_eq!(
            a.clone()
                .finish(DType::I64, 4, 0.0)
                .unwrap()
                .as_slice::<i64>()
                .unwrap(),
            &[1]
        );
        a.fold(&Reg::F(vec![f64::NAN, f64::NAN]), 2, target(0, 0), (4, 1))
            .unwrap();
        assert_eq!(
            a.finish(DType::I64, 6, 0.0)
                .unwrap()
                .as_slice::<i64>()
                .unwrap(),
            &[4]
        );
    }

    #[test]
    fn nanargmin_skips_nans_and_refuses_all_nan_lanes() {
        // Two lanes (stride 1): lane 0 has a NaN before its minimum, lane 1 only NaNs.
        let fold = |acc: &mut Accumulator, values: [f64; 2], at: i64| {
            acc.fold(&Reg::F(values.to_vec()), 2, target(0, 1), (at, 0))
                .unwrap()
        };
        let mut a = Accumulator::new(ReduceFunc::NanArgmin, DType::F64, 2).unwrap();
        fold(&mut a, [f64::NAN, f64::NAN], 0);
        fold(&mut a, [3.0, f64::NAN], 1);
        let mut b = Accumulator::new(ReduceFunc::NanArgmin, DType::F64, 2).unwrap();
        fold(&mut b, [-1.0, f64::NAN], 2);
        fold(&mut b, [-1.0, f64::NAN], 3);
        let mut whole = a.clone();
        whole.merge(&b).unwrap();
        let err = whole.finish(DType::I64, 4, 0.0).unwrap_err();
        assert_eq!(err.kind, crate::error::ErrorKind::Value);
        assert!(err.to_string().contains("all-NaN slice"), "{err}");
        // With a value in lane 1, the first minimum of each lane, NaNs passed over.
        fold(&mut b, [7.0, 2.0], 4);
        b.merge(&a).unwrap();
        let idx = b.finish(DType::I64, 5, 0.0).unwrap();
        assert_eq!(idx.as_slice::<i64>().unwrap(), &[2, 4]);
    }

    /// The index an argmin accumulator folded from `values` at flat `indices` finishes with.
    fn argmin_of(parts: &[(&[f64], &[i64])]) -> i64 {
        let accs: Vec<Accumulator> = parts
            .iter()
            .map(|(values, indices)| {
                let mut acc = Accumulator::new(ReduceFunc::Argmin, DType::F64, 1).unwrap();
                for (v, i) in values.iter().zip(*indices) {
                    acc.fold(&Reg::F(vec![*v]), 1, target(0, 0), (*i, 1))
                        .unwrap();
                }
                acc
            })
            .collect();
        let mut merged = accs[0].clone();
        for other in &accs[1..] {
            merged.merge(other).unwrap();
        }
        merged
            .finish(DType::I64, 6, 0.0)
            .unwrap()
            .as_slice::<i64>()
            .unwrap()[0]
    }

    #[test]
    fn arg_merge_keeps_the_earlier_index_of_ties_whatever_the_merge_order() {
        // [[0, 0, nan], [nan, 0, 0]] split by columns: the column holding flat index 3
        // merges first, yet the first NaN (index 2) wins, as does the first 0.
        let nan = f64::NAN;
        let col0: (&[f64], &[i64]) = (&[0.0, nan], &[0, 3]);
        let col2: (&[f64], &[i64]) = (&[nan, 0.0], &[2, 5]);
        assert_eq!(argmin_of(&[col0, col2]), 2);
        assert_eq!(argmin_of(&[col2, col0]), 2);
        let late: (&[f64], &[i64]) = (&[1.0, 0.0], &[1, 4]);
        let early: (&[f64], &[i64]) = (&[0.0, 2.0], &[0, 3]);
        assert_eq!(argmin_of(&[late, early]), 0);
    }
}
