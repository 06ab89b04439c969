//! The values of FFT leaves: their material's values transformed and cut to the leaf's box.

use std::sync::Arc;

use super::read::LeafRead;
use crate::array::buffer::copy_region;
use crate::array::grid::c_strides;
use crate::array::{Buffer, Region};
use crate::error::Result;
use crate::kernels::fft::{rfft_of_box, transform, Block};
use crate::kernels::{eval_into, Inst, LeafInput, Program};
use crate::physical::fused::LeafFft;

/// The values of FFT leaf `lr`: its material's `values` (over `read_box`) cast to the compute
/// dtype, transformed, and cut to the leaf's box.
pub(super) fn transform_leaf(values: Buffer, lr: &LeafRead, fft: &LeafFft) -> Result<Buffer> {
    let shape: Vec<usize> = lr.read_box.shape.iter().map(|&n| n as usize).collect();
    let values = if values.dtype() == fft.compute {
        values
    } else {
        let program = Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: values.dtype(),
                },
                Inst::Cast {
                    arg: 0,
                    to: fft.compute,
                },
            ],
        };
        let strides = c_strides(&lr.read_box.shape)
            .into_iter()
            .map(|s| s as usize)
            .collect();
        let mut cast = Buffer::zeros(fft.compute, values.len());
        let input = [LeafInput {
            buf: &values,
            offset: 0,
            strides,
        }];
        eval_into(&program, &input, &lr.read_box.shape, &mut cast)?;
        cast
    };
    let out = transform(Block { values, shape }, &fft.steps, fft.norm)?;
    Ok(cut_to_leaf(out, lr, fft))
}

/// The transform of FFT leaf `lr` computed from its material's band `(region, values)` where
/// the band holds it, without copying the read box out first; `None` where the kernel cannot
/// read the box in place (see [`rfft_of_box`]), or the values need a cast first.
pub(super) fn transform_in_band(
    band: &(Region, Arc<Buffer>),
    lr: &LeafRead,
    fft: &LeafFft,
) -> Result<Option<Buffer>> {
    let (region, values) = band;
    let ([step], true) = (fft.steps.as_slice(), values.dtype() == fft.compute) else {
        return Ok(None);
    };
    let strides = c_strides(&region.shape);
    let origin: u64 = (0..region.rank())
        .map(|d| (lr.read_box.start[d] - region.start[d]) * strides[d])
        .sum();
    let strides: Vec<usize> = strides.iter().map(|&s| s as usize).collect();
    let shape: Vec<usize> = lr.read_box.shape.iter().map(|&n| n as usize).collect();
    let out = rfft_of_box(values, origin as usize, &strides, &shape, *step, fft.norm)?;
    Ok(out.map(|block| cut_to_leaf(block, lr, fft)))
}

/// The transformed block `out` of FFT leaf `lr` cut to the leaf's box.
fn cut_to_leaf(out: Block, lr: &LeafRead, fft: &LeafFft) -> Buffer {
    let block = lr.fft_block(fft);
    if block == lr.bbox {
        return out.values;
    }
    let dtype = out.values.dtype();
    let mut cut = Buffer::zeros(dtype, lr.bbox.len() as usize);
    copy_region(
        out.values.bytes(),
        &block,
        cut.bytes_mut(),
        &lr.bbox,
        &lr.bbox,
        dtype.size(),
    );
    cut
}
