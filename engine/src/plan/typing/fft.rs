//! Validation and typing of `fft` ops: axes, lengths, dtypes and the per-axis steps the
//! kernels run, with numpy's rules.

use crate::array::dtype::Kind;
use crate::array::{AxisChunks, ChunkGrid, DType};
use crate::error::Result;
use crate::plan::fft_params::{FftStep, FftStepKind};
use crate::plan::node::{FftSpec, Node, NodeId, NodeKind};
use crate::plan::{FftDecl, FftKind};
use crate::{plan_bail, plan_ensure};

/// The largest natural chunk of an FFT's result (it is what a write of it uses by default).
pub const NATURAL_CHUNK_BYTES: u64 = 64 << 20;

/// The single or double precision an FFT of `dtype` computes in, as numpy 2: float32 and
/// complex64 stay single, everything else is double. `None` for bool (not numeric).
fn precision(dtype: DType) -> Option<bool> {
    match dtype.kind() {
        Kind::Bool => None,
        _ => Some(matches!(dtype, DType::F32 | DType::C64)),
    }
}

/// The transformed axes of an FFT of `src` (numpy's defaults when `decl` names none),
/// normalised, each once. `name` is the function's name, for errors.
fn fft_axes(src: &Node, decl: &FftDecl, field: &str, name: &str) -> Result<Vec<usize>> {
    let rank = src.shape.len();
    let axes_key = if decl.nd { "axes" } else { "axis" };
    let raw_axes: Vec<i64> = match &decl.axes {
        Some(a) => a.clone(),
        None if decl.nd => match &decl.lengths {
            // numpy: with `s` and no axes, the last len(s) axes.
            Some(s) => (rank as i64 - s.len() as i64..rank as i64).collect(),
            None => (0..rank as i64).collect(),
        },
        None => vec![-1],
    };
    plan_ensure!(
        !raw_axes.is_empty(),
        format!("{field}.{axes_key}"),
        "{name} needs at least one axis"
    );
    let mut axes = Vec::with_capacity(raw_axes.len());
    for &a in &raw_axes {
        let r = rank as i64;
        plan_ensure!(
            (-r..r).contains(&a),
            format!("{field}.{axes_key}"),
            "axis {a} is out of range for \"{}\" of rank {rank}",
            src.id
        );
        let a = a.rem_euclid(r) as usize;
        plan_ensure!(
            !axes.contains(&a),
            format!("{field}.{axes_key}"),
            "axis {a} is given twice"
        );
        axes.push(a);
    }
    Ok(axes)
}

/// The transform length along each of `axes` (numpy's `n` or `s`; by default the axis'
/// length, or `2 (m - 1)` for the last axis of an irfft), each positive.
fn fft_lengths(src: &Node, decl: &FftDecl, axes: &[usize], field: &str) -> Result<Vec<usize>> {
    let lengths_key = if decl.nd { "s" } else { "n" };
    let lengths: Vec<usize> = match &decl.lengths {
        Some(l) => {
            plan_ensure!(
                l.len() == axes.len(),
                format!("{field}.{lengths_key}"),
                "{} lengths for {} axes",
                l.len(),
                axes.len()
            );
            l.iter().map(|&n| n.max(0) as usize).collect()
        }
        None => axes
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let m = src.shape[a] as usize;
                if decl.kind == FftKind::Irfft && i == axes.len() - 1 {
                    2 * m.saturating_sub(1)
                } else {
                    m
                }
            })
            .collect(),
    };
    for (&a, &n) in axes.iter().zip(&lengths) {
        plan_ensure!(
            n > 0,
            format!("{field}.{lengths_key}"),
            "invalid FFT length {n} along axis {a} of \"{}\" (shape {:?})",
            src.id,
            src.shape
        );
    }
    Ok(lengths)
}

