//! Sums, products and means (sum, nansum, prod, nanprod, mean, nanmean): the state each
//! starts from, its fold over a tile, the merge of two partial results and the finished
//! values. Float sums accumulate in f64, complex ones in complex f64, integer sums and
//! products wrap in 64 bits as numpy's do; nanmean keeps a count of the values it adds.

use num_complex::Complex64;

use super::folds::{each, f64_state, fold_floats, fold_into, written};
use super::{mismatched_fold, State};
use crate::error::{Error, Result};
use crate::kernels::eval::tiles::TileTarget;
use crate::kernels::work::{Reg, Work};
use crate::plan::ReduceFunc;

/// The fresh state of `func` computing in `w`; `None` where it has none.
pub(super) fn state(func: ReduceFunc, w: Work, len: usize) -> Option<State> {
    use ReduceFunc::*;
    Some(match (func, w) {
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
        _ => return None,
    })
}

/// Bytes of state per element of `func` computing in `w`, one value taking `value` bytes.
pub(super) fn bytes_per_element(func: ReduceFunc, w: Work, value: u64) -> u64 {
    match (func, w) {
        (ReduceFunc::NanMean, Work::F | Work::C) => value + 8,
        (ReduceFunc::NanMean, _) => 8,
        _ => value,
    }
}

/// Float values `v` folded into the f64 sums or products `acc` at `at`.
#[inline(always)]
fn fold_f64(func: ReduceFunc, acc: &mut [f64], v: &[f64], at: TileTarget) -> Result<()> {
    use ReduceFunc::*;
    let nan_add = |a: f64, x: f64| if x.is_nan() { a } else { a + x };
    let nan_mul = |a: f64, x: f64| if x.is_nan() { a } else { a * x };
    match func {
        Sum | Mean => fold_floats(acc, v, at, 0.0, |a: f64, x: f64| a + x),
        NanSum | NanMean => fold_floats(acc, v, at, 0.0, nan_add),
        Prod => fold_floats(acc, v, at, 1.0, |a: f64, x: f64| a * x),
        NanProd => fold_floats(acc, v, at, 1.0, nan_mul),
        _ => return Err(Error::internal("float fold")),
    }
    Ok(())
}

/// Complex values `v` folded into the sums or products `acc` at `at`.
#[inline(always)]
fn fold_complex(
    func: ReduceFunc,
    acc: &mut [Complex64],
    v: &[Complex64],
    at: TileTarget,
) -> Result<()> {
    use ReduceFunc::*;
    let nan_add = |a: Complex64, x: Complex64| if x.is_nan() { a } else { a + x };
    let nan_mul = |a: Complex64, x: Complex64| if x.is_nan() { a } else { a * x };
    match func {
        Sum | Mean => fold_into(acc, v, at, |a: Complex64, x: Complex64| a + x),
        NanSum => fold_into(acc, v, at, nan_add),
        Prod => fold_into(acc, v, at, |a: Complex64, x: Complex64| a * x),
        NanProd => fold_into(acc, v, at, nan_mul),
        _ => return Err(Error::internal("complex fold")),
    }
    Ok(())
}

/// Folds `n` values of `reg` into the elements of `state` at `at`.
#[inline(always)]
pub(super) fn fold(
    state: &mut State,
    func: ReduceFunc,
    reg: &Reg,
    n: usize,
    at: TileTarget,
) -> Result<()> {
    use ReduceFunc::*;
    let o = at.offset;
    match (state, reg) {
        (State::F(buf), Reg::F(v)) => fold_f64(func, buf.as_slice_mut::<f64>()?, &v[..n], at)?,
        (State::F(buf), Reg::I(v)) if func == NanMean => {
            let acc = buf.as_slice_mut::<f64>()?;
            fold_into(acc, &v[..n], at, |a: f64, x: i64| a + x as f64)
        }
        (State::F(buf), Reg::U(v)) if func == NanMean => {
            let acc = buf.as_slice_mut::<f64>()?;
            fold_into(acc, &v[..n], at, |a: f64, x: u64| a + x as f64)
        }
        (State::C(acc), Reg::C(v)) => fold_complex(func, acc, &v[..n], at)?,
        (State::I(acc), Reg::I(v)) => match func {
            Sum | NanSum | Mean => fold_into(acc, &v[..n], at, |a: i64, x: i64| a.wrapping_add(x)),
            Prod | NanProd => fold_into(acc, &v[..n], at, |a: i64, x: i64| a.wrapping_mul(x)),
            _ => return Err(Error::internal("integer fold")),
        },
        (State::U(acc), Reg::U(v)) => match func {
            Sum | NanSum | Mean => fold_into(acc, &v[..n], at, |a: u64, x: u64| a.wrapping_add(x)),
            Prod | NanProd => fold_into(acc, &v[..n], at, |a: u64, x: u64| a.wrapping_mul(x)),
            _ => return Err(Error::internal("uint64 fold")),
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
        _ => return Err(mismatched_fold(func)),
    }
    Ok(())
}

/// Merges `other`, a partial result over other elements of the reduction, into `state`.
pub(super) fn merge(state: &mut State, func: ReduceFunc, other: &State) -> Result<()> {
    use ReduceFunc::*;
    match (state, other) {
        (State::F(ab), State::F(bb)) => {
            let a = ab.as_slice_mut::<f64>()?;
            let b = bb.as_slice::<f64>()?;
            match func {
                Sum | Mean | NanSum | NanMean => each(a, b, |x, y| x + y),
                Prod | NanProd => each(a, b, |x, y| x * y),
                _ => return Err(Error::internal("float merge")),
            }
        }
        (State::C(a), State::C(b)) => match func {
            Prod | NanProd => each(a, b, |x, y| x * y),
            _ => each(a, b, |x, y| x + y),
        },
        (State::I(a), State::I(b)) => match func {
            Prod | NanProd => each(a, b, i64::wrapping_mul),
            _ => each(a, b, i64::wrapping_add),
        },
        (State::U(a), State::U(b)) => match func {
            Prod | NanProd => each(a, b, u64::wrapping_mul),
            _ => each(a, b, u64::wrapping_add),
        },
        (State::NanMeanF(s, c), State::NanMeanF(s2, c2)) => {
            each(s, s2, |x, y| x + y);
            each(c, c2, |x, y| x + y);
        }
        (State::NanMeanC(s, c), State::NanMeanC(s2, c2)) => {
            each(s, s2, |x, y| x + y);
            each(c, c2, |x, y| x + y);
        }
        _ => return Err(super::mismatched_merge()),
    }
    Ok(())
}

/// The finished values of `state` (not a float's f64 state, which finishes where it lies):
/// `count` values reduced into each element.
pub(super) fn finish(func: ReduceFunc, state: State, count: u64) -> Result<Reg> {
    let mean = func == ReduceFunc::Mean;
    Ok(match state {
        State::C(v) if mean => Reg::C(v.into_iter().map(|s| s / count as f64).collect()),
        State::C(v) => Reg::C(v),
        State::I(v) if mean => Reg::F(v.into_iter().map(|s| s as f64 / count as f64).collect()),
        State::I(v) => Reg::I(v),
        State::U(v) if mean => Reg::F(v.into_iter().map(|s| s as f64 / count as f64).collect()),
        State::U(v) => Reg::U(v),
        State::NanMeanF(s, c) => Reg::F(s.into_iter().zip(c).map(|(s, c)| s / c as f64).collect()),
        State::NanMeanC(s, c) => Reg::C(s.into_iter().zip(c).map(|(s, c)| s / c as f64).collect()),
        _ => return Err(super::mismatched_finish(func)),
    })
}
