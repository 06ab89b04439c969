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

use super::eval::fast32::SumMode;
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

    /// Readies sums that have room for `terms` more values per element for a fold of them
    /// (a full accumulator flushes them first, see `PartialSums::start_fold` in
    /// [`reduce`](super::reduce)). Returns the mode of the fold's first values:
    /// [`SumMode::Start`] when the sums hold nothing and `covers_all` (those values give every
    /// element exactly one value, so they are written and the sums need no zeroing), else
    /// [`SumMode::Add`] (sums that held nothing are zeroed).
    pub fn begin_fold(&mut self, terms: u64, covers_all: bool) -> Result<SumMode> {
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

    /// Records that the sums' values went to an accumulator: they hold nothing from here on.
    pub fn mark_flushed(&mut self) {
        self.terms = 0;
        self.stale = true;
    }
}
