//! Physical operators: each turns a stage into tasks.

pub mod compute;
pub mod reduce;
pub mod region;
