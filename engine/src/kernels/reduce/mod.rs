//! Streaming reductions: accumulators that fold tiles, merge with each other, and finish into
//! numpy's result.
//!
//! One [`Accumulator`] dispatches on the reduction's family, each in its own file with its
//! fresh state, its fold, its merge and its finished values: `sums` (sum, prod, mean and
//! their NaN-skipping forms), `extremes` (min, max, nanmin, nanmax), `logical` (any, all),
//! `variance` (var, std, nanvar, nanstd) and `arg` (argmin, argmax and their NaN-skipping
//! forms). `partials` starts and feeds float sums from float32 partial sums (see
//! [`cascade`](super::cascade)); `finish` converts results to the output dtype.
//!
//! Sums accumulate in f64 (float32 programs add up to 16 values per element in float32
//! first), complex sums in complex f64, integer sums wrap in 64 bits as numpy's do. Variance
//! uses Welford's update per element and Chan's formula to merge partial results.

mod arg;
mod extremes;
mod finish;
mod folds;
mod logical;
mod partials;
mod state_bytes;
mod sums;
mod variance;

use num_complex::Complex64;

use super::eval::tiles::TileTarget;
use super::work::{work_of, Reg, Work};
use crate::array::{Buffer, DType};
use crate::error::{Error, ErrorKind, Result};
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

/// The families of reductions, each folded and merged by its own module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// sum, prod, mean and their NaN-skipping forms: `sums`.
    Sums,
    /// min, max, nanmin, nanmax: `extremes`.
    Extremes,
    /// any, all: `logical`.
    Logical,
    /// var, std, nanvar, nanstd: `variance`.
    Variance,
    /// argmin, argmax, nanargmin, nanargmax: `arg`.
    Arg,
}

impl Family {
    /// The family of `func`.
    fn of(func: ReduceFunc) -> Family {
        use ReduceFunc::*;
        match func {
            Sum | NanSum | Mean | NanMean | Prod | NanProd => Family::Sums,
            Min | Max | NanMin | NanMax => Family::Extremes,
            Any | All => Family::Logical,
            Var | Std | NanVar | NanStd => Family::Variance,
            Argmin | Argmax | NanArgmin | NanArgmax => Family::Arg,
        }
    }
}

/// The error for a fold of `func` given a register its state cannot take.
fn mismatched_fold(func: ReduceFunc) -> Error {
    Error::internal(format!("{} fold of a mismatched register", func.name()))
}

/// The error for a merge of two accumulators of different states.
fn mismatched_merge() -> Error {
    Error::internal("merge of mismatched accumulators")
}

/// The error for a state of another family than `func`'s at the finish.
fn mismatched_finish(func: ReduceFunc) -> Error {
    Error::internal(format!("{} finished from a mismatched state", func.name()))
}

/// A reduction's running state for every element of one output region.
#[derive(Debug, Clone)]
pub struct Accumulator {
    func: ReduceFunc,
    state: State,
}

impl Accumulator {
    /// A fresh accumulator of `len` elements for `func` computing in `compute`.
    pub fn new(func: ReduceFunc, compute: DType, len: usize) -> Result<Self> {
        let w = work_of(compute);
        let state = match Family::of(func) {
            Family::Sums => sums::state(func, w, len),
            Family::Extremes => extremes::state(func, w, len),
            Family::Logical => logical::state(func, w, len),
            Family::Variance => variance::state(w, len),
            Family::Arg => arg::state(w, len),
        };
        match state {
            Some(state) => Ok(Accumulator { func, state }),
            None => Err(Error::new(
                ErrorKind::Unsupported,
                format!("{} computing in {compute} is not supported", func.name()),
            )),
        }
    }

    /// Bytes of state per element, for memory projections.
    pub fn bytes_per_element(func: ReduceFunc, compute: DType) -> u64 {
        let w = work_of(compute);
        // The element size of one value of the state `new` makes.
        let value: u64 = match w {
            Work::C => 16,
            Work::B => 1,
            _ => 8,
        };
        match Family::of(func) {
            Family::Sums => sums::bytes_per_element(func, w, value),
            Family::Extremes | Family::Logical => value,
            Family::Variance => variance::bytes_per_element(w),
            Family::Arg => arg::bytes_per_element(w, value),
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

    /// [`fold`](Self::fold) by the family's own fold (inlined, so compiled for AVX2 where
    /// the CPU has it).
    #[inline(always)]
    fn fold_impl(&mut self, reg: &Reg, n: usize, at: TileTarget, index: (i64, i64)) -> Result<()> {
        let (func, state) = (self.func, &mut self.state);
        match Family::of(func) {
            Family::Sums => sums::fold(state, func, reg, n, at),
            Family::Extremes => extremes::fold(state, func, reg, n, at),
            Family::Logical => logical::fold(state, func, reg, n, at),
            Family::Variance => variance::fold(state, func, reg, n, at),
            Family::Arg => arg::fold(state, func, reg, n, at, index),
        }
    }

    /// Merges `other`, a partial result over other elements of the reduction, into `self`.
    pub fn merge(&mut self, other: &Accumulator) -> Result<()> {
        let (func, state) = (self.func, &mut self.state);
        match Family::of(func) {
            Family::Sums => sums::merge(state, func, &other.state),
            Family::Extremes => extremes::merge(state, func, &other.state),
            Family::Logical => logical::merge(state, func, &other.state),
            Family::Variance => variance::merge(state, &other.state),
            Family::Arg => arg::merge(state, func, &other.state),
        }
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
                let at = TileTarget { offset: 0, stride: 0, index: &[] };
                lanes.fold(&Reg::F(vals.clone()), vals.len(), at, (0, 0)).unwrap();
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
}
