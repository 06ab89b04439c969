//! The arguments of a generated elementwise kernel for one region: each leaf's bytes from the
//! region's origin to the last value it reaches, the geometry (shape, then every leaf's
//! element strides), whether any leaf is laid out otherwise than the output, and the count.
//! The device launch and the host-compiled tests both take them from here.

use crate::array::grid::c_strides;
use crate::error::{Error, Result};
use crate::kernels::eval::tiles::LeafInput;

/// What the kernel `cf_eval(out, leaf0, …, geom, general, n)` is called with, less the output.
#[derive(Debug)]
pub struct LaunchArgs<'a> {
    /// Each leaf's values, from the region's origin to the last element the region reaches.
    pub leaves: Vec<&'a [u8]>,
    /// The region's shape, then each leaf's element strides (`rank` values per leaf).
    pub geom: Vec<i64>,
    /// 1 when some leaf is not laid out as the output (the kernel then reads `geom`).
    pub general: i32,
    /// Values in the region.
    pub n: u64,
}

impl<'a> LaunchArgs<'a> {
    /// The arguments for evaluating over a region of `shape` (C order) from `leaves`.
    pub fn new(leaves: &[LeafInput<'a>], shape: &[u64]) -> Result<LaunchArgs<'a>> {
        let n: u64 = shape.iter().product();
        let out_strides = c_strides(shape);
        let mut geom: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
        let mut general = 0i32;
        let mut bytes = Vec::with_capacity(leaves.len());
        for leaf in leaves {
            if leaf.strides.len() != shape.len() {
                return Err(Error::internal("GPU leaf of another rank than its region"));
            }
            let item = leaf.buf.dtype().size();
            // The elements the region reaches: from its origin to its last value.
            let last = leaf.offset
                + shape
                    .iter()
                    .zip(&leaf.strides)
                    .map(|(&s, &st)| (s as usize).saturating_sub(1) * st)
                    .sum::<usize>();
            let reached = if n == 0 {
                &[][..]
            } else {
                leaf.buf
                    .bytes()
                    .get(leaf.offset * item..(last + 1) * item)
                    .ok_or_else(|| Error::internal("GPU leaf reaches past its buffer"))?
            };
            let contiguous = leaf
                .strides
                .iter()
                .zip(&out_strides)
                .all(|(&a, &b)| a as u64 == b);
            general |= i32::from(!contiguous);
            geom.extend(leaf.strides.iter().map(|&s| s as i64));
            bytes.push(reached);
        }
        Ok(LaunchArgs {
            leaves: bytes,
            geom,
            general,
            n,
        })
    }

    /// The blocks to copy to the device, in parameter order: every leaf, then the geometry.
    pub fn uploads(&self) -> Vec<&[u8]> {
        let mut parts = self.leaves.clone();
        parts.push(bytemuck::cast_slice(&self.geom));
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{Buffer, DType};

    #[test]
    fn leaves_laid_out_as_the_output_need_no_geometry() {
        let buf = Buffer::zeros(DType::F32, 24);
        let leaves = [LeafInput {
            buf: &buf,
            offset: 0,
            strides: vec![12, 4, 1],
        }];
        let args = LaunchArgs::new(&leaves, &[2, 3, 4]).unwrap();
        assert_eq!(args.general, 0);
        assert_eq!(args.n, 24);
        assert_eq!(args.geom, vec![2, 3, 4, 12, 4, 1]);
        assert_eq!(args.leaves[0].len(), 24 * 4);
    }

    #[test]
    fn a_broadcast_window_sends_only_the_values_it_reaches() {
        let buf = Buffer::zeros(DType::I16, 40);
        // A (2, 3) region broadcast along axis 1, from element 5, rows 10 apart.
        let leaves = [LeafInput {
            buf: &buf,
            offset: 5,
            strides: vec![10, 0],
        }];
        let args = LaunchArgs::new(&leaves, &[2, 3]).unwrap();
        assert_eq!(args.general, 1);
        assert_eq!(args.leaves[0].len(), 11 * 2);
        assert_eq!(args.uploads().len(), 2);
        let past = [LeafInput {
            buf: &buf,
            offset: 35,
            strides: vec![10, 0],
        }];
        let err = LaunchArgs::new(&past, &[2, 3]).unwrap_err().to_string();
        assert!(err.contains("past its buffer"), "{err}");
    }
}
