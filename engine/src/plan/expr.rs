//! Elementwise expression trees and their numpy typing rules.

use crate::array::dtype::{promote_operands, Kind, Operand, WeakKind};
use crate::array::DType;
use crate::error::{Error, Result};

/// A scalar constant as written in a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A float.
    Float(f64),
    /// A complex number `[re, im]`.
    Complex(f64, f64),
}

impl Scalar {
    /// The Python kind of the scalar (weak in promotion).
    pub fn weak_kind(self) -> WeakKind {
        match self {
            Scalar::Bool(_) => WeakKind::Bool,
            Scalar::Int(_) => WeakKind::Int,
            Scalar::Float(_) => WeakKind::Float,
            Scalar::Complex(..) => WeakKind::Complex,
        }
    }

    /// Checks that a Python integer fits `dtype` as numpy 2 requires.
    pub fn check_fits(self, dtype: DType) -> std::result::Result<(), String> {
        let Scalar::Int(v) = self else { return Ok(()) };
        let (lo, hi): (i128, i128) = match dtype {
            DType::I8 => (i8::MIN as i128, i8::MAX as i128),
            DType::I16 => (i16::MIN as i128, i16::MAX as i128),
            DType::I32 => (i32::MIN as i128, i32::MAX as i128),
            DType::I64 => (i64::MIN as i128, i64::MAX as i128),
            DType::U8 => (0, u8::MAX as i128),
            DType::U16 => (0, u16::MAX as i128),
            DType::U32 => (0, u32::MAX as i128),
            DType::U64 => (0, u64::MAX as i128),
            _ => return Ok(()),
        };
        if v < lo || v > hi {
            return Err(format!("Python integer {v} out of bounds for {dtype}"));
        }
        Ok(())
    }
}

/// Unary, binary and ternary functions (numpy ufunc names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Func {
    /// `-x`
    Negative,
    /// `|x|`
    Abs,
    /// square root
    Sqrt,
    /// e^x
    Exp,
    /// natural log
    Log,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// round down
    Floor,
    /// round up
    Ceil,
    /// `not x`
    LogicalNot,
    /// `a + b`
    Add,
    /// `a - b`
    Subtract,
    /// `a * b`
    Multiply,
    /// `a / b` (true division)
    Divide,
    /// `a // b`
    FloorDivide,
    /// `a % b` (sign of the divisor, as Python)
    Remainder,
    /// `a ** b`
    Power,
    /// elementwise max (NaN propagates)
    Maximum,
    /// elementwise min (NaN propagates)
    Minimum,
    /// `a == b`
    Equal,
    /// `a != b`
    NotEqual,
    /// `a < b`
    Less,
    /// `a <= b`
    LessEqual,
    /// `a > b`
    Greater,
    /// `a >= b`
    GreaterEqual,
    /// `a and b`
    LogicalAnd,
    /// `a or b`
    LogicalOr,
    /// `a xor b`
    LogicalXor,
    /// `where(cond, a, b)`
    Where,
    /// `clip(x, lo, hi)`
    Clip,
}

impl Func {
    /// Every function with its plan name.
    pub const ALL: [(&'static str, Func); 30] = [
        ("negative", Func::Negative),
        ("abs", Func::Abs),
        ("sqrt", Func::Sqrt),
        ("exp", Func::Exp),
        ("log", Func::Log),
        ("sin", Func::Sin),
        ("cos", Func::Cos),
        ("floor", Func::Floor),
        ("ceil", Func::Ceil),
        ("logical_not", Func::LogicalNot),
        ("add", Func::Add),
        ("subtract", Func::Subtract),
        ("multiply", Func::Multiply),
        ("divide", Func::Divide),
        ("floor_divide", Func::FloorDivide),
        ("remainder", Func::Remainder),
        ("power", Func::Power),
        ("maximum", Func::Maximum),
        ("minimum", Func::Minimum),
        ("equal", Func::Equal),
        ("not_equal", Func::NotEqual),
        ("less", Func::Less),
        ("less_equal", Func::LessEqual),
        ("greater", Func::Greater),
        ("greater_equal", Func::GreaterEqual),
        ("logical_and", Func::LogicalAnd),
        ("logical_or", Func::LogicalOr),
        ("logical_xor", Func::LogicalXor),
        ("where", Func::Where),
        ("clip", Func::Clip),
    ];

    /// Looks a function up by plan name (a few numpy aliases accepted).
    pub fn from_name(name: &str) -> Option<Func> {
        let name = match name {
            "absolute" => "abs",
            "true_divide" => "divide",
            "mod" => "remainder",
            "pow" => "power",
            "neg" => "negative",
            other => other,
        };
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// The plan name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    /// Number of arguments.
    pub fn arity(self) -> usize {
        use Func::*;
        match self {
            Negative | Abs | Sqrt | Exp | Log | Sin | Cos | Floor | Ceil | LogicalNot => 1,
            Where | Clip => 3,
            _ => 2,
        }
    }

    /// True for functions returning bool.
    pub fn is_predicate(self) -> bool {
        use Func::*;
        matches!(
            self,
            Equal
                | NotEqual
                | Less
                | LessEqual
                | Greater
                | GreaterEqual
                | LogicalAnd
                | LogicalOr
                | LogicalXor
                | LogicalNot
        )
    }
}

/// An expression node.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// The i-th input array of the op.
    Input(usize),
    /// A constant; a weak Python scalar when `dtype` is `None`.
    Const(Scalar, Option<DType>),
    /// A function application.
    Call(Func, Vec<Expr>),
    /// A cast.
    AsType(DType, Box<Expr>),
}

/// How a function computes: the dtype its arguments are cast to, and the dtype of its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    /// Arguments are cast to this dtype before computing (`Where`: only the value arguments).
    pub compute: DType,
    /// The result dtype.
    pub result: DType,
}

