//! FFT kernels on rustfft: transforms along one axis of a C-order block, chained for n-d
//! transforms, with numpy's semantics (`n` pads with zeros or crops; `norm` backward, ortho,
//! forward; rfft keeps `n / 2 + 1` values; irfft reads `n / 2 + 1` values and treats the
//! spectrum as Hermitian).
//!
//! Lanes along the axis are gathered a group at a time into a contiguous work buffer, so a
//! transform along a strided axis reads whole cache lines; groups run in parallel on rayon.
//! rustfft plans are made once per (precision, length, direction) and reused. Real forward
//! transforms of lengths with an awkward prime factor (721 = 7 × 103) along a strided axis are
//! computed directly across the lanes instead ([`rdft`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use num_complex::Complex;
use rayon::prelude::*;
use rustfft::{Fft, FftDirection, FftNum, FftPlanner};

use crate::array::{Buffer, DType};
use crate::error::{Error, Result};

mod irdft;
mod pack;
mod rdft;

/// What one step computes along its axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FftStepKind {
    /// Complex → complex, forward (`fft`).
    Forward,
    /// Complex → complex, inverse (`ifft`).
    Inverse,
    /// Real → complex, forward, keeping `n / 2 + 1` values (`rfft`).
    RealForward,
    /// Hermitian complex → real, inverse (`irfft`).
    RealInverse,
}

impl FftStepKind {
    /// True for the steps whose unnormalised direction is the inverse one.
    pub fn is_inverse(self) -> bool {
        matches!(self, FftStepKind::Inverse | FftStepKind::RealInverse)
    }

    /// Length of the step's output along its axis.
    pub fn out_len(self, n: usize) -> usize {
        match self {
            FftStepKind::RealForward => n / 2 + 1,
            _ => n,
        }
    }

    /// How many input values along the axis the step uses (the rest is cropped).
    pub fn in_len(self, n: usize) -> usize {
        match self {
            FftStepKind::RealInverse => n / 2 + 1,
            _ => n,
        }
    }
}

/// numpy's `norm`: which direction is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FftNorm {
    /// Inverse scaled by `1/n` (numpy's default).
    Backward,
    /// Both scaled by `1/sqrt(n)`.
    Ortho,
    /// Forward scaled by `1/n`.
    Forward,
}

impl FftNorm {
    /// Parses numpy's names.
    pub fn parse(name: &str) -> Option<FftNorm> {
        match name {
            "backward" => Some(FftNorm::Backward),
            "ortho" => Some(FftNorm::Ortho),
            "forward" => Some(FftNorm::Forward),
            _ => None,
        }
    }

    /// numpy's name.
    pub fn name(self) -> &'static str {
        match self {
            FftNorm::Backward => "backward",
            FftNorm::Ortho => "ortho",
            FftNorm::Forward => "forward",
        }
    }

    /// The factor of a transform of length `n` in direction `inverse`.
    fn scale(self, n: usize, inverse: bool) -> f64 {
        let n = n.max(1) as f64;
        match (self, inverse) {
            (FftNorm::Ortho, _) => 1.0 / n.sqrt(),
            (FftNorm::Backward, true) | (FftNorm::Forward, false) => 1.0 / n,
            _ => 1.0,
        }
    }
}

/// One transform along one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FftStep {
    /// The axis of the block.
    pub axis: usize,
    /// What it computes.
    pub kind: FftStepKind,
    /// The transform length (numpy's `n`).
    pub n: usize,
}

/// A block of values in C order.
#[derive(Debug)]
pub struct Block {
    /// The values.
    pub values: Buffer,
    /// The shape.
    pub shape: Vec<usize>,
}

/// Applies `steps` in order to `block` with normalisation `norm`. The block's dtype must be
/// what the first step reads: a real float for [`FftStepKind::RealForward`], complex
/// otherwise; every step after the first reads complex values.
pub fn transform(mut block: Block, steps: &[FftStep], norm: FftNorm) -> Result<Block> {
    for step in steps {
        block = transform_axis(block, *step, norm)?;
    }
    Ok(block)
}

