//! Real forward transforms of lengths with an awkward prime factor, computed directly across
//! contiguous lanes.
//!
//! FFT libraries handle a prime factor above their hand-written butterflies (rustfft's stop at
//! 32) with Rader's or Bluestein's algorithm, several times slower than a smooth length: a
//! transform of 721 = 7 × 103 costs rustfft about eight times one of 720. Along a strided axis
//! (ERA5's latitude in (time, lat, lon)) the lanes sit side by side in memory, so here each
//! value of the transform is a vector of [`GROUP`] lanes and the prime factor's transform is a
//! direct real DFT: its symmetric and antisymmetric halves against cosines and sines, fused
//! multiply-adds across the lanes, with no gather into a work buffer and no scatter back. The
//! remaining factor combines the prime-length transforms with twiddles (one decimation-in-time
//! step).

use num_complex::Complex;
use rayon::prelude::*;
use rustfft::num_traits::Float;

use super::lanes::{Lanes, SharedOut, GROUP};
use super::precision::Precision;

/// A length split as `cofactor × prime`, the prime being its largest prime factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Split {
    /// `n / prime`.
    pub(super) cofactor: usize,
    /// The largest prime factor of `n`.
    pub(super) prime: usize,
}

/// Largest prime factor rustfft transforms with its own butterflies; above it, this module.
const SMOOTH_PRIME: usize = 32;
/// Largest prime worth a direct DFT (its cost grows with the square of the prime).
const MAX_PRIME: usize = 256;
/// Largest cofactor (the combining step costs `cofactor` multiply-adds per value).
const MAX_COFACTOR: usize = 8;

/// The split of `n` when a direct transform beats rustfft for it: its largest prime factor is
/// above rustfft's butterflies and small enough for a direct DFT, and the lanes fill groups.
pub(super) fn split_for(n: usize, inner: usize) -> Option<Split> {
    if inner < GROUP || n < 2 {
        return None;
    }
    let prime = largest_prime_factor(n);
    let cofactor = n / prime;
    (prime > SMOOTH_PRIME && prime <= MAX_PRIME && cofactor <= MAX_COFACTOR)
        .then_some(Split { cofactor, prime })
}

fn largest_prime_factor(mut n: usize) -> usize {
    let mut largest = 1;
    let mut f = 2;
    while f * f <= n {
        while n.is_multiple_of(f) {
            largest = f;
            n /= f;
        }
        f += 1;
    }
    if n > 1 {
        n
    } else {
        largest
    }
}

/// `cos` and `sin` of `2π t / n` for `t` in `0..n`, computed in f64.
fn unit_circle<T: Precision + Float>(n: usize) -> (Vec<T>, Vec<T>) {
    (0..n)
        .map(|t| {
            let angle = std::f64::consts::TAU * t as f64 / n as f64;
            (cast::<T>(angle.cos()), cast::<T>(angle.sin()))
        })
        .unzip()
}

fn cast<T: Precision>(x: f64) -> T {
    T::from_f64(x).unwrap_or_else(T::zero)
}

/// Values of [`GROUP`] neighbouring lanes.
pub(super) type Lane<T> = [T; GROUP];

/// Groups gathered together: each input row is read `WIDE × GROUP` lanes at a time (whole
/// cache lines side by side, fewer pages touched per row), then transformed a group at a time.
pub(super) const WIDE: usize = 4;
/// Lanes gathered together.
pub(super) const WIDE_LANES: usize = WIDE * GROUP;

/// Real forward transform of length `n` (zero-padded or cropped from the lanes' length) of
/// every lane, scaled by `scale`, into `out` (`n / 2 + 1` values per lane).
pub(super) fn r2c_lanes<T: Precision + Float>(
    input: &[T],
    lanes: &Lanes,
    n: usize,
    split: Split,
    scale: T,
    out: &mut [Complex<T>],
) {
    debug_assert_eq!(out.len(), lanes.out_elements());
    for_each_wide_group::<Work<T>, T, Complex<T>, T>(input, lanes, n, split, scale, out);
}

