//! Float32 running sums of a few values per element, flushed into an f64 accumulator.
//!
//! A float sum's accumulator holds f64 per element, and every input piece streams it through
//! memory: for the ERA5 sum (one (721, 1440) plane per piece) that is 16.6 MB read and written
//! per 4 MB piece, and the fold became bound by it. Single-precision programs instead add up
//! to [`TERMS`] values per element in float32 (half the bytes, so the workers' running sums
//! and pieces stay in the last-level cache), then add those partial sums to the f64
//! accumulator. This is cascade summation, as numpy's own float32 sums are: its pairwise sum
//! adds up to 16 values per lane in float32 before combining partial sums, and its sums along
//! a non-contiguous axis (such as the time axis here) add every value in float32.
//!
//! nansum and nanmean (xarray's mean of floats) cascade the same way: NaNs add nothing, and
//! nanmean's partial sums come with a one-byte count per element of the values they hold.

use super::fast32::SumMode;
use super::reduce::Accumulator;
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::plan::ReduceFunc;

/// Values per element added in float32 before the partial sums go to the f64 accumulator.
pub const TERMS: u64 = 16;

/// Whether `func` of single-precision values can add them in float32 partial sums first.
pub fn cascades(func: ReduceFunc) -> bool {
    use ReduceFunc::*;
    matches!(func, Sum | Mean | NanSum | NanMean)
}

/// Whether `func`'s partial sums skip NaN values.
pub fn skips_nan(func: ReduceFunc) -> bool {
    matches!(func, ReduceFunc::NanSum | ReduceFunc::NanMean)
}

/// Bytes of partial sums per element for `func` (the sum, and nanmean's count).
pub fn bytes_per_element(func: ReduceFunc) -> u64 {
    4 + u64::from(func == ReduceFunc::NanMean)
}

/// Float32 partial sums of one output region, with the number of values each holds at most.
///
/// Sums that hold nothing (fresh, or just flushed) are not zeroed: the next fold either
/// starts them, writing a value to every element (see [`PartialSums::start_fold`]), or has
/// them zeroed first. A fold that covers the whole region with one value per element (a
/// plane of an ERA5 sum over time) so skips one pass over the sums per flush.
#[derive(Debug)]
pub struct PartialSums {
    func: ReduceFunc,
    sums: Buffer,
    /// Values each element's sum holds, for nanmean (NaNs are not counted).
    counts: Option<Buffer>,
    terms: u64,
    /// Whether the buffers hold nothing of these sums (unwritten memory or flushed values).
    stale: bool,
}

impl PartialSums {
    /// Partial sums of `len` elements for `func` (one that [`cascades`]) that hold nothing
    /// yet: a fold starts them (see [`PartialSums::start_fold`]), or they are written whole
    /// and [`added`](PartialSums::added).
    pub fn new(func: ReduceFunc, len: usize) -> Self {
        PartialSums {
            func,
            sums: Buffer::for_overwrite(DType::F32, len),
            counts: (func == ReduceFunc::NanMean).then(|| Buffer::for_overwrite(DType::U8, len)),
            terms: 0,
            stale: true,
        }
    }

    /// The reduction the sums are for.
    pub fn func(&self) -> ReduceFunc {
        self.func
    }

    /// Whether the sums may take `terms` more values per element within [`TERMS`].
    pub fn has_room_for(&self, terms: u64) -> bool {
        self.terms + terms <= TERMS
    }

    /// Records that `terms` more values per element were added (the sums hold values of their
    /// own from here on).
    pub fn added(&mut self, terms: u64) {
        self.terms += terms;
        self.stale = false;
    }

    /// Readies the sums for a fold of `terms` values per element: flushes them into `acc`
    /// first when they have no room for those within [`TERMS`]. Returns the mode of the
    /// fold's first values: [`SumMode::Start`] when the sums hold nothing and `covers_all`
    /// (those values give every element exactly one value, so they are written and the
    /// sums need no zeroing), else [`SumMode::Add`] (sums that held nothing are zeroed).
    pub fn start_fold(
        &mut self,
        acc: &mut Option<Accumulator>,
        terms: u64,
        covers_all: bool,
    ) -> Result<SumMode> {
        if !self.has_room_for(terms) {
            self.flush_into(acc)?;
        }
        let mode = match (self.stale, covers_all) {
            (true, true) => SumMode::Start,
            (true, false) => {
                self.sums.as_slice_mut::<f32>()?.fill(0.0);
                if let Some(c) = self.counts.as_mut() {
                    c.as_slice_mut::<u8>()?.fill(0);
                }
                SumMode::Add
            }
            (false, _) => SumMode::Add,
        };
        self.added(terms);
        Ok(mode)
    }

    /// Whether no value was added since the sums were made or last flushed.
    pub fn is_empty(&self) -> bool {
        self.terms == 0
    }

    /// The running sums.
    pub fn sums(&self) -> Result<&[f32]> {
        self.sums.as_slice::<f32>()
    }

    /// The counts of values in each sum (nanmean only).
    pub fn counts(&self) -> Result<Option<&[u8]>> {
        self.counts.as_ref().map(|c| c.as_slice::<u8>()).transpose()
    }

    /// The running sums, to add values to.
    pub fn sums_mut(&mut self) -> Result<&mut [f32]> {
        self.sums.as_slice_mut::<f32>()
    }

    /// The running sums and counts (nanmean only), to add values to.
    pub fn parts_mut(&mut self) -> Result<(&mut [f32], Option<&mut [u8]>)> {
        let counts = match self.counts.as_mut() {
            Some(c) => Some(c.as_slice_mut::<u8>()?),
            None => None,
        };
        Ok((self.sums.as_slice_mut::<f32>()?, counts))
    }

    /// Adds the partial sums to `acc` (made from them when `None`); they then hold nothing.
    pub fn flush_into(&mut self, acc: &mut Option<Accumulator>) -> Result<()> {
        if self.terms == 0 {
            return Ok(());
        }
        match acc {
            Some(acc) => acc.add_partial(self)?,
            None => *acc = Some(Accumulator::from_partial(self)?),
        }
        self.terms = 0;
        self.stale = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
