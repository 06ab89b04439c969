//! Arg-reductions (argmin, argmax, nanargmin, nanargmax): per element the best value, its
//! index along the reduction and whether a value was seen; the fold over a tile, the merge of
//! two partial results (of equal values the earlier index wins, in whatever order partial
//! results come) and the finished indices.

use super::folds::written;
use super::{mismatched_fold, State};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::eval::tiles::TileTarget;
use crate::kernels::work::{Reg, Work};
use crate::plan::ReduceFunc;

/// The fresh state computing in `w`; `None` where it has none.
pub(super) fn state(w: Work, len: usize) -> Option<State> {
    let reg = match w {
        Work::C => return None,
        Work::I | Work::B => Reg::I(written(0, len)),
        Work::U => Reg::U(written(0, len)),
        _ => Reg::F(written(0.0, len)),
    };
    Some(State::Arg(reg, written(0, len), written(false, len)))
}

/// Bytes of state per element computing in `w`, one value taking `value` bytes: the best
/// value, its index and whether seen.
pub(super) fn bytes_per_element(w: Work, value: u64) -> u64 {
    match w {
        Work::B => 8 + 8 + 1,
        _ => value + 8 + 1,
    }
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

/// Whether `x` comes before `cur`: is greater for an argmax, less for an argmin.
#[inline(always)]
fn in_order<T: PartialOrd>(is_max: bool, x: T, cur: T) -> bool {
    if is_max {
        x > cur
    } else {
        x < cur
    }
}

/// Values `vals` folded one by one into the elements at `at` (the scalar rule): a value
/// replaces the best when the element has none, when it is `better`, or when it ties at an
/// earlier index; `index` gives the reduction index of the first value and the step.
#[inline(always)]
fn arg_fold_each<T: Copy>(
    best: &mut [T],
    idx: &mut [i64],
    seen: &mut [bool],
    vals: &[T],
    at: TileTarget,
    index: (i64, i64),
    better: impl Fn(T, T) -> bool,
) {
    for (k, x) in vals.iter().enumerate() {
        let j = at.offset + k * at.stride;
        let i = index.0 + k as i64 * index.1;
        let tie = !better(*x, best[j]) && !better(best[j], *x);
        if !seen[j] || better(*x, best[j]) || (tie && i < idx[j]) {
            best[j] = *x;
            idx[j] = i;
            seen[j] = true;
        }
    }
}

/// Folds `n` values of `reg` into the elements of `state` at `at`; `index` gives the
/// reduction index of the tile's first value and the step between consecutive values.
#[inline(always)]
pub(super) fn fold(
    state: &mut State,
    func: ReduceFunc,
    reg: &Reg,
    n: usize,
    at: TileTarget,
    index: (i64, i64),
) -> Result<()> {
    use ReduceFunc::*;
    let State::Arg(best, idx, seen) = state else {
        return Err(mismatched_fold(func));
    };
    let o = at.offset;
    let is_max = matches!(func, Argmax | NanArgmax);
    let skip_nan = matches!(func, NanArgmin | NanArgmax);
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
            let better =
                |x: f64, cur: f64| !x.is_nan() && (cur.is_nan() || in_order(is_max, x, cur));
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
            let better =
                |x: f64, cur: f64| !cur.is_nan() && (x.is_nan() || in_order(is_max, x, cur));
            arg_fold_each(b, idx, seen, &v[..n], at, index, better)
        }
        (Reg::I(b), Reg::I(v)) => arg_fold_each(b, idx, seen, &v[..n], at, index, |x, cur| {
            in_order(is_max, x, cur)
        }),
        (Reg::I(b), Reg::B(v)) => {
            let vi: Vec<i64> = v[..n].iter().map(|&x| x as i64).collect();
            arg_fold_each(b, idx, seen, &vi, at, index, |x, cur| {
                in_order(is_max, x, cur)
            })
        }
        (Reg::U(b), Reg::U(v)) => arg_fold_each(b, idx, seen, &v[..n], at, index, |x, cur| {
            in_order(is_max, x, cur)
        }),
        _ => return Err(Error::internal("arg fold")),
    }
    Ok(())
}

/// The partial result `b2`, `idx2`, `seen2` merged into `b`, `idx`, `seen`: where it saw a value
/// that is `better`, or equal at an earlier index, it replaces the element's.
fn arg_merge_each<T: Copy>(
    b: &mut [T],
    idx: &mut [i64],
    seen: &mut [bool],
    b2: &[T],
    idx2: &[i64],
    seen2: &[bool],
    better: impl Fn(T, T) -> bool,
) {
    for j in 0..idx.len() {
        let tie = !better(b2[j], b[j]) && !better(b[j], b2[j]);
        let earlier = tie && idx2[j] < idx[j];
        if seen2[j] && (!seen[j] || better(b2[j], b[j]) || earlier) {
            b[j] = b2[j];
            idx[j] = idx2[j];
            seen[j] = true;
        }
    }
}

/// Merges `other`, a partial result over other elements of the reduction, into `state`.
pub(super) fn merge(state: &mut State, func: ReduceFunc, other: &State) -> Result<()> {
    use ReduceFunc::*;
    let (State::Arg(best, idx, seen), State::Arg(best2, idx2, seen2)) = (state, other) else {
        return Err(super::mismatched_merge());
    };
    // NaN-skipping forms never keep a NaN, so NaN's rank below does not matter.
    let is_max = matches!(func, Argmax | NanArgmax);
    // Partial results need not cover earlier elements first (an argmin over every axis of an
    // array split along its last): of equal values (or two NaNs) the earlier index wins, as
    // in numpy.
    match (best, best2) {
        (Reg::F(b), Reg::F(b2)) => {
            arg_merge_each(b, idx, seen, b2, idx2, seen2, |x: f64, cur: f64| {
                !cur.is_nan() && (x.is_nan() || in_order(is_max, x, cur))
            })
        }
        (Reg::I(b), Reg::I(b2)) => arg_merge_each(b, idx, seen, b2, idx2, seen2, |x, cur| {
            in_order(is_max, x, cur)
        }),
        (Reg::U(b), Reg::U(b2)) => arg_merge_each(b, idx, seen, b2, idx2, seen2, |x, cur| {
            in_order(is_max, x, cur)
        }),
        _ => return Err(Error::internal("arg merge")),
    }
    Ok(())
}

/// The indices of `state`; an error for a NaN-skipping form with an element that saw no
/// value (numpy's "all-NaN slice encountered").
pub(super) fn finish(func: ReduceFunc, state: State) -> Result<Reg> {
    let State::Arg(_, idx, seen) = state else {
        return Err(super::mismatched_finish(func));
    };
    if matches!(func, ReduceFunc::NanArgmin | ReduceFunc::NanArgmax) && seen.iter().any(|s| !s) {
        return Err(Error::new(
            ErrorKind::Value,
            format!("{}: all-NaN slice encountered", func.name()),
        ));
    }
    Ok(Reg::I(idx))
}

#[cfg(test)]
mod tests {
    use super::super::Accumulator;
    use super::*;
    use crate::array::DType;

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
        assert_eq!(err.kind, ErrorKind::Value);
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
