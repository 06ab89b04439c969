//! Physical operators: each turns a stage into tasks.

pub mod chunk_fn;
pub mod compute;
pub mod reduce;
pub mod region;
pub mod stream_copy;
