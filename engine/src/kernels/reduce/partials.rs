//! Float32 partial sums (see [`cascade`](crate::kernels::cascade)) into and out of the f64
//! accumulator of a sum, mean, nansum or nanmean: an accumulator started from them or adding
//! them, and the partial sums flushed into an accumulator when full.

use super::{Accumulator, State};
use crate::array::{Buffer, DType};
use crate::error::{Error, Result};
use crate::kernels::cascade::PartialSums;
use crate::kernels::eval::fast32::SumMode;
use crate::plan::ReduceFunc;

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

impl Accumulator {
    /// The accumulator of `partial`'s reduction (Sum, Mean, NanSum or NanMean) that starts
    /// from its float32 partial sums (see [`cascade`](crate::kernels::cascade)).
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
}

impl PartialSums {
    /// Readies the sums for a fold of `terms` values per element: flushes them into `acc`
    /// first when they have no room for those within [`TERMS`](crate::kernels::cascade::TERMS).
    /// Returns the mode of the fold's first values: [`SumMode::Start`] when the sums hold
    /// nothing and `covers_all` (those values give every element exactly one value, so they
    /// are written and the sums need no zeroing), else [`SumMode::Add`] (sums that held
    /// nothing are zeroed).
    pub fn start_fold(
        &mut self,
        acc: &mut Option<Accumulator>,
        terms: u64,
        covers_all: bool,
    ) -> Result<SumMode> {
        if !self.has_room_for(terms) {
            self.flush_into(acc)?;
        }
        self.begin_fold(terms, covers_all)
    }

    /// Adds the partial sums to `acc` (made from them when `None`); they then hold nothing.
    pub fn flush_into(&mut self, acc: &mut Option<Accumulator>) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        match acc {
            Some(acc) => acc.add_partial(self)?,
            None => *acc = Some(Accumulator::from_partial(self)?),
        }
        self.mark_flushed();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::DType;
    use crate::kernels::cascade::TERMS;

    #[test]
    fn flushes_add_to_the_accumulator_and_restart_from_zero() {
        let mut partial = PartialSums::new(ReduceFunc::Sum, 3);
        let mut acc = None;
        assert!(partial.has_room_for(TERMS));
        assert!(!partial.has_room_for(TERMS + 1));
        partial
            .sums_mut()
            .unwrap()
            .copy_from_slice(&[1.5, -2.0, 1e30]);
        partial.added(2);
        assert!(!partial.has_room_for(TERMS - 1));
        partial.flush_into(&mut acc).unwrap();
        assert!(partial.has_room_for(TERMS));
        // A fold that does not cover every element adds to zeroed sums.
        assert_eq!(
            partial.start_fold(&mut acc, 1, false).unwrap(),
            SumMode::Add
        );
        assert_eq!(partial.sums_mut().unwrap(), &[0.0, 0.0, 0.0]);
        partial.sums_mut().unwrap()[..2].copy_from_slice(&[0.25, 3.0]);
        partial.flush_into(&mut acc).unwrap();
        let out = acc
            .unwrap()
            .finish(DType::F64, 3, 0.0)
            .unwrap()
            .as_slice::<f64>()
            .unwrap()
            .to_vec();
        assert_eq!(out, vec![1.75, 1.0, 1e30f32 as f64]);
    }

    #[test]
    fn a_fold_that_covers_every_element_starts_the_sums_without_zeroing() {
        let mut partial = PartialSums::new(ReduceFunc::Sum, 2);
        let mut acc = None;
        // Fresh sums, covered: started, not zeroed.
        assert_eq!(
            partial.start_fold(&mut acc, 1, true).unwrap(),
            SumMode::Start
        );
        partial.sums_mut().unwrap().copy_from_slice(&[1.0, 2.0]);
        // Sums that hold values take the next fold's values added.
        assert_eq!(partial.start_fold(&mut acc, 1, true).unwrap(), SumMode::Add);
        partial.sums_mut().unwrap()[0] += 0.5;
        // No room for the next fold: flushed, then started again.
        assert_eq!(
            partial.start_fold(&mut acc, TERMS, true).unwrap(),
            SumMode::Start
        );
        assert!(!partial.has_room_for(1));
        partial.sums_mut().unwrap().copy_from_slice(&[10.0, 20.0]);
        partial.flush_into(&mut acc).unwrap();
        let out = acc.unwrap().finish(DType::F64, 3, 0.0).unwrap();
        assert_eq!(out.as_slice::<f64>().unwrap(), &[11.5, 22.0]);
    }

    #[test]
    fn nanmean_partials_carry_counts_into_the_accumulator() {
        let mut partial = PartialSums::new(ReduceFunc::NanMean, 2);
        let mut acc = None;
        let (sums, counts) = partial.parts_mut().unwrap();
        sums.copy_from_slice(&[3.0, 0.0]);
        counts.unwrap().copy_from_slice(&[2, 0]);
        partial.added(2);
        partial.flush_into(&mut acc).unwrap();
        assert_eq!(
            partial.start_fold(&mut acc, 1, false).unwrap(),
            SumMode::Add
        );
        assert_eq!(partial.counts().unwrap().unwrap(), &[0, 0]);
        let (sums, counts) = partial.parts_mut().unwrap();
        sums.copy_from_slice(&[1.0, 5.0]);
        counts.unwrap().copy_from_slice(&[1, 1]);
        partial.flush_into(&mut acc).unwrap();
        let out = acc.unwrap().finish(DType::F64, 3, 0.0).unwrap();
        // (3 + 1) / 3 values and 5 / 1 value: NaNs neither add nor count.
        assert_eq!(out.as_slice::<f64>().unwrap(), &[4.0 / 3.0, 5.0]);
    }

    #[test]
    fn partials_of_another_reduction_are_refused() {
        let mut sum = PartialSums::new(ReduceFunc::Sum, 2);
        sum.added(1);
        let mut acc = Accumulator::from_partial(&sum).unwrap();
        let mut nanmean = PartialSums::new(ReduceFunc::NanMean, 2);
        nanmean.added(1);
        assert!(acc.add_partial(&nanmean).is_err());
        let short = PartialSums::new(ReduceFunc::Sum, 3);
        assert!(acc.add_partial(&short).is_err());
        // Nor paired with partial sums of another reduction or length.
        let mut mean = PartialSums::new(ReduceFunc::Mean, 2);
        mean.added(1);
        assert!(Accumulator::from_partials(&sum, Some(&mean)).is_err());
        assert!(acc.add_partials(&sum, Some(&mean)).is_err());
        assert!(Accumulator::from_partials(&sum, Some(&short)).is_err());
    }

    #[test]
    fn an_empty_flush_leaves_no_accumulator() {
        let mut partial = PartialSums::new(ReduceFunc::Mean, 4);
        let mut acc = None;
        partial.flush_into(&mut acc).unwrap();
        assert!(acc.is_none());
    }
}
