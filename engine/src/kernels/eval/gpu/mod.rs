//! Fused elementwise programs on NVIDIA GPUs (feature `cuda`): CUDA C generated from the
//! register program, compiled by NVRTC at run time and launched through the driver, both
//! loaded dynamically, so the engine builds and runs where CUDA is absent.

pub mod codegen;
mod failure;
mod launch;
mod runtime;
mod staging;

pub use runtime::{gpu, Gpu, GpuKernel};
pub use staging::PINNED_BYTES_PER_THREAD;

#[cfg(test)]
mod tests;