/// The dtype of a typed sub-expression, or the kind of a weak constant.
pub type Typed = Operand;

/// numpy's type resolution for `func` applied to `args`; errors name what numpy refuses.
pub fn resolve(func: Func, args: &[Typed]) -> Result<Signature> {
    use Func::*;
    let err = |m: String| Err(Error::new(crate::error::ErrorKind::Plan, m));
    let value_args: &[Typed] = if func == Where { &args[1..] } else { args };
    let promoted = promote_operands(value_args).dtype();
    let kind = promoted.kind();
    let sig = |compute: DType, result: DType| Ok(Signature { compute, result });
    match func {
        Add | Multiply | Maximum | Minimum => sig(promoted, promoted),
        Subtract => {
            if kind == Kind::Bool {
                return err("numpy boolean subtract is not supported; use logical_xor".into());
            }
            sig(promoted, promoted)
        }
        Negative => {
            if kind == Kind::Bool {
                return err("numpy boolean negative is not supported; use logical_not".into());
            }
            sig(promoted, promoted)
        }
        Divide => {
            let d = if matches!(kind, Kind::Bool | Kind::Int) {
                DType::F64
            } else {
                promoted
            };
            sig(d, d)
        }
        FloorDivide | Remainder | Power => {
            if kind == Kind::Complex && func != Power {
                return err(format!(
                    "{} is not defined for complex numbers",
                    func.name()
                ));
            }
            let d = if kind == Kind::Bool {
                DType::I8
            } else {
                promoted
            };
            sig(d, d)
        }
        Abs => sig(
            promoted,
            if kind == Kind::Complex {
                promoted.real()
            } else {
                promoted
            },
        ),
        Sqrt | Exp | Log | Sin | Cos => {
            let d = promoted.to_float_for_ufunc();
            sig(d, d)
        }
        Floor | Ceil => {
            if kind == Kind::Complex {
                return err(format!(
                    "{} is not defined for complex numbers",
                    func.name()
                ));
            }
            sig(promoted, promoted)
        }
        Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual => sig(promoted, DType::Bool),
        LogicalAnd | LogicalOr | LogicalXor | LogicalNot => sig(DType::Bool, DType::Bool),
        Where | Clip => sig(promoted, promoted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: DType) -> Typed {
        Operand::Strong(d)
    }

    #[test]
    fn division_of_integers_is_float64() {
        let r = resolve(Func::Divide, &[s(DType::I8), s(DType::I8)]).unwrap();
        assert_eq!(r.result, DType::F64);
    }

    #[test]
    fn comparison_computes_in_promoted_type() {
        let r = resolve(Func::Less, &[s(DType::F32), Operand::Weak(WeakKind::Int)]).unwrap();
        assert_eq!(
            r,
            Signature {
                compute: DType::F32,
                result: DType::Bool
            }
        );
    }

    #[test]
    fn where_promotes_only_values() {
        let r = resolve(Func::Where, &[s(DType::Bool), s(DType::I16), s(DType::U8)]).unwrap();
        assert_eq!(r.result, DType::I16);
    }

    #[test]
    fn boolean_subtract_is_refused() {
        assert!(resolve(Func::Subtract, &[s(DType::Bool), s(DType::Bool)]).is_err());
    }
}
