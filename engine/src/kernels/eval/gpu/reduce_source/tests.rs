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
extern "C" void h_init(double* acc, double* cnt, u64 n) {{ cf_reduce_init(acc, cnt, n); }}
extern "C" void h_partial(const unsigned char* l0, double* part, double* pcnt, const cf_dims* g, u64 K, u64 R, u64 P) {{
    cf_reduce_partial(l0, part, pcnt, *g, K, R, P);
}}
extern "C" void h_merge(const double* part, const double* pcnt, double* acc, double* cnt, const cf_dims* g, u64 K, u64 P, i64 obase) {{
    cf_reduce_merge(part, pcnt, acc, cnt, *g, K, P, obase);
}}
extern "C" void h_finish(const double* acc, const double* cnt, void* out, u64 n, double count) {{
    cf_reduce_finish(acc, cnt, ({out}*)out, n, count);
}}
"#
    )
}

type Init = unsafe extern "C" fn(*mut f64, *mut f64, u64);
type Partial =
    unsafe extern "C" fn(*const u8, *mut f64, *mut f64, *const ReduceDims, u64, u64, u64);
type Merge = unsafe extern "C" fn(
    *const f64,
    *const f64,
    *mut f64,
    *mut f64,
    *const ReduceDims,
    u64,
    u64,
    i64,
);
type Finish = unsafe extern "C" fn(*const f64, *const f64, *mut u8, u64, f64);

/// The four kernels of one source, built into a library for the host.
struct Host {
    _dir: tempfile::TempDir,
    handle: *mut libc::c_void,
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
        Host { _dir: dir, handle }
    }

    fn sym(&self, name: &std::ffi::CStr) -> *mut libc::c_void {
        // SAFETY: the library is open; the symbol is one of the driver's.
        let f = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        assert!(!f.is_null());
        f
    }

    /// Reduces `values` (C order, `shape`) over `axes`, folding the slabs of axis 0 that
    /// `cuts` gives one after another, as the device does; returns the finished values.
    fn reduce(
        &self,
        values: &[u8],
        elem: usize,
        shape: &[u64],
        axes: &[usize],
        cuts: &[u64],
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
            let (mut acc, mut cnt) = (vec![0f64; n as usize], vec![0f64; n as usize]);
            init(acc.as_mut_ptr(), cnt.as_mut_ptr(), n);
            let row: u64 = shape[1..].iter().product();
            for w in cuts.windows(2) {
                let mut start = vec![0u64; shape.len()];
                start[0] = w[0];
                let mut slab = shape.to_vec();
                slab[0] = w[1] - w[0];
                let f = Fold::new(shape, axes, &start, &slab).unwrap();
                let m = (f.kept * f.parts) as usize;
                let (mut part, mut pcnt) = (vec![0f64; m], vec![0f64; m]);
                let at = (w[0] * row) as usize * elem;
                partial(
                    values[at..].as_ptr(),
                    part.as_mut_ptr(),
                    pcnt.as_mut_ptr(),
                    &f.dims,
                    f.kept,
                    f.reduced,
                    f.parts,
                );
                merge(
                    part.as_ptr(),
                    pcnt.as_ptr(),
                    acc.as_mut_ptr(),
                    cnt.as_mut_ptr(),
                    &f.dims,
                    f.kept,
                    f.parts,
                    f.obase,
                );
            }
            let count: u64 = axes.iter().map(|&a| shape[a]).product();
            let mut out = vec![0u8; n as usize * elem];
            finish(
                acc.as_ptr(),
                cnt.as_ptr(),
                out.as_mut_ptr(),
                n,
                count as f64,
            );
            match elem {
                4 => bytemuck::cast_slice::<u8, f32>(&out)
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

/// `func` over the lanes of `x` (C order, `shape`) along `axes`, written plainly.
fn reference(func: ReduceFunc, x: &[f64], shape: &[u64], axes: &[usize]) -> Vec<f64> {
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
            match func {
                ReduceFunc::Sum => lane.iter().sum(),
                ReduceFunc::NanSum => clean.iter().sum(),
                ReduceFunc::Mean => lane.iter().sum::<f64>() / lane.len() as f64,
                ReduceFunc::NanMean => clean.iter().sum::<f64>() / clean.len() as f64,
                ReduceFunc::Min if has_nan => f64::NAN,
                ReduceFunc::Max if has_nan => f64::NAN,
                ReduceFunc::Min | ReduceFunc::NanMin => fold(&clean, f64::min).unwrap_or(f64::NAN),
                ReduceFunc::Max | ReduceFunc::NanMax => fold(&clean, f64::max).unwrap_or(f64::NAN),
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
            let want: Vec<f64> = reference(func, &y, &shape, &axes)
                .iter()
                .map(|&v| v as f32 as f64)
                .collect();
            for cuts in [vec![0u64, 7], vec![0, 3, 4, 7]] {
                let got = host.reduce(bytes, 4, &shape, &axes, &cuts);
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
    let got = host.reduce(bytemuck::cast_slice(&x), 8, &shape, &[0], &[0, 4]);
    let want = reference(ReduceFunc::Sum, &x, &shape, &[0]);
    close(&got, &want, false, "float64 sum");
    assert!(got[0] != 4.0, "the sum kept float64's digits: {got:?}");
}

#[test]
fn folds_split_lanes_into_parts_and_place_slabs_in_the_output() {
    // Sum over time of 256 x 721 x 1440 in slabs of 64 steps: one thread per output value.
    let f = Fold::new(&[256, 721, 1440], &[0], &[64, 0, 0], &[64, 721, 1440]).unwrap();
    assert_eq!(
        (f.kept, f.reduced, f.parts, f.obase),
        (721 * 1440, 64, 1, 0)
    );
    // Mean over longitude: the slab of rows 64.. lands at output row 64.
    let f = Fold::new(&[256, 721, 1440], &[2], &[64, 0, 0], &[64, 721, 1440]).unwrap();
    assert_eq!((f.kept, f.reduced, f.obase), (64 * 721, 1440, 64 * 721));
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
    let var = reduce_source(ReduceFunc::Var, &prog, DType::F32, DType::F32).unwrap_err();
    assert_eq!(var.0, "var has no device form yet");
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
