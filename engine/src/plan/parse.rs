//! JSON → [`Plan`], reporting the JSON path of every bad field.

use std::collections::HashSet;

use serde_json::Value;

use super::{
    ArrayDecl, Expr, FftDecl, FftKind, Func, GroupDecl, Op, OpDecl, Plan, ReduceFunc, Scalar,
    SliceItem, WriteSpec,
};
use crate::array::DType;
use crate::error::{Error, Result};
use crate::zarr::Codec;
use crate::{plan_bail, plan_ensure};

/// A JSON object with its path, for field access with good errors.
struct Obj<'a> {
    map: &'a serde_json::Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, path: &str) -> Result<Self> {
        match v.as_object() {
            Some(map) => Ok(Obj {
                map,
                path: path.to_string(),
            }),
            None => Err(Error::plan(
                path,
                format!("expected an object, got {}", kind(v)),
            )),
        }
    }

    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn req(&self, key: &str) -> Result<&'a Value> {
        self.get(key)
            .ok_or_else(|| Error::plan(&self.path, format!("missing field \"{key}\"")))
    }

    fn str(&self, key: &str) -> Result<&'a str> {
        let v = self.req(key)?;
        v.as_str()
            .ok_or_else(|| Error::plan(self.at(key), format!("expected a string, got {}", kind(v))))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.str(key).map(Some),
        }
    }

    fn opt_bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::plan(
                    self.at(key),
                    format!("expected true or false, got {}", kind(v)),
                )
            }),
        }
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let path = self.at(key);
        let items = v.as_array().ok_or_else(|| {
            Error::plan(
                &path,
                format!("expected a list of integers, got {}", kind(v)),
            )
        })?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_i64().ok_or_else(|| {
                    Error::plan(
                        format!("{path}[{i}]"),
                        format!("expected an integer, got {}", kind(x)),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// Positive sizes, or -1 for "the whole axis" (returned as 0, resolved against the shape).
    fn sizes(&self, key: &str) -> Result<Option<Vec<u64>>> {
        let Some(v) = self.ints(key)? else {
            return Ok(None);
        };
        for (i, x) in v.iter().enumerate() {
            plan_ensure!(
                *x > 0 || *x == -1,
                format!("{}[{i}]", self.at(key)),
                "must be a positive integer or -1 (the whole axis), got {x}"
            );
        }
        Ok(Some(v.into_iter().map(|x| x.max(0) as u64).collect()))
    }

    fn dtype(&self, key: &str) -> Result<Option<DType>> {
        match self.opt_str(key)? {
            None => Ok(None),
            Some(s) => DType::parse(s)
                .map(Some)
                .map_err(|e| e.with_field(self.at(key))),
        }
    }

    fn check_keys(&self, allowed: &[&str]) -> Result<()> {
        for k in self.map.keys() {
            plan_ensure!(
                allowed.contains(&k.as_str()),
                self.at(k),
                "unknown field \"{k}\"; expected one of {}",
                allowed.join(", ")
            );
        }
        Ok(())
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn list<'a>(v: &'a Value, path: &str) -> Result<&'a Vec<Value>> {
    v.as_array()
        .ok_or_else(|| Error::plan(path, format!("expected a list, got {}", kind(v))))
}

/// Parses a whole plan.
pub fn plan(v: &Value) -> Result<Plan> {
    let top = Obj::new(v, "")?;
    top.check_keys(&[
        "name",
        "description",
        "params",
        "arrays",
        "ops",
        "groups",
        "version",
    ])?;
    let name = top.opt_str("name")?.unwrap_or("plan").to_string();
    let mut ids = HashSet::new();
    let mut arrays = Vec::new();
    if let Some(a) = top.get("arrays") {
        for (i, item) in list(a, "arrays")?.iter().enumerate() {
            let path = format!("arrays[{i}]");
            let o = Obj::new(item, &path)?;
            o.check_keys(&["id", "zarr", "shape", "dtype", "chunks"])?;
            let id = o.str("id")?.to_string();
            plan_ensure!(ids.insert(id.clone()), o.at("id"), "duplicate id \"{id}\"");
            let shape = o
                .ints("shape")?
                .map(|s| s.into_iter().map(|x| x.max(0) as u64).collect());
            arrays.push(ArrayDecl {
                id,
                url: o.str("zarr")?.to_string(),
                shape,
                dtype: o.dtype("dtype")?,
                field: path,
            });
        }
    }
    let ops_v = top.req("ops")?;
    let mut ops = Vec::new();
    for (i, item) in list(ops_v, "ops")?.iter().enumerate() {
        let path = format!("ops[{i}]");
        let o = Obj::new(item, &path)?;
        let id = o.str("id")?.to_string();
        plan_ensure!(ids.insert(id.clone()), o.at("id"), "duplicate id \"{id}\"");
        let op = op(&o)?;
        ops.push(OpDecl {
            id,
            op,
            field: path,
        });
    }
    plan_ensure!(!ops.is_empty(), "ops", "a plan needs at least one op");
    let groups = match top.get("groups") {
        None => Vec::new(),
        Some(g) => list(g, "groups")?
            .iter()
            .enumerate()
            .map(|(i, item)| group(&Obj::new(item, &format!("groups[{i}]"))?))
            .collect::<Result<Vec<_>>>()?,
    };
    Ok(Plan {
        name,
        arrays,
        ops,
        groups,
    })
}

/// A group the plan writes: `target`, `metadata_from` (a group URL), `zarr_format`,
/// `consolidated`, `overwrite`.
fn group(o: &Obj) -> Result<GroupDecl> {
    o.check_keys(&[
        "target",
        "metadata_from",
        "zarr_format",
        "consolidated",
        "overwrite",
    ])?;
    let consolidated = match o.get("consolidated") {
        None => None,
        Some(_) => Some(o.opt_bool("consolidated", false)?),
    };
    Ok(GroupDecl {
        target: o.str("target")?.to_string(),
        metadata_from: o.opt_str("metadata_from")?.map(str::to_string),
        zarr_format: zarr_format(o)?,
        consolidated,
        overwrite: o.opt_bool("overwrite", true)?,
        field: o.path.clone(),
    })
}

/// An object's `zarr_format`: 2 or 3 (the default).
fn zarr_format(o: &Obj) -> Result<u8> {
    Ok(match o.get("zarr_format") {
        None => 3,
        Some(v) => match v.as_u64() {
            Some(2) => 2,
            Some(3) => 3,
            _ => plan_bail!(o.at("zarr_format"), "must be 2 or 3, got {v}"),
        },
    })
}

fn op(o: &Obj) -> Result<Op> {
    let name = o.str("op")?;
    Ok(match name {
        "elementwise" => {
            o.check_keys(&["id", "op", "inputs", "expr"])?;
            let inputs_v = o.req("inputs")?;
            let inputs = list(inputs_v, &o.at("inputs"))?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(String::from).ok_or_else(|| {
                        Error::plan(
                            format!("{}[{i}]", o.at("inputs")),
                            "expected an array id (a string)",
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let expr = expr(o.req("expr")?, &o.at("expr"), inputs.len())?;
            Op::Elementwise { inputs, expr }
        }
        "reduce" => {
            o.check_keys(&[
                "id", "op", "input", "func", "axes", "axis", "keepdims", "dtype", "ddof",
            ])?;
            let fname = o.str("func")?;
            let func = ReduceFunc::ALL
                .iter()
                .find(|(n, _)| *n == fname)
                .map(|(_, f)| *f)
                .ok_or_else(|| {
                    let names: Vec<&str> = ReduceFunc::ALL.iter().map(|(n, _)| *n).collect();
                    Error::plan(
                        o.at("func"),
                        format!(
                            "unknown reduction \"{fname}\"; must be one of {}",
                            names.join(", ")
                        ),
                    )
                })?;
            let axes = match (o.get("axes"), o.get("axis")) {
                (Some(_), _) => o.ints("axes")?,
                (None, Some(v)) => Some(vec![v.as_i64().ok_or_else(|| {
                    Error::plan(
                        o.at("axis"),
                        format!("expected an integer, got {}", kind(v)),
                    )
                })?]),
                (None, None) => None,
            };
            let ddof = match o.get("ddof") {
                None => 0.0,
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| Error::plan(o.at("ddof"), "expected a number"))?,
            };
            Op::Reduce {
                input: o.str("input")?.to_string(),
                func,
                axes,
                keepdims: o.opt_bool("keepdims", false)?,
                dtype: o.dtype("dtype")?,
                ddof,
            }
        }
        "rechunk" => {
            o.check_keys(&["id", "op", "input", "chunks"])?;
            let chunks = o
                .ints("chunks")?
                .ok_or_else(|| Error::plan(&o.path, "missing field \"chunks\""))?;
            for (i, c) in chunks.iter().enumerate() {
                plan_ensure!(
                    *c > 0 || *c == -1,
                    format!("{}[{i}]", o.at("chunks")),
                    "chunk sizes must be positive (or -1 for the whole axis), got {c}"
                );
            }
            Op::Rechunk {
                input: o.str("input")?.to_string(),
                chunks,
            }
        }
        "slice" => {
            o.check_keys(&["id", "op", "input", "selection"])?;
            let sel_path = o.at("selection");
            let items = list(o.req("selection")?, &sel_path)?;
            let selection = items
                .iter()
                .enumerate()
                .map(|(i, v)| slice_item(v, &format!("{sel_path}[{i}]")))
                .collect::<Result<Vec<_>>>()?;
            Op::Slice {
                input: o.str("input")?.to_string(),
                selection,
            }
        }
        "transpose" => {
            o.check_keys(&["id", "op", "input", "axes"])?;
            let axes = match o.get("axes") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    let path = o.at("axes");
                    let items = list(v, &path)?;
                    let axes = items
                        .iter()
                        .enumerate()
                        .map(|(i, a)| {
                            a.as_i64().ok_or_else(|| {
                                Error::plan(format!("{path}[{i}]"), "expected an integer")
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Some(axes)
                }
            };
            Op::Transpose {
                input: o.str("input")?.to_string(),
                axes,
            }
        }
        "concat" => {
            o.check_keys(&["id", "op", "inputs", "axis"])?;
            let path = o.at("inputs");
            let inputs = list(o.req("inputs")?, &path)?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        Error::plan(format!("{path}[{i}]"), "expected an array or op id")
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            plan_ensure!(!inputs.is_empty(), path, "concat needs at least one input");
            let axis = match o.get("axis") {
                None => 0,
                Some(v) => v
                    .as_i64()
                    .ok_or_else(|| Error::plan(o.at("axis"), "expected an integer"))?,
            };
            Op::Concat { inputs, axis }
        }
        "write" => {
            o.check_keys(&[
                "id",
                "op",
                "input",
                "target",
                "chunks",
                "shards",
                "codec",
                "zarr_format",
                "overwrite",
                "existing",
                "region",
                "metadata_from",
            ])?;
            let existing = o.opt_bool("existing", false)?;
            let region = o.ints("region")?;
            plan_ensure!(
                region.is_none() || existing,
                o.at("region"),
                "\"region\" writes into an existing array: it needs \"existing\": true"
            );
            if let Some(r) = &region {
                for (i, x) in r.iter().enumerate() {
                    plan_ensure!(
                        *x >= 0,
                        format!("{}[{i}]", o.at("region")),
                        "must be a start index (0 or more), got {x}"
                    );
                }
            }
            if existing {
                for key in [
                    "chunks",
                    "shards",
                    "codec",
                    "zarr_format",
                    "overwrite",
                    "metadata_from",
                ] {
                    plan_ensure!(
                        o.get(key).is_none(),
                        o.at(key),
                        "\"{key}\" cannot be given with \"existing\": the existing array's is used"
                    );
                }
            }
            let codec = match o.get("codec") {
                None => Codec::default(),
                Some(v) => codec(v, &o.at("codec"))?,
            };
            let zarr_format = zarr_format(o)?;
            let shards = o.sizes("shards")?;
            plan_ensure!(
                shards.is_none() || zarr_format == 3,
                o.at("shards"),
                "shards need Zarr v3 (zarr_format 3)"
            );
            Op::Write {
                input: o.str("input")?.to_string(),
                spec: WriteSpec {
                    target: o.str("target")?.to_string(),
                    chunks: o.sizes("chunks")?,
                    shards,
                    codec,
                    zarr_format,
                    overwrite: o.opt_bool("overwrite", true)?,
                    existing,
                    region: region.map(|r| r.into_iter().map(|x| x as u64).collect()),
                    metadata_from: o.opt_str("metadata_from")?.map(str::to_string),
                    copied: Default::default(),
                },
            }
        }
        "fft" => fft(o)?,
        other => plan_bail!(
            o.at("op"),
            "unknown op \"{other}\"; must be one of elementwise, reduce, rechunk, slice, concat, fft, write"
        ),
    })
}

/// An `fft` op: `kind`, `axis` or `axes`, `n` (1-d kinds) or `s` (n-d kinds), `norm`.
fn fft(o: &Obj) -> Result<Op> {
    o.check_keys(&[
        "id", "op", "input", "kind", "axis", "axes", "n", "s", "norm",
    ])?;
    let kname = o.str("kind")?;
    let (base, nd) = match kname.strip_suffix('n') {
        Some(b) if FftKind::ALL.iter().any(|(n, _)| *n == b) => (b, true),
        _ => (kname, false),
    };
    let fft_kind = FftKind::ALL
        .iter()
        .find(|(n, _)| *n == base)
        .map(|(_, k)| *k)
        .ok_or_else(|| {
            Error::plan(
                o.at("kind"),
                format!(
                    "unknown FFT \"{kname}\"; must be one of fft, ifft, rfft, irfft, fftn, ifftn, rfftn, irfftn"
                ),
            )
        })?;
    let one_int = |key: &str| -> Result<Option<Vec<i64>>> {
        match o.get(key) {
            None => Ok(None),
            Some(v) => v.as_i64().map(|i| Some(vec![i])).ok_or_else(|| {
                Error::plan(o.at(key), format!("expected an integer, got {}", kind(v)))
            }),
        }
    };
    let axes = match (nd, o.get("axes").is_some(), o.get("axis").is_some()) {
        (true, _, true) => plan_bail!(
            o.at("axis"),
            "{kname} takes \"axes\" (a list), not \"axis\""
        ),
        (false, true, _) => plan_bail!(
            o.at("axes"),
            "{kname} takes \"axis\" (one integer), not \"axes\""
        ),
        (true, _, false) => o.ints("axes")?,
        (false, _, _) => one_int("axis")?,
    };
    let lengths = match (nd, o.get("n").is_some(), o.get("s").is_some()) {
        (true, true, _) => plan_bail!(
            o.at("n"),
            "{kname} takes \"s\" (a list of lengths), not \"n\""
        ),
        (false, _, true) => plan_bail!(o.at("s"), "{kname} takes \"n\" (one length), not \"s\""),
        (true, _, _) => o.ints("s")?,
        (false, _, _) => one_int("n")?,
    };
    let lengths_key = if nd { "s" } else { "n" };
    for (i, n) in lengths.iter().flatten().enumerate() {
        plan_ensure!(
            *n > 0,
            if nd {
                format!("{}[{i}]", o.at(lengths_key))
            } else {
                o.at(lengths_key)
            },
            "FFT lengths must be positive, got {n}"
        );
    }
    let norm = match o.opt_str("norm")? {
        None => crate::kernels::fft::FftNorm::Backward,
        Some(n) => crate::kernels::fft::FftNorm::parse(n).ok_or_else(|| {
            Error::plan(
                o.at("norm"),
                format!("unknown norm \"{n}\"; must be one of backward, ortho, forward"),
            )
        })?,
    };
    Ok(Op::Fft {
        input: o.str("input")?.to_string(),
        fft: FftDecl {
            kind: fft_kind,
            nd,
            axes,
            lengths,
            norm,
        },
    })
}

fn codec(v: &Value, path: &str) -> Result<Codec> {
    let o = Obj::new(v, path)?;
    o.check_keys(&["name", "level", "cname", "clevel", "shuffle"])?;
    let int = |key: &str, default: i64| -> Result<i64> {
        match o.get(key) {
            None => Ok(default),
            Some(v) => v.as_i64().ok_or_else(|| {
                Error::plan(o.at(key), format!("expected an integer, got {}", kind(v)))
            }),
        }
    };
    let c = match o.str("name")? {
        "zstd" => Codec::Zstd {
            level: int("level", 3)? as i32,
        },
        "gzip" => Codec::Gzip {
            level: int("level", 5)?.clamp(0, 100) as u32,
        },
        "blosc" => Codec::Blosc {
            cname: o.opt_str("cname")?.unwrap_or("lz4").to_string(),
            clevel: int("clevel", 5)?.clamp(0, 255) as u8,
            shuffle: o.opt_str("shuffle")?.unwrap_or("shuffle").to_string(),
        },
        "none" => Codec::None,
        other => plan_bail!(
            o.at("name"),
            "unknown codec \"{other}\"; must be zstd, blosc, gzip or none"
        ),
    };
    c.validate().map_err(|e| e.with_field(path))?;
    Ok(c)
}

fn slice_item(v: &Value, path: &str) -> Result<SliceItem> {
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

/// Parses an expression; `n_inputs` bounds `{"input": i}`.
pub fn expr(v: &Value, path: &str, n_inputs: usize) -> Result<Expr> {
    let o = Obj::new(v, path)?;
    if let Some(i) = o.get("input") {
        o.check_keys(&["input"])?;
        let i = i.as_u64().ok_or_else(|| {
            Error::plan(o.at("input"), "expected an input index (an integer ≥ 0)")
        })?;
        plan_ensure!(
            (i as usize) < n_inputs,
            o.at("input"),
            "input {i} does not exist: the op has {n_inputs} input(s)"
        );
        return Ok(Expr::Input(i as usize));
    }
    if let Some(c) = o.map.get("const") {
        o.check_keys(&["const", "dtype"])?;
        return Ok(Expr::Const(scalar(c, &o.at("const"))?, o.dtype("dtype")?));
    }
    let name = o.str("op").map_err(|_| {
        Error::plan(
            path,
            "an expression is {\"input\": i}, {\"const\": v} or {\"op\": NAME, \"args\": [...]}",
        )
    })?;
    o.check_keys(&["op", "args", "dtype"])?;
    let args_path = o.at("args");
    let args_v = list(o.req("args")?, &args_path)?;
    let args = args_v
        .iter()
        .enumerate()
        .map(|(i, a)| expr(a, &format!("{args_path}[{i}]"), n_inputs))
        .collect::<Result<Vec<_>>>()?;
    if name == "astype" {
        plan_ensure!(
            args.len() == 1,
            &args_path,
            "astype takes 1 argument, got {}",
            args.len()
        );
        let dtype = o
            .dtype("dtype")?
            .ok_or_else(|| Error::plan(path, "astype needs \"dtype\""))?;
        let mut args = args;
        return Ok(Expr::AsType(dtype, Box::new(args.remove(0))));
    }
    let func = Func::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Func::ALL.iter().map(|(n, _)| *n).collect();
        Error::plan(
            o.at("op"),
            format!(
                "unknown function \"{name}\"; must be astype or one of {}",
                names.join(", ")
            ),
        )
    })?;
    plan_ensure!(
        args.len() == func.arity(),
        &args_path,
        "{name} takes {} argument(s), got {}",
        func.arity(),
        args.len()
    );
    Ok(Expr::Call(func, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_function_names_its_path() {
        let v = json!({"ops": [{"id": "y", "op": "elementwise", "inputs": ["x"],
            "expr": {"op": "add", "args": [{"op": "ad", "args": []}, {"const": 1}]}}]});
        let e = plan(&v).unwrap_err();
        assert_eq!(e.context.field.as_deref(), Some("ops[0].expr.args[0].op"));
    }

    #[test]
    fn unknown_op_names_its_path() {
        let v = json!({"ops": [{"id": "y", "op": "reshape", "input": "x"}]});
        let e = plan(&v).unwrap_err();
        assert_eq!(e.context.field.as_deref(), Some("ops[0].op"));
    }

    #[test]
    fn parses_the_era5_sum_shape() {
        let v = json!({"arrays": [{"id": "x", "zarr": "/d"}], "ops": [
            {"id": "y", "op": "elementwise", "inputs": ["x"], "expr": {"op": "multiply", "args": [
                {"op": "add", "args": [{"input": 0}, {"const": 1}]}, {"const": 2}]}},
            {"id": "s", "op": "reduce", "input": "y", "func": "sum", "axes": [0]},
            {"id": "o", "op": "write", "input": "s", "target": "/t"}]});
        let p = plan(&v).unwrap();
        assert_eq!(p.ops.len(), 3);
        assert!(matches!(
            p.ops[1].op,
            Op::Reduce {
                func: ReduceFunc::Sum,
                ..
            }
        ));
    }
}
