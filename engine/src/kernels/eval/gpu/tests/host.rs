//! The generated CUDA C compiled for the host: a few lines of C stand in for CUDA's builtins
//! (one thread walks every index), the system C compiler builds every random program's kernel
//! into one shared library, and each runs on the arguments the device launch gets
//! ([`LaunchArgs`]). Its values must equal the CPU evaluator's, so the code generation is
//! checked on machines without a GPU; what only the device can differ in (its libm, NVRTC)
//! is left to the device test.

use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::process::Command;

use super::{cases, Case};
use crate::array::Buffer;
use crate::kernels::eval::gpu::codegen::{kernel_source, KERNEL_NAME, PRELUDE};
use crate::kernels::eval::gpu::launch::LaunchArgs;

/// CUDA's qualifiers and builtins in C, for one thread: `min`/`max` take two values of one
/// type, as the generated code calls them.
const SHIM: &str = r#"
#include <math.h>
#include <stdbool.h>
#include <string.h>
#define __device__
#define __forceinline__ static inline
#define __global__
#define __restrict__ restrict
struct cf_dim { unsigned int x; };
static const struct cf_dim blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, sizeof d); return d; }
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
"#;

/// The C translation unit: the shim, the prelude once, then kernel `k` of `kernels` named
/// `cf_eval_k` (without C++'s `extern "C"`).
fn translation_unit(kernels: &[(usize, String)]) -> String {
    let mut unit = format!("{SHIM}{PRELUDE}");
    for (k, src) in kernels {
        let body = src
            .strip_prefix(PRELUDE)
            .expect("every kernel source starts with the prelude");
        let signature = format!("extern \"C\" __global__ void {KERNEL_NAME}(");
        assert!(body.contains(&signature), "no kernel signature in {body}");
        unit.push_str(&body.replace(&signature, &format!("void {KERNEL_NAME}_{k}(")));
    }
    unit
}

/// A shared library loaded with `dlopen`.
struct Library(*mut c_void);

impl Library {
    /// Compiles `unit` with the system C compiler (`$CC`, else `cc`) as the device compiles
    /// (no contraction into fused multiply-adds, IEEE math) and loads it.
    fn build(unit: &str, dir: &Path) -> Library {
        let c = dir.join("kernels.c");
        let so = dir.join("kernels.so");
        std::fs::write(&c, unit).expect("write the kernels' C");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .args(["-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off"])
            .args(["-fno-fast-math", "-fno-strict-aliasing", "-o"])
            .arg(&so)
            .arg(&c)
            .arg("-lm")
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(
            out.status.success(),
            "{cc} failed on the generated kernels:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = CString::new(so.to_string_lossy().as_bytes()).expect("a path without NUL");
        // SAFETY: loads a library this test just built; its code only defines functions.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a message for the failed dlopen above.
            let why = unsafe { CStr::from_ptr(libc::dlerror()) };
            panic!("cannot load the kernels: {why:?}");
        }
        Library(handle)
    }

    /// The address of `name`.
    fn symbol(&self, name: &str) -> *mut c_void {
        let name = CString::new(name).expect("a name without NUL");
        // SAFETY: the handle is open for the library's lifetime.
        let sym = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!sym.is_null(), "no {name:?} in the kernels");
        sym
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and no function of it is called after this.
        unsafe { libc::dlclose(self.0) };
    }
}

type Kernel1 = unsafe extern "C" fn(*mut u8, *const u8, *const i64, i32, u64);
type Kernel2 = unsafe extern "C" fn(*mut u8, *const u8, *const u8, *const i64, i32, u64);
type Kernel3 = unsafe extern "C" fn(*mut u8, *const u8, *const u8, *const u8, *const i64, i32, u64);

/// Runs `case`'s kernel at `sym` as the device launch would, into a new buffer.
fn run(sym: *mut c_void, case: &Case) -> Buffer {
    let inputs = case.inputs();
    let args = LaunchArgs::new(&inputs, &case.shape).expect("launch arguments");
    let mut out = Buffer::zeros(case.prog.dtype(), case.len());
    let o = out.bytes_mut().as_mut_ptr();
    let l = &args.leaves;
    let (g, general, n) = (args.geom.as_ptr(), args.general, args.n);
    // SAFETY: `sym` is `cf_eval_k`, generated for exactly these leaves (one pointer each, at
    // the region's origin) and this rank; the output holds the region's values and the
    // geometry keeps every index within the leaves' spans, as on the device.
    unsafe {
        match l.len() {
            1 => std::mem::transmute::<*mut c_void, Kernel1>(sym)(o, l[0].as_ptr(), g, general, n),
            2 => std::mem::transmute::<*mut c_void, Kernel2>(sym)(
                o,
                l[0].as_ptr(),
                l[1].as_ptr(),
                g,
                general,
                n,
            ),
            3 => std::mem::transmute::<*mut c_void, Kernel3>(sym)(
                o,
                l[0].as_ptr(),
                l[1].as_ptr(),
                l[2].as_ptr(),
                g,
                general,
                n,
            ),
            other => panic!("{other} leaves: the cases draw one to three"),
        }
    }
    out
}

#[test]
fn random_programs_compiled_for_the_host_match_the_cpu_evaluator() {
    let cases = cases(400);
    let mut kernels = Vec::new();
    let mut references = Vec::new();
    for (k, case) in cases.iter().enumerate() {
        let Some(cpu) = case.reference() else {
            continue;
        };
        let Ok(src) = kernel_source(&case.prog, &case.leaf_dtypes, case.shape.len()) else {
            continue;
        };
        kernels.push((k, src));
        references.push(cpu);
    }
    assert!(
        kernels.len() > 200,
        "only {} of 400 programs have a GPU form",
        kernels.len()
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let library = Library::build(&translation_unit(&kernels), dir.path());
    for ((k, _), cpu) in kernels.iter().zip(&references) {
        let out = run(library.symbol(&format!("{KERNEL_NAME}_{k}")), &cases[*k]);
        if let Err(e) = cases[*k].check(*k, cpu, &out) {
            panic!("{e}");
        }
    }
    eprintln!("{} programs matched on the host", kernels.len());
}
