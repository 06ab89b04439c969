//! CUDA C source for a fused elementwise [`Program`]. Each instruction is evaluated in the
//! CPU evaluator's working types (bool, int64, uint64, double) and narrowed to its dtype after
//! every step, exactly as [`crate::kernels::eval::ufunc`] does, so arithmetic, comparisons, casts and
//! selections give the CPU's bits; only the transcendental functions (exp, log, sin, cos,
//! power) may differ from the CPU's in the last unit of a float64.
//!
//! Programs with complex values or integer powers (whose negative exponents the CPU reports
//! as an error) have no source: they run on the CPU, and [`NoGpuForm`] says why.

use std::fmt::Write;

use crate::array::DType;
use crate::kernels::eval::inst::Inst;
use crate::kernels::eval::program::Program;
use crate::plan::{Func, Scalar};

/// The name of the generated kernel.
pub const KERNEL_NAME: &str = "cf_eval";

/// Working type of a register, as the CPU evaluator holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    B,
    I,
    U,
    F,
}

impl Work {
    fn of(dtype: DType) -> Option<Work> {
        Some(match dtype {
            DType::Bool => Work::B,
            DType::U64 => Work::U,
            DType::F32 | DType::F64 => Work::F,
            DType::C64 | DType::C128 => return None,
            _ => Work::I,
        })
    }

    fn c_type(self) -> &'static str {
        match self {
            Work::B => "bool",
            Work::I => "i64",
            Work::U => "u64",
            Work::F => "double",
        }
    }
}

/// The C type a value of `dtype` is stored as.
fn storage_type(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool | DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::U16 => "unsigned short",
        DType::U32 => "unsigned int",
        DType::U64 => "u64",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::C64 | DType::C128 => return None,
    })
}

/// `x` (of working type `work`) narrowed to `dtype` as [`crate::kernels::work::narrow`] does.
fn narrow(x: &str, work: Work, dtype: DType) -> String {
    match (work, dtype) {
        (Work::I, DType::I8) => format!("(i64)(signed char)({x})"),
        (Work::I, DType::I16) => format!("(i64)(short)({x})"),
        (Work::I, DType::I32) => format!("(i64)(int)({x})"),
        (Work::I, DType::U8) => format!("(i64)(unsigned char)({x})"),
        (Work::I, DType::U16) => format!("(i64)(unsigned short)({x})"),
        (Work::I, DType::U32) => format!("(i64)(unsigned int)({x})"),
        (Work::F, DType::F32) => format!("(double)(float)({x})"),
        _ => x.to_string(),
    }
}

/// A C literal of an int64.
fn i64_literal(v: i64) -> String {
    if v == i64::MIN {
        "(-9223372036854775807LL - 1)".to_string()
    } else {
        format!("{v}LL")
    }
}

/// A C literal of a double, exact to the bit (NaN and infinities included).
fn f64_literal(v: f64) -> String {
    format!("__longlong_as_double({:#x}LL)", v.to_bits() as i64)
}

/// The constant `value` of dtype `dtype` in working type `work`, as
/// [`crate::kernels::work::fill_const`] fills a register.
fn const_literal(value: Scalar, dtype: DType, work: Work) -> Option<String> {
    let (re, int, truth) = match value {
        Scalar::Bool(b) => (b as u8 as f64, b as i128, b),
        Scalar::Int(i) => (i as f64, i, i != 0),
        Scalar::Float(f) => (f, f as i128, f != 0.0),
        Scalar::Complex(..) => return None,
    };
    Some(match work {
        Work::B => truth.to_string(),
        Work::I => i64_literal(crate::kernels::work::wrap_int(int as i64, dtype)),
        Work::U => format!("{}ULL", int as u64),
        Work::F => f64_literal(if dtype == DType::F32 {
            re as f32 as f64
        } else {
            re
        }),
    })
}

