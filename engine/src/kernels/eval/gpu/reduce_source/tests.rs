//! The reduction kernels compiled for the host by `c++` (one thread walks each grid-stride
//! loop) and compared with reductions written here over the same values.

use super::*;
use crate::kernels::eval::inst::Inst;
use crate::plan::expr::Signature;
use crate::plan::{Func, Scalar};

const HOST_SHIM: &str = r#"#include <cmath>
#include <cstring>
#define __device__
#define __global__
#define __forceinline__ inline
static double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
using std::isnan;
struct cf_dim { unsigned int x, y, z; };
static cf_dim blockIdx, threadIdx, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
"#;

fn host_driver(out: &str) -> String {
    format!(
        r#"
extern "C" void h_init(double** s, u64 n) {{ cf_reduce_init(s[0], s[1], s[2], n); }}
extern "C" void h_partial(const unsigned char* l0, double** p, const cf_dims* g, u64 K, u64 R, u64 P, i64 ibase) {{
    cf_reduce_partial(l0, p[0], p[1], p[2], *g, K, R, P, ibase);
}}
extern "C" void h_merge(double** p, double** s, const cf_dims* g, u64 K, u64 P, i64 obase) {{
    cf_reduce_merge(p[0], p[1], p[2], s[0], s[1], s[2], *g, K, P, obase);
}}
extern "C" void h_finish(double** s, void* out, u64 n, double count, double ddof) {{
    cf_reduce_finish(s[0], s[1], s[2], ({out}*)out, n, count, ddof);
}}
"#
    )
}

/// Three state arrays (accumulators, counts, auxiliaries) as the drivers take them.
type States = *const *mut f64;
type Init = unsafe extern "C" fn(States, u64);
type Partial = unsafe extern "C" fn(*const u8, States, *const ReduceDims, u64, u64, u64, i64);
type Merge = unsafe extern "C" fn(States, States, *const ReduceDims, u64, u64, i64);
type Finish = unsafe extern "C" fn(States, *mut u8, u64, f64, f64);

/// Three state arrays of `n` values each, and pointers to them.
fn states(n: usize) -> ([Vec<f64>; 3], [*mut f64; 3]) {
    let mut s = [vec![0f64; n], vec![0f64; n], vec![0f64; n]];
    let ptrs = [s[0].as_mut_ptr(), s[1].as_mut_ptr(), s[2].as_mut_ptr()];
    (s, ptrs)
}

/// The four kernels of one source, built into a library for the host.
struct Host {
    _dir: tempfile::TempDir,
    handle: *mut libc::c_void,
    /// The C type of the finished values.
    out: String,
}

