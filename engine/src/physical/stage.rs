//! Stages: sets of independent tasks that fill one material each, and the physical plan that
//! orders them.

use super::fused::{Fused, MatId};
use super::material::Material;
use crate::plan::ReduceFunc;

/// A stage: a set of independent tasks that fill one material.
#[derive(Debug, Clone)]
pub enum Stage {
    /// Computes `input` into `out`, one task per block of `block` output chunks per axis.
    Compute {
        /// What to compute.
        input: Fused,
        /// Where.
        out: MatId,
        /// Output chunks per task along each axis.
        block: Vec<u64>,
        /// For messages.
        label: String,
    },
    /// Copies `input`, a plain copy of one array, into `out` through one encoder stream per
    /// output chunk (see `exec::ops::stream_copy`), one task per group of `group` output
    /// chunks per axis.
    Stream {
        /// What to copy.
        input: Fused,
        /// Where.
        out: MatId,
        /// Output chunks per task along each axis.
        group: Vec<u64>,
        /// Bytes one stream's encoder holds.
        stream_bytes: u64,
        /// Decoded bytes of input per read batch.
        batch_bytes: u64,
        /// For messages.
        label: String,
    },
    /// Reduces `input` (already cast to the compute dtype) over `axes` into `out`.
    Reduce {
        /// The reduced values.
        input: Fused,
        /// Where.
        out: MatId,
        /// The function.
        func: ReduceFunc,
        /// Reduced axes of the input.
        axes: Vec<usize>,
        /// Whether the output keeps reduced axes.
        keepdims: bool,
        /// Delta degrees of freedom.
        ddof: f64,
        /// For messages.
        label: String,
    },
}

/// Materials and stages, in execution order.
#[derive(Debug, Clone)]
pub struct PhysicalPlan {
    /// Every materialized array.
    pub materials: Vec<Material>,
    /// Stages in order.
    pub stages: Vec<Stage>,
}
