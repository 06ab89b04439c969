//! Real inverse transforms (irfft) of the lengths [`rdft`](super::rdft) handles, computed
//! directly across contiguous lanes: the inverse of its decomposition.
//!
//! For `n = a × p` (`p` the awkward prime), `x[a j + r] = Σ_m e^{2πi jm/p} T_r[m]` with
//! `T_r[m] = Σ_q e^{2πi r (m + p q)/n} X[m + p q]`: each residue `r` is an inverse real DFT of
//! length `p` of a Hermitian sequence, computed directly from its first half (cosine and sine
//! sums shared by `x[j]` and `x[p - j]`), the lanes side by side as in the forward transform.
//! As in numpy, the imaginary parts of the DC and Nyquist terms are ignored.

use num_complex::Complex;
use rustfft::num_traits::Float;

use super::lanes::{Lanes, GROUP};
use super::precision::Precision;
use super::rdft::{for_each_wide_group, madd, wide_group, Group, Lane, Split, WideGroupWork, WIDE};

/// Real inverse transform of length `n` of every lane's Hermitian half-spectrum (its first
/// `n / 2 + 1` values, zero-padded or cropped from the lanes' length), scaled by `scale`,
/// into `out` (`n` values per lane).
pub(super) fn c2r_lanes<T: Precision + Float>(
    input: &[Complex<T>],
    lanes: &Lanes,
    n: usize,
    split: Split,
    scale: T,
    out: &mut [T],
) {
    debug_assert_eq!(out.len(), lanes.outer * n * lanes.inner);
    for_each_wide_group::<InverseWork<T>, Complex<T>, T, T>(input, lanes, n, split, scale, out);
}

type InverseGroup<'a, T> = Group<'a, Complex<T>, T, T>;

/// One wide group's half-spectrum rows, one group's residue spectra and output rows.
struct InverseWork<T> {
    /// Real and imaginary parts of spectrum values `0..=n/2` (zeros past the input).
    re: Vec<[Lane<T>; WIDE]>,
    im: Vec<[Lane<T>; WIDE]>,
    /// `T_r[m]`, `m` in `0..=half`, residue after residue.
    t_re: Vec<Lane<T>>,
    t_im: Vec<Lane<T>>,
    /// Output rows of one residue: `x[a j + r]` for `j` in `0..prime`.
    rows: Vec<Lane<T>>,
}

impl<T: Precision + Float> WideGroupWork<Complex<T>, T, T> for InverseWork<T> {
    fn new(n: usize, split: Split) -> Self {
        let zero = [T::zero(); GROUP];
        let half = (split.prime - 1) / 2;
        InverseWork {
            re: vec![[zero; WIDE]; n / 2 + 1],
            im: vec![[zero; WIDE]; n / 2 + 1],
            t_re: vec![zero; split.cofactor * (half + 1)],
            t_im: vec![zero; split.cofactor * (half + 1)],
            rows: vec![zero; split.prime],
        }
    }

    #[inline(always)]
    fn run<const FUSED: bool>(&mut self, group: &InverseGroup<'_, T>) {
        let (o, i0, count) = wide_group(group.lanes, group.g);
        self.gather(group, o, i0, count);
        for b in 0..count.div_ceil(GROUP) {
            self.residue_spectra::<FUSED>(b, group);
            for r in 0..group.split.cofactor {
                self.inverse_prime::<FUSED>(r, group);
                self.scatter(group, r, o, i0 + b * GROUP, GROUP.min(count - b * GROUP));
            }
        }
    }
}

impl<T: Precision + Float> InverseWork<T> {
    /// Copies the group's half-spectrum rows into real and imaginary parts, dropping the
    /// imaginary parts of the DC and Nyquist terms.
    #[inline(always)]
    fn gather(&mut self, group: &InverseGroup<'_, T>, o: usize, i0: usize, count: usize) {
        let lanes = group.lanes;
        let n = group.n;
        let used = lanes.len.min(n / 2 + 1);
        for (k, (re, im)) in self.re.iter_mut().zip(self.im.iter_mut()).enumerate() {
            let (re, im) = (re.as_flattened_mut(), im.as_flattened_mut());
            if k >= used {
                re.fill(T::zero());
                im.fill(T::zero());
                continue;
            }
            let at = (o * lanes.len + k) * lanes.inner + i0;
            let real_only = k == 0 || 2 * k == n;
            for ((r, i), v) in re
                .iter_mut()
                .zip(im.iter_mut())
                .zip(&group.input[at..at + count])
            {
                *r = v.re;
                *i = if real_only { T::zero() } else { v.im };
            }
            re[count..].fill(T::zero());
            im[count..].fill(T::zero());
        }
    }