fn transform_axis(block: Block, step: FftStep, norm: FftNorm) -> Result<Block> {
    let Block { values, shape } = block;
    if step.axis >= shape.len() {
        return Err(Error::internal(format!(
            "FFT axis {} of a block of rank {}",
            step.axis,
            shape.len()
        )));
    }
    if step.n == 0 {
        return Err(Error::internal("FFT of length 0"));
    }
    let lanes = Lanes::new(&shape, step.axis, step.kind.out_len(step.n));
    let scale = norm.scale(step.n, step.kind.is_inverse());
    let out = match values.dtype() {
        DType::F32 | DType::C64 => step_typed::<f32>(&values, &lanes, step, scale as f32)?,
        DType::F64 | DType::C128 => step_typed::<f64>(&values, &lanes, step, scale)?,
        d => {
            return Err(Error::internal(format!(
                "FFT step {:?} cannot read {d} values",
                step.kind
            )))
        }
    };
    let mut shape = shape;
    shape[step.axis] = lanes.out_len;
    Ok(Block { values: out, shape })
}

/// One step on values of precision `T`.
fn step_typed<T: Precision>(
    values: &Buffer,
    lanes: &Lanes,
    step: FftStep,
    scale: T,
) -> Result<Buffer> {
    let complex_in = values.dtype() == T::COMPLEX;
    let wrong = || {
        Error::internal(format!(
            "FFT step {:?} cannot read {} values",
            step.kind,
            values.dtype()
        ))
    };
    let n = step.n;
    match step.kind {
        FftStepKind::RealForward => {
            if complex_in {
                return Err(wrong());
            }
            let mut out = Buffer::for_overwrite(T::COMPLEX, lanes.out_elements());
            let input = T::real(values)?;
            r2c(input, lanes, n, scale, T::complex_mut(&mut out)?);
            Ok(out)
        }
        FftStepKind::RealInverse => {
            if !complex_in {
                return Err(wrong());
            }
            let mut out = Buffer::for_overwrite(T::REAL, lanes.out_elements());
            c2r(T::complex(values)?, lanes, n, scale, T::real_mut(&mut out)?);
            Ok(out)
        }
        FftStepKind::Forward | FftStepKind::Inverse => {
            if !complex_in {
                return Err(wrong());
            }
            let mut out = Buffer::for_overwrite(T::COMPLEX, lanes.out_elements());
            for_each_group(
                T::complex(values)?,
                lanes,
                n,
                step.kind.is_inverse(),
                |v| v,
                |v| v * scale,
                T::complex_mut(&mut out)?,
            );
            Ok(out)
        }
    }
}

