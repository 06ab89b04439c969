//! Compute kernels: fused elementwise programs over tiles ([`eval`]), streaming reductions
//! ([`reduce`], with float32 partial sums in [`cascade`]), FFTs ([`fft`]), the choice of
//! device ([`device`]) and the working registers they share ([`work`]).

pub mod cascade;
pub mod device;
pub mod eval;
pub mod fft;
pub mod reduce;
pub mod work;

pub use eval::{drive, eval_into, Inst, LeafInput, Program, Registers};
pub use reduce::Accumulator;
