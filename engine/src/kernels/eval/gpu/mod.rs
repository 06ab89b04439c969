//! NVIDIA GPUs (feature `cuda`): fused elementwise programs as CUDA C generated from the
//! register program, compiled by NVRTC at run time and launched through the driver; and reads
//! onto the device (zstd chunks decoded by nvCOMP, parts placed by a kernel); and reductions
//! of such reads, folded slab by slab into accumulators kept on the device; and chunks on the
//! device encoded into zstd frames by nvCOMP. The driver,
//! NVRTC and nvCOMP are all loaded dynamically, so the engine builds and runs where CUDA is
//! absent.

mod batch;
mod batch_queue;
pub mod codegen;
mod device_array;
mod encode;
mod failure;
mod launch;
pub mod nvcomp;
mod place;
mod read_staging;
mod reduce;
pub mod reduce_source;
mod runtime;
mod staging;

pub use batch::{BatchChunk, BatchTimes, Part};
pub use batch_queue::BatchQueue;
pub use device_array::DeviceArray;
pub use encode::{DeviceEncoded, EncodePiece};
pub use reduce::DeviceReduction;
pub use runtime::{gpu, Gpu, GpuKernel};
pub use staging::PINNED_BYTES_PER_THREAD;

#[cfg(test)]
mod tests;
