//! What differs between single and double precision FFTs: the dtypes of real and complex
//! values, their buffers' slices, and the rustfft plans, made once per (length, direction)
//! and reused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use num_complex::Complex;
use rustfft::{Fft, FftDirection, FftNum, FftPlanner};

use super::pack;
use crate::array::{Buffer, DType};
use crate::error::Result;

/// Precision-specific glue.
pub(super) trait Precision:
    FftNum + Default + crate::array::buffer::Element + rustfft::num_traits::Float
{
    /// The dtype of complex values of this precision.
    const COMPLEX: DType;
    /// The dtype of real values of this precision.
    const REAL: DType;
    /// The shared plan cache of this precision.
    fn plans() -> &'static Mutex<PlanCache<Self>>;
    /// A buffer's real values.
    fn real(b: &Buffer) -> Result<&[Self]>;
    /// A buffer's real values, mutable.
    fn real_mut(b: &mut Buffer) -> Result<&mut [Self]>;
    /// A buffer's complex values.
    fn complex(b: &Buffer) -> Result<&[Complex<Self>]>;
    /// A buffer's complex values, mutable.
    fn complex_mut(b: &mut Buffer) -> Result<&mut [Complex<Self>]>;
    /// Packs one group of real lanes into complex ones (see [`pack::gather_pairs`]).
    fn gather_pairs(input: &[Self], g: pack::GroupLanes, work: &mut [Complex<Self>]) {
        pack::gather_pairs(input, g, work)
    }
    /// Unpacks the spectra of one group's packed lanes (see [`pack::unpack_pairs`]).
    fn unpack_pairs(
        work: &[Complex<Self>],
        g: pack::GroupLanes,
        (kb, kn): (usize, usize),
        half: Self,
        tile: &mut pack::Tile<Self>,
    ) {
        pack::unpack_pairs(work, g, kb, kn, half, tile)
    }
}

macro_rules! buffer_access {
    () => {
        fn real(b: &Buffer) -> Result<&[Self]> {
            b.as_slice()
        }
        fn real_mut(b: &mut Buffer) -> Result<&mut [Self]> {
            b.as_slice_mut()
        }
        fn complex(b: &Buffer) -> Result<&[Complex<Self>]> {
            b.as_slice()
        }
        fn complex_mut(b: &mut Buffer) -> Result<&mut [Complex<Self>]> {
            b.as_slice_mut()
        }
    };
}

/// rustfft plans per (length, direction), shared by all threads.
pub(super) struct PlanCache<T: FftNum> {
    planner: FftPlanner<T>,
    plans: HashMap<(usize, bool), Arc<dyn Fft<T>>>,
}

impl<T: FftNum> PlanCache<T> {
    fn new() -> Self {
        PlanCache {
            planner: FftPlanner::new(),
            plans: HashMap::new(),
        }
    }
}

impl Precision for f32 {
    const COMPLEX: DType = DType::C64;
    const REAL: DType = DType::F32;
    fn plans() -> &'static Mutex<PlanCache<f32>> {
        static CACHE: OnceLock<Mutex<PlanCache<f32>>> = OnceLock::new();
        CACHE.get_or_init(|| Mutex::new(PlanCache::new()))
    }
    buffer_access!();
    fn gather_pairs(input: &[f32], g: pack::GroupLanes, work: &mut [Complex<f32>]) {
        pack::gather_pairs_f32(input, g, work)
    }
    fn unpack_pairs(
        work: &[Complex<f32>],
        g: pack::GroupLanes,
        (kb, kn): (usize, usize),
        half: f32,
        tile: &mut pack::Tile<f32>,
    ) {
        pack::unpack_pairs_f32(work, g, kb, kn, half, tile)
    }
}

impl Precision for f64 {
    const COMPLEX: DType = DType::C128;
    const REAL: DType = DType::F64;
    fn plans() -> &'static Mutex<PlanCache<f64>> {
        static CACHE: OnceLock<Mutex<PlanCache<f64>>> = OnceLock::new();
        CACHE.get_or_init(|| Mutex::new(PlanCache::new()))
    }
    buffer_access!();
}

/// The plan of a transform of length `n`, made once and reused.
pub(super) fn plan<T: Precision>(n: usize, inverse: bool) -> Arc<dyn Fft<T>> {
    let mut cache = match T::plans().lock() {
        Ok(c) => c,
        Err(poisoned) => poisoned.into_inner(),
    };
    let PlanCache { planner, plans } = &mut *cache;
    plans
        .entry((n, inverse))
        .or_insert_with(|| {
            let direction = if inverse {
                FftDirection::Inverse
            } else {
                FftDirection::Forward
            };
            planner.plan_fft(n, direction)
        })
        .clone()
}