/// The value of a cast of `x` (working type `from`) to `to` (working type `into`), before
/// narrowing, as [`crate::kernels::work::cast`] computes it.
fn cast(x: &str, from: Work, into: Work, to: DType) -> String {
    match (from, into) {
        (a, b) if a == b => x.to_string(),
        (Work::B, _) => format!("({})({x})", into.c_type()),
        (Work::I | Work::U, Work::B) => format!("(({x}) != 0)"),
        (Work::F, Work::B) => format!("(({x}) != 0.0)"),
        (Work::I | Work::U, _) => format!("({})({x})", into.c_type()),
        // Float to integer saturates and takes NaN to 0, as Rust's `as` does.
        (Work::F, Work::I) if matches!(to, DType::U8 | DType::U16 | DType::U32) => {
            format!("(i64)cf_f2u({x})")
        }
        (Work::F, Work::I) => format!("cf_f2i({x})"),
        (Work::F, Work::U) => format!("cf_f2u_wrapping({x})"),
        (Work::F, Work::F) => x.to_string(),
    }
}

/// The expression of `func` over argument registers `a` (with their working types), whose
/// result has working type `out`; `None` where the CPU has no kernel for these types or the
/// GPU does not take the function (integer powers).
fn call(func: Func, args: &[(String, Work)], out: Work) -> Option<String> {
    use Func::*;
    use Work::*;
    let a = |i: usize| args[i].0.as_str();
    let works: Vec<Work> = args.iter().map(|(_, w)| *w).collect();
    Some(match (works.as_slice(), out) {
        ([B], B) => match func {
            LogicalNot => format!("!{}", a(0)),
            Abs | Floor | Ceil => a(0).to_string(),
            _ => return None,
        },
        ([I | U], B) if func == LogicalNot => format!("({} == 0)", a(0)),
        ([F], B) if func == LogicalNot => format!("({} == 0.0)", a(0)),
        ([I], I) => match func {
            Negative => format!("(i64)(0ULL - (u64){})", a(0)),
            Abs => format!("({0} < 0 ? (i64)(0ULL - (u64){0}) : {0})", a(0)),
            Floor | Ceil => a(0).to_string(),
            _ => return None,
        },
        ([U], U) => match func {
            Negative => format!("(0ULL - {})", a(0)),
            Abs | Floor | Ceil => a(0).to_string(),
            _ => return None,
        },
        ([F], F) => {
            let f = match func {
                Negative => return Some(format!("(-{})", a(0))),
                Abs => "fabs",
                Sqrt => "sqrt",
                Exp => "exp",
                Log => "log",
                Sin => "sin",
                Cos => "cos",
                Floor => "floor",
                Ceil => "ceil",
                _ => return None,
            };
            format!("{f}({})", a(0))
        }
        ([B, B], B) => {
            let (x, y) = (a(0), a(1));
            match func {
                Add | LogicalOr | Maximum => format!("({x} | {y})"),
                Multiply | LogicalAnd | Minimum => format!("({x} & {y})"),
                LogicalXor | NotEqual => format!("({x} ^ {y})"),
                Equal => format!("({x} == {y})"),
                Less => format!("(!{x} & {y})"),
                LessEqual => format!("(!{x} | {y})"),
                Greater => format!("({x} & !{y})"),
                GreaterEqual => format!("({x} | !{y})"),
                _ => return None,
            }
        }
        ([I, I], I) => {
            let (x, y) = (a(0), a(1));
            match func {
                Add => format!("(i64)((u64){x} + (u64){y})"),
                Subtract => format!("(i64)((u64){x} - (u64){y})"),
                Multiply => format!("(i64)((u64){x} * (u64){y})"),
                FloorDivide => format!("cf_ifloordiv({x}, {y})"),
                Remainder => format!("cf_irem({x}, {y})"),
                Maximum => format!("max({x}, {y})"),
                Minimum => format!("min({x}, {y})"),
                _ => return None,
            }
        }
        ([U, U], U) => {
            let (x, y) = (a(0), a(1));
            match func {
                Add => format!("({x} + {y})"),
                Subtract => format!("({x} - {y})"),
                Multiply => format!("({x} * {y})"),
                FloorDivide => format!("({y} == 0 ? 0ULL : {x} / {y})"),
                Remainder => format!("({y} == 0 ? 0ULL : {x} % {y})"),
                Maximum => format!("max({x}, {y})"),
                Minimum => format!("min({x}, {y})"),
                _ => return None,
            }
        }
        ([F, F], F) => {
            let (x, y) = (a(0), a(1));
            match func {
                Add => format!("({x} + {y})"),
                Subtract => format!("({x} - {y})"),
                Multiply => format!("({x} * {y})"),
                Divide => format!("({x} / {y})"),
                FloorDivide => format!("cf_floordiv({x}, {y})"),
                Remainder => format!("cf_fmod_py({x}, {y})"),
                Power => format!("pow({x}, {y})"),
                Maximum => format!("cf_fmax({x}, {y})"),
                Minimum => format!("cf_fmin({x}, {y})"),
                _ => return None,
            }
        }
        ([I, I] | [U, U] | [F, F], B) => {
            let op = match func {
                Equal => "==",
                NotEqual => "!=",
                Less => "<",
                LessEqual => "<=",
                Greater => ">",
                GreaterEqual => ">=",
                _ => return None,
            };
            format!("({} {op} {})", a(0), a(1))
        }
        ([B, x, y], o) if func == Where && x == y && *x == o => {
            format!("({} ? {} : {})", a(0), a(1), a(2))
        }
        ([x, l, h], o) if func == Clip && x == l && l == h && *x == o => {
            let (x, l, h) = (a(0), a(1), a(2));
            match o {
                I | U => format!("min(max({x}, {l}), {h})"),
                F => format!("cf_fmin(cf_fmax({x}, {l}), {h})"),
                B => format!("(({x} | {l}) & {h})"),
            }
        }
        _ => return None,
    })
}

