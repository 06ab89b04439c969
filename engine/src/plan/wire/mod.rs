//! The plan IR's wire format: serde types of the JSON a plan is written in. They are the
//! reference for the format: docs/plan-ir.schema.json is generated from them ([`schema`]).
//! Every object refuses unknown fields, and every error names the JSON path of its field;
//! [`super::parse`] turns a [`PlanWire`] into a [`super::Plan`], checking values.

mod expr;
mod ops;
pub(crate) mod path;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use expr::{CallExpr, ConstExpr, ExprWire, InputExpr};
pub use ops::{
    CodecWire, ConcatOp, ElementwiseOp, FftOp, OpWire, RechunkOp, ReduceOp, SliceOp, TransposeOp,
    WriteOp,
};

/// The only plan format version: a plan's `version`, when given, must be this.
pub const VERSION: u64 = 1;

/// A whole plan.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "chunkfuse plan")]
pub struct PlanWire {
    /// The format version: 1 (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1))]
    pub version: Option<u64>,
    /// Shown in progress and errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The parameters the plan expects (`${NAME}` in its strings), each with a description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<BTreeMap<String, String>>,
    /// Input arrays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrays: Option<Vec<ArrayWire>>,
    /// Operations, in order; each produces the array named by its `id`.
    pub ops: Vec<OpWire>,
    /// Zarr groups the plan writes (the arrays in them are `write` targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<GroupWire>>,
}

/// An input array read from a Zarr store.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArrayWire {
    /// The id ops refer to (unique among arrays and ops).
    pub id: String,
    /// Store URL or path.
    pub zarr: String,
    /// Expected shape, checked against the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// Expected dtype (a numpy name), checked against the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// A Zarr group the plan writes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupWire {
    /// Store URL or path of the group.
    pub target: String,
    /// A group (URL) whose attributes the target takes (and whose consolidation, by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_from: Option<String>,
    /// 2 or 3 (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 3))]
    pub zarr_format: Option<u8>,
    /// Write consolidated metadata (default: when `metadata_from` has some).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidated: Option<bool>,
    /// Replace whatever is at `target` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
}

/// The JSON Schema of the plan format, as committed in docs/plan-ir.schema.json.
pub fn schema() -> serde_json::Value {
    serde_json::Value::from(schemars::schema_for!(PlanWire))
}
