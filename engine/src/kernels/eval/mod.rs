//! The evaluators of fused elementwise programs: the instruction set ([`inst`]), the general
//! evaluator ([`program`], every float in f64, calling numpy's ufuncs from [`ufunc`]), the
//! single-precision fast path ([`fast32`]), the walk of an n-dimensional region tile by tile
//! that feeds them ([`tiles`]), and the CUDA code generation and runtime ([`gpu`], feature
//! `cuda`).

pub mod fast32;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod inst;
pub mod program;
pub mod tiles;
pub mod ufunc;

pub use fast32::SumMode;
pub use inst::Inst;
pub use program::{Program, Registers};
pub use tiles::{drive, drive_tiles, eval_into, LeafInput, TileTarget};
