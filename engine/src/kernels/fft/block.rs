//! A C-order block of values: what the FFT kernels transform.

use crate::array::Buffer;

/// A block of values in C order.
#[derive(Debug)]
pub struct Block {
    /// The values.
    pub values: Buffer,
    /// The shape.
    pub shape: Vec<usize>,
}
