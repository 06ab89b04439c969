//! Compute kernels: fused elementwise programs over tiles, and streaming reductions.

pub mod cascade;
pub mod device;
pub mod fast32;
pub mod fft;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod ops;
pub mod program;
pub mod reduce;
pub mod region;
pub mod work;

pub use program::{Inst, Program, Registers};
pub use reduce::Accumulator;
pub use region::{drive, eval_into, LeafInput};