impl Host {
    fn build(src: &str, out: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let (file, lib) = (dir.path().join("reduce.cpp"), dir.path().join("reduce.so"));
        std::fs::write(&file, format!("{HOST_SHIM}{src}{}", host_driver(out))).unwrap();
        let made = std::process::Command::new("c++")
            .args(["-O1", "-fPIC", "-shared", "-w", "-o"])
            .arg(&lib)
            .arg(&file)
            .output()
            .expect("a C++ compiler (c++)");
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let path = std::ffi::CString::new(lib.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a library this test just built, defining functions only.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        Host {
            _dir: dir,
            handle,
            out: out.to_string(),
        }
    }

    fn sym(&self, name: &std::ffi::CStr) -> *mut libc::c_void {
        // SAFETY: the library is open; the symbol is one of the driver's.
        let f = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        assert!(!f.is_null());
        f
    }

    /// Reduces `values` (C order, `shape`) over `axes` with `ddof`, folding the slabs of
    /// axis 0 that `cuts` gives one after another, as the device does; returns the finished
    /// values as f64.
    fn reduce(
        &self,
        values: &[u8],
        elem: usize,
        shape: &[u64],
        axes: &[usize],
        cuts: &[u64],
        ddof: f64,
    ) -> Vec<f64> {
        // SAFETY: the symbols are the driver's functions, of these types; every buffer below
        // is sized for what the kernels index.
        unsafe {
            let init: Init = std::mem::transmute(self.sym(c"h_init"));
            let partial: Partial = std::mem::transmute(self.sym(c"h_partial"));
            let merge: Merge = std::mem::transmute(self.sym(c"h_merge"));
            let finish: Finish = std::mem::transmute(self.sym(c"h_finish"));
            let n: u64 = (0..shape.len())
                .filter(|d| !axes.contains(d))
                .map(|d| shape[d])
                .product();
            let (_state, sp) = states(n as usize);
            init(sp.as_ptr(), n);
            let row: u64 = shape[1..].iter().product();
            for w in cuts.windows(2) {
                let mut start = vec![0u64; shape.len()];
                start[0] = w[0];
                let mut slab = shape.to_vec();
                slab[0] = w[1] - w[0];
                let f = Fold::new(shape, axes, &start, &slab).unwrap();
                let (_part, pp) = states((f.kept * f.parts) as usize);
                let at = (w[0] * row) as usize * elem;
                partial(
                    values[at..].as_ptr(),
                    pp.as_ptr(),
                    &f.dims,
                    f.kept,
                    f.reduced,
                    f.parts,
                    f.ibase,
                );
                merge(pp.as_ptr(), sp.as_ptr(), &f.dims, f.kept, f.parts, f.obase);
            }
            let count: u64 = axes.iter().map(|&a| shape[a]).product();
            let mut out = vec![0u8; n as usize * 8];
            finish(sp.as_ptr(), out.as_mut_ptr(), n, count as f64, ddof);
            match self.out.as_str() {
                "float" => bytemuck::cast_slice::<u8, f32>(&out[..n as usize * 4])
                    .iter()
                    .map(|&v| v as f64)
                    .collect(),
                "long long" => bytemuck::cast_slice::<u8, i64>(&out)
                    .iter()
                    .map(|&v| v as f64)
                    .collect(),
                _ => bytemuck::cast_slice::<u8, f64>(&out).to_vec(),
            }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY: no function of the library is called after this.
        unsafe { libc::dlclose(self.handle) };
    }
}

/// `(x + 1) * 2` of a `dtype` input, computed in `dtype`.
fn affine(dtype: DType) -> Program {
    let sig = Signature {
        compute: dtype,
        result: dtype,
    };
    Program {
        insts: vec![
            Inst::Load { leaf: 0, dtype },
            Inst::Const {
                value: Scalar::Float(1.0),
                dtype,
            },
            Inst::Call {
                func: Func::Add,
                sig,
                args: vec![0, 1],
            },
            Inst::Const {
                value: Scalar::Float(2.0),
                dtype,
            },
            Inst::Call {
                func: Func::Multiply,
                sig,
                args: vec![2, 3],
            },
        ],
    }
}

/// `func` over the lanes of `x` (C order, `shape`) along `axes` with `ddof`, written plainly
/// (two passes for variances; indices in a lane's order, -1 where a NaN-skipping
/// arg-reduction saw no value, as the finish kernel writes).
fn reference(func: ReduceFunc, x: &[f64], shape: &[u64], axes: &[usize], ddof: f64) -> Vec<f64> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let n: u64 = kept.iter().map(|&d| shape[d]).product();
    let mut lanes = vec![Vec::new(); n as usize];
    for (i, &v) in x.iter().enumerate() {
        let (mut rem, mut idx) = (i as u64, vec![0u64; shape.len()]);
        for d in (0..shape.len()).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let o = kept.iter().fold(0, |o, &d| o * shape[d] + idx[d]);
        lanes[o as usize].push(v);
    }
    lanes
        .iter()
        .map(|lane| {
            let clean: Vec<f64> = lane.iter().copied().filter(|v| !v.is_nan()).collect();
            let has_nan = clean.len() < lane.len();
            let fold = |vals: &[f64], f: fn(f64, f64) -> f64| vals.iter().copied().reduce(f);
            let var = |vals: &[f64]| {
                let n = vals.len() as f64;
                let mean = vals.iter().sum::<f64>() / n;
                vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - ddof)
            };
            let nan_var = |vals: &[f64]| {
                if vals.len() as f64 - ddof <= 0.0 {
                    f64::NAN
                } else {
                    var(vals)
                }
            };
            // The first index of the best value (the first NaN, unless skipped).
            let arg = |better: fn(f64, f64) -> bool, skip: bool| {
                let mut best: Option<(usize, f64)> = None;
                for (i, &v) in lane.iter().enumerate() {
                    if skip && v.is_nan() {
                        continue;
                    }
                    match best {
                        Some((_, b)) if b.is_nan() || !(v.is_nan() || better(v, b)) => {}
                        _ => best = Some((i, v)),
                    }
                }
                best.map_or(-1.0, |(i, _)| i as f64)
            };
            match func {
                ReduceFunc::Sum => lane.iter().sum(),
                ReduceFunc::NanSum => clean.iter().sum(),
                ReduceFunc::Mean => lane.iter().sum::<f64>() / lane.len() as f64,
                ReduceFunc::NanMean => clean.iter().sum::<f64>() / clean.len() as f64,
                ReduceFunc::Min if has_nan => f64::NAN,
                ReduceFunc::Max if has_nan => f64::NAN,
                ReduceFunc::Min | ReduceFunc::NanMin => fold(&clean, f64::min).unwrap_or(f64::NAN),
                ReduceFunc::Max | ReduceFunc::NanMax => fold(&clean, f64::max).unwrap_or(f64::NAN),
                ReduceFunc::Var => var(lane),
                ReduceFunc::Std => var(lane).sqrt(),
                ReduceFunc::NanVar => nan_var(&clean),
                ReduceFunc::NanStd => nan_var(&clean).sqrt(),
                ReduceFunc::Argmin => arg(|v, b| v < b, false),
                ReduceFunc::Argmax => arg(|v, b| v > b, false),
                ReduceFunc::NanArgmin => arg(|v, b| v < b, true),
                ReduceFunc::NanArgmax => arg(|v, b| v > b, true),
                _ => unreachable!(),
            }
        })
        .collect()
}

