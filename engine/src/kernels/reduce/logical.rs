//! any and all of bools: the state each starts from, its fold over a tile and the merge of
//! two partial results.

use super::folds::{each, fold_into, written};
use super::{mismatched_fold, State};
use crate::error::Result;
use crate::kernels::eval::tiles::TileTarget;
use crate::kernels::work::{Reg, Work};
use crate::plan::ReduceFunc;

/// The fresh state of `func` computing in `w`; `None` where it has none.
pub(super) fn state(func: ReduceFunc, w: Work, len: usize) -> Option<State> {
    match (func, w) {
        (ReduceFunc::Any, Work::B) => Some(State::B(written(false, len))),
        (ReduceFunc::All, Work::B) => Some(State::B(written(true, len))),
        _ => None,
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
    match (state, reg) {
        (State::B(acc), Reg::B(v)) if func == ReduceFunc::Any => {
            fold_into(acc, &v[..n], at, |a: bool, x: bool| a | x)
        }
        (State::B(acc), Reg::B(v)) => fold_into(acc, &v[..n], at, |a: bool, x: bool| a & x),
        _ => return Err(mismatched_fold(func)),
    }
    Ok(())
}

/// Merges `other`, a partial result over other elements of the reduction, into `state`.
pub(super) fn merge(state: &mut State, func: ReduceFunc, other: &State) -> Result<()> {
    match (state, other) {
        (State::B(a), State::B(b)) if func == ReduceFunc::Any => each(a, b, |x, y| x | y),
        (State::B(a), State::B(b)) => each(a, b, |x, y| x & y),
        _ => return Err(super::mismatched_merge()),
    }
    Ok(())
}

/// The finished values of `state`.
pub(super) fn finish(func: ReduceFunc, state: State) -> Result<Reg> {
    match state {
        State::B(v) => Ok(Reg::B(v)),
        _ => Err(super::mismatched_finish(func)),
    }
}
