//! Which packed lane pairs of a real forward transform are transformed apart instead. Packing
//! two real lanes into one complex lane mixes their values: a NaN or an infinity in one lane
//! would spread to the other's spectrum, and the smaller lane's spectrum would carry rounding
//! errors of the larger one's size. A pair stays packed only where both lanes are finite and
//! their largest magnitudes lie within [`PACK_RATIO`] of each other (neighbouring lanes of a
//! field, usually); the lanes of every other pair are transformed one by one, as numpy does.

use num_complex::Complex;

use super::lanes::{SharedOut, GROUP};
use super::pack::GroupLanes;
use super::precision::Precision;

/// How far apart two packed lanes' largest magnitudes may be: the smaller lane's error grows
/// by at most about this factor over a transform of its own.
const PACK_RATIO: f64 = 2.0;

/// The largest magnitude of each lane of group `g` (its first `g.used` values), and whether
/// every value of it is finite.
fn scan<T: Precision>(input: &[T], g: GroupLanes) -> [(T, bool); GROUP] {
    let mut lanes = [(T::zero(), true); GROUP];
    for k in 0..g.used {
        let row = &input[g.base + k * g.inner..][..g.lanes];
        for (lane, &v) in lanes.iter_mut().zip(row) {
            let a = v.abs();
            lane.1 &= v.is_finite();
            if a > lane.0 {
                lane.0 = a;
            }
        }
    }
    lanes
}

/// Whether a pair of lanes scanned as `a` and `b` is transformed apart.
fn apart<T: Precision>(a: (T, bool), b: (T, bool)) -> bool {
    if !(a.1 && b.1) {
        return true;
    }
    let (hi, lo) = if a.0 > b.0 { (a.0, b.0) } else { (b.0, a.0) };
    let ratio = T::from_f64(PACK_RATIO).unwrap_or_else(T::one);
    hi > T::zero() && lo * ratio < hi
}

/// The lanes of group `g` (indices into the group) whose pair is transformed apart.
pub(super) fn lanes_apart<T: Precision>(input: &[T], g: GroupLanes) -> Vec<usize> {
    let scanned = scan(input, g);
    // An odd last lane is packed with zeros: nothing of another lane reaches it.
    (0..g.lanes / 2)
        .filter(|&p| apart(scanned[2 * p], scanned[2 * p + 1]))
        .flat_map(|p| [2 * p, 2 * p + 1])
        .collect()
}

/// Where one lane's spectrum goes: lane `lane` of the output's `inner` lanes, of outer index
/// `o`, `out_len` values.
#[derive(Debug, Clone, Copy)]
pub(super) struct LaneOut {
    pub(super) o: usize,
    pub(super) lane: usize,
    pub(super) inner: usize,
    pub(super) out_len: usize,
}

