//! CUDA C source of a reduction whose values are a fused single-input program: the program
//! is evaluated per element where the reduction reads it (nothing between them is stored),
//! each thread folds its share of the reduced elements into a double, and the partial
//! results are merged into per-output accumulators in a fixed order. Sums and means add in
//! double (the CPU adds float32 values 16 at a time in float32 first, so a float32 sum may
//! differ from the CPU's in its last bits); minima and maxima are exact.
//!
//! Variances fold by Welford's update and merge by Chan's formula (as the CPU does), in
//! double; arg-reductions keep the best value and its index, the earlier index winning ties.
//!
//! Four kernels: `cf_reduce_init` (the states' start), `cf_reduce_partial`,
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
    /// The index, among all the reduced elements of an output value, of the slab's first
    /// (what arg-reductions add to the slab's own indices).
    pub ibase: i64,
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
        // Slabs are cut along axis 0 only: where it is reduced (the outermost of the reduced
        // axes), the slab's first element follows `start[0]` times the other reduced extents.
        let ibase = match (axes.contains(&0), start.first()) {
            (true, Some(&s0)) => {
                let rest: u64 = axes
                    .iter()
                    .filter(|&&a| a != 0)
                    .map(|&a| shape[a])
                    .product();
                (s0 * rest) as i64
            }
            _ => 0,
        };
        Ok(Fold {
            dims,
            obase,
            kept,
            reduced,
            parts,
            ibase,
        })
    }
}

// SAFETY: a repr(C) struct of i64 only; the kernels take it by value as `cf_dims`.
#[cfg(feature = "cuda")]
unsafe impl cudarc::driver::DeviceRepr for ReduceDims {}

/// How one function folds values into an output value's state (an accumulator `a`, a count
/// `c` and an auxiliary `q`: the sum of squared deviations of a variance, the index of an
/// arg-reduction), merges a partial state `(xa, xc, xq)` into it, and where `a` starts.
struct Parts {
    fold: String,
    merge: String,
    init: &'static str,
}

/// Welford's update of a running mean `a` and squared deviations `q` by `x`.
const WELFORD: &str = "c += 1.0; double d = x - a; a += d / c; q += d * (x - a);";
/// Chan's merge of a partial mean and squared deviations.
const CHAN: &str = "if (xc == 0.0) return; double t = c + xc, d = xa - a; \
                    a += d * (xc / t); q += xq + d * d * c * xc / t; c = t;";

/// The [`Parts`] of `func`; `None` when it has no device form.
fn parts(func: ReduceFunc) -> Option<Parts> {
    use ReduceFunc::*;
    const ADD: &str = "a += x;";
    const MIN: &str = "a = (isnan(a) || isnan(x)) ? CF_NAN : (x < a ? x : a);";
    const MAX: &str = "a = (isnan(a) || isnan(x)) ? CF_NAN : (x > a ? x : a);";
    const NANMIN: &str = "if (!isnan(x) && (isnan(a) || x < a)) a = x;";
    const NANMAX: &str = "if (!isnan(x) && (isnan(a) || x > a)) a = x;";
    const SKIP_NAN: &str = "if (isnan(x)) return; ";
    let plain = |fold: &str, merge: &str, init| Parts {
        fold: fold.to_string(),
        merge: merge.to_string(),
        init,
    };
    // An arg-reduction keeps the best value in `a` and its index in `q`; `c` counts the
    // values seen. Of equal values the earlier index wins: a part's values fold in index
    // order and partial states merge in index order. Without skipping, the first NaN wins.
    let arg = |op: &str, skip: bool| {
        Parts {
        fold: format!(
            "{}if (c == 0.0 || (!isnan(a) && (isnan(x) || x {op} a))) {{ a = x; q = (double)i; }} c += 1.0;",
            if skip { SKIP_NAN } else { "" }
        ),
        merge: format!(
            "if (xc > 0.0 && (c == 0.0 || (!isnan(a) && (isnan(xa) || xa {op} a)))) {{ a = xa; q = xq; }} c += xc;"
        ),
        init: "0.0",
    }
    };
    Some(match func {
        Sum | Mean => plain(ADD, "a += xa;", "0.0"),
        NanSum => plain("if (!isnan(x)) a += x;", "a += xa;", "0.0"),
        NanMean => plain(
            "if (!isnan(x)) { a += x; c += 1.0; }",
            "a += xa; c += xc;",
            "0.0",
        ),
        Min => plain(MIN, &MIN.replace('x', "xa"), "CF_INF"),
        Max => plain(MAX, &MAX.replace('x', "xa"), "-CF_INF"),
        NanMin => plain(NANMIN, &NANMIN.replace('x', "xa"), "CF_NAN"),
        NanMax => plain(NANMAX, &NANMAX.replace('x', "xa"), "CF_NAN"),
        Var | Std => plain(WELFORD, CHAN, "0.0"),
        NanVar | NanStd => Parts {
            fold: format!("{SKIP_NAN}{WELFORD}"),
            merge: CHAN.to_string(),
            init: "0.0",
        },
        Argmin => arg("<", false),
        Argmax => arg(">", false),
        NanArgmin => arg("<", true),
        NanArgmax => arg(">", true),
        _ => return None,
    })
}

