//! Float32 programs evaluated in single precision.
//!
//! The general evaluator computes every float in f64 and rounds float32 results after each
//! function. For the IEEE-exact functions (+ − × ÷, sqrt, abs, negation, floor, ceil,
//! maximum, minimum) computing directly in f32 gives the same bits: f64 holds more than
//! 2 × 24 + 2 significand bits, so rounding the f64 result to f32 is the correctly rounded f32
//! result. A program made only of float32 loads, constants and such functions is therefore
//! evaluated here in f32: half the bytes per value, twice the SIMD lanes, no conversions
//! between steps, constants as scalars rather than filled registers, and contiguous leaves
//! read in place rather than copied. The modulus of a complex64 leaf (as in a power spectrum,
//! `abs(z) ** 2`) joins such programs as a load: the general evaluator computes it in f64 and
//! rounds it to float32, and so does this path.

mod compile;
mod sink;
mod tile;

use crate::kernels::work::TILE;
use crate::plan::expr::Func;

/// An operand: the value of an earlier step, or a constant.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Arg {
    Step(usize),
    Scalar(f32),
}

/// One step; its value is the slot with the step's index.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Load {
        leaf: usize,
    },
    /// `|z|` of a complex64 leaf, as the general evaluator computes it (the parts squared
    /// and summed in f64, its square root rounded to float32).
    LoadAbs {
        leaf: usize,
    },
    Unary {
        func: Func,
        a: usize,
    },
    Binary {
        func: Func,
        a: Arg,
        b: Arg,
    },
}

/// How a tile's values go into float32 running sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumMode {
    /// Added to the sums there.
    Add,
    /// Written as the sums' first values (whatever the sums held is dropped).
    Start,
}

/// A program whose values are all float32, compiled to single-precision steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Fast32 {
    steps: Vec<Step>,
    result: Arg,
}

impl Fast32 {
    /// Scratch slots for one tile per step.
    pub fn scratch(&self) -> Vec<Vec<f32>> {
        vec![vec![0.0; TILE]; self.steps.len()]
    }
}

/// `func` (a function [`compile`] takes as unary) of `x` in f32.
#[inline(always)]
fn unary_fn(func: Func, x: f32) -> f32 {
    match func {
        Func::Negative => -x,
        Func::Abs => x.abs(),
        Func::Sqrt => x.sqrt(),
        Func::Floor => x.floor(),
        _ => x.ceil(),
    }
}

/// numpy's `maximum` in f32.
#[inline(always)]
fn nan_max(x: f32, y: f32) -> f32 {
    // numpy: NaN propagates, and of equal values (`-0.0` and `0.0`) the second.
    if x.is_nan() || x > y {
        x
    } else {
        y
    }
}

/// numpy's `minimum` in f32: NaN propagates.
#[inline(always)]
fn nan_min(x: f32, y: f32) -> f32 {
    if x.is_nan() || x < y {
        x
    } else {
        y
    }
}

/// `func` (a function [`compile`] takes as binary) of `x` and `y` in f32.
#[inline(always)]
fn binary_fn(func: Func, x: f32, y: f32) -> f32 {
    match func {
        Func::Add => x + y,
        Func::Subtract => x - y,
        Func::Multiply => x * y,
        Func::Divide => x / y,
        Func::Maximum => nan_max(x, y),
        _ => nan_min(x, y),
    }
}

#[cfg(test)]
mod tests;
