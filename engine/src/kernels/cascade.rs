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

use super::reduce::Accumulator;
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::plan::ReduceFunc;

/// Values per element added in float32 before the partial sums go to the f64 accumulator.
pub const TERMS: u64 = 16;

/// Float32 partial sums of one output region, with the number of values each holds at most.
#[derive(Debug)]
pub struct PartialSums {
    sums: Buffer,
    terms: u64,
}

impl PartialSums {
    /// Zeroed partial sums of `len` elements.
    pub fn new(len: usize) -> Self {
        PartialSums {
            sums: Buffer::zeros(DType::F32, len),
            terms: 0,
        }
    }

    /// Whether the sums may take `terms` more values per element within [`TERMS`].
    pub fn has_room_for(&self, terms: u64) -> bool {
        self.terms + terms <= TERMS
    }

    /// Records that `terms` more values per element were added.
    pub fn added(&mut self, terms: u64) {
        self.terms += terms;
    }

    /// Whether no value was added since the sums were made or last flushed.
    pub fn is_empty(&self) -> bool {
        self.terms == 0
    }

    /// The running sums.
    pub fn sums(&self) -> Result<&[f32]> {
        self.sums.as_slice::<f32>()
    }

    /// The running sums, to add values to.
    pub fn sums_mut(&mut self) -> Result<&mut [f32]> {
        self.sums.as_slice_mut::<f32>()
    }

    /// Adds the partial sums to `acc` (made from them when `None`; `func` is Sum or Mean) and
    /// starts again from zero.
    pub fn flush_into(&mut self, acc: &mut Option<Accumulator>, func: ReduceFunc) -> Result<()> {
        if self.terms == 0 {
            return Ok(());
        }
        let sums = self.sums.as_slice_mut::<f32>()?;
        match acc {
            Some(acc) => acc.add_f32_sums(sums)?,
            None => *acc = Some(Accumulator::from_f32_sums(func, sums)?),
        }
        sums.fill(0.0);
        self.terms = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_add_to_the_accumulator_and_restart_from_zero() {
        let mut partial = PartialSums::new(3);
        let mut acc = None;
        assert!(partial.has_room_for(TERMS));
        assert!(!partial.has_room_for(TERMS + 1));
        partial
            .sums_mut()
            .unwrap()
            .copy_from_slice(&[1.5, -2.0, 1e30]);
        partial.added(2);
        assert!(!partial.has_room_for(TERMS - 1));
        partial.flush_into(&mut acc, ReduceFunc::Sum).unwrap();
        assert!(partial.has_room_for(TERMS));
        assert_eq!(partial.sums_mut().unwrap(), &[0.0, 0.0, 0.0]);
        partial
            .sums_mut()
            .unwrap()
            .copy_from_slice(&[0.25, 3.0, 1e30]);
        partial.added(1);
        partial.flush_into(&mut acc, ReduceFunc::Sum).unwrap();
        let out = acc
            .unwrap()
            .finish(DType::F64, 3, 0.0)
            .unwrap()
            .as_slice::<f64>()
            .unwrap()
            .to_vec();
        // 1e30 as float32 twice, added in f64.
        let big = 1e30f32 as f64 * 2.0;
        assert_eq!(out, vec![1.75, 1.0, big]);
    }

    #[test]
    fn an_empty_flush_leaves_no_accumulator() {
        let mut partial = PartialSums::new(4);
        let mut acc = None;
        partial.flush_into(&mut acc, ReduceFunc::Mean).unwrap();
        assert!(acc.is_none());
    }
}
