//! chunkfuse-engine: executes chunked-array plans over Zarr data, fusing read → decode →
//! compute → encode → write per output chunk, under a memory budget.
//!
//! Layers, each in its own module: [`array`] (dtypes, grids, buffers), [`store`] (where bytes
//! live), [`zarr`] (the adapter over the `zarrs` crate), [`plan`] (the IR and its validation),
//! [`physical`] (the physical plan types and cost formulas), [`optimize`] (fusion and stage
//! planning), [`kernels`] (the compute), [`exec`] (scheduling,
//! memory, progress) and [`run`] (the entry points used by the CLI and the Python bindings).

pub mod array;
pub mod cancel;
pub mod chunk_job;
pub mod error;
pub mod exec;
pub mod fork_safe;
pub mod fuzz;
pub mod kernels;
pub mod optimize;
pub mod permute;
pub mod physical;
pub mod plan;
pub mod read;
pub mod run;
pub mod store;
pub mod zarr;

pub use error::{Error, ErrorKind, Result};

/// The engine's version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
