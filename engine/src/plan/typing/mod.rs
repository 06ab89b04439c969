//! Typing per op family: each op of a plan becomes a [`Node`](super::node::Node) with its
//! shape, dtype and chunk grid, checked with numpy's rules. The graph builder
//! ([`Graph::build`](super::graph::Graph::build)) calls these in plan order.

pub(super) mod elementwise;
pub(super) mod fft;
pub(super) mod joins;
pub(super) mod rechunk;
pub(super) mod reductions;
pub(super) mod slices;
pub(super) mod stores;
