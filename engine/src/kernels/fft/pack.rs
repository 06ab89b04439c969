//! Packing two real lanes into one complex lane for a real forward transform, and unpacking
//! the two spectra from the transform of the packed lane.
//!
//! Lanes `2p` and `2p + 1` of a group become the real and imaginary parts of complex lane `p`
//! (`z = x + i y`). After the transform, `X[k] = (Z[k] + conj Z[n - k]) / 2` and
//! `Y[k] = (Z[k] - conj Z[n - k]) / 2i`. Both directions transpose between rows of the block
//! (one value per lane) and lanes (one value per row). In single precision, whole groups go
//! through AVX2: 4 × 4 transposes of value pairs on the way in; on the way out, four
//! frequencies of one lane pair at a time, the mirrored values reversed in registers. The
//! vector path does the same IEEE operations as the scalar one, so results are bit for bit
//! the same (up to the sign of a NaN).

use num_complex::Complex;
use rustfft::num_traits::Float;

use super::lanes::GROUP;

/// A block of output values: `GROUP` frequencies (rows) × `GROUP` lanes.
pub(super) type Tile<T> = [[Complex<T>; GROUP]; GROUP];

/// One group of real lanes: lane `j` (of `lanes`, at most [`GROUP`]) holds the values
/// `input[base + k * inner + j]` for `k < used`, transformed with length `n`.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupLanes {
    pub(super) base: usize,
    pub(super) inner: usize,
    pub(super) used: usize,
    pub(super) lanes: usize,
    pub(super) n: usize,
}

/// Fills the packed lanes of group `g`: packed lane `p` (`g.n` values, in `work`) gets lanes
/// `2p` and `2p + 1` as its real and imaginary parts (an odd last lane pairs with zeros).
/// Values from `g.used` on are left as they were.
pub(super) fn gather_pairs<T: Float>(input: &[T], g: GroupLanes, work: &mut [Complex<T>]) {
    let GroupLanes {
        base,
        inner,
        used,
        lanes,
        n,
    } = g;
    let mut tile = [[T::zero(); GROUP]; GROUP];
    let pairs = lanes.div_ceil(2);
    for kb in (0..used).step_by(GROUP) {
        let kn = GROUP.min(used - kb);
        for (kk, t) in tile.iter_mut().enumerate().take(kn) {
            let row = base + (kb + kk) * inner;
            t[..lanes].copy_from_slice(&input[row..row + lanes]);
            if lanes < GROUP {
                t[lanes] = T::zero();
            }
        }
        for (p, lane) in work.chunks_exact_mut(n).take(pairs).enumerate() {
            for (kk, dst) in lane[kb..kb + kn].iter_mut().enumerate() {
                *dst = Complex::new(tile[kk][2 * p], tile[kk][2 * p + 1]);
            }
        }
    }
}

/// The two spectra at frequency `k` of the lane pair packed in `lane` (length `n`), each
/// scaled by `half` (half the normalisation).
#[inline(always)]
fn unpack_one<T: Float>(
    lane: &[Complex<T>],
    n: usize,
    k: usize,
    half: T,
) -> (Complex<T>, Complex<T>) {
    let z = lane[k];
    // Z[n - k], with Z[n] = Z[0].
    let w = lane[if k == 0 { 0 } else { n - k }].conj();
    let s = z + w;
    let d = z - w;
    // (z - w) / 2i = (d.im - i d.re) / 2.
    (
        Complex::new(s.re * half, s.im * half),
        Complex::new(d.im * half, (-d.re) * half),
    )
}

/// Unpacks frequencies `kb .. kb + kn` (`kn` at most [`GROUP`]) of the lane pairs of group
/// `g` into `tile`: row `kk` holds frequency `kb + kk` of every lane.
pub(super) fn unpack_pairs<T: Float>(
    work: &[Complex<T>],
    g: GroupLanes,
    kb: usize,
    kn: usize,
    half: T,
    tile: &mut Tile<T>,
) {
    let n = g.n;
    for (p, lane) in work.chunks_exact(n).take(g.lanes.div_ceil(2)).enumerate() {
        for (kk, t) in tile.iter_mut().enumerate().take(kn) {
            let (x, y) = unpack_one(lane, n, kb + kk, half);
            t[2 * p] = x;
            t[2 * p + 1] = y;
        }
    }
}

