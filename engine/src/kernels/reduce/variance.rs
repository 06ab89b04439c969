//! Variance and standard deviation (var, std, nanvar, nanstd) of floats and complex values:
//! Welford's update per element, Chan's formula to merge partial results, and the finished
//! values for a given `ddof`.

use num_complex::Complex64;

use super::folds::written;
use super::{mismatched_fold, State};
use crate::error::Result;
use crate::kernels::eval::tiles::TileTarget;
use crate::kernels::work::{Reg, Work};
use crate::plan::ReduceFunc;

/// The fresh state of a variance computing in `w`; `None` where it has none.
pub(super) fn state(w: Work, len: usize) -> Option<State> {
    match w {
        Work::F => Some(State::Welford(
            written(0.0, len),
            written(0.0, len),
            written(0.0, len),
        )),
        Work::C => Some(State::WelfordC(
            written(0.0, len),
            written(Complex64::new(0.0, 0.0), len),
            written(0.0, len),
        )),
        _ => None,
    }
}

/// Bytes of state per element computing in `w`: count, mean and sum of squared deviations.
pub(super) fn bytes_per_element(w: Work) -> u64 {
    match w {
        Work::C => 8 + 16 + 8,
        _ => 24,
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
    let o = at.offset;
    let skip_nan = matches!(func, ReduceFunc::NanVar | ReduceFunc::NanStd);
    match (state, reg) {
        (State::Welford(cnt, mean, m2), Reg::F(v)) if at.stride == 1 => {
            // Contiguous lanes, branch-free (a NaN that nanvar skips adds 0 to the count
            // and leaves mean and m2 as they were), so the loop vectorizes.
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
        _ => return Err(mismatched_fold(func)),
    }
    Ok(())
}

/// Merges `other`, a partial result over other elements of the reduction, into `state`
/// (Chan's formula).
pub(super) fn merge(state: &mut State, other: &State) -> Result<()> {
    match (state, other) {
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
        _ => return Err(super::mismatched_merge()),
    }
    Ok(())
}

/// The variances (or, for std and nanstd, their square roots) of `state`, with `ddof` delta
/// degrees of freedom.
pub(super) fn finish(func: ReduceFunc, state: State, ddof: f64) -> Result<Reg> {
    use ReduceFunc::*;
    let (n, m2) = match state {
        State::Welford(n, _, m2) | State::WelfordC(n, _, m2) => (n, m2),
        _ => return Err(super::mismatched_finish(func)),
    };
    Ok(Reg::F(
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
    ))
}

#[cfg(test)]
mod tests {
    use super::super::Accumulator;
    use super::*;
    use crate::array::DType;

    #[test]
    fn welford_merge_equals_one_pass() {
        let at = TileTarget {
            offset: 0,
            stride: 0,
            index: &[],
        };
        let xs = [1.0, 2.0, 4.0, 7.0, 11.0];
        let mut a = Accumulator::new(ReduceFunc::Var, DType::F64, 1).unwrap();
        a.fold(&Reg::F(xs[..2].to_vec()), 2, at, (0, 0)).unwrap();
        let mut b = Accumulator::new(ReduceFunc::Var, DType::F64, 1).unwrap();
        b.fold(&Reg::F(xs[2..].to_vec()), 3, at, (0, 0)).unwrap();
        a.merge(&b).unwrap();
        let v = a.finish(DType::F64, 5, 1.0).unwrap();
        let mean = xs.iter().sum::<f64>() / 5.0;
        let expect = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4.0;
        assert!((v.as_slice::<f64>().unwrap()[0] - expect).abs() < 1e-12);
    }
}
