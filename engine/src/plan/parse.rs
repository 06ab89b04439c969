//! JSON → [`Plan`]: the document is read into the wire types of [`super::wire`] (shape,
//! field names and types, with the JSON path of any bad field), then each value is checked
//! and converted here, again naming its path.

mod values;

use std::collections::HashSet;

use serde_json::Value;

use super::fft_params::FftNorm;
use super::wire::{self, ArrayWire, GroupWire, OpWire, PlanWire, WriteOp};
use super::{ArrayDecl, FftDecl, FftKind, GroupDecl, Op, OpDecl, Plan, ReduceFunc, WriteSpec};
use crate::error::{Error, Result};
use crate::zarr::Codec;
use crate::{plan_bail, plan_ensure};
use values::{codec, dtype, expr, positive, sizes, slice_item};

/// Parses a whole plan.
pub fn plan(v: &Value) -> Result<Plan> {
    plan_ensure!(
        v.is_object(),
        "",
        "a plan is a JSON object, got {}",
        values::kind(v)
    );
    let wire: PlanWire = wire::path::document(v)?;
    convert(wire)
}

/// Checks and converts a plan read from its wire form.
fn convert(wire: PlanWire) -> Result<Plan> {
    if let Some(v) = wire.version {
        plan_ensure!(
            v == wire::VERSION,
            "version",
            "unsupported plan version {v}; this engine reads version {}",
            wire::VERSION
        );
    }
    let mut ids = HashSet::new();
    let arrays = wire
        .arrays
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, a)| array(a, format!("arrays[{i}]"), &mut ids))
        .collect::<Result<Vec<_>>>()?;
    plan_ensure!(!wire.ops.is_empty(), "ops", "a plan needs at least one op");
    let ops = wire
        .ops
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            let field = format!("ops[{i}]");
            let id = o.id().to_string();
            plan_ensure!(
                ids.insert(id.clone()),
                format!("{field}.id"),
                "duplicate id \"{id}\""
            );
            Ok(OpDecl {
                id,
                op: op(o, &field)?,
                field,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let groups = wire
        .groups
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, g)| group(g, format!("groups[{i}]")))
        .collect::<Result<Vec<_>>>()?;
    Ok(Plan {
        name: wire.name.unwrap_or_else(|| "plan".to_string()),
        arrays,
        ops,
        groups,
    })
}

/// An input array; its id must be new.
fn array(a: ArrayWire, field: String, ids: &mut HashSet<String>) -> Result<ArrayDecl> {
    plan_ensure!(
        ids.insert(a.id.clone()),
        format!("{field}.id"),
        "duplicate id \"{}\"",
        a.id
    );
    Ok(ArrayDecl {
        dtype: dtype(a.dtype.as_deref(), || format!("{field}.dtype"))?,
        id: a.id,
        url: a.zarr,
        shape: a.shape,
        field,
    })
}

/// A group the plan writes.
fn group(g: GroupWire, field: String) -> Result<GroupDecl> {
    Ok(GroupDecl {
        zarr_format: zarr_format(g.zarr_format, &field)?,
        target: g.target,
        metadata_from: g.metadata_from,
        consolidated: g.consolidated,
        overwrite: g.overwrite.unwrap_or(true),
        field,
    })
}

/// A `zarr_format`: 2 or 3 (the default).
fn zarr_format(v: Option<u8>, field: &str) -> Result<u8> {
    match v {
        None => Ok(3),
        Some(f @ (2 | 3)) => Ok(f),
        Some(f) => plan_bail!(format!("{field}.zarr_format"), "must be 2 or 3, got {f}"),
    }
}

fn op(o: OpWire, field: &str) -> Result<Op> {
    let at = |key: &str| format!("{field}.{key}");
    Ok(match o {
        OpWire::Elementwise(e) => {
            let n = e.inputs.len();
            Op::Elementwise {
                expr: expr(e.expr, &at("expr"), n)?,
                inputs: e.inputs,
            }
        }
        OpWire::Reduce(r) => {
            let func = ReduceFunc::ALL
                .iter()
                .find(|(n, _)| *n == r.func)
                .map(|(_, f)| *f)
                .ok_or_else(|| {
                    let names: Vec<&str> = ReduceFunc::ALL.iter().map(|(n, _)| *n).collect();
                    Error::plan(
                        at("func"),
                        format!(
                            "unknown reduction \"{}\"; must be one of {}",
                            r.func,
                            names.join(", ")
                        ),
                    )
                })?;
            plan_ensure!(
                r.axes.is_none() || r.axis.is_none(),
                at("axis"),
                "give \"axes\" or \"axis\", not both"
            );
            Op::Reduce {
                axes: r.axes.or(r.axis.map(|a| vec![a])),
                keepdims: r.keepdims.unwrap_or(false),
                dtype: dtype(r.dtype.as_deref(), || at("dtype"))?,
                ddof: r.ddof.unwrap_or(0.0),
                input: r.input,
                func,
            }
        }
        OpWire::Rechunk(r) => {
            for (i, c) in r.chunks.iter().enumerate() {
                plan_ensure!(
                    *c > 0 || *c == -1,
                    format!("{}[{i}]", at("chunks")),
                    "chunk sizes must be positive (or -1 for the whole axis), got {c}"
                );
            }
            Op::Rechunk {
                input: r.input,
                chunks: r.chunks,
            }
        }
        OpWire::Slice(s) => Op::Slice {
            selection: s
                .selection
                .iter()
                .enumerate()
                .map(|(i, v)| slice_item(&v.0, &format!("{}[{i}]", at("selection"))))
                .collect::<Result<Vec<_>>>()?,
            input: s.input,
        },
        OpWire::Transpose(t) => Op::Transpose {
            input: t.input,
            axes: t.axes,
        },
        OpWire::Concat(c) => {
            plan_ensure!(
                !c.inputs.is_empty(),
                at("inputs"),
                "concat needs at least one input"
            );
            Op::Concat {
                inputs: c.inputs,
                axis: c.axis.unwrap_or(0),
            }
        }
        OpWire::Fft(f) => fft(f, field)?,
        OpWire::Write(w) => write(w, field)?,
    })
}