/// Transforms lane `j` of group `g` on its own (its values as the real parts of a complex
/// lane in `work`, `g.n` long) and writes its first `to.out_len` values, times `scale`.
///
/// # Safety
/// The output lane `to` is in bounds of `out` and written by no other thread.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn transform_alone<T: Precision>(
    input: &[T],
    g: GroupLanes,
    j: usize,
    fft: &dyn rustfft::Fft<T>,
    (work, scratch): (&mut [Complex<T>], &mut [Complex<T>]),
    scale: T,
    out: SharedOut<Complex<T>>,
    to: LaneOut,
) {
    let work = &mut work[..g.n];
    for (k, w) in work.iter_mut().enumerate() {
        *w = if k < g.used {
            Complex::new(input[g.base + k * g.inner + j], T::zero())
        } else {
            Complex::default()
        };
    }
    fft.process_with_scratch(work, scratch);
    for (k, v) in work.iter().take(to.out_len).enumerate() {
        let row = (to.o * to.out_len + k) * to.inner + to.lane;
        out.write_row(row, &[*v * scale]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{transform, Block};
    use super::*;
    use crate::array::{Buffer, DType};
    use crate::plan::fft_params::{FftNorm, FftStep, FftStepKind};

    /// rfft along axis 0 of float32 lanes `x` (`len` values of `inner` lanes), as complex
    /// values per lane.
    fn rfft_axis0(x: &[f32], len: usize, inner: usize) -> Vec<Vec<Complex<f64>>> {
        let block = Block {
            values: Buffer::from_bytes(DType::F32, bytemuck::cast_slice(x).to_vec()).unwrap(),
            shape: vec![len, inner],
        };
        let step = FftStep {
            axis: 0,
            kind: FftStepKind::RealForward,
            n: len,
        };
        let out = transform(block, &[step], FftNorm::Backward).unwrap();
        let values = out.values.as_slice::<[f32; 2]>().unwrap();
        (0..inner)
            .map(|i| {
                (0..len / 2 + 1)
                    .map(|k| {
                        let v = values[k * inner + i];
                        Complex::new(f64::from(v[0]), f64::from(v[1]))
                    })
                    .collect()
            })
            .collect()
    }

    /// The first `n / 2 + 1` values of the DFT of a real lane, in f64.
    fn real_dft(lane: &[f64]) -> Vec<Complex<f64>> {
        let n = lane.len();
        (0..n / 2 + 1)
            .map(|k| {
                lane.iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        let a = -2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                        Complex::new(a.cos(), a.sin()) * v
                    })
                    .sum()
            })
            .collect()
    }

    #[test]
    fn each_lane_s_spectrum_is_its_own_whatever_its_neighbour_holds() {
        // 16 steps of 6 lanes: lane 0 holds a NaN, lane 2 an infinity, lane 4 is a million
        // times lane 5; lanes 1, 3 and 5 must come out as their own DFTs.
        let (len, inner) = (16usize, 6usize);
        let mut x: Vec<f32> = (0..len * inner)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.125)
            .collect();
        x[3 * inner] = f32::NAN;
        x[5 * inner + 2] = f32::INFINITY;
        for k in 0..len {
            x[k * inner + 4] *= 1e6;
        }
        let got = rfft_axis0(&x, len, inner);
        for (i, spectrum) in got.iter().enumerate() {
            let lane: Vec<f64> = (0..len).map(|k| f64::from(x[k * inner + i])).collect();
            if i == 0 || i == 2 {
                assert!(spectrum.iter().any(|v| !v.re.is_finite()), "lane {i}");
                continue;
            }
            let want = real_dft(&lane);
            let size = lane.iter().map(|v| v.abs()).fold(0.0, f64::max) * len as f64;
            for (k, (g, w)) in spectrum.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).norm() <= 1e-6 * size,
                    "lane {i}, frequency {k}: {g} against {w}"
                );
            }
        }
    }

    fn group(lanes: usize, used: usize) -> GroupLanes {
        GroupLanes {
            base: 0,
            inner: lanes,
            used,
            lanes,
            n: used,
        }
    }

    #[test]
    fn pairs_with_a_non_finite_value_or_far_apart_magnitudes_go_apart() {
        // Four lanes, three rows: lanes (0, 1) alike, lane 2 has a NaN, lane 5 is 1e6 times
        // lane 4; the odd lane 6 pairs with zeros.
        let rows: [[f32; 7]; 3] = [
            [1.0, -1.5, 2.0, 1.0, 1e-3, 1e3, f32::NAN],
            [0.5, 1.0, f32::NAN, 1.0, 2e-3, -2e3, 1.0],
            [-1.0, 0.25, 1.0, 1.0, 1e-3, 1e3, 1.0],
        ];
        let input: Vec<f32> = rows.iter().flatten().copied().collect();
        assert_eq!(lanes_apart(&input, group(7, 3)), vec![2, 3, 4, 5]);
        // Zeros with zeros stay packed; zeros beside a value do not.
        let zeros = [0f32, 0.0, 0.0, 3.0];
        assert_eq!(lanes_apart(&zeros, group(4, 1)), vec![2, 3]);
        // Values past `used` are not the lane's.
        let tail = [1f32, 1.0, f32::INFINITY, 1.0];
        assert!(lanes_apart(&tail, group(2, 1)).is_empty());
    }
}
