//! NVIDIA GPUs (feature `cuda`): fused elementwise programs as CUDA C generated from the
//! register program, compiled by NVRTC at run time and launched through the driver; and reads
//! onto the device (zstd chunks decoded by nvCOMP, parts placed by a kernel). The driver,
//! NVRTC and nvCOMP are all loaded dynamically, so the engine builds and runs where CUDA is
//! absent.

mod batch;
pub mod codegen;
mod device_array;
mod failure;
mod launch;
pub mod nvcomp;
mod place;
mod read_staging;
mod runtime;
mod staging;

pub use batch::{BatchChunk, BatchTimes, Part};
pub use device_array::DeviceArray;
pub use runtime::{gpu, Gpu, GpuKernel};
pub use staging::PINNED_BYTES_PER_THREAD;

#[cfg(test)]
mod tests;