/// What a direct transform does with one wide group of lanes.
pub(super) trait WideGroupWork<I, O, T>: Sized {
    /// Work buffers for transforms of length `n` split as `split`.
    fn new(n: usize, split: Split) -> Self;
    /// Gathers, transforms and writes wide group `group.g`, multiply-adds fused (`FUSED`)
    /// or not.
    fn run<const FUSED: bool>(&mut self, group: &Group<'_, I, O, T>);
}

/// Runs `W` over every wide group of `lanes` in parallel (FMA where the CPU has it).
pub(super) fn for_each_wide_group<W, I, O, T>(
    input: &[I],
    lanes: &Lanes,
    n: usize,
    split: Split,
    scale: T,
    out: &mut [O],
) where
    W: WideGroupWork<I, O, T>,
    I: Sync,
    O: Send + Copy,
    T: Precision + Float,
{
    let tables = Tables::new(split);
    let shared = SharedOut(out.as_mut_ptr());
    let fma = fma_available();
    let wide_groups = lanes.outer * lanes.inner.div_ceil(WIDE_LANES);
    (0..wide_groups).into_par_iter().for_each_init(
        || W::new(n, split),
        |work, g| {
            let group = Group {
                input,
                lanes,
                n,
                split,
                tables: &tables,
                shared,
                scale,
                g,
            };
            #[cfg(target_arch = "x86_64")]
            if fma {
                // SAFETY: the CPU has AVX2 and FMA (`fma_available`).
                unsafe { run_fma(work, &group) };
                return;
            }
            let _ = fma;
            work.run::<false>(&group);
        },
    );
}

/// `work.run` compiled for AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_fma<W: WideGroupWork<I, O, T>, I, O, T>(work: &mut W, group: &Group<'_, I, O, T>) {
    work.run::<true>(group);
}

/// Whether the CPU has AVX2 and FMA.
fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The cosines and sines a split's transforms multiply by.
pub(super) struct Tables<T> {
    /// The prime's DFT matrix, row m (1..=half) holding cos(2π jm/p) for j in 1..=half
    /// (symmetric in j and m).
    pub(super) cos_m: Vec<T>,
    /// The same for sin.
    pub(super) sin_m: Vec<T>,
    /// cos(2π t/n) for t in 0..n (twiddles).
    pub(super) cos_n: Vec<T>,
    /// sin(2π t/n) for t in 0..n.
    pub(super) sin_n: Vec<T>,
}

impl<T: Precision + Float> Tables<T> {
    /// The tables of `split`, computed in f64.
    pub(super) fn new(split: Split) -> Self {
        let Split { cofactor, prime } = split;
        let half = (prime - 1) / 2;
        let (cos_p, sin_p) = unit_circle::<T>(prime);
        let (cos_n, sin_n) = unit_circle::<T>(cofactor * prime);
        let (cos_m, sin_m) = (1..=half)
            .flat_map(|m| (1..=half).map(move |j| (j * m) % prime))
            .map(|t| (cos_p[t], sin_p[t]))
            .unzip();
        Tables {
            cos_m,
            sin_m,
            cos_n,
            sin_n,
        }
    }
}

/// Everything one wide group's transform reads and where it writes.
pub(super) struct Group<'a, I, O, T> {
    /// The lanes' input values.
    pub(super) input: &'a [I],
    /// Their layout.
    pub(super) lanes: &'a Lanes,
    /// Transform length.
    pub(super) n: usize,
    /// Its split.
    pub(super) split: Split,
    /// Cosines and sines of the split.
    pub(super) tables: &'a Tables<T>,
    /// Where the output values go.
    pub(super) shared: SharedOut<O>,
    /// Factor of every output value.
    pub(super) scale: T,
    /// Which wide group.
    pub(super) g: usize,
}

/// The position of wide group `g`: outer index, first lane, lane count.
pub(super) fn wide_group(lanes: &Lanes, g: usize) -> (usize, usize, usize) {
    let per_outer = lanes.inner.div_ceil(WIDE_LANES);
    let i0 = (g % per_outer) * WIDE_LANES;
    (g / per_outer, i0, WIDE_LANES.min(lanes.inner - i0))
}

