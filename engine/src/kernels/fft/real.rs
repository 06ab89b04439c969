//! Real transforms through rustfft's complex ones: the forward transform of two real lanes
//! packed into one complex lane (of a block, or of a box read where it lies in a larger
//! buffer), and the inverse of a Hermitian spectrum mirrored to its full length. Lengths with
//! an awkward prime factor go to the direct transforms of [`rdft`](super::rdft) and
//! [`irdft`](super::irdft).

use num_complex::Complex;
use rayon::prelude::*;

use super::apart;
use super::block::Block;
use super::groups::for_each_group;
use super::irdft;
use super::lanes::{Lanes, SharedOut, GROUP, WIDE, WORK_BYTES};
use super::pack;
use super::precision::{plan, Precision};
use super::rdft;
use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::plan::fft_params::{FftNorm, FftStep, FftStepKind};

/// Where a real forward transform reads its lanes: lane `i` (of `inner`) of outer index `o`
/// starts at `origin + o * outer + (i / row) * row_stride + i % row` and its values lie
/// `along` apart. A C-order block is one row of `inner` lanes; a box inside a larger buffer
/// (a band of a material held in memory) has rows of its last axis, `row_stride` apart.
#[derive(Debug, Clone, Copy)]
pub(super) struct InputLanes {
    pub(super) origin: usize,
    pub(super) outer: usize,
    pub(super) along: usize,
    pub(super) row: usize,
    pub(super) row_stride: usize,
}

impl InputLanes {
    pub(super) fn contiguous(lanes: &Lanes) -> InputLanes {
        InputLanes {
            origin: 0,
            outer: lanes.len * lanes.inner,
            along: lanes.inner,
            row: lanes.inner.max(1),
            row_stride: 0,
        }
    }

    /// The offset of lane `i`'s first value.
    pub(super) fn base(&self, o: usize, i: usize) -> usize {
        self.origin + o * self.outer + (i / self.row) * self.row_stride + i % self.row
    }
}

/// The real forward transform `step` (normalised by `norm`) of the box of `shape` whose
/// element at index `x` is `values[origin + Σ x[d] * strides[d]]`: a box inside a larger
/// buffer, read where it lies rather than copied out first. `None` where the kernel cannot
/// read the box so (then copy it out and call [`transform`](super::transform)): another kind of step, more than
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

/// Real forward transform of every lane, two real lanes packed into one complex transform
/// (`z = x + i y`; `X[k] = (Z[k] + conj Z[n-k]) / 2`, `Y[k] = (Z[k] - conj Z[n-k]) / 2i`):
/// half the work of transforming each real lane as a complex one. Pairs that must not mix
/// (see [`apart`]) are transformed lane by lane.
pub(super) fn r2c<T: Precision>(
    input: &[T],
    lanes: &Lanes,
    n: usize,
    scale: T,
    out: &mut [Complex<T>],
) {
    debug_assert_eq!(out.len(), lanes.out_elements());
    if let Some(split) = rdft::split_for(n, lanes.inner) {
        return rdft::r2c_lanes(input, lanes, n, split, scale, out);
    }
    r2c_packed(input, lanes, InputLanes::contiguous(lanes), n, scale, out)
}

/// [`r2c`] by packed complex transforms (rustfft), reading lanes where `addr` says.
pub(super) fn r2c_packed<T: Precision>(
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
            // Pairs whose lanes must not mix (a NaN or infinity, magnitudes far apart) are
            // transformed again lane by lane, over their packed results.
            for b in 0..groups {
                let g = group(b);
                for j in apart::lanes_apart(input, g) {
                    let to = apart::LaneOut {
                        o,
                        lane: i0 + b * GROUP + j,
                        inner,
                        out_len,
                    };
                    // SAFETY: lane i0 + b * GROUP + j of outer index o is this task's, in
                    // bounds as the packed writes above.
                    unsafe {
                        apart::transform_alone(
                            input,
                            g,
                            j,
                            &*fft,
                            (&mut *work, &mut *scratch),
                            scale,
                            shared,
                            to,
                        )
                    };
                }
            }
        },
    );
}

/// Hermitian inverse: the lane's `n / 2 + 1` values are mirrored into a full spectrum, whose
/// inverse transform is real; the imaginary parts of the DC and Nyquist terms drop out, as in
/// numpy.
pub(super) fn c2r<T: Precision>(
    input: &[Complex<T>],
    lanes: &Lanes,
    n: usize,
    scale: T,
    out: &mut [T],
) {
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