/// [`gather_pairs`] in single precision: whole groups through AVX2 where the CPU has it.
pub(super) fn gather_pairs_f32(input: &[f32], g: GroupLanes, work: &mut [Complex<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        let in_bounds = g.used == 0
            || g.base
                .checked_add((g.used - 1).saturating_mul(g.inner))
                .and_then(|last| last.checked_add(GROUP))
                .is_some_and(|end| end <= input.len());
        if g.lanes == GROUP
            && g.used <= g.n
            && work.len() >= (GROUP / 2) * g.n
            && in_bounds
            && std::is_x86_feature_detected!("avx2")
        {
            // SAFETY: AVX2 is present; rows `base + k * inner .. + GROUP` for k < used are in
            // `input` and lanes `p * n + k` (p < GROUP / 2, k < used <= n) are in `work`
            // (both checked above).
            unsafe { avx2::gather_group(input, g, work) };
            return;
        }
    }
    gather_pairs(input, g, work)
}

/// [`unpack_pairs`] in single precision: whole groups through AVX2 where the CPU has it.
pub(super) fn unpack_pairs_f32(
    work: &[Complex<f32>],
    g: GroupLanes,
    kb: usize,
    kn: usize,
    half: f32,
    tile: &mut Tile<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let n = g.n;
        if g.lanes == GROUP
            && kn <= GROUP
            && kb + kn <= n
            && work.len() >= (GROUP / 2) * n
            && std::is_x86_feature_detected!("avx2")
        {
            // SAFETY: AVX2 is present; frequencies kb .. kb + kn (and their mirrors) are within
            // each of the GROUP / 2 lanes of `work` (checked above).
            unsafe { avx2::unpack_group(work, n, kb, kn, half, tile) };
            return;
        }
    }
    unpack_pairs(work, g, kb, kn, half, tile)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use num_complex::Complex;

    use crate::kernels::fft::lanes::GROUP;
    use crate::kernels::fft::pack::{unpack_one, GroupLanes, Tile};

    /// [`super::gather_pairs`] of a whole group: per four rows, the group's eight value pairs
    /// of each row are transposed into four values of each packed lane.
    ///
    /// # Safety
    /// AVX2 must be present; rows `base + k * inner .. + GROUP` for `k < used` must lie in
    /// `input`, and `used <= n`, `work.len() >= GROUP / 2 * n`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn gather_group(input: &[f32], g: GroupLanes, work: &mut [Complex<f32>]) {
        let GroupLanes {
            base,
            inner,
            used,
            n,
            ..
        } = g;
        let src = input.as_ptr();
        let dst = work.as_mut_ptr().cast::<f64>();
        let mut k = 0;
        while k + 4 <= used {
            for h in 0..2 {
                // Eight floats of rows k .. k + 4: pairs 4h .. 4h + 4, one 64-bit pair each.
                let row = |i: usize| {
                    _mm256_castps_pd(_mm256_loadu_ps(src.add(base + (k + i) * inner + 8 * h)))
                };
                let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                let t0 = _mm256_unpacklo_pd(r0, r1);
                let t1 = _mm256_unpackhi_pd(r0, r1);
                let t2 = _mm256_unpacklo_pd(r2, r3);
                let t3 = _mm256_unpackhi_pd(r2, r3);
                let lanes = [
                    _mm256_permute2f128_pd(t0, t2, 0x20),
                    _mm256_permute2f128_pd(t1, t3, 0x20),
                    _mm256_permute2f128_pd(t0, t2, 0x31),
                    _mm256_permute2f128_pd(t1, t3, 0x31),
                ];
                for (j, v) in lanes.into_iter().enumerate() {
                    _mm256_storeu_pd(dst.add((4 * h + j) * n + k), v);
                }
            }
            k += 4;
        }
        for k in k..used {
            let row = base + k * inner;
            for p in 0..GROUP / 2 {
                *work.get_unchecked_mut(p * n + k) = Complex::new(
                    *input.get_unchecked(row + 2 * p),
                    *input.get_unchecked(row + 2 * p + 1),
                );
            }
        }
    }

    /// [`super::unpack_pairs`] of a whole group: four frequencies of one lane pair at a time,
    /// `Z[n - k]` for the four loaded at once and reversed in registers.
    ///
    /// # Safety
    /// AVX2 must be present; `kn <= GROUP`, `kb + kn <= n`, `work.len() >= GROUP / 2 * n`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn unpack_group(
        work: &[Complex<f32>],
        n: usize,
        kb: usize,
        kn: usize,
        half: f32,
        tile: &mut Tile<f32>,
    ) {
        let halves = _mm256_set1_ps(half);
        // Sign bits of the imaginary parts.
        let imag_sign = _mm256_castsi256_ps(_mm256_set_epi32(
            i32::MIN,
            0,
            i32::MIN,
            0,
            i32::MIN,
            0,
            i32::MIN,
            0,
        ));
        let out = tile.as_mut_ptr().cast::<f32>();
        for p in 0..GROUP / 2 {
            let lane = &work[p * n..(p + 1) * n];
            let at = lane.as_ptr().cast::<f32>();
            let mut kk = 0;
            while kk < kn {
                let k = kb + kk;
                if k >= 1 && kk + 4 <= kn && k + 3 <= n {
                    let z = _mm256_loadu_ps(at.add(2 * k));
                    // Z[n-k-3], Z[n-k-2], Z[n-k-1], Z[n-k] → reversed, conjugated.
                    let m = _mm256_loadu_ps(at.add(2 * (n - k - 3)));
                    let m = _mm256_permute2f128_ps(m, m, 0x01);
                    let m = _mm256_shuffle_ps(m, m, 0x4E);
                    let w = _mm256_xor_ps(m, imag_sign);
                    let s = _mm256_add_ps(z, w);
                    let d = _mm256_sub_ps(z, w);
                    let x = _mm256_mul_ps(s, halves);
                    // (d.im, -d.re) · half.
                    let swapped = _mm256_permute_ps(d, 0xB1);
                    let y = _mm256_mul_ps(_mm256_xor_ps(swapped, imag_sign), halves);
                    let (x, y) = (_mm256_castps_pd(x), _mm256_castps_pd(y));
                    // [X_k Y_k | X_k+2 Y_k+2] and [X_k+1 Y_k+1 | X_k+3 Y_k+3].
                    let even = _mm256_unpacklo_pd(x, y);
                    let odd = _mm256_unpackhi_pd(x, y);
                    let cell = |r: usize| out.add((r * GROUP + 2 * p) * 2).cast::<f64>();
                    _mm_storeu_pd(cell(kk), _mm256_castpd256_pd128(even));
                    _mm_storeu_pd(cell(kk + 1), _mm256_castpd256_pd128(odd));
                    _mm_storeu_pd(cell(kk + 2), _mm256_extractf128_pd(even, 1));
                    _mm_storeu_pd(cell(kk + 3), _mm256_extractf128_pd(odd, 1));
                    kk += 4;
                } else {
                    let (x, y) = unpack_one(lane, n, k, half);
                    tile[kk][2 * p] = x;
                    tile[kk][2 * p + 1] = y;
                    kk += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i as u64).wrapping_mul(2654435761).wrapping_add(seed) % 10007;
                match x % 97 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 1e-40,
                    _ => x as f32 * 0.37 - 1800.0,
                }
            })
            .collect()
    }

    proptest! {
        #[test]
        fn single_precision_packing_matches_the_scalar_path(
            n in 1usize..70,
            used_less in 0usize..4,
            extra in 0usize..40,
            some_lanes in 1usize..GROUP,
            whole_group in any::<bool>(),
            seed in 0u64..1000,
        ) {
            let lanes = if whole_group { GROUP } else { some_lanes };
            let used = n.saturating_sub(used_less).max(1).min(n);
            let inner = lanes + extra;
            let base = extra / 2;
            let input = values(base + used * inner + GROUP, seed);
            let pairs = GROUP / 2;
            let mut fast = vec![Complex::new(7.0f32, 7.0); pairs * n];
            let mut slow = fast.clone();
            let g = GroupLanes { base, inner, used, lanes, n };
            gather_pairs_f32(&input, g, &mut fast);
            gather_pairs(&input, g, &mut slow);
            // Bit for bit, except that a NaN is any NaN (its sign depends on operand order).
            let canon = |x: f32| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() };
            let bits = |v: &[Complex<f32>]| v.iter().map(|c| (canon(c.re), canon(c.im))).collect::<Vec<_>>();
            prop_assert_eq!(bits(&fast), bits(&slow));

            let work: Vec<Complex<f32>> = values(2 * pairs * n, seed + 1)
                .chunks_exact(2)
                .map(|c| Complex::new(c[0], c[1]))
                .collect();
            let out_len = n / 2 + 1;
            for kb in (0..out_len).step_by(GROUP) {
                let kn = GROUP.min(out_len - kb);
                let mut a = [[Complex::new(0.0f32, 0.0); GROUP]; GROUP];
                let mut b = a;
                unpack_pairs_f32(&work, g, kb, kn, 0.5, &mut a);
                unpack_pairs(&work, g, kb, kn, 0.5, &mut b);
                for kk in 0..kn {
                    prop_assert_eq!(bits(&a[kk][..lanes]), bits(&b[kk][..lanes]));
                }
            }
        }
    }
}