/// One wide group's input rows, and one group's prime-length spectra and output rows.
struct Work<T> {
    rows: Vec<[Lane<T>; WIDE]>,
    sym: Vec<Lane<T>>,
    anti: Vec<Lane<T>>,
    /// Spectra of the `cofactor` decimated sequences, `half + 1` values each.
    spec_re: Vec<Lane<T>>,
    spec_im: Vec<Lane<T>>,
    out_re: Vec<Lane<T>>,
    out_im: Vec<Lane<T>>,
}

impl<T: Precision + Float> WideGroupWork<T, Complex<T>, T> for Work<T> {
    fn new(n: usize, split: Split) -> Self {
        let zero = [T::zero(); GROUP];
        let half = (split.prime - 1) / 2;
        Work {
            rows: vec![[zero; WIDE]; n],
            sym: vec![zero; half + 1],
            anti: vec![zero; half + 1],
            spec_re: vec![zero; split.cofactor * (half + 1)],
            spec_im: vec![zero; split.cofactor * (half + 1)],
            out_re: vec![zero; n / 2 + 1],
            out_im: vec![zero; n / 2 + 1],
        }
    }

    #[inline(always)]
    fn run<const FUSED: bool>(&mut self, group: &Group<'_, T, Complex<T>, T>) {
        let (o, i0, count) = wide_group(group.lanes, group.g);
        self.gather(group, o, i0, count);
        let Split { cofactor, prime } = group.split;
        for b in 0..count.div_ceil(GROUP) {
            for r in 0..cofactor {
                self.prime_spectrum::<FUSED>(b, r, cofactor, prime, group.tables);
            }
            self.combine::<FUSED>(cofactor, prime, group.tables);
            let first = i0 + b * GROUP;
            self.scatter(group, o, first, GROUP.min(count - b * GROUP));
        }
    }
}

impl<T: Precision + Float> Work<T> {
    /// Copies the group's `n` rows (zeros past the lanes' length and past `count` lanes).
    #[inline(always)]
    fn gather(&mut self, group: &Group<'_, T, Complex<T>, T>, o: usize, i0: usize, count: usize) {
        let lanes = group.lanes;
        let used = lanes.len.min(group.n);
        for (j, row) in self.rows.iter_mut().enumerate() {
            let row = row.as_flattened_mut();
            if j >= used {
                row.fill(T::zero());
                continue;
            }
            let at = (o * lanes.len + j) * lanes.inner + i0;
            for (d, v) in row.iter_mut().zip(&group.input[at..at + count]) {
                *d = *v;
            }
            row[count..].fill(T::zero());
        }
    }

    /// Direct real DFT of the sequence `rows[cofactor * j + r]`, `j` in `0..prime`, of the
    /// gathered group `b`: values `0..=half` of its spectrum (the rest are their conjugates).
    #[inline(always)]
    fn prime_spectrum<const FUSED: bool>(
        &mut self,
        b: usize,
        r: usize,
        cofactor: usize,
        prime: usize,
        tables: &Tables<T>,
    ) {
        let half = (prime - 1) / 2;
        let x = |j: usize| &self.rows[cofactor * j + r][b];
        let first = *x(0);
        for j in 1..=half {
            let (a, b) = (x(j), x(prime - j));
            for l in 0..GROUP {
                self.sym[j][l] = a[l] + b[l];
                self.anti[j][l] = a[l] - b[l];
            }
        }
        let base = r * (half + 1);
        // Value 0: the sum.
        let mut dc = first;
        for s in &self.sym[1..=half] {
            for l in 0..GROUP {
                dc[l] = dc[l] + s[l];
            }
        }
        self.spec_re[base] = dc;
        self.spec_im[base] = [T::zero(); GROUP];
        // Two values per pass over the halves: independent accumulators keep the
        // multiply-add units busy.
        let mut m = 1;
        while m <= half {
            let m2 = (m + 1).min(half);
            let mut re0 = first;
            let mut im0 = [T::zero(); GROUP];
            let mut re1 = first;
            let mut im1 = [T::zero(); GROUP];
            let (row0, row1) = ((m - 1) * half..m * half, (m2 - 1) * half..m2 * half);
            let rows = tables.cos_m[row0.clone()]
                .iter()
                .zip(&tables.sin_m[row0])
                .zip(tables.cos_m[row1.clone()].iter().zip(&tables.sin_m[row1]));
            for (((&c0, &s0), (&c1, &s1)), (sym, anti)) in
                rows.zip(self.sym[1..=half].iter().zip(&self.anti[1..=half]))
            {
                for l in 0..GROUP {
                    re0[l] = madd::<T, FUSED>(sym[l], c0, re0[l]);
                    im0[l] = madd::<T, FUSED>(anti[l], s0, im0[l]);
                    re1[l] = madd::<T, FUSED>(sym[l], c1, re1[l]);
                    im1[l] = madd::<T, FUSED>(anti[l], s1, im1[l]);
                }
            }
            // X[m] = Σ x[j] e^{-2πi jm/p}: the sine terms enter negated.
            for l in 0..GROUP {
                im0[l] = -im0[l];
                im1[l] = -im1[l];
            }
            self.spec_re[base + m] = re0;
            self.spec_im[base + m] = im0;
            if m2 > m {
                self.spec_re[base + m2] = re1;
                self.spec_im[base + m2] = im1;
            }
            m += 2;
        }
    }

