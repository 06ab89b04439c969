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
    /// `x * x` (bool squares to int8, as in numpy)
    Square,
    /// -1, 0 or 1 (NaN stays NaN; no bool or complex)
    Sign,
    /// round toward zero
    Trunc,
    /// `x` is NaN
    IsNan,
    /// `x` is ±infinity
    IsInf,
    /// `x` is neither NaN nor infinite
    IsFinite,
    /// log(1 + x)
    Log1p,
    /// e^x − 1
    Expm1,
    /// 2^x
    Exp2,
    /// base-2 log
    Log2,
    /// base-10 log
    Log10,
    /// tangent
    Tan,
    /// inverse sine
    Arcsin,
    /// inverse cosine
    Arccos,
    /// inverse tangent
    Arctan,
    /// hyperbolic sine
    Sinh,
    /// hyperbolic cosine
    Cosh,
    /// hyperbolic tangent
    Tanh,
    /// the angle of the point (b, a): `arctan2(a, b)`
    Arctan2,
    /// sqrt(a² + b²) without overflow on the way
    Hypot,
    /// elementwise max, a NaN passed over when the other value is not NaN
    Fmax,
    /// elementwise min, a NaN passed over when the other value is not NaN
    Fmin,
    /// round to the nearest integer, halves to even (in float)
    Rint,
}

impl Func {
    /// Every function with its plan name.
    pub const ALL: [(&'static str, Func); 53] = [
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
        ("square", Func::Square),
        ("sign", Func::Sign),
        ("trunc", Func::Trunc),
        ("isnan", Func::IsNan),
        ("isinf", Func::IsInf),
        ("isfinite", Func::IsFinite),
        ("log1p", Func::Log1p),
        ("expm1", Func::Expm1),
        ("exp2", Func::Exp2),
        ("log2", Func::Log2),
        ("log10", Func::Log10),
        ("tan", Func::Tan),
        ("arcsin", Func::Arcsin),
        ("arccos", Func::Arccos),
        ("arctan", Func::Arctan),
        ("sinh", Func::Sinh),
        ("cosh", Func::Cosh),
        ("tanh", Func::Tanh),
        ("arctan2", Func::Arctan2),
        ("hypot", Func::Hypot),
        ("fmax", Func::Fmax),
        ("fmin", Func::Fmin),
        ("rint", Func::Rint),
    ];

    /// Looks a function up by plan name (a few numpy aliases accepted).
    pub fn from_name(name: &str) -> Option<Func> {
        let name = match name {
            "absolute" => "abs",
            "true_divide" => "divide",
            "mod" => "remainder",
            "pow" => "power",
            "neg" => "negative",
            "asin" => "arcsin",
            "acos" => "arccos",
            "atan" => "arctan",
            "atan2" => "arctan2",
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
            Negative | Abs | Sqrt | Exp | Log | Sin | Cos | Floor | Ceil | LogicalNot | Square
            | Sign | Trunc | IsNan | IsInf | IsFinite | Rint => 1,
            f if f.is_float_math() => 1,
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
                | IsNan
                | IsInf
                | IsFinite
        )
    }

    /// True for the one-argument float functions added beside exp, log, sin and cos: they
    /// compute in float (integers as numpy's float for them) and take no complex values.
    pub fn is_float_math(self) -> bool {
        use Func::*;
        matches!(
            self,
            Log1p
                | Expm1
                | Exp2
                | Log2
                | Log10
                | Tan
                | Arcsin
                | Arccos
                | Arctan
                | Sinh
                | Cosh
                | Tanh
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
        IsNan | IsInf | IsFinite => sig(promoted, DType::Bool),
        Square => {
            let d = if kind == Kind::Bool {
                DType::I8
            } else {
                promoted
            };
            sig(d, d)
        }
        Sign | Trunc | Fmax | Fmin | Arctan2 | Hypot if kind == Kind::Complex => err(format!(
            "{} of complex numbers is not supported",
            func.name()
        )),
        Sign if kind == Kind::Bool => err("numpy sign is not defined for booleans".into()),
        Sign | Trunc | Fmax | Fmin => sig(promoted, promoted),
        Arctan2 | Hypot => {
            // numpy's first float loop both arguments cast to safely: of two arrays, each
            // one's own float type, promoted (int8 and uint16 give float32, not float64); with
            // a Python scalar, the float type of their promotion (int8 and 0.5: float64).
            let d = if value_args.iter().any(|a| matches!(a, Operand::Weak(_))) {
                promoted.to_float_for_ufunc()
            } else {
                let floats: Vec<Operand> = value_args
                    .iter()
                    .map(|a| Operand::Strong(a.dtype().to_float_for_ufunc()))
                    .collect();
                promote_operands(&floats).dtype()
            };
            sig(d, d)
        }
        Log1p | Expm1 | Exp2 | Log2 | Log10 | Tan | Arcsin | Arccos | Arctan | Sinh | Cosh
        | Tanh | Rint => {
            if kind == Kind::Complex {
                return err(format!(
                    "{} of complex numbers is not supported",
                    func.name()
                ));
            }
            let d = promoted.to_float_for_ufunc();
            sig(d, d)
        }
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
    fn two_argument_float_functions_take_numpy_loops() {
        // Two arrays: each one's own float type, promoted.
        let r = resolve(Func::Arctan2, &[s(DType::I8), s(DType::U16)]).unwrap();
        assert_eq!(r.result, DType::F32);
        let r = resolve(Func::Hypot, &[s(DType::I32), s(DType::F32)]).unwrap();
        assert_eq!(r.result, DType::F64);
        // With a Python float, the float type of the promotion.
        let r = resolve(
            Func::Arctan2,
            &[s(DType::I8), Operand::Weak(WeakKind::Float)],
        )
        .unwrap();
        assert_eq!(r.result, DType::F64);
        assert!(resolve(Func::Hypot, &[s(DType::C64), s(DType::C64)]).is_err());
        assert_eq!(
            resolve(Func::Square, &[s(DType::Bool)]).unwrap().result,
            DType::I8
        );
        assert_eq!(
            resolve(Func::IsNan, &[s(DType::C64)]).unwrap().result,
            DType::Bool
        );
        assert!(resolve(Func::Sign, &[s(DType::Bool)]).is_err());
        assert!(resolve(Func::Log1p, &[s(DType::C128)]).is_err());
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