/// Precision-specific glue.
trait Precision: FftNum + Default + crate::array::buffer::Element + rustfft::num_traits::Float {
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
struct PlanCache<T: FftNum> {
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
fn plan<T: Precision>(n: usize, inverse: bool) -> Arc<dyn Fft<T>> {
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

/// Where a real forward transform reads its lanes: lane `i` (of `inner`) of outer index `o`
/// starts at `origin + o * outer + (i / row) * row_stride + i % row` and its values lie
/// `along` apart. A C-order block is one row of `inner` lanes; a box inside a larger buffer
/// (a band of a material held in memory) has rows of its last axis, `row_stride` apart.
#[derive(Debug, Clone, Copy)]
struct InputLanes {
    origin: usize,
    outer: usize,
    along: usize,
    row: usize,
    row_stride: usize,
}

impl InputLanes {
    fn contiguous(lanes: &Lanes) -> InputLanes {
        InputLanes {
            origin: 0,
            outer: lanes.len * lanes.inner,
            along: lanes.inner,
            row: lanes.inner.max(1),
            row_stride: 0,
        }
    }

    /// The offset of lane `i`'s first value.
    fn base(&self, o: usize, i: usize) -> usize {
        self.origin + o * self.outer + (i / self.row) * self.row_stride + i % self.row
    }
}

/// The real forward transform `step` (normalised by `norm`) of the box of `shape` whose
/// element at index `x` is `values[origin + Σ x[d] * strides[d]]`: a box inside a larger
/// buffer, read where it lies rather than copied out first. `None` where the kernel cannot
/// read the box so (then copy it out and call [`transform`]): another kind of step, more than
/// one axis before the transformed one or more than two after it, a last axis that is not
/// contiguous, rows of the last axis apart in the buffer that do not hold whole groups of
/// lanes, lengths computed directly across lanes, or a box reaching past the buffer.
pub fn rfft_of_box(
    values: &Buffer,
    origin: usize,
    strides: &[usize],
    shape: &[usize],
    step: FftStep,
    norm: FftNorm,
) -> Result<Option<Block>> {
    let rank = shape.len();
    let axis = step.axis;
    let after = rank.saturating_sub(axis + 1);
    if step.kind != FftStepKind::RealForward
        || strides.len() != rank
        || axis >= rank
        || axis > 1
        || !(1..=2).contains(&after)
        || strides[rank - 1] != 1
        || step.n == 0
        || shape.contains(&0)
    {
        return Ok(None);
    }
    let last_offset: Option<usize> = shape.iter().zip(strides).try_fold(origin, |acc, (&n, &s)| {
        acc.checked_add((n - 1).checked_mul(s)?)
    });
    if last_offset.is_none_or(|end| end >= values.len()) {
        return Ok(None);
    }
    let lanes = Lanes::new(shape, axis, step.kind.out_len(step.n));
    // Rows that follow one another are one row of every lane.
    let rows = after == 2 && strides[rank - 2] != shape[rank - 1];
    let row = if rows { shape[rank - 1] } else { lanes.inner };
    if (rows && !row.is_multiple_of(GROUP)) || rdft::split_for(step.n, lanes.inner).is_some() {
        return Ok(None);
    }
    let addr = InputLanes {
        origin,
        outer: if axis == 1 { strides[0] } else { 0 },
        along: strides[axis],
        row,
        row_stride: if rows { strides[rank - 2] } else { 0 },
    };
    let scale = norm.scale(step.n, false);
    let out = match values.dtype() {
        DType::F32 => r2c_of_box::<f32>(values, &lanes, addr, step.n, scale as f32)?,
        DType::F64 => r2c_of_box::<f64>(values, &lanes, addr, step.n, scale)?,
        _ => return Ok(None),
    };
    let mut shape = shape.to_vec();
    shape[axis] = lanes.out_len;
    Ok(Some(Block { values: out, shape }))
}

fn r2c_of_box<T: Precision>(
    values: &Buffer,
    lanes: &Lanes,
    addr: InputLanes,
    n: usize,
    scale: T,
) -> Result<Buffer> {
    let mut out = Buffer::for_overwrite(T::COMPLEX, lanes.out_elements());
    r2c_packed(
        T::real(values)?,
        lanes,
        addr,
        n,
        scale,
        T::complex_mut(&mut out)?,
    );
    Ok(out)
}

/// The lanes of a block along one axis: `outer` × `inner` lanes of `len` values, `inner`
/// apart, and the output's lane length.
#[derive(Debug, Clone, Copy)]
struct Lanes {
    outer: usize,
    len: usize,
    inner: usize,
    out_len: usize,
}

/// Lanes transformed together: a group gathers up to this many neighbouring lanes.
const GROUP: usize = 16;

/// A real forward transform takes up to this many groups side by side per task...
const WIDE: usize = 4;
/// ... while their work buffer stays within this many bytes.
const WORK_BYTES: usize = 256 * 1024;

impl Lanes {
    fn new(shape: &[usize], axis: usize, out_len: usize) -> Lanes {
        Lanes {
            outer: shape[..axis].iter().product(),
            len: shape[axis],
            inner: shape[axis + 1..].iter().product(),
            out_len,
        }
    }

    fn groups_per_outer(&self) -> usize {
        self.inner.div_ceil(GROUP)
    }

    fn groups(&self) -> usize {
        self.outer * self.groups_per_outer()
    }

    /// (outer index, first inner index, lane count) of group `g`.
    fn group(&self, g: usize) -> (usize, usize, usize) {
        let per = self.groups_per_outer();
        let o = g / per;
        let i0 = (g % per) * GROUP;
        (o, i0, GROUP.min(self.inner - i0))
    }

    fn out_elements(&self) -> usize {
        self.outer * self.out_len * self.inner
    }
}

/// A pointer to output values that groups write in parallel. Each output element belongs to
/// exactly one lane and each lane to exactly one group, so the writes never overlap.
#[derive(Clone, Copy)]
struct SharedOut<T>(*mut T);
// SAFETY: groups write disjoint elements (see above) and the vector outlives the parallel loop.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T: Copy> SharedOut<T> {
    /// Writes `values` from `index` on (one vector copy rather than element stores).
    ///
    /// # Safety
    /// `index..index + values.len()` is in bounds and no other thread writes it.
    unsafe fn write_row(self, index: usize, values: &[T]) {
        match <&[T; GROUP]>::try_from(values) {
            // A whole group: a fixed-size copy, inlined as vector moves.
            Ok(whole) => self.0.add(index).cast::<[T; GROUP]>().write(*whole),
            Err(_) => {
                std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(index), values.len())
            }
        }
    }
}

/// Transforms every lane, groups of lanes in parallel: each group's lanes are gathered
/// through `load` (zero-padded to `n`), transformed, and scattered to `out` through `store`.
fn for_each_group<T, I, O>(
    input: &[I],
    lanes: &Lanes,
    n: usize,
    inverse: bool,
    load: impl Fn(I) -> Complex<T> + Sync,
    store: impl Fn(Complex<T>) -> O + Sync,
    out: &mut [O],
) where
    T: Precision,
    I: Copy + Default + Sync,
    O: Copy + Default + Send + Sync,
{
    debug_assert_eq!(out.len(), lanes.out_elements());
    let fft = plan::<T>(n, inverse);
    let shared = SharedOut(out.as_mut_ptr());
    let used = lanes.len.min(n);
    let out_len = lanes.out_len;
    let inner = lanes.inner;
    (0..lanes.groups()).into_par_iter().for_each_init(
        || {
            (
                // Only as many lanes as a group holds: a long transform of few lanes (a 1-d
                // FFT) must not allocate GROUP lanes' worth.
                vec![Complex::<T>::default(); GROUP.min(inner) * n],
                vec![Complex::<T>::default(); fft.get_inplace_scratch_len()],
            )
        },
        |(work, scratch), g| {
            let (o, i0, count) = lanes.group(g);
            let work = &mut work[..count * n];
            // Gather: GROUP x GROUP tiles, read along rows and written along lanes, so both
            // sides stay in cache lines.
            let mut tile = [[I::default(); GROUP]; GROUP];
            for kb in (0..used).step_by(GROUP) {
                let kn = GROUP.min(used - kb);
                for (kk, t) in tile.iter_mut().enumerate().take(kn) {
                    let row = (o * lanes.len + kb + kk) * inner + i0;
                    read_row(t, &input[row..row + count]);
                }
                for (j, lane) in work.chunks_exact_mut(n).enumerate() {
                    for (kk, dst) in lane[kb..kb + kn].iter_mut().enumerate() {
                        *dst = load(tile[kk][j]);
                    }
                }
            }
            for lane in work.chunks_exact_mut(n) {
                lane[used..].fill(Complex::default());
            }
            fft.process_with_scratch(work, scratch);
            // Scatter: the same tiles the other way round.
            let mut tile = [[O::default(); GROUP]; GROUP];
            for kb in (0..out_len).step_by(GROUP) {
                let kn = GROUP.min(out_len - kb);
                for (j, lane) in work.chunks_exact(n).enumerate() {
                    for (kk, v) in lane[kb..kb + kn].iter().enumerate() {
                        tile[kk][j] = store(*v);
                    }
                }
                for (kk, t) in tile.iter().enumerate().take(kn) {
                    let row = (o * out_len + kb + kk) * inner + i0;
                    // SAFETY: `row..row + count` are lanes (o, i0..i0 + count) at position
                    // kb + kk: in bounds, and only this group writes those lanes.
                    unsafe { shared.write_row(row, &t[..count]) };
                }
            }
        },
    );
}

/// Copies `src` (at most GROUP values) into the start of `tile`; whole groups copy as one
/// fixed-size block (vector moves, no call).
#[inline(always)]
fn read_row<I: Copy>(tile: &mut [I; GROUP], src: &[I]) {
    match <&[I; GROUP]>::try_from(src) {
        Ok(whole) => *tile = *whole,
        Err(_) => {
            for (t, v) in tile.iter_mut().zip(src) {
                *t = *v;
            }
        }
    }
}

/// Real forward transform of every lane, two real lanes packed into one complex transform
/// (`z = x + i y`; `X[k] = (Z[k] + conj Z[n-k]) / 2`, `Y[k] = (Z[k] - conj Z[n-k]) / 2i`):
/// half the work of transforming each real lane as a complex one.
fn r2c<T: Precision>(input: &[T], lanes: &Lanes, n: usize, scale: T, out: &mut [Complex<T>]) {
    debug_assert_eq!(out.len(), lanes.out_elements());
    if let Some(split) = rdft::split_for(n, lanes.inner) {
        return rdft::r2c_lanes(input, lanes, n, split, scale, out);
    }
    r2c_packed(input, lanes, InputLanes::contiguous(lanes), n, scale, out)
}

/// [`r2c`] by packed complex transforms (rustfft), reading lanes where `addr` says.
fn r2c_packed<T: Precision>(
    input: &[T],
    lanes: &Lanes,
    addr: InputLanes,
    n: usize,
    scale: T,
    out: &mut [Complex<T>],
) {
    let fft = plan::<T>(n, false);
    let shared = SharedOut(out.as_mut_ptr());
    let used = lanes.len.min(n);
    let out_len = lanes.out_len;
    let inner = lanes.inner;
    let half = T::from_f64(0.5).unwrap_or_else(T::zero) * scale;
    // Lanes per task: up to WIDE groups side by side while their work stays cache-sized, so
    // each strided row is read (and written) in longer runs, fewer pages apart per value.
    let group_work = n * (GROUP / 2) * std::mem::size_of::<Complex<T>>();
    let wide = (WORK_BYTES / group_work.max(1)).clamp(1, WIDE);
    let span = (wide * GROUP).min(inner.max(1));
    let per_outer = inner.div_ceil(span);
    (0..lanes.outer * per_outer).into_par_iter().for_each_init(
        || {
            (
                vec![Complex::<T>::default(); span.div_ceil(2) * n],
                vec![Complex::<T>::default(); fft.get_inplace_scratch_len()],
            )
        },
        |(work, scratch), g| {
            let o = g / per_outer;
            let i0 = (g % per_outer) * span;
            let count = span.min(inner - i0);
            // Groups of GROUP lanes; lane pairs never straddle two groups.
            let groups = count.div_ceil(GROUP);
            let in_group = |b: usize| GROUP.min(count - b * GROUP);
            let pairs = (groups - 1) * (GROUP / 2) + in_group(groups - 1).div_ceil(2);
            let work = &mut work[..pairs * n];
            let group = |b: usize| pack::GroupLanes {
                base: addr.base(o, i0 + b * GROUP),
                inner: addr.along,
                used,
                lanes: in_group(b),
                n,
            };
            // Packed lanes of group b.
            let span_of = |b: usize| {
                let first = b * (GROUP / 2) * n;
                first..first + in_group(b).div_ceil(2) * n
            };
            for b in 0..groups {
                T::gather_pairs(input, group(b), &mut work[span_of(b)]);
            }
            for lane in work.chunks_exact_mut(n) {
                lane[used..].fill(Complex::default());
            }
            fft.process_with_scratch(work, scratch);
            let mut tile = [[Complex::<T>::default(); GROUP]; GROUP];
            for kb in (0..out_len).step_by(GROUP) {
                let kn = GROUP.min(out_len - kb);
                for b in 0..groups {
                    let lanes_b = in_group(b);
                    T::unpack_pairs(&work[span_of(b)], group(b), (kb, kn), half, &mut tile);
                    for (kk, t) in tile.iter().enumerate().take(kn) {
                        let row = (o * out_len + kb + kk) * inner + i0 + b * GROUP;
                        // SAFETY: `row..row + lanes_b` are lanes (o, i0 + b * GROUP ..) at
                        // position kb + kk: in bounds, and only this task writes those lanes.
                        unsafe { shared.write_row(row, &t[..lanes_b]) };
                    }
                }
            }
        },
    );
}

/// Hermitian inverse: the lane's `n / 2 + 1` values are mirrored into a full spectrum, whose
/// inverse transform is real; the imaginary parts of the DC and Nyquist terms drop out, as in
/// numpy.
fn c2r<T: Precision>(input: &[Complex<T>], lanes: &Lanes, n: usize, scale: T, out: &mut [T]) {
    if let Some(split) = rdft::split_for(n, lanes.inner) {
        return irdft::c2r_lanes(input, lanes, n, split, scale, out);
    }
    let half = n / 2 + 1;
    let used = lanes.len.min(half);
    // Gather only the first `half` values, then mirror: do it as a pre-pass into a full
    // Hermitian block so the shared group loop applies.
    let full_lanes = Lanes {
        outer: lanes.outer,
        len: n,
        inner: lanes.inner,
        out_len: n,
    };
    let mut full = vec![Complex::<T>::default(); lanes.outer * n * lanes.inner];
    full.par_chunks_mut(n * lanes.inner)
        .enumerate()
        .for_each(|(o, dst)| {
            for k in 0..used {
                let src = &input[(o * lanes.len + k) * lanes.inner..][..lanes.inner];
                dst[k * lanes.inner..(k + 1) * lanes.inner].copy_from_slice(src);
                let mirror = n - k;
                if k > 0 && mirror > k && mirror < n {
                    for (d, s) in dst[mirror * lanes.inner..(mirror + 1) * lanes.inner]
                        .iter_mut()
                        .zip(src)
                    {
                        *d = s.conj();
                    }
                }
            }
        });
    for_each_group(&full, &full_lanes, n, true, |v| v, |v| v.re * scale, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook DFT, in f64.
    fn dft(x: &[Complex<f64>], inverse: bool) -> Vec<Complex<f64>> {
        let n = x.len();
        let sign = if inverse { 1.0 } else { -1.0 };
        (0..n)
            .map(|k| {
                x.iter()
                    .enumerate()
                    .map(|(j, v)| {
                        let a = sign * 2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                        v * Complex::new(a.cos(), a.sin())
                    })
                    .sum()
            })
            .collect()
    }

    fn block_c128(values: &[Complex<f64>], shape: &[usize]) -> Block {
        let raw: Vec<[f64; 2]> = values.iter().map(|c| [c.re, c.im]).collect();
        Block {
            values: Buffer::from_bytes(DType::C128, bytemuck::cast_slice(&raw).to_vec()).unwrap(),
            shape: shape.to_vec(),
        }
    }

    fn values_c128(b: &Block) -> Vec<Complex<f64>> {
        b.values
            .as_slice::<[f64; 2]>()
            .unwrap()
            .iter()
            .map(|v| Complex::new(v[0], v[1]))
            .collect()
    }

    fn close(a: &[Complex<f64>], b: &[Complex<f64>]) -> bool {
        let scale = b.iter().map(|v| v.norm()).fold(1.0, f64::max);
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).norm() <= 1e-9 * scale)
    }