    /// `X[k] = Σ_r w^{rk} S_r[k mod prime]`, `w = e^{-2πi/n}`, for `k` in `0..=n/2`.
    #[inline(always)]
    fn combine<const FUSED: bool>(&mut self, cofactor: usize, prime: usize, tables: &Tables<T>) {
        let half = (prime - 1) / 2;
        let n = cofactor * prime;
        let mut m = 0usize;
        for k in 0..self.out_re.len() {
            // S_r[m] for m past half is the conjugate of S_r[prime - m].
            let (at, sign) = if m <= half {
                (m, T::one())
            } else {
                (prime - m, -T::one())
            };
            let mut re = [T::zero(); GROUP];
            let mut im = [T::zero(); GROUP];
            // Twiddle index r k mod n, from r = 0 (no twiddle) on.
            let mut t = 0usize;
            for r in 0..cofactor {
                let (c, s) = (tables.cos_n[t], tables.sin_n[t]);
                let sr = &self.spec_re[r * (half + 1) + at];
                let si = &self.spec_im[r * (half + 1) + at];
                // w^t S = (c - i s)(sr + i si).
                for l in 0..GROUP {
                    let si = si[l] * sign;
                    re[l] = madd::<T, FUSED>(c, sr[l], madd::<T, FUSED>(s, si, re[l]));
                    im[l] = madd::<T, FUSED>(c, si, madd::<T, FUSED>(-s, sr[l], im[l]));
                }
                t += k;
                if t >= n {
                    t -= n;
                }
            }
            self.out_re[k] = re;
            self.out_im[k] = im;
            m += 1;
            if m == prime {
                m = 0;
            }
        }
    }

    /// Writes the group's output rows, scaled.
    #[inline(always)]
    fn scatter(&self, group: &Group<'_, T, Complex<T>, T>, o: usize, i0: usize, count: usize) {
        let lanes = group.lanes;
        let scale = group.scale;
        let mut row = [Complex::<T>::default(); GROUP];
        for (k, (re, im)) in self.out_re.iter().zip(&self.out_im).enumerate() {
            for ((d, &x), &y) in row.iter_mut().zip(re).zip(im) {
                *d = Complex::new(x * scale, y * scale);
            }
            let at = (o * lanes.out_len + k) * lanes.inner + i0;
            // SAFETY: `at..at + count` are lanes (o, i0..i0 + count) at output position k:
            // in bounds, and only this group writes those lanes.
            unsafe {
                let dst = group.shared.0.add(at);
                if count == GROUP {
                    dst.cast::<[Complex<T>; GROUP]>().write_unaligned(row);
                } else {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), dst, count);
                }
            }
        }
    }
}

