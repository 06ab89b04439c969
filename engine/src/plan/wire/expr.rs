//! The wire type of an elementwise expression: `{"input": i}`, `{"const": v}` or
//! `{"op": NAME, "args": [...]}`, told apart by which of `input`, `const` and `op` it has.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::path::{at, variant};

/// An expression node.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ExprWire {
    /// One of the op's inputs.
    Input(InputExpr),
    /// A scalar.
    Const(ConstExpr),
    /// A numpy ufunc, or `astype`.
    Call(CallExpr),
}

/// `{"input": i}`: the i-th array of the op's `inputs`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputExpr {
    /// Index into the op's `inputs`.
    pub input: u64,
}

/// `{"const": v, "dtype": D}`: a scalar; weak in type promotion (a Python scalar) without
/// `dtype`, a numpy scalar with one.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstExpr {
    /// A number, a boolean, `"nan"`, `"inf"`, `"-inf"` or `[re, im]`.
    #[serde(rename = "const")]
    #[schemars(with = "ConstSchema")]
    pub value: Value,
    /// The scalar's dtype (a numpy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// The shapes of a constant (for the schema only).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ConstSchema {
    Bool(bool),
    Number(f64),
    Special(Special),
    Complex([Real; 2]),
}

/// A real part (for the schema only).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum Real {
    Bool(bool),
    Number(f64),
    Special(Special),
}

/// The non-finite floats by name (for the schema only).
#[derive(JsonSchema)]
#[allow(dead_code)]
enum Special {
    #[serde(rename = "nan")]
    Nan,
    #[serde(rename = "NaN")]
    NaN,
    #[serde(rename = "inf")]
    Inf,
    #[serde(rename = "Infinity")]
    Infinity,
    #[serde(rename = "-inf")]
    NegInf,
    #[serde(rename = "-Infinity")]
    NegInfinity,
}

/// `{"op": NAME, "args": [...]}`: a numpy ufunc by name, or `astype` with `dtype`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallExpr {
    /// The ufunc's name, or `astype`.
    pub op: String,
    /// Its arguments.
    pub args: Vec<ExprWire>,
    /// `astype`'s target dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

impl<'de> Deserialize<'de> for ExprWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(d)?;
        let has = |k: &str| map.get(k).is_some_and(|v| !v.is_null());
        if has("input") {
            Ok(ExprWire::Input(variant(map)?))
        } else if map.contains_key("const") {
            Ok(ExprWire::Const(variant(map)?))
        } else if has("op") {
            Ok(ExprWire::Call(variant(map)?))
        } else {
            Err(at(
                "",
                "an expression is {\"input\": i}, {\"const\": v} or {\"op\": NAME, \"args\": [...]}",
            ))
        }
    }
}
