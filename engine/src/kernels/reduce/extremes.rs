//! Minima and maxima (min, max, nanmin, nanmax) of floats, integers and bools: the state
//! each starts from, its fold over a tile and the merge of two partial results. min and max
//! propagate NaN as numpy's do; nanmin and nanmax pass NaN over.

use super::folds::{each, f64_state, fold_floats, fold_into, written};
use super::{mismatched_fold, State};
use crate::error::{Error, Result};
use crate::kernels::eval::tiles::TileTarget;
use crate::kernels::work::{Reg, Work};
use crate::plan::ReduceFunc;

/// The fresh state of `func` computing in `w`; `None` where it has none.
pub(super) fn state(func: ReduceFunc, w: Work, len: usize) -> Option<State> {
    use ReduceFunc::*;
    let is_max = matches!(func, Max | NanMax);
    Some(match (func, w) {
        (Min | Max, Work::F) => State::F(f64_state(
            len,
            if is_max {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            },
        )),
        (NanMin | NanMax, Work::F) => State::F(f64_state(len, f64::NAN)),
        (_, Work::I) => State::I(written(if is_max { i64::MIN } else { i64::MAX }, len)),
        (_, Work::U) => State::U(written(if is_max { 0 } else { u64::MAX }, len)),
        (_, Work::B) => State::B(written(!is_max, len)),
        _ => return None,
    })
}

/// The minimum of two floats, NaN if either is.
#[inline(always)]
fn min(a: f64, x: f64) -> f64 {
    if a.is_nan() || x.is_nan() {
        f64::NAN
    } else {
        a.min(x)
    }
}

/// The maximum of two floats, NaN if either is.
#[inline(always)]
fn max(a: f64, x: f64) -> f64 {
    if a.is_nan() || x.is_nan() {
        f64::NAN
    } else {
        a.max(x)
    }
}

/// The minimum of two floats passing NaN over (NaN only if both are).
#[inline(always)]
fn nan_min(a: f64, x: f64) -> f64 {
    if x.is_nan() {
        a
    } else if a.is_nan() {
        x
    } else {
        a.min(x)
    }
}

/// The maximum of two floats passing NaN over (NaN only if both are).
#[inline(always)]
fn nan_max(a: f64, x: f64) -> f64 {
    if x.is_nan() {
        a
    } else if a.is_nan() {
        x
    } else {
        a.max(x)
    }
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
    match (state, reg) {
        (State::F(buf), Reg::F(v)) => {
            let (acc, v) = (buf.as_slice_mut::<f64>()?, &v[..n]);
            match func {
                Min => fold_floats(acc, v, at, f64::INFINITY, min),
                Max => fold_floats(acc, v, at, f64::NEG_INFINITY, max),
                NanMin => fold_floats(acc, v, at, f64::NAN, nan_min),
                NanMax => fold_floats(acc, v, at, f64::NAN, nan_max),
                _ => return Err(Error::internal("float fold")),
            }
        }
        (State::I(acc), Reg::I(v)) => match func {
            Min | NanMin => fold_into(acc, &v[..n], at, |a: i64, x: i64| a.min(x)),
            Max | NanMax => fold_into(acc, &v[..n], at, |a: i64, x: i64| a.max(x)),
            _ => return Err(Error::internal("integer fold")),
        },
        (State::U(acc), Reg::U(v)) => match func {
            Min | NanMin => fold_into(acc, &v[..n], at, |a: u64, x: u64| a.min(x)),
            Max | NanMax => fold_into(acc, &v[..n], at, |a: u64, x: u64| a.max(x)),
            _ => return Err(Error::internal("uint64 fold")),
        },
        (State::B(acc), Reg::B(v)) => match func {
            Max | NanMax => fold_into(acc, &v[..n], at, |a: bool, x: bool| a | x),
            Min | NanMin => fold_into(acc, &v[..n], at, |a: bool, x: bool| a & x),
            _ => return Err(Error::internal("bool fold")),
        },
        _ => return Err(mismatched_fold(func)),
    }
    Ok(())
}

/// Merges `other`, a partial result over other elements of the reduction, into `state`.
pub(super) fn merge(state: &mut State, func: ReduceFunc, other: &State) -> Result<()> {
    use ReduceFunc::*;
    let is_max = matches!(func, Max | NanMax);
    match (state, other) {
        (State::F(ab), State::F(bb)) => {
            let a = ab.as_slice_mut::<f64>()?;
            let b = bb.as_slice::<f64>()?;
            match func {
                Min => each(a, b, min),
                Max => each(a, b, max),
                NanMin => each(a, b, nan_min),
                NanMax => each(a, b, nan_max),
                _ => return Err(Error::internal("float merge")),
            }
        }
        (State::I(a), State::I(b)) if is_max => each(a, b, i64::max),
        (State::I(a), State::I(b)) => each(a, b, i64::min),
        (State::U(a), State::U(b)) if is_max => each(a, b, u64::max),
        (State::U(a), State::U(b)) => each(a, b, u64::min),
        (State::B(a), State::B(b)) if is_max => each(a, b, |x, y| x | y),
        (State::B(a), State::B(b)) => each(a, b, |x, y| x & y),
        _ => return Err(super::mismatched_merge()),
    }
    Ok(())
}

/// The finished values of `state` (not a float's f64 state, which finishes where it lies).
pub(super) fn finish(func: ReduceFunc, state: State) -> Result<Reg> {
    Ok(match state {
        State::I(v) => Reg::I(v),
        State::U(v) => Reg::U(v),
        State::B(v) => Reg::B(v),
        _ => return Err(super::mismatched_finish(func)),
    })
}
