//! Data types and numpy 2 type promotion (NEP 50: Python scalars are "weak").

use std::fmt;

use crate::error::{Error, Result};

/// An element type the engine computes with; names follow numpy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `bool`, one byte.
    Bool,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint8`.
    U8,
    /// `uint16`.
    U16,
    /// `uint32`.
    U32,
    /// `uint64`.
    U64,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `complex64` (two float32).
    C64,
    /// `complex128` (two float64).
    C128,
}

/// The broad kind of a dtype, ordered as numpy orders kinds in promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// bool
    Bool,
    /// unsigned or signed integer
    Int,
    /// real float
    Float,
    /// complex float
    Complex,
}

/// Every dtype, for iteration in tests and error messages.
pub const ALL_DTYPES: [DType; 13] = [
    DType::Bool,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F32,
    DType::F64,
    DType::C64,
    DType::C128,
];

impl DType {
    /// numpy's name for the dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    /// Parses a numpy dtype name (`"float32"`, `"f4"`, `"<f4"`, `"int"`, ...).
    pub fn parse(name: &str) -> Result<DType> {
        let n = name.trim_start_matches(['<', '>', '|', '=']);
        let d = match n {
            "bool" | "b1" | "?" => DType::Bool,
            "int8" | "i1" => DType::I8,
            "int16" | "i2" => DType::I16,
            "int32" | "i4" => DType::I32,
            "int64" | "i8" | "int" => DType::I64,
            "uint8" | "u1" => DType::U8,
            "uint16" | "u2" => DType::U16,
            "uint32" | "u4" => DType::U32,
            "uint64" | "u8" | "uint" => DType::U64,
            "float32" | "f4" => DType::F32,
            "float64" | "f8" | "float" => DType::F64,
            "complex64" | "c8" => DType::C64,
            "complex128" | "c16" | "complex" => DType::C128,
            _ => {
                let names: Vec<&str> = ALL_DTYPES.iter().map(|d| d.name()).collect();
                return Err(Error::new(
                    crate::error::ErrorKind::Plan,
                    format!(
                        "unknown dtype \"{name}\"; must be one of {}",
                        names.join(", ")
                    ),
                ));
            }
        };
        Ok(d)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The dtype's kind.
    pub fn kind(self) -> Kind {
        match self {
            DType::Bool => Kind::Bool,
            DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64 => Kind::Int,
            DType::F32 | DType::F64 => Kind::Float,
            DType::C64 | DType::C128 => Kind::Complex,
        }
    }

    /// True for unsigned integers.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// True for signed integers.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// True for integer dtypes (not bool).
    pub fn is_int(self) -> bool {
        self.kind() == Kind::Int
    }

    /// True for real and complex floats.
    pub fn is_inexact(self) -> bool {
        matches!(self.kind(), Kind::Float | Kind::Complex)
    }

    /// The real dtype of a complex dtype (itself otherwise).
    pub fn real(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }

    /// The complex dtype whose parts are `self` (float32 → complex64).
    pub fn to_complex(self) -> DType {
        match self {
            DType::F32 | DType::C64 => DType::C64,
            DType::I8 | DType::U8 | DType::I16 | DType::U16 => DType::C64,
            _ => DType::C128,
        }
    }

    /// The float dtype numpy's float ufuncs (`sqrt`, `exp`, true division, ...) give for
    /// `self`. numpy gives float16 for bool and 8-bit integers; float16 is not an engine
    /// dtype, so those compute and store as float32 (a documented departure).
    pub fn to_float_for_ufunc(self) -> DType {
        match self {
            DType::Bool | DType::I8 | DType::U8 | DType::I16 | DType::U16 => DType::F32,
            DType::I32 | DType::U32 | DType::I64 | DType::U64 => DType::F64,
            d => d,
        }
    }

    /// Integer bit width (for ints), 1 for bool.
    fn int_bits(self) -> u32 {
        (self.size() * 8) as u32
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// numpy's `result_type` for two array (or typed scalar) dtypes.
pub fn promote(a: DType, b: DType) -> DType {
    use Kind::*;
    if a == b {
        return a;
    }
    match (a.kind(), b.kind()) {
        (Bool, _) => b,
        (_, Bool) => a,
        (Int, Int) => promote_ints(a, b),
        (Int, Float) => promote_float(b, a.to_float_for_promotion()),
        (Float, Int) => promote_float(a, b.to_float_for_promotion()),
        (Float, Float) => {
            if a.size() >= b.size() {
                a
            } else {
                b
            }
        }
        (Complex, _) | (_, Complex) => {
            let ra = if a.kind() == Complex { a.real() } else { a };
            let rb = if b.kind() == Complex { b.real() } else { b };
            let r = promote(ra, rb);
            match r.kind() {
                Float => r.to_complex(),
                Int | Bool => r.to_float_for_promotion().to_complex(),
                Complex => r,
            }
        }
    }
}

impl DType {
    /// The float dtype an integer promotes to when combined with a float array.
    fn to_float_for_promotion(self) -> DType {
        match self {
            DType::Bool | DType::I8 | DType::U8 => DType::F32,
            DType::I16 | DType::U16 => DType::F32,
            DType::I32 | DType::U32 | DType::I64 | DType::U64 => DType::F64,
            d => d,
        }
    }
}

fn promote_float(f: DType, other_as_float: DType) -> DType {
    if other_as_float.size() > f.size() {
        other_as_float
    } else {
        f
    }
}

fn promote_ints(a: DType, b: DType) -> DType {
    let signed = |bits: u32| match bits {
        8 => DType::I8,
        16 => DType::I16,
        32 => DType::I32,
        _ => DType::I64,
    };
    match (a.is_unsigned(), b.is_unsigned()) {
        (true, true) | (false, false) => {
            if a.int_bits() >= b.int_bits() {
                a
            } else {
                b
            }
        }
        _ => {
            let (u, s) = if a.is_unsigned() { (a, b) } else { (b, a) };
            if s.int_bits() > u.int_bits() {
                s
            } else if u.int_bits() == 64 {
                DType::F64
            } else {
                signed(u.int_bits() * 2)
            }
        }
    }
}

/// The kind of a Python scalar in an expression: weak in promotion (NEP 50).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeakKind {
    /// Python `bool`.
    Bool,
    /// Python `int`.
    Int,
    /// Python `float`.
    Float,
    /// Python `complex`.
    Complex,
}

impl WeakKind {
    /// The dtype the scalar has on its own (numpy's default for Python values).
    pub fn default_dtype(self) -> DType {
        match self {
            WeakKind::Bool => DType::Bool,
            WeakKind::Int => DType::I64,
            WeakKind::Float => DType::F64,
            WeakKind::Complex => DType::C128,
        }
    }
}

/// The dtype of an operand in promotion: an array dtype, or a weak Python scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// An array or typed scalar.
    Strong(DType),
    /// A Python scalar.
    Weak(WeakKind),
}

/// numpy 2's `result_type` over operands where Python scalars are weak.
pub fn promote_operands(ops: &[Operand]) -> Operand {
    let strong: Vec<DType> = ops
        .iter()
        .filter_map(|o| match o {
            Operand::Strong(d) => Some(*d),
            Operand::Weak(_) => None,
        })
        .collect();
    let weak_max = ops
        .iter()
        .filter_map(|o| match o {
            Operand::Weak(k) => Some(*k),
            Operand::Strong(_) => None,
        })
        .max_by_key(|k| *k as u8);
    let Some(mut d) = strong.first().copied() else {
        return Operand::Weak(weak_max.unwrap_or(WeakKind::Int));
    };
    for s in &strong[1..] {
        d = promote(d, *s);
    }
    let Some(w) = weak_max else {
        return Operand::Strong(d);
    };
    let r = match (w, d.kind()) {
        (WeakKind::Bool, _) => d,
        (WeakKind::Int, Kind::Bool) => DType::I64,
        (WeakKind::Int, _) => d,
        (WeakKind::Float, Kind::Bool | Kind::Int) => DType::F64,
        (WeakKind::Float, _) => d,
        (WeakKind::Complex, Kind::Complex) => d,
        (WeakKind::Complex, Kind::Float) => d.to_complex(),
        (WeakKind::Complex, _) => DType::C128,
    };
    Operand::Strong(r)
}

impl Operand {
    /// The concrete dtype (weak scalars take numpy's default for their Python type).
    pub fn dtype(self) -> DType {
        match self {
            Operand::Strong(d) => d,
            Operand::Weak(k) => k.default_dtype(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_promotion_follows_numpy() {
        assert_eq!(promote(DType::I8, DType::U8), DType::I16);
        assert_eq!(promote(DType::U32, DType::I32), DType::I64);
        assert_eq!(promote(DType::U64, DType::I64), DType::F64);
        assert_eq!(promote(DType::U16, DType::I64), DType::I64);
        assert_eq!(promote(DType::Bool, DType::U8), DType::U8);
    }

    #[test]
    fn float_promotion_follows_numpy() {
        assert_eq!(promote(DType::I16, DType::F32), DType::F32);
        assert_eq!(promote(DType::I32, DType::F32), DType::F64);
        assert_eq!(promote(DType::F32, DType::C64), DType::C64);
        assert_eq!(promote(DType::F64, DType::C64), DType::C128);
        assert_eq!(promote(DType::I64, DType::C64), DType::C128);
    }

    #[test]
    fn python_scalars_are_weak() {
        let f32 = Operand::Strong(DType::F32);
        assert_eq!(
            promote_operands(&[f32, Operand::Weak(WeakKind::Int)]),
            Operand::Strong(DType::F32)
        );
        assert_eq!(
            promote_operands(&[Operand::Strong(DType::I8), Operand::Weak(WeakKind::Float)]),
            Operand::Strong(DType::F64)
        );
        assert_eq!(
            promote_operands(&[f32, Operand::Weak(WeakKind::Complex)]),
            Operand::Strong(DType::C64)
        );
        assert_eq!(
            promote_operands(&[Operand::Strong(DType::Bool), Operand::Weak(WeakKind::Int)]),
            Operand::Strong(DType::I64)
        );
    }

    #[test]
    fn parse_round_trips_every_name() {
        for d in ALL_DTYPES {
            assert_eq!(DType::parse(d.name()).ok(), Some(d));
        }
        assert!(DType::parse("float16").is_err());
    }
}
