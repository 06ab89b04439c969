//! FFT kernels on rustfft: transforms along one axis of a C-order block, chained for n-d
//! transforms, with numpy's semantics (`n` pads with zeros or crops; `norm` backward, ortho,
//! forward; rfft keeps `n / 2 + 1` values; irfft reads `n / 2 + 1` values and treats the
//! spectrum as Hermitian).
//!
//! Lanes along the axis are gathered a group at a time into a contiguous work buffer, so a
//! transform along a strided axis reads whole cache lines; groups run in parallel on rayon.
//! rustfft plans are made once per (precision, length, direction) and reused. Real forward
//! transforms of lengths with an awkward prime factor (721 = 7 × 103) along a strided axis are
//! computed directly across the lanes instead (`rdft`).

use crate::array::{Buffer, DType};
use crate::error::{Error, Result};
use crate::plan::fft_params::{FftNorm, FftStep, FftStepKind};

mod apart;
mod block;
mod groups;
mod irdft;
mod lanes;
mod pack;
mod precision;
mod rdft;
mod real;

pub use block::Block;
use groups::for_each_group;
use lanes::Lanes;
use precision::Precision;
pub use real::rfft_of_box;
use real::{c2r, r2c};

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

#[cfg(test)]
mod tests {
    use super::*;
    use num_complex::Complex;
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
