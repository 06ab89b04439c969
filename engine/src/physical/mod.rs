//! The physical plan: what the planner ([`crate::optimize`]) builds and the executor
//! ([`crate::exec`]) runs. Fused values and their leaves, materials, stages, plan options,
//! and the pure functions of them both sides need (task bytes, encode batching, the input
//! regions of leaves). No execution and no planning here; it imports neither.

pub mod cost;
pub mod fused;
pub mod material;
pub mod options;
pub mod regions;
pub mod stage;