/// The finished value of output `i` of `func` from its state (`acc[i]`, `cnt[i]`, `aux[i]`),
/// the `count` values reduced into each and the delta degrees of freedom `ddof`. An
/// arg-reduction that saw no value (all NaN, skipped) finishes as -1.
fn finished(func: ReduceFunc) -> &'static str {
    use ReduceFunc::*;
    match func {
        Mean => "acc[i] / count",
        NanMean => "(cnt[i] == 0.0 ? CF_NAN : acc[i] / cnt[i])",
        Var => "aux[i] / fmax(cnt[i] - ddof, 0.0)",
        Std => "sqrt(aux[i] / fmax(cnt[i] - ddof, 0.0))",
        NanVar => "(cnt[i] - ddof <= 0.0 ? CF_NAN : aux[i] / (cnt[i] - ddof))",
        NanStd => "(cnt[i] - ddof <= 0.0 ? CF_NAN : sqrt(aux[i] / (cnt[i] - ddof)))",
        Argmin | Argmax | NanArgmin | NanArgmax => "(cnt[i] == 0.0 ? -1.0 : aux[i])",
        _ => "acc[i]",
    }
}

/// The C type the finish kernel writes for `func` into `out_dtype`, or why there is none.
fn out_type(func: ReduceFunc, out_dtype: DType) -> Result<&'static str, NoGpuForm> {
    match (func.is_arg(), out_dtype) {
        (false, DType::F32) => Ok("float"),
        (false, DType::F64) => Ok("double"),
        (true, DType::I64) => Ok("long long"),
        (_, other) => Err(NoGpuForm(format!(
            "{} into {other} runs on the CPU (the device writes floats, or int64 indices)",
            func.name()
        ))),
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
    let Parts { fold, merge, init } =
        parts(func).ok_or_else(|| no(format!("{} has no device form yet", func.name())))?;
    let body = program_body(prog, &[leaf_dtype])?;
    if !body.is_float() {
        return Err(no(format!(
            "{} of {} values runs on the CPU (the device reduces floats)",
            func.name(),
            prog.dtype()
        )));
    }
    let out = out_type(func, out_dtype)?;
    let last = body.last;
    let mut src = String::from(PRELUDE);
    let _ = write!(
        src,
        r#"#define CF_INF __longlong_as_double(0x7ff0000000000000LL)
struct cf_dims {{ i64 nk; i64 nr; i64 ksize[8]; i64 kstride[8]; i64 rsize[8]; i64 rstride[8]; i64 ostride[8]; }};
__device__ __forceinline__ void cf_fold(double& a, double& c, double& q, double x, i64 i) {{ {fold} }}
__device__ __forceinline__ void cf_merge(double& a, double& c, double& q, double xa, double xc, double xq) {{ {merge} }}
extern "C" __global__ void cf_reduce_init(double* acc, double* cnt, double* aux, u64 n) {{
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{
        acc[i] = {init};
        cnt[i] = 0.0;
        aux[i] = 0.0;
    }}
}}
extern "C" __global__ void cf_reduce_partial(const unsigned char* __restrict__ l0, double* __restrict__ part, double* __restrict__ pcnt, double* __restrict__ paux, cf_dims g, u64 K, u64 R, u64 P, i64 ibase) {{
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
        double a = {init}, c = 0.0, q = 0.0;
        for (u64 j = j0; j < j1; ++j) {{
            i64 o0 = base;
            u64 rr = j;
            for (int d = (int)g.nr - 1; d >= 0; --d) {{
                o0 += (i64)(rr % (u64)g.rsize[d]) * g.rstride[d];
                rr /= (u64)g.rsize[d];
            }}
{text}            cf_fold(a, c, q, (double)r{last}, ibase + (i64)j);
        }}
        part[t] = a;
        pcnt[t] = c;
        paux[t] = q;
    }}
}}
extern "C" __global__ void cf_reduce_merge(const double* __restrict__ part, const double* __restrict__ pcnt, const double* __restrict__ paux, double* acc, double* cnt, double* aux, cf_dims g, u64 K, u64 P, i64 obase) {{
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < K; k += (u64)gridDim.x * blockDim.x) {{
        i64 o = obase;
        u64 rem = k;
        for (int d = (int)g.nk - 1; d >= 0; --d) {{
            o += (i64)(rem % (u64)g.ksize[d]) * g.ostride[d];
            rem /= (u64)g.ksize[d];
        }}
        double a = acc[o], c = cnt[o], q = aux[o];
        for (u64 p = 0; p < P; ++p) cf_merge(a, c, q, part[p * K + k], pcnt[p * K + k], paux[p * K + k]);
        acc[o] = a;
        cnt[o] = c;
        aux[o] = q;
    }}
}}
extern "C" __global__ void cf_reduce_finish(const double* __restrict__ acc, const double* __restrict__ cnt, const double* __restrict__ aux, {out}* __restrict__ out, u64 n, double count, double ddof) {{
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
