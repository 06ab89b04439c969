//! Checks and conversions of the values inside ops: expressions, scalars, selections,
//! codecs, dtypes and sizes, each error naming its JSON path.

use serde_json::Value;

use crate::array::DType;
use crate::error::{Error, Result};
use crate::plan::wire::{CodecWire, ExprWire};
use crate::plan::{Expr, Func, Scalar, SliceItem};
use crate::zarr::Codec;
use crate::{plan_bail, plan_ensure};

/// What a JSON value is, in words.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A dtype by numpy name; `field` names where it is.
pub fn dtype(name: Option<&str>, field: impl FnOnce() -> String) -> Result<Option<DType>> {
    match name {
        None => Ok(None),
        Some(s) => DType::parse(s).map(Some).map_err(|e| e.with_field(field())),
    }
}

/// Sizes: positive, or -1 for "the whole axis" (returned as 0, resolved against the shape).
pub fn sizes(v: Option<&[i64]>, field: &str) -> Result<Option<Vec<u64>>> {
    let Some(v) = v else { return Ok(None) };
    for (i, x) in v.iter().enumerate() {
        plan_ensure!(
            *x > 0 || *x == -1,
            format!("{field}[{i}]"),
            "must be a positive integer or -1 (the whole axis), got {x}"
        );
    }
    Ok(Some(v.iter().map(|x| (*x).max(0) as u64).collect()))
}

/// Start indices (0 or more; `zero` allows 0).
pub fn positive(v: &[i64], field: &str, zero: bool) -> Result<Vec<u64>> {
    v.iter()
        .enumerate()
        .map(|(i, x)| {
            plan_ensure!(
                *x > 0 || (zero && *x == 0),
                format!("{field}[{i}]"),
                "must be a start index (0 or more), got {x}"
            );
            Ok(*x as u64)
        })
        .collect()
}

/// A write's codec.
pub fn codec(c: CodecWire, field: &str) -> Result<Codec> {
    let c = match c {
        CodecWire::Zstd { level } => Codec::Zstd {
            level: level.unwrap_or(3).clamp(i32::MIN as i64, i32::MAX as i64) as i32,
        },
        CodecWire::Gzip { level } => Codec::Gzip {
            level: level.unwrap_or(5).clamp(0, 100) as u32,
        },
        CodecWire::Blosc {
            cname,
            clevel,
            shuffle,
        } => Codec::Blosc {
            cname: cname.unwrap_or_else(|| "lz4".to_string()),
            clevel: clevel.unwrap_or(5).clamp(0, 255) as u8,
            shuffle: shuffle.unwrap_or_else(|| "shuffle".to_string()),
        },
        CodecWire::None {} => Codec::None,
    };
    c.validate().map_err(|e| e.with_field(field))?;
    Ok(c)
}

/// One selection item: an index, `null`, `[start, stop, step]` or `"newaxis"`.
pub fn slice_item(v: &Value, path: &str) -> Result<SliceItem> {
    let opt = |x: &Value, p: String| -> Result<Option<i64>> {
        if x.is_null() {
            return Ok(None);
        }
        x.as_i64()
            .map(Some)
            .ok_or_else(|| Error::plan(p, format!("expected an integer or null, got {}", kind(x))))
    };
    match v {
        Value::Null => Ok(SliceItem::Range {
            start: None,
            stop: None,
            step: 1,
        }),
        Value::Number(_) => Ok(SliceItem::Index(
            opt(v, path.to_string())?.ok_or_else(|| Error::plan(path, "expected an integer"))?,
        )),
        Value::Array(items) => {
            plan_ensure!(
                (1..=3).contains(&items.len()),
                path,
                "a range is [start, stop] or [start, stop, step]"
            );
            let start = opt(&items[0], format!("{path}[0]"))?;
            let stop = match items.get(1) {
                Some(x) => opt(x, format!("{path}[1]"))?,
                None => None,
            };
            let step = match items.get(2) {
                Some(x) => opt(x, format!("{path}[2]"))?.unwrap_or(1),
                None => 1,
            };
            plan_ensure!(step != 0, format!("{path}[2]"), "step must not be 0");
            Ok(SliceItem::Range { start, stop, step })
        }
        Value::String(s) if s == "newaxis" => Ok(SliceItem::NewAxis),
        other => plan_bail!(
            path,
            "expected an integer, null, [start, stop, step] or \"newaxis\", got {}",
            kind(other)
        ),
    }
}