/// A `write` op.
fn write(w: WriteOp, field: &str) -> Result<Op> {
    let at = |key: &str| format!("{field}.{key}");
    let existing = w.existing.unwrap_or(false);
    plan_ensure!(
        w.region.is_none() || existing,
        at("region"),
        "\"region\" writes into an existing array: it needs \"existing\": true"
    );
    if existing {
        let given = [
            ("chunks", w.chunks.is_some()),
            ("shards", w.shards.is_some()),
            ("codec", w.codec.is_some()),
            ("zarr_format", w.zarr_format.is_some()),
            ("overwrite", w.overwrite.is_some()),
            ("metadata_from", w.metadata_from.is_some()),
        ];
        if let Some((key, _)) = given.iter().find(|(_, g)| *g) {
            plan_bail!(
                at(key),
                "\"{key}\" cannot be given with \"existing\": the existing array's is used"
            );
        }
    }
    let region = match w.region {
        None => None,
        Some(r) => Some(positive(&r, &at("region"), true)?),
    };
    let codec = match w.codec {
        None => Codec::default(),
        Some(c) => codec(c, &at("codec"))?,
    };
    let zarr_format = zarr_format(w.zarr_format, field)?;
    let shards = sizes(w.shards.as_deref(), &at("shards"))?;
    plan_ensure!(
        shards.is_none() || zarr_format == 3,
        at("shards"),
        "shards need Zarr v3 (zarr_format 3)"
    );
    Ok(Op::Write {
        input: w.input,
        spec: WriteSpec {
            target: w.target,
            chunks: sizes(w.chunks.as_deref(), &at("chunks"))?,
            shards,
            codec,
            zarr_format,
            overwrite: w.overwrite.unwrap_or(true),
            existing,
            region,
            metadata_from: w.metadata_from,
            copied: Default::default(),
        },
    })
}

/// An `fft` op: `kind`, `axis` or `axes`, `n` (1-d kinds) or `s` (n-d kinds), `norm`.
fn fft(f: wire::FftOp, field: &str) -> Result<Op> {
    let at = |key: &str| format!("{field}.{key}");
    let kname = f.kind.as_str();
    let (base, nd) = match kname.strip_suffix('n') {
        Some(b) if FftKind::ALL.iter().any(|(n, _)| *n == b) => (b, true),
        _ => (kname, false),
    };
    let kind = FftKind::ALL
        .iter()
        .find(|(n, _)| *n == base)
        .map(|(_, k)| *k)
        .ok_or_else(|| {
            Error::plan(
                at("kind"),
                format!(
                    "unknown FFT \"{kname}\"; must be one of fft, ifft, rfft, irfft, fftn, ifftn, rfftn, irfftn"
                ),
            )
        })?;
    if nd {
        plan_ensure!(
            f.axis.is_none(),
            at("axis"),
            "{kname} takes \"axes\" (a list), not \"axis\""
        );
        plan_ensure!(
            f.n.is_none(),
            at("n"),
            "{kname} takes \"s\" (a list of lengths), not \"n\""
        );
    } else {
        plan_ensure!(
            f.axes.is_none(),
            at("axes"),
            "{kname} takes \"axis\" (one integer), not \"axes\""
        );
        plan_ensure!(
            f.s.is_none(),
            at("s"),
            "{kname} takes \"n\" (one length), not \"s\""
        );
    }
    let (axes, lengths) = if nd {
        (f.axes, f.s)
    } else {
        (f.axis.map(|a| vec![a]), f.n.map(|n| vec![n]))
    };
    for (i, n) in lengths.iter().flatten().enumerate() {
        plan_ensure!(
            *n > 0,
            if nd {
                format!("{}[{i}]", at("s"))
            } else {
                at("n")
            },
            "FFT lengths must be positive, got {n}"
        );
    }
    let norm = match f.norm.as_deref() {
        None => FftNorm::Backward,
        Some(n) => FftNorm::parse(n).ok_or_else(|| {
            Error::plan(
                at("norm"),
                format!("unknown norm \"{n}\"; must be one of backward, ortho, forward"),
            )
        })?,
    };
    Ok(Op::Fft {
        input: f.input,
        fft: FftDecl {
            kind,
            nd,
            axes,
            lengths,
            norm,
        },
    })
}

#[cfg(test)]
mod tests;