/// `a * b + c`, fused into one rounding where the CPU has FMA (`FUSED`).
#[inline(always)]
pub(super) fn madd<T: Float, const FUSED: bool>(a: T, b: T, c: T) -> T {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[cfg(test)]
mod tests {
    use super::super::{transform, Block};
    use super::*;
    use crate::array::{Buffer, DType};
    use crate::plan::fft_params::{FftNorm, FftStep, FftStepKind};
    use proptest::prelude::*;

    /// Values `0..=n/2` of the DFT of `lane` zero-padded or cropped to `n`, in f64.
    fn rdft_reference(lane: &[f64], n: usize) -> Vec<Complex<f64>> {
        (0..=n / 2)
            .map(|k| {
                lane.iter()
                    .take(n)
                    .enumerate()
                    .map(|(j, &v)| {
                        let a = -std::f64::consts::TAU * ((j * k) % n) as f64 / n as f64;
                        Complex::new(a.cos(), a.sin()) * v
                    })
                    .sum()
            })
            .collect()
    }

    fn block<T: bytemuck::Pod>(dtype: DType, vals: &[T], shape: &[usize]) -> Block {
        Block {
            values: Buffer::from_bytes(dtype, bytemuck::cast_slice(vals).to_vec()).unwrap(),
            shape: shape.to_vec(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// rfft along the middle axis of (outer, len, inner) blocks, for lengths this module
        /// takes (an awkward prime times a small cofactor, padded or cropped from the lanes'
        /// length), in both precisions and every norm, equals the DFT of each lane; lane
        /// counts fill wide groups, groups, or neither.
        #[test]
        fn rfft_of_awkward_lengths_is_the_dft(
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
            prop_assume!(split_for(n, inner).is_some());
            let len = (n as i64 + pad).max(1) as usize;
            let norm = [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward][norm];
            let vals: Vec<f64> = (0..outer * len * inner)
                .map(|i| ((i as u64 + 3).wrapping_mul(seed | 1) >> 52) as f64 - 2000.0)
                .collect();
            let shape = [outer, len, inner];
            let step = FftStep { axis: 1, kind: FftStepKind::RealForward, n };
            let out = if single {
                let v32: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
                let out = transform(block(DType::F32, &v32, &shape), &[step], norm).unwrap();
                out.values
                    .as_slice::<[f32; 2]>()
                    .unwrap()
                    .iter()
                    .map(|c| Complex::new(c[0] as f64, c[1] as f64))
                    .collect::<Vec<_>>()
            } else {
                let out = transform(block(DType::F64, &vals, &shape), &[step], norm).unwrap();
                out.values
                    .as_slice::<[f64; 2]>()
                    .unwrap()
                    .iter()
                    .map(|c| Complex::new(c[0], c[1]))
                    .collect::<Vec<_>>()
            };
            let half = n / 2 + 1;
            prop_assert_eq!(out.len(), outer * half * inner);
            let scale = norm.scale(n, false);
            let tolerance = if single { 2e-5 } else { 1e-10 };
            for o in 0..outer {
                for i in 0..inner {
                    let lane: Vec<f64> = (0..len).map(|k| vals[(o * len + k) * inner + i]).collect();
                    let want = rdft_reference(&lane, n);
                    let size = want.iter().map(|v| v.norm()).fold(1.0, f64::max) * scale;
                    for (k, w) in want.iter().enumerate() {
                        let have = out[(o * half + k) * inner + i];
                        prop_assert!(
                            (have - w * scale).norm() <= tolerance * size,
                            "n {n}, lane ({o}, {i}), value {k}: {have} vs {}", w * scale
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn splits_only_lengths_with_an_awkward_prime_and_full_groups() {
        assert_eq!(
            split_for(721, 1440),
            Some(Split {
                cofactor: 7,
                prime: 103
            })
        );
        assert_eq!(
            split_for(103, 16),
            Some(Split {
                cofactor: 1,
                prime: 103
            })
        );
        // Smooth lengths stay with rustfft, as do lanes too few for a group.
        assert_eq!(split_for(1440, 1440), None);
        assert_eq!(split_for(720, 1440), None);
        assert_eq!(split_for(721, 8), None);
        // Primes too large for a direct DFT, cofactors too large to combine cheaply.
        assert_eq!(split_for(1031, 1440), None);
        assert_eq!(split_for(16 * 103, 1440), None);
        assert_eq!(largest_prime_factor(2 * 2 * 3), 3);
        assert_eq!(largest_prime_factor(97), 97);
    }
}