/// A constant's value.
fn scalar(v: &Value, path: &str) -> Result<Scalar> {
    match v {
        Value::Bool(b) => Ok(Scalar::Bool(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(Scalar::Int(i as i128))
            } else if let Some(u) = n.as_u64() {
                Ok(Scalar::Int(u as i128))
            } else {
                Ok(Scalar::Float(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Value::String(s) => match s.as_str() {
            "nan" | "NaN" => Ok(Scalar::Float(f64::NAN)),
            "inf" | "Infinity" => Ok(Scalar::Float(f64::INFINITY)),
            "-inf" | "-Infinity" => Ok(Scalar::Float(f64::NEG_INFINITY)),
            _ => plan_bail!(path, "expected a number, got the string \"{s}\""),
        },
        Value::Array(parts) if parts.len() == 2 => {
            let re = scalar(&parts[0], &format!("{path}[0]"))?;
            let im = scalar(&parts[1], &format!("{path}[1]"))?;
            let f = |s: Scalar| match s {
                Scalar::Bool(b) => b as u8 as f64,
                Scalar::Int(i) => i as f64,
                Scalar::Float(x) => x,
                Scalar::Complex(x, _) => x,
            };
            Ok(Scalar::Complex(f(re), f(im)))
        }
        other => plan_bail!(
            path,
            "expected a number, boolean or [re, im], got {}",
            kind(other)
        ),
    }
}

/// An expression; `n_inputs` bounds `{"input": i}`.
pub fn expr(e: ExprWire, path: &str, n_inputs: usize) -> Result<Expr> {
    match e {
        ExprWire::Input(i) => {
            plan_ensure!(
                (i.input as usize) < n_inputs,
                format!("{path}.input"),
                "input {} does not exist: the op has {n_inputs} input(s)",
                i.input
            );
            Ok(Expr::Input(i.input as usize))
        }
        ExprWire::Const(c) => Ok(Expr::Const(
            scalar(&c.value, &format!("{path}.const"))?,
            dtype(c.dtype.as_deref(), || format!("{path}.dtype"))?,
        )),
        ExprWire::Call(call) => {
            let args_path = format!("{path}.args");
            let n_args = call.args.len();
            let mut args = call
                .args
                .into_iter()
                .enumerate()
                .map(|(i, a)| expr(a, &format!("{args_path}[{i}]"), n_inputs))
                .collect::<Result<Vec<_>>>()?;
            let name = call.op.as_str();
            if name == "astype" {
                plan_ensure!(
                    n_args == 1,
                    &args_path,
                    "astype takes 1 argument, got {n_args}"
                );
                let dtype = dtype(call.dtype.as_deref(), || format!("{path}.dtype"))?
                    .ok_or_else(|| Error::plan(path, "astype needs \"dtype\""))?;
                return Ok(Expr::AsType(dtype, Box::new(args.remove(0))));
            }
            plan_ensure!(
                call.dtype.is_none(),
                format!("{path}.dtype"),
                "only astype takes \"dtype\"; {name} computes its result dtype"
            );
            let func = Func::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = Func::ALL.iter().map(|(n, _)| *n).collect();
                Error::plan(
                    format!("{path}.op"),
                    format!(
                        "unknown function \"{name}\"; must be astype or one of {}",
                        names.join(", ")
                    ),
                )
            })?;
            plan_ensure!(
                n_args == func.arity(),
                &args_path,
                "{name} takes {} argument(s), got {n_args}",
                func.arity()
            );
            Ok(Expr::Call(func, args))
        }
    }
}
