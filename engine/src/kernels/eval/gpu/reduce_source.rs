//! CUDA C source of a reduction whose values are a fused single-input program: the program
//! is evaluated per element where the reduction reads it (nothing between them is stored),
//! each thread folds its share of the reduced elements into a double, and the partial
//! results are merged into per-output accumulators in a fixed order. Sums and means add in
//! double (the CPU adds float32 values 16 at a time in float32 first, so a float32 sum may
//! differ from the CPU's in its last bits); minima and maxima are exact.
//!
//! Four kernels: `cf_reduce_init` (the accumulators' start), `cf_reduce_partial`,
//! `cf_reduce_merge` and `cf_reduce_finish` (the values of the output dtype).

use std::fmt::Write;

use super::codegen::{program_body, NoGpuForm, PRELUDE};
use crate::array::DType;
use crate::kernels::eval::program::Program;
use crate::plan::ReduceFunc;

/// Axes a device reduction takes at most.
pub const MAX_AXES: usize = 8;

/// The geometry of one fold, as the kernels take it by value: the kept axes (their extents
/// and element strides in the input, and strides in the output) and the reduced axes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceDims {
    /// Kept axes.
    pub nk: i64,
    /// Reduced axes.
    pub nr: i64,
    /// Extents of the kept axes in the input.
    pub ksize: [i64; MAX_AXES],
    /// Element strides of the kept axes in the input.
    pub kstride: [i64; MAX_AXES],
    /// Extents of the reduced axes in the input.
    pub rsize: [i64; MAX_AXES],
    /// Element strides of the reduced axes in the input.
    pub rstride: [i64; MAX_AXES],
    /// Element strides of the kept axes in the output.
    pub ostride: [i64; MAX_AXES],
}

impl ReduceDims {
    /// The geometry of reducing `axes` of a C-ordered input of `shape` whose kept axes land
    /// in an output of kept extents `out_shape`.
    pub fn new(shape: &[u64], axes: &[usize], out_shape: &[u64]) -> Result<ReduceDims, String> {
        if shape.len() > MAX_AXES {
            return Err(format!(
                "reductions over more than {MAX_AXES} axes have no device form"
            ));
        }
        let mut strides = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1] as i64;
        }
        let mut out_strides = vec![1i64; out_shape.len()];
        for d in (0..out_shape.len().saturating_sub(1)).rev() {
            out_strides[d] = out_strides[d + 1] * out_shape[d + 1] as i64;
        }
        let mut g = ReduceDims::default();
        for (d, (&n, &s)) in shape.iter().zip(&strides).enumerate() {
            if axes.contains(&d) {
                let r = g.nr as usize;
                (g.rsize[r], g.rstride[r]) = (n as i64, s);
                g.nr += 1;
            } else {
                let k = g.nk as usize;
                let o = *out_strides
                    .get(k)
                    .ok_or_else(|| "the output has fewer axes than the input keeps".to_string())?;
                (g.ksize[k], g.kstride[k], g.ostride[k]) = (n as i64, s, o);
                g.nk += 1;
            }
        }
        Ok(g)
    }

    /// Values the input keeps (one per output element this fold touches).
    pub fn kept(&self) -> u64 {
        self.ksize[..self.nk as usize]
            .iter()
            .map(|&n| n as u64)
            .product()
    }

    /// Values folded into each.
    pub fn reduced(&self) -> u64 {
        self.rsize[..self.nr as usize]
            .iter()
            .map(|&n| n as u64)
            .product()
    }
}

/// Threads one fold aims to run: each output value's reduced elements are split into parts
/// until about this many threads share the fold.
const FOLD_THREADS: u64 = 1 << 20;

/// One fold of a slab (a box of the reduction's input) into the accumulators: its geometry,
/// the output element its first kept value lands on, and how the reduced elements are split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fold {
    /// The geometry the kernels take.
    pub dims: ReduceDims,
    /// The output element of the slab's first kept value.
    pub obase: i64,
    /// Output elements the slab touches.
    pub kept: u64,
    /// Elements folded into each.
    pub reduced: u64,
    /// Partial results per output element (threads per output element).
    pub parts: u64,
}

impl Fold {
    /// The fold of the slab of shape `slab` at `start` of an input of `shape` reduced over
    /// `axes` (the output holds the kept axes, in order).
    pub fn new(shape: &[u64], axes: &[usize], start: &[u64], slab: &[u64]) -> Result<Fold, String> {
        let kept_of = |v: &[u64]| -> Vec<u64> {
            v.iter()
                .enumerate()
                .filter(|(d, _)| !axes.contains(d))
                .map(|(_, &n)| n)
                .collect()
        };
        let dims = ReduceDims::new(slab, axes, &kept_of(shape))?;
        let obase = kept_of(start)
            .iter()
            .zip(&dims.ostride)
            .map(|(&s, &o)| s as i64 * o)
            .sum();
        let (kept, reduced) = (dims.kept(), dims.reduced());
        let parts = (FOLD_THREADS / kept.max(1)).clamp(1, reduced.max(1));
        Ok(Fold {
            dims,
            obase,
            kept,
            reduced,
            parts,
        })
    }
}

// SAFETY: a repr(C) struct of i64 only; the kernels take it by value as `cf_dims`.
#[cfg(feature = "cuda")]
unsafe impl cudarc::driver::DeviceRepr for ReduceDims {}