/// The steps of a transform `fft_kind` over `axes` with `lengths` (a real step on the last axis
/// for rfft and irfft), and the dtypes it computes in and gives, in single or double
/// precision.
fn fft_steps(
    fft_kind: FftKind,
    axes: &[usize],
    lengths: &[usize],
    single: bool,
) -> (Vec<FftStep>, DType, DType) {
    let last = axes.len() - 1;
    let step = |i: usize, kind: FftStepKind| FftStep {
        axis: axes[i],
        kind,
        n: lengths[i],
    };
    match fft_kind {
        FftKind::Fft | FftKind::Ifft => {
            let kind = if fft_kind == FftKind::Fft {
                FftStepKind::Forward
            } else {
                FftStepKind::Inverse
            };
            let c = if single { DType::C64 } else { DType::C128 };
            ((0..axes.len()).map(|i| step(i, kind)).collect(), c, c)
        }
        FftKind::Rfft => {
            let mut steps = vec![step(last, FftStepKind::RealForward)];
            steps.extend((0..last).map(|i| step(i, FftStepKind::Forward)));
            let (r, c) = if single {
                (DType::F32, DType::C64)
            } else {
                (DType::F64, DType::C128)
            };
            (steps, r, c)
        }
        FftKind::Irfft => {
            let mut steps: Vec<FftStep> =
                (0..last).map(|i| step(i, FftStepKind::Inverse)).collect();
            steps.push(step(last, FftStepKind::RealInverse));
            let (c, r) = if single {
                (DType::C64, DType::F32)
            } else {
                (DType::C128, DType::F64)
            };
            (steps, c, r)
        }
    }
}

/// The natural chunk grid of an FFT of `src` giving `shape` and `dtype`: transformed `axes`
/// whole in each chunk, the others as the input's chunks, halved (widest first) while a
/// chunk is larger than [`NATURAL_CHUNK_BYTES`].
fn natural_grid(src: &Node, shape: &[u64], axes: &[usize], dtype: DType) -> Result<ChunkGrid> {
    let rank = src.shape.len();
    let mut sizes: Vec<u64> = (0..rank)
        .map(|d| {
            if axes.contains(&d) {
                shape[d].max(1)
            } else {
                src.grid.chunk_shape()[d].max(1)
            }
        })
        .collect();
    while sizes.iter().product::<u64>() * dtype.size() as u64 > NATURAL_CHUNK_BYTES {
        let Some(widest) = (0..rank)
            .filter(|d| !axes.contains(d) && sizes[*d] > 1)
            .max_by_key(|d| sizes[*d])
        else {
            break;
        };
        sizes[widest] = sizes[widest].div_ceil(2);
    }
    let grid_axes = (0..rank)
        .map(|d| {
            if axes.contains(&d) || sizes[d] != src.grid.chunk_shape()[d] {
                AxisChunks::regular(shape[d], sizes[d])
            } else {
                Ok(src.grid.axes()[d].clone())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ChunkGrid::new(grid_axes))
}

/// Types an `fft` op over node `input`.
pub(crate) fn fft_node(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    decl: &FftDecl,
) -> Result<Node> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let name = format!("{}{}", decl.kind.name(), if decl.nd { "n" } else { "" });
    let Some(single) = precision(src.dtype) else {
        plan_bail!(
            format!("{field}.input"),
            "{name} needs numeric values but \"{}\" has dtype {}",
            src.id,
            src.dtype
        );
    };
    plan_ensure!(
        !(decl.kind == FftKind::Rfft && src.dtype.kind() == Kind::Complex),
        format!("{field}.input"),
        "rfft needs real values but \"{}\" has dtype {} (use fft)",
        src.id,
        src.dtype
    );
    plan_ensure!(rank > 0, format!("{field}.input"), "{name} of a 0-d array");
    let axes = fft_axes(src, decl, &field, &name)?;
    let lengths = fft_lengths(src, decl, &axes, &field)?;
    let (steps, compute, dtype) = fft_steps(decl.kind, &axes, &lengths, single);
    let mut shape = src.shape.clone();
    for s in &steps {
        shape[s.axis] = s.kind.out_len(s.n) as u64;
    }
    let grid = natural_grid(src, &shape, &axes, dtype)?;
    Ok(Node {
        id,
        field,
        shape,
        dtype,
        grid,
        kind: NodeKind::Fft(FftSpec {
            input,
            compute,
            steps,
            norm: decl.norm,
        }),
    })
}