fn close(got: &[f64], want: &[f64], exact: bool, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if exact {
            g == w
        } else {
            (g - w).abs() <= 1e-6 * w.abs().max(1.0)
        };
        assert!(ok, "{what}: element {i}: {g} against {w}");
    }
}

#[test]
fn the_kernels_compiled_for_the_host_reduce_as_written_here() {
    let shape = [7u64, 5, 6];
    let len = 210;
    // Values with NaNs in some lanes and a lane of NaNs only along axis 0 at (.., 0, 0).
    let x: Vec<f32> = (0..len)
        .map(|i| {
            if i % 30 == 0 || i % 23 == 7 {
                f32::NAN
            } else {
                ((i * 37 % 101) as f32 - 50.0) * 0.25
            }
        })
        .collect();
    // The program's values, as the CPU computes them in float32.
    let y: Vec<f64> = x.iter().map(|&v| ((v + 1.0) * 2.0) as f64).collect();
    let bytes = bytemuck::cast_slice::<f32, u8>(&x);
    use ReduceFunc::*;
    for func in [Sum, NanSum, Mean, NanMean, Min, Max, NanMin, NanMax] {
        let src = reduce_source(func, &affine(DType::F32), DType::F32, DType::F32).unwrap();
        let host = Host::build(&src, "float");
        for axes in [vec![0usize], vec![1, 2], vec![0, 2], vec![0, 1, 2], vec![]] {
            let want: Vec<f64> = reference(func, &y, &shape, &axes, 0.0)
                .iter()
                .map(|&v| v as f32 as f64)
                .collect();
            for cuts in [vec![0u64, 7], vec![0, 3, 4, 7]] {
                let got = host.reduce(bytes, 4, &shape, &axes, &cuts, 0.0);
                let exact = matches!(func, Min | Max | NanMin | NanMax);
                close(
                    &got,
                    &want,
                    exact,
                    &format!("{func:?} over {axes:?}, slabs {cuts:?}"),
                );
            }
        }
    }
}

/// Values of 7 x 5 x 6 float32 with NaNs in some lanes, a lane of NaNs only along axis 0 at
/// (.., 0, 0), and repeated values (ties); and `(x + 1) * 2` of them as the CPU computes it.
fn lanes_with_nans_and_ties() -> (Vec<f32>, Vec<f64>) {
    let x: Vec<f32> = (0..210)
        .map(|i| {
            if i % 30 == 0 || i % 23 == 7 {
                f32::NAN
            } else {
                ((i * 37 % 101) as f32 - 50.0).rem_euclid(9.0) * 0.5
            }
        })
        .collect();
    let y = x.iter().map(|&v| ((v + 1.0) * 2.0) as f64).collect();
    (x, y)
}