    proptest! {
        /// An FFT along the middle axis of a 3-d block, with padding or cropping and every
        /// norm, equals the DFT of each lane.
        #[test]
        fn c2c_along_middle_axis_is_the_dft(
            outer in 1usize..3, len in 1usize..12, inner in 1usize..20, n in 1usize..14,
            inverse: bool, norm in 0usize..3, seed: u64,
        ) {
            let norm = [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward][norm];
            let total = outer * len * inner;
            let vals: Vec<Complex<f64>> = (0..total)
                .map(|i| {
                    let h = (i as u64 + 1).wrapping_mul(seed | 1).wrapping_mul(0x9E3779B97F4A7C15);
                    Complex::new((h >> 40) as f64 / 1e6, (h & 0xffff) as f64 / 1e4)
                })
                .collect();
            let kind = if inverse { FftStepKind::Inverse } else { FftStepKind::Forward };
            let out = transform(
                block_c128(&vals, &[outer, len, inner]),
                &[FftStep { axis: 1, kind, n }],
                norm,
            )
            .unwrap();
            prop_assert_eq!(&out.shape, &vec![outer, n, inner]);
            let got = values_c128(&out);
            let scale = norm.scale(n, inverse);
            for o in 0..outer {
                for i in 0..inner {
                    let mut lane: Vec<Complex<f64>> =
                        (0..len.min(n)).map(|k| vals[(o * len + k) * inner + i]).collect();
                    lane.resize(n, Complex::default());
                    let want: Vec<Complex<f64>> =
                        dft(&lane, inverse).into_iter().map(|v| v * scale).collect();
                    let have: Vec<Complex<f64>> =
                        (0..n).map(|k| got[(o * n + k) * inner + i]).collect();
                    prop_assert!(close(&have, &want), "lane ({o}, {i}): {have:?} vs {want:?}");
                }
            }
        }

        /// rfft along the leading axis of a (len, inner) block equals the DFT of each lane, for
        /// lane counts that fill groups, pairs and wide tasks or not.
        #[test]
        fn r2c_along_a_strided_axis_is_the_dft(
            len in 1usize..20, inner in 1usize..150, n in 1usize..24, seed: u64,
        ) {
            let vals: Vec<f64> = (0..len * inner)
                .map(|i| ((i as u64 + 3).wrapping_mul(seed | 1) >> 50) as f64 - 4000.0)
                .collect();
            let block = Block {
                values: Buffer::from_bytes(DType::F64, bytemuck::cast_slice(&vals).to_vec())
                    .unwrap(),
                shape: vec![len, inner],
            };
            let out = transform(
                block,
                &[FftStep { axis: 0, kind: FftStepKind::RealForward, n }],
                FftNorm::Backward,
            )
            .unwrap();
            let half = n / 2 + 1;
            prop_assert_eq!(&out.shape, &vec![half, inner]);
            let got = values_c128(&out);
            for i in 0..inner {
                let mut lane: Vec<Complex<f64>> =
                    (0..len.min(n)).map(|k| Complex::new(vals[k * inner + i], 0.0)).collect();
                lane.resize(n, Complex::default());
                let want = dft(&lane, false);
                let have: Vec<Complex<f64>> = (0..half).map(|k| got[k * inner + i]).collect();
                prop_assert!(close(&have, &want[..half]), "lane {i}: {have:?} vs {want:?}");
            }
        }

        /// irfft(rfft(x)) gives x back for every length, odd ones included.
        #[test]
        fn rfft_then_irfft_round_trips(n in 1usize..40, lanes in 1usize..5) {
            let vals: Vec<f64> = (0..n * lanes).map(|i| ((i * 7919) % 101) as f64 - 50.0).collect();
            let block = Block {
                values: Buffer::from_bytes(DType::F64, bytemuck::cast_slice(&vals).to_vec())
                    .unwrap(),
                shape: vec![lanes, n],
            };
            let spec = transform(
                block,
                &[FftStep { axis: 1, kind: FftStepKind::RealForward, n }],
                FftNorm::Backward,
            )
            .unwrap();
            prop_assert_eq!(&spec.shape, &vec![lanes, n / 2 + 1]);
            let back = transform(
                spec,
                &[FftStep { axis: 1, kind: FftStepKind::RealInverse, n }],
                FftNorm::Backward,
            )
            .unwrap();
            prop_assert_eq!(&back.shape, &vec![lanes, n]);
            let got = back.values.as_slice::<f64>().unwrap();
            for (a, b) in got.iter().zip(&vals) {
                prop_assert!((a - b).abs() < 1e-9 * 50.0, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn rfft_of_float32_is_complex64_with_n_over_2_plus_1_values() {
        let vals: Vec<f32> = (0..721).map(|i| (i as f32 * 0.1).sin()).collect();
        let block = Block {
            values: Buffer::from_bytes(DType::F32, bytemuck::cast_slice(&vals).to_vec()).unwrap(),
            shape: vec![721],
        };
        let out = transform(
            block,
            &[FftStep {
                axis: 0,
                kind: FftStepKind::RealForward,
                n: 721,
            }],
            FftNorm::Backward,
        )
        .unwrap();
        assert_eq!(out.values.dtype(), DType::C64);
        assert_eq!(out.shape, vec![361]);
        let dc = out.values.as_slice::<[f32; 2]>().unwrap()[0];
        let sum: f32 = vals.iter().sum();
        assert!((dc[0] - sum).abs() < 1e-3 && dc[1].abs() < 1e-3);
    }

    /// The box of `shape` at `start` of a C-order array of `outer_shape`, copied out.
    fn copy_box(
        values: &[f32],
        outer_shape: &[usize],
        start: &[usize],
        shape: &[usize],
    ) -> Vec<f32> {
        let strides = c_strides(outer_shape);
        let mut out = Vec::new();
        let total: usize = shape.iter().product();
        for flat in 0..total {
            let mut rest = flat;
            let mut at = 0;
            for d in (0..shape.len()).rev() {
                at += (start[d] + rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            out.push(values[at]);
        }
        out
    }

    fn c_strides(shape: &[usize]) -> Vec<usize> {
        let mut strides = vec![1; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    }

    #[test]
    fn rfft_of_a_box_read_in_place_equals_the_box_copied_out() {
        // (array shape, box start, box shape, axis, n): rows of whole groups of lanes after
        // the axis, or one contiguous inner axis, with or without an axis before it.
        type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], usize, usize);
        let cases: [Case; 5] = [
            (&[12, 7, 40], &[0, 2, 8], &[12, 3, 32], 0, 12),
            (&[12, 7, 20], &[0, 2, 0], &[12, 3, 20], 0, 12),
            (&[9, 5, 64], &[0, 1, 16], &[9, 4, 16], 0, 16),
            (&[4, 20, 48], &[1, 0, 0], &[3, 20, 48], 1, 25),
            (&[10, 33], &[0, 5], &[10, 20], 0, 8),
        ];
        for (outer_shape, start, shape, axis, n) in cases {
            let total: usize = outer_shape.iter().product();
            let vals: Vec<f32> = (0..total).map(|i| ((i * 37 % 101) as f32).sin()).collect();
            let buf = Buffer::from_bytes(DType::F32, bytemuck::cast_slice(&vals).to_vec()).unwrap();
            let strides = c_strides(outer_shape);
            let origin: usize = start.iter().zip(&strides).map(|(a, s)| a * s).sum();
            let step = FftStep {
                axis,
                kind: FftStepKind::RealForward,
                n,
            };
            let got = rfft_of_box(&buf, origin, &strides, shape, step, FftNorm::Ortho)
                .unwrap()
                .expect("a box the kernel reads in place");
            let copied = copy_box(&vals, outer_shape, start, shape);
            let block = Block {
                values: Buffer::from_bytes(DType::F32, bytemuck::cast_slice(&copied).to_vec())
                    .unwrap(),
                shape: shape.to_vec(),
            };
            let want = transform(block, &[step], FftNorm::Ortho).unwrap();
            assert_eq!(got.shape, want.shape);
            assert_eq!(
                got.values.bytes(),
                want.values.bytes(),
                "{outer_shape:?} {start:?}"
            );
        }
    }

    #[test]
    fn boxes_the_kernel_cannot_read_in_place_are_left_to_the_copy() {
        let vals = vec![0f32; 4 * 8 * 40];
        let buf = Buffer::from_bytes(DType::F32, bytemuck::cast_slice(&vals).to_vec()).unwrap();
        let strides = [320, 40, 1];
        let rfft = |axis| FftStep {
            axis,
            kind: FftStepKind::RealForward,
            n: 4,
        };
        let norm = FftNorm::Backward;
        // Rows of 20 lanes split groups of 16; a box past the buffer; a complex step.
        assert!(rfft_of_box(&buf, 0, &strides, &[4, 8, 20], rfft(0), norm)
            .unwrap()
            .is_none());
        assert!(rfft_of_box(&buf, 30, &strides, &[4, 8, 16], rfft(0), norm)
            .unwrap()
            .is_none());
        let fft = FftStep {
            kind: FftStepKind::Forward,
            ..rfft(0)
        };
        assert!(rfft_of_box(&buf, 0, &strides, &[4, 8, 16], fft, norm)
            .unwrap()
            .is_none());
        // The last axis transformed, or not contiguous.
        assert!(
            rfft_of_box(&buf, 0, &[320, 40, 1], &[4, 8, 16], rfft(2), norm)
                .unwrap()
                .is_none()
        );
        assert!(
            rfft_of_box(&buf, 0, &[320, 1, 8], &[4, 8, 16], rfft(0), norm)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_step_that_cannot_read_the_dtype_is_an_error() {
        let block = Block {
            values: Buffer::zeros(DType::I32, 4),
            shape: vec![4],
        };
        let err = transform(
            block,
            &[FftStep {
                axis: 0,
                kind: FftStepKind::Forward,
                n: 4,
            }],
            FftNorm::Backward,
        )
        .unwrap_err();
        assert!(err.to_string().contains("int32"), "{err}");
    }
}