    /// `T_r[m] = Σ_q e^{2πi r (m + p q)/n} X[m + p q]` for every residue `r` and `m` in
    /// `0..=half`, of gathered group `b` (`X[k]` past `n / 2` is `conj X[n - k]`).
    #[inline(always)]
    fn residue_spectra<const FUSED: bool>(&mut self, b: usize, group: &InverseGroup<'_, T>) {
        let Split { cofactor, prime } = group.split;
        let half = (prime - 1) / 2;
        let n = group.n;
        let tables = group.tables;
        for m in 0..=half {
            for r in 0..cofactor {
                let mut tr = [T::zero(); GROUP];
                let mut ti = [T::zero(); GROUP];
                for q in 0..cofactor {
                    let k = m + prime * q;
                    let (row, sign) = if 2 * k <= n {
                        (k, T::one())
                    } else {
                        (n - k, -T::one())
                    };
                    let t = (r * k) % n;
                    let (c, s) = (tables.cos_n[t], tables.sin_n[t]);
                    let (xr, xi) = (&self.re[row][b], &self.im[row][b]);
                    // (c + i s)(xr + i xi), with xi negated for a conjugate.
                    for l in 0..GROUP {
                        let xi = xi[l] * sign;
                        tr[l] = madd::<T, FUSED>(c, xr[l], madd::<T, FUSED>(-s, xi, tr[l]));
                        ti[l] = madd::<T, FUSED>(c, xi, madd::<T, FUSED>(s, xr[l], ti[l]));
                    }
                }
                self.t_re[r * (half + 1) + m] = tr;
                self.t_im[r * (half + 1) + m] = ti;
            }
        }
    }

    /// `x[a j + r]` for `j` in `0..prime` from `T_r[0..=half]` (Hermitian): `x[j] = A_j - B_j`
    /// and `x[p - j] = A_j + B_j` with `A_j = T_0 + 2 Σ Re T_m cos`, `B_j = 2 Σ Im T_m sin`.
    #[inline(always)]
    fn inverse_prime<const FUSED: bool>(&mut self, r: usize, group: &InverseGroup<'_, T>) {
        let prime = group.split.prime;
        let half = (prime - 1) / 2;
        let tables = group.tables;
        let base = r * (half + 1);
        let two = T::one() + T::one();
        let t0 = self.t_re[base];
        let (t_re, t_im) = (
            &self.t_re[base + 1..=base + half],
            &self.t_im[base + 1..=base + half],
        );
        let mut first = t0;
        for tr in t_re {
            for l in 0..GROUP {
                first[l] = madd::<T, FUSED>(two, tr[l], first[l]);
            }
        }
        self.rows[0] = first;
        for j in 1..=half {
            let row = (j - 1) * half..j * half;
            let mut a = [T::zero(); GROUP];
            let mut bsum = [T::zero(); GROUP];
            for ((&c, &s), (tr, ti)) in tables.cos_m[row.clone()]
                .iter()
                .zip(&tables.sin_m[row])
                .zip(t_re.iter().zip(t_im))
            {
                for l in 0..GROUP {
                    a[l] = madd::<T, FUSED>(tr[l], c, a[l]);
                    bsum[l] = madd::<T, FUSED>(ti[l], s, bsum[l]);
                }
            }
            let (mut lo, mut hi) = ([T::zero(); GROUP], [T::zero(); GROUP]);
            for l in 0..GROUP {
                let a = madd::<T, FUSED>(two, a[l], t0[l]);
                let b = two * bsum[l];
                lo[l] = a - b;
                hi[l] = a + b;
            }
            self.rows[j] = lo;
            self.rows[prime - j] = hi;
        }
    }