#[test]
fn variances_fold_and_merge_as_written_here() {
    let shape = [7u64, 5, 6];
    let (x, y) = lanes_with_nans_and_ties();
    use ReduceFunc::*;
    for func in [Var, Std, NanVar, NanStd] {
        let src = reduce_source(func, &affine(DType::F32), DType::F32, DType::F64).unwrap();
        let host = Host::build(&src, "double");
        for axes in [vec![0usize], vec![1, 2], vec![0, 2], vec![0, 1, 2]] {
            for ddof in [0.0, 1.0, 7.0] {
                let want = reference(func, &y, &shape, &axes, ddof);
                for cuts in [
                    vec![0u64, 7],
                    vec![0, 3, 4, 7],
                    vec![0, 1, 2, 3, 4, 5, 6, 7],
                ] {
                    let got = host.reduce(bytemuck::cast_slice(&x), 4, &shape, &axes, &cuts, ddof);
                    let what = format!("{func:?} over {axes:?}, ddof {ddof}, slabs {cuts:?}");
                    // ddof 7 over axis 0 leaves no degree of freedom: numpy's inf or NaN.
                    if ddof >= 7.0 && axes == [0] {
                        assert!(got.iter().all(|v| !v.is_finite()), "{what}: {got:?}");
                    } else {
                        close(&got, &want, false, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn arg_reductions_give_the_first_index_of_the_best_value() {
    let shape = [7u64, 5, 6];
    let (x, y) = lanes_with_nans_and_ties();
    use ReduceFunc::*;
    for func in [Argmin, Argmax, NanArgmin, NanArgmax] {
        let src = reduce_source(func, &affine(DType::F32), DType::F32, DType::I64).unwrap();
        let host = Host::build(&src, "long long");
        // One axis (the index along it) or every axis (the flat index).
        for axes in [vec![0usize], vec![1], vec![2], vec![0, 1, 2]] {
            let want = reference(func, &y, &shape, &axes, 0.0);
            for cuts in [
                vec![0u64, 7],
                vec![0, 3, 4, 7],
                vec![0, 1, 2, 3, 4, 5, 6, 7],
            ] {
                let got = host.reduce(bytemuck::cast_slice(&x), 4, &shape, &axes, &cuts, 0.0);
                close(
                    &got,
                    &want,
                    true,
                    &format!("{func:?} over {axes:?}, slabs {cuts:?}"),
                );
            }
        }
    }
    // The lane of NaNs only: argmax finds its first NaN, nanargmax no value (-1).
    let arg = |func| reference(func, &y, &shape, &[0], 0.0)[0];
    assert_eq!((arg(Argmax), arg(NanArgmax)), (0.0, -1.0));
}

#[test]
fn float64_values_are_reduced_in_float64() {
    let shape = [4u64, 3];
    let x: Vec<f64> = (0..12).map(|i| 1.0 + i as f64 * 1e-12).collect();
    let prog = Program {
        insts: vec![Inst::Load {
            leaf: 0,
            dtype: DType::F64,
        }],
    };
    let src = reduce_source(ReduceFunc::Sum, &prog, DType::F64, DType::F64).unwrap();
    let host = Host::build(&src, "double");
    let got = host.reduce(bytemuck::cast_slice(&x), 8, &shape, &[0], &[0, 4], 0.0);
    let want = reference(ReduceFunc::Sum, &x, &shape, &[0], 0.0);
    close(&got, &want, false, "float64 sum");
    assert!(got[0] != 4.0, "the sum kept float64's digits: {got:?}");
}

#[test]
fn folds_split_lanes_into_parts_and_place_slabs_in_the_output() {
    // Sum over time of 256 x 721 x 1440 in slabs of 64 steps: one thread per output value.
    let f = Fold::new(&[256, 721, 1440], &[0], &[64, 0, 0], &[64, 721, 1440]).unwrap();
    assert_eq!(
        (f.kept, f.reduced, f.parts, f.obase, f.ibase),
        (721 * 1440, 64, 1, 0, 64)
    );
    // Over every axis, a slab's indices follow the steps before it.
    let f = Fold::new(&[8, 3, 4], &[0, 1, 2], &[2, 0, 0], &[2, 3, 4]).unwrap();
    assert_eq!((f.kept, f.reduced, f.ibase), (1, 24, 24));
    // Mean over longitude: the slab of rows 64.. lands at output row 64.
    let f = Fold::new(&[256, 721, 1440], &[2], &[64, 0, 0], &[64, 721, 1440]).unwrap();
    assert_eq!(
        (f.kept, f.reduced, f.obase, f.ibase),
        (64 * 721, 1440, 64 * 721, 0)
    );
    assert_eq!(f.parts, 22);
    // A whole reduction to one value splits its elements across about a million threads.
    let f = Fold::new(&[1 << 24], &[0], &[0], &[1 << 24]).unwrap();
    assert_eq!((f.kept, f.parts), (1, 1 << 20));
    let too_many = Fold::new(&[1; 9], &[0], &[0; 9], &[1; 9]).unwrap_err();
    assert!(too_many.contains("more than 8 axes"), "{too_many}");
}

#[test]
fn what_has_no_device_form_says_why() {
    let prog = affine(DType::F32);
    let prod = reduce_source(ReduceFunc::Prod, &prog, DType::F32, DType::F32).unwrap_err();
    assert_eq!(prod.0, "prod has no device form yet");
    let arg_into_float =
        reduce_source(ReduceFunc::Argmax, &prog, DType::F32, DType::F32).unwrap_err();
    assert!(
        arg_into_float.0.contains("int64 indices"),
        "{}",
        arg_into_float.0
    );
    let ints = Program {
        insts: vec![Inst::Load {
            leaf: 0,
            dtype: DType::I32,
        }],
    };
    let int_sum = reduce_source(ReduceFunc::Sum, &ints, DType::I32, DType::I64).unwrap_err();
    assert!(
        int_sum.0.contains("the device reduces floats"),
        "{}",
        int_sum.0
    );
    let into_int = reduce_source(ReduceFunc::Sum, &prog, DType::F32, DType::I32).unwrap_err();
    assert!(
        into_int.0.contains("the device writes floats"),
        "{}",
        into_int.0
    );
}