/// The fold of one value into an accumulator and a count, the merge of a partial result,
/// and the accumulator's start, of `func`; `None` when it has no device form.
fn parts(func: ReduceFunc) -> Option<(&'static str, &'static str, &'static str)> {
    use ReduceFunc::*;
    const ADD: &str = "a += x;";
    const MIN: &str = "a = (isnan(a) || isnan(x)) ? CF_NAN : (x < a ? x : a);";
    const MAX: &str = "a = (isnan(a) || isnan(x)) ? CF_NAN : (x > a ? x : a);";
    const NANMIN: &str = "if (!isnan(x) && (isnan(a) || x < a)) a = x;";
    const NANMAX: &str = "if (!isnan(x) && (isnan(a) || x > a)) a = x;";
    Some(match func {
        Sum | Mean => (ADD, "a += x;", "0.0"),
        NanSum => ("if (!isnan(x)) a += x;", "a += x;", "0.0"),
        NanMean => (
            "if (!isnan(x)) { a += x; c += 1.0; }",
            "a += x; c += xc;",
            "0.0",
        ),
        Min => (MIN, MIN, "CF_INF"),
        Max => (MAX, MAX, "-CF_INF"),
        NanMin => (NANMIN, NANMIN, "CF_NAN"),
        NanMax => (NANMAX, NANMAX, "CF_NAN"),
        _ => return None,
    })
}

/// The finished value of accumulator `acc[i]` (count `cnt[i]`; `count` values per output in
/// all) of `func`.
fn finished(func: ReduceFunc) -> &'static str {
    match func {
        ReduceFunc::Mean => "acc[i] / count",
        ReduceFunc::NanMean => "(cnt[i] == 0.0 ? CF_NAN : acc[i] / cnt[i])",
        _ => "acc[i]",
    }
}

/// The kernels reducing the values of `prog` (over one input of `leaf_dtype`) by `func` into
/// values of `out_dtype`; [`NoGpuForm`] says why where there is none.
pub fn reduce_source(
    func: ReduceFunc,
    prog: &Program,
    leaf_dtype: DType,
    out_dtype: DType,
) -> Result<String, NoGpuForm> {
    let no = |why: String| NoGpuForm(why);
    let (fold, merge, init) =
        parts(func).ok_or_else(|| no(format!("{} has no device form yet", func.name())))?;
    let body = program_body(prog, &[leaf_dtype])?;
    if !body.is_float() {
        return Err(no(format!(
            "{} of {} values runs on the CPU (the device reduces floats)",
            func.name(),
            prog.dtype()
        )));
    }
    let out = match out_dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        other => {
            return Err(no(format!(
                "{} into {other} runs on the CPU (the device writes floats)",
                func.name()
            )))
        }
    };
    let last = body.last;
    let mut src = String::from(PRELUDE);
    let _ = write!(
        src,
        r#"#define CF_INF __longlong_as_double(0x7ff0000000000000LL)
struct cf_dims {{ i64 nk; i64 nr; i64 ksize[8]; i64 kstride[8]; i64 rsize[8]; i64 rstride[8]; i64 ostride[8]; }};
__device__ __forceinline__ void cf_fold(double& a, double& c, double x) {{ {fold} }}
__device__ __forceinline__ void cf_merge(double& a, double& c, double x, double xc) {{ {merge} }}
extern "C" __global__ void cf_reduce_init(double* acc, double* cnt, u64 n) {{
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
        acc[i] = {init};
        cnt[i] = 0.0;
    }}
}}
extern "C" __global__ void cf_reduce_partial(const unsigned char* __restrict__ l0, double* __restrict__ part, double* __restrict__ pcnt, cf_dims g, u64 K, u64 R, u64 P) {{
    for (u64 t = blockIdx.x * (u64)blockDim.x + threadIdx.x; t < K * P; t += (u64)gridDim.x * blockDim.x) {{
        const u64 k = t % K, p = t / K;
        i64 base = 0;
        u64 rem = k;
        for (int d = (int)g.nk - 1; d >= 0; --d) {{
            base += (i64)(rem % (u64)g.ksize[d]) * g.kstride[d];
            rem /= (u64)g.ksize[d];
        }}
        const u64 j0 = R / P * p + (p < R % P ? p : R % P);
        const u64 j1 = j0 + R / P + (p < R % P ? 1 : 0);
        double a = {init}, c = 0.0;
        for (u64 j = j0; j < j1; ++j) {{
            i64 o0 = base;
            u64 rr = j;
            for (int d = (int)g.nr - 1; d >= 0; --d) {{
                o0 += (i64)(rr % (u64)g.rsize[d]) * g.rstride[d];
                rr /= (u64)g.rsize[d];
            }}
{text}            cf_fold(a, c, (double)r{last});
        }}
        part[t] = a;
        pcnt[t] = c;
    }}
}}
extern "C" __global__ void cf_reduce_merge(const double* __restrict__ part, const double* __restrict__ pcnt, double* acc, double* cnt, cf_dims g, u64 K, u64 P, i64 obase) {{
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < K; k += (u64)gridDim.x * blockDim.x) {{
        i64 o = obase;
        u64 rem = k;
        for (int d = (int)g.nk - 1; d >= 0; --d) {{
            o += (i64)(rem % (u64)g.ksize[d]) * g.ostride[d];
            rem /= (u64)g.ksize[d];
        }}
        double a = acc[o], c = cnt[o];
        for (u64 p = 0; p < P; ++p) cf_merge(a, c, part[p * K + k], pcnt[p * K + k]);
        acc[o] = a;
        cnt[o] = c;
    }}
}}
extern "C" __global__ void cf_reduce_finish(const double* __restrict__ acc, const double* __restrict__ cnt, {out}* __restrict__ out, u64 n, double count) {{
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
        out[i] = ({out})({finish});
    }}
}}
"#,
        text = body.text.replace("        const", "            const"),
        finish = finished(func),
    );
    Ok(src)
}

#[cfg(test)]
mod tests;
