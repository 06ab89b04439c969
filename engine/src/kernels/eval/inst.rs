//! The instructions of a register program: loads of leaves, constants, functions of earlier
//! registers and casts. Every evaluator (general, float32, GPU) reads programs of these.

use crate::array::DType;
use crate::plan::expr::Signature;
use crate::plan::{Func, Scalar};

/// One instruction; its result is the register with the instruction's index.
#[derive(Debug, Clone, PartialEq)]
pub enum Inst {
    /// Values of leaf `leaf`.
    Load {
        /// Leaf index.
        leaf: usize,
        /// The leaf's dtype.
        dtype: DType,
    },
    /// A constant.
    Const {
        /// The value.
        value: Scalar,
        /// Its dtype.
        dtype: DType,
    },
    /// A function of earlier registers.
    Call {
        /// The function.
        func: Func,
        /// Compute and result dtypes.
        sig: Signature,
        /// Argument registers.
        args: Vec<usize>,
    },
    /// A cast of an earlier register.
    Cast {
        /// Argument register.
        arg: usize,
        /// Target dtype.
        to: DType,
    },
}

impl Inst {
    /// The dtype of the instruction's result.
    pub fn dtype(&self) -> DType {
        match self {
            Inst::Load { dtype, .. } | Inst::Const { dtype, .. } => *dtype,
            Inst::Call { sig, .. } => sig.result,
            Inst::Cast { to, .. } => *to,
        }
    }
}