    /// Writes residue `r`'s output rows (`x[a j + r]`), scaled.
    #[inline(always)]
    fn scatter(&self, group: &InverseGroup<'_, T>, r: usize, o: usize, i0: usize, count: usize) {
        let lanes = group.lanes;
        let n = group.n;
        let cofactor = group.split.cofactor;
        for (j, values) in self.rows.iter().enumerate() {
            let mut row = [T::zero(); GROUP];
            for (d, &v) in row.iter_mut().zip(values) {
                *d = v * group.scale;
            }
            let at = (o * n + cofactor * j + r) * lanes.inner + i0;
            // SAFETY: `at..at + count` are lanes (o, i0..i0 + count) at output position
            // a j + r: in bounds, and only this group writes those lanes.
            unsafe {
                let dst = group.shared.0.add(at);
                if count == GROUP {
                    dst.cast::<Lane<T>>().write_unaligned(row);
                } else {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), dst, count);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{transform, Block};
    use super::*;
    use crate::array::{Buffer, DType};
    use crate::plan::fft_params::{FftNorm, FftStep, FftStepKind};
    use proptest::prelude::*;

    /// numpy's irfft of `half` (values `0..=n/2`, zero-padded or cropped) to length `n`, in
    /// f64: the imaginary parts of the DC and Nyquist terms ignored.
    fn irfft_reference(half: &[Complex<f64>], n: usize) -> Vec<f64> {
        let spectrum = |k: usize| -> Complex<f64> {
            let (k, conj) = if 2 * k <= n {
                (k, false)
            } else {
                (n - k, true)
            };
            let mut v = half.get(k).copied().unwrap_or_default();
            if k == 0 || 2 * k == n {
                v.im = 0.0;
            }
            if conj {
                v.conj()
            } else {
                v
            }
        };
        (0..n)
            .map(|j| {
                (0..n)
                    .map(|k| {
                        let a = std::f64::consts::TAU * ((j * k) % n) as f64 / n as f64;
                        (spectrum(k) * Complex::new(a.cos(), a.sin())).re
                    })
                    .sum()
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// irfft along the middle axis of (outer, len, inner) complex blocks, for lengths the
        /// direct path takes (the half-spectrum padded or cropped), in both precisions and
        /// every norm, equals numpy's definition for each lane.
        #[test]
        fn irfft_of_awkward_lengths_is_the_inverse_dft(
            prime in prop::sample::select(vec![37usize, 41, 53, 103]),
            cofactor in 1usize..8,
            pad in -3i64..4,
            outer in 1usize..3,
            inner in 16usize..80,
            norm in 0usize..3,
            single: bool,
            seed: u64,
        ) {
            let n = cofactor * prime;
            prop_assume!(super::super::rdft::split_for(n, inner).is_some());
            let len = ((n / 2 + 1) as i64 + pad).max(1) as usize;
            let norm = [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward][norm];
            let vals: Vec<Complex<f64>> = (0..outer * len * inner)
                .map(|i| {
                    let h = (i as u64 + 5).wrapping_mul(seed | 1).wrapping_mul(0x9E3779B97F4A7C15);
                    Complex::new((h >> 52) as f64 - 2000.0, ((h >> 20) & 0xfff) as f64 - 2000.0)
                })
                .collect();
            let shape = vec![outer, len, inner];
            let step = FftStep { axis: 1, kind: FftStepKind::RealInverse, n };
            let out: Vec<f64> = if single {
                let raw: Vec<[f32; 2]> = vals.iter().map(|c| [c.re as f32, c.im as f32]).collect();
                let block = Block {
                    values: Buffer::from_bytes(DType::C64, bytemuck::cast_slice(&raw).to_vec())
                        .unwrap(),
                    shape,
                };
                let out = transform(block, &[step], norm).unwrap();
                out.values.as_slice::<f32>().unwrap().iter().map(|&v| v as f64).collect()
            } else {
                let raw: Vec<[f64; 2]> = vals.iter().map(|c| [c.re, c.im]).collect();
                let block = Block {
                    values: Buffer::from_bytes(DType::C128, bytemuck::cast_slice(&raw).to_vec())
                        .unwrap(),
                    shape,
                };
                transform(block, &[step], norm).unwrap().values.as_slice::<f64>().unwrap().to_vec()
            };
            prop_assert_eq!(out.len(), outer * n * inner);
            let scale = norm.scale(n, true);
            let tolerance = if single { 2e-5 } else { 1e-10 };
            for o in 0..outer {
                for i in 0..inner {
                    let lane: Vec<Complex<f64>> =
                        (0..len).map(|k| vals[(o * len + k) * inner + i]).collect();
                    let want = irfft_reference(&lane, n);
                    let size = want.iter().map(|v| v.abs()).fold(1.0, f64::max) * scale;
                    for (j, w) in want.iter().enumerate() {
                        let have = out[(o * n + j) * inner + i];
                        prop_assert!(
                            (have - w * scale).abs() <= tolerance * size,
                            "n {n}, lane ({o}, {i}), value {j}: {have} vs {}", w * scale
                        );
                    }
                }
            }
        }
    }
}