/// Helpers the generated code calls: numpy's float and integer floor division and remainder
/// (as [`crate::kernels::eval::ufunc`]), NaN-propagating maximum and minimum, saturating
/// float-to-integer conversions.
pub(super) const PRELUDE: &str = r#"
typedef long long i64;
typedef unsigned long long u64;
#define CF_NAN __longlong_as_double(0x7ff8000000000000LL)
__device__ __forceinline__ double cf_fmax(double a, double b) {
    return (isnan(a) || a > b) ? a : b;
}
__device__ __forceinline__ double cf_fmin(double a, double b) {
    return (isnan(a) || a < b) ? a : b;
}
__device__ double cf_floordiv(double a, double b) {
    if (b == 0.0) return a / b;
    double m = fmod(a, b);
    double div = (a - m) / b;
    if (m != 0.0) {
        if ((b < 0.0) != (m < 0.0)) { div -= 1.0; }
    }
    if (div != 0.0) {
        double f = floor(div);
        return (div - f > 0.5) ? f + 1.0 : f;
    }
    return copysign(0.0, a / b);
}
__device__ double cf_fmod_py(double a, double b) {
    if (b == 0.0) return CF_NAN;
    double m = fmod(a, b);
    if (m != 0.0) {
        if ((b < 0.0) != (m < 0.0)) { m += b; }
        return m;
    }
    return copysign(0.0, b);
}
__device__ __forceinline__ i64 cf_ifloordiv(i64 a, i64 b) {
    if (b == 0) return 0;
    if (b == -1) return (i64)(0ULL - (u64)a);
    i64 q = a / b;
    return ((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ i64 cf_irem(i64 a, i64 b) {
    if (b == 0 || b == -1) return 0;
    i64 r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ i64 cf_f2i(double x) {
    if (isnan(x)) return 0;
    if (x >= 9223372036854775807.0) return 9223372036854775807LL;
    if (x <= -9223372036854775808.0) return (-9223372036854775807LL - 1);
    return (i64)x;
}
__device__ __forceinline__ u64 cf_f2u(double x) {
    if (isnan(x) || x <= 0.0) return 0ULL;
    if (x >= 18446744073709551615.0) return 18446744073709551615ULL;
    return (u64)x;
}
__device__ __forceinline__ u64 cf_f2u_wrapping(double x) {
    return x < 0.0 ? (u64)cf_f2i(x) : cf_f2u(x);
}
"#;

/// Why a program has no GPU form (it runs on the CPU), in words for the run's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoGpuForm(pub String);

impl NoGpuForm {
    fn new(reason: impl Into<String>) -> Self {
        NoGpuForm(reason.into())
    }
}

/// The name of a register's working type, for [`NoGpuForm`].
fn work_name(w: Work) -> &'static str {
    match w {
        Work::B => "bool",
        Work::I => "int",
        Work::U => "uint64",
        Work::F => "float",
    }
}

/// A program's instructions as CUDA C statements (`const T rK = ...;`, leaf `l` read at
/// element offset `oL` of pointer `lL`), with what the last register holds.
pub(super) struct ProgramBody {
    /// The statements, one per instruction.
    pub text: String,
    /// The C type the program's values are stored as.
    pub out_store: &'static str,
    /// The register holding the value.
    pub last: usize,
    /// Its working type.
    out_work: Work,
}

impl ProgramBody {
    /// Whether the value is a float (held as a double).
    pub fn is_float(&self) -> bool {
        self.out_work == Work::F
    }
}

/// The statements of `prog` over leaves of `leaf_dtypes`; [`NoGpuForm`] when some
/// instruction has none.
pub(super) fn program_body(
    prog: &Program,
    leaf_dtypes: &[DType],
) -> Result<ProgramBody, NoGpuForm> {
    let complex = |dtype: DType| NoGpuForm::new(format!("complex values ({dtype}) run on the CPU"));
    let out_dtype = prog.dtype();
    let out_store = storage_type(out_dtype).ok_or_else(|| complex(out_dtype))?;
    let out_work = Work::of(out_dtype).ok_or_else(|| complex(out_dtype))?;
    let malformed = || NoGpuForm::new("the program refers to a register it has not computed");
    let mut body = String::new();
    let mut works: Vec<Work> = Vec::with_capacity(prog.insts.len());
    for (k, inst) in prog.insts.iter().enumerate() {
        let work = Work::of(inst.dtype()).ok_or_else(|| complex(inst.dtype()))?;
        let value = match inst {
            Inst::Load { leaf, dtype } => {
                if leaf_dtypes.get(*leaf) != Some(dtype) {
                    return Err(NoGpuForm::new(format!(
                        "input {leaf} is loaded as {dtype} but arrives as {}",
                        leaf_dtypes
                            .get(*leaf)
                            .map_or("nothing".to_string(), |d| d.to_string())
                    )));
                }
                let store = storage_type(*dtype).ok_or_else(|| complex(*dtype))?;
                let v = format!("((const {store}*)l{leaf})[o{leaf}]");
                match work {
                    Work::B => format!("({v} != 0)"),
                    _ => format!("({})({v})", work.c_type()),
                }
            }
            Inst::Const { value, dtype } => const_literal(*value, *dtype, work)
                .ok_or_else(|| NoGpuForm::new("complex constants run on the CPU"))?,
            Inst::Cast { arg, to } => {
                let from = *works.get(*arg).ok_or_else(malformed)?;
                narrow(&cast(&format!("r{arg}"), from, work, *to), work, *to)
            }
            Inst::Call { func, sig, args } => {
                let typed: Vec<(String, Work)> = args
                    .iter()
                    .map(|&r| works.get(r).map(|w| (format!("r{r}"), *w)))
                    .collect::<Option<_>>()
                    .ok_or_else(malformed)?;
                let code = call(*func, &typed, work).ok_or_else(|| {
                    let kinds: Vec<&str> = typed.iter().map(|(_, w)| work_name(*w)).collect();
                    NoGpuForm::new(format!(
                        "{} of {} values has no GPU form",
                        func.name(),
                        kinds.join(", ")
                    ))
                })?;
                narrow(&code, work, sig.result)
            }
        };
        let _ = writeln!(body, "        const {} r{k} = {value};", work.c_type());
        works.push(work);
    }
    if works.last() != Some(&out_work) {
        return Err(NoGpuForm::new(
            "the program's last value is not of its dtype",
        ));
    }
    let last = prog.insts.len().checked_sub(1).ok_or_else(malformed)?;
    Ok(ProgramBody {
        text: body,
        out_store,
        last,
        out_work,
    })
}

/// The CUDA C source of `prog` over regions of rank `rank`, writing `out` values of the
/// program's dtype; [`NoGpuForm`] when some instruction has none (see the module docs).
///
/// The kernel `cf_eval(out, leaf0, …, geom, general, n)` evaluates `n` values; each leaf
/// points at the element of the region's origin. `geom` holds the region's shape (`rank`
/// values), then every leaf's `rank` element strides; they are read only when `general` is
/// set, else every leaf is laid out as the output (C-contiguous) and value `i` is element `i`.
pub fn kernel_source(
    prog: &Program,
    leaf_dtypes: &[DType],
    rank: usize,
) -> Result<String, NoGpuForm> {
    let ProgramBody {
        text: body,
        out_store,
        last,
        out_work,
    } = program_body(prog, leaf_dtypes)?;
    let result = match out_work {
        Work::B => format!("(unsigned char)(r{last} ? 1 : 0)"),
        _ => format!("({out_store})r{last}"),
    };
    let leaves = leaf_dtypes.len();
    let mut src = String::from(PRELUDE);
    let params: String = (0..leaves)
        .map(|l| format!(", const unsigned char* __restrict__ l{l}"))
        .collect();
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void {KERNEL_NAME}({out_store}* __restrict__ out{params}, \
         const i64* __restrict__ geom, int general, u64 n) {{"
    );
    let _ = writeln!(src, "    const int R = {rank};");
    src.push_str(
        "    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {\n",
    );
    for l in 0..leaves {
        let _ = writeln!(src, "        i64 o{l} = 0;");
    }
    src.push_str("        if (!general) {\n");
    for l in 0..leaves {
        let _ = writeln!(src, "            o{l} = (i64)i;");
    }
    src.push_str("        } else {\n            u64 rem = i;\n            for (int d = R - 1; d >= 0; --d) {\n                u64 ix = rem % (u64)geom[d];\n                rem /= (u64)geom[d];\n");
    for l in 0..leaves {
        let _ = writeln!(
            src,
            "                o{l} += (i64)ix * geom[R + {l} * R + d];"
        );
    }
    src.push_str("            }\n        }\n");
    src.push_str(&body);
    let _ = writeln!(src, "        out[i] = {result};");
    src.push_str("    }\n}\n");
    Ok(src)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::expr::Signature;

    fn f32_add_one() -> Program {
        Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: DType::F32,
                },
                Inst::Const {
                    value: Scalar::Float(1.0),
                    dtype: DType::F32,
                },
                Inst::Call {
                    func: Func::Add,
                    sig: Signature {
                        compute: DType::F32,
                        result: DType::F32,
                    },
                    args: vec![0, 1],
                },
            ],
        }
    }

    #[test]
    fn float32_arithmetic_narrows_after_every_step() {
        let src = kernel_source(&f32_add_one(), &[DType::F32], 3).expect("a GPU form");
        assert!(
            src.contains("const double r2 = (double)(float)((r0 + r1));"),
            "{src}"
        );
        assert!(src.contains("out[i] = (float)r2;"), "{src}");
        assert!(src.contains("const int R = 3;"));
    }

    #[test]
    fn constants_are_exact_to_the_bit() {
        assert_eq!(
            f64_literal(0.1),
            "__longlong_as_double(0x3fb999999999999aLL)"
        );
        assert_eq!(
            const_literal(Scalar::Int(300), DType::U8, Work::I).as_deref(),
            Some("44LL")
        );
        assert_eq!(i64_literal(i64::MIN), "(-9223372036854775807LL - 1)");
        assert_eq!(
            const_literal(Scalar::Float(f64::NAN), DType::F64, Work::F).as_deref(),
            Some("__longlong_as_double(0x7ff8000000000000LL)")
        );
    }

    #[test]
    fn complex_values_and_integer_powers_stay_on_the_cpu() {
        let complex = Program {
            insts: vec![Inst::Load {
                leaf: 0,
                dtype: DType::C64,
            }],
        };
        let why = kernel_source(&complex, &[DType::C64], 1).unwrap_err();
        assert_eq!(why.0, "complex values (complex64) run on the CPU");
        let int_power = Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: DType::I32,
                },
                Inst::Call {
                    func: Func::Power,
                    sig: Signature {
                        compute: DType::I32,
                        result: DType::I32,
                    },
                    args: vec![0, 0],
                },
            ],
        };
        let why = kernel_source(&int_power, &[DType::I32], 1).unwrap_err();
        assert_eq!(why.0, "power of int, int values has no GPU form");
    }

    #[test]
    fn a_leaf_of_another_dtype_than_loaded_has_no_source() {
        let why = kernel_source(&f32_add_one(), &[DType::F64], 1).unwrap_err();
        assert_eq!(why.0, "input 0 is loaded as float32 but arrives as float64");
    }
}
