//! numpy ufunc semantics on tiles of working values: each function of one, two or three
//! registers, on the scalar arithmetic of `scalar`.

use num_complex::Complex64;

mod scalar;

use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::work::{narrow, Reg};
use crate::plan::expr::Signature;
use crate::plan::Func;
pub use scalar::float_divmod;
use scalar::{
    cexp, clt, complex64_div, complex_div, complex_pow, float_sign, fmax, fmin, int_floordiv,
    int_pow, int_rem, nan_skipping_max, nan_skipping_min, uint_pow,
};

#[inline(always)]
fn zip2<A: Copy, B: Copy, C>(a: &[A], b: &[B], out: &mut [C], n: usize, f: impl Fn(A, B) -> C) {
    for ((o, x), y) in out[..n].iter_mut().zip(&a[..n]).zip(&b[..n]) {
        *o = f(*x, *y);
    }
}

fn map1<A: Copy, C>(a: &[A], out: &mut [C], n: usize, f: impl Fn(A) -> C) {
    for (o, x) in out[..n].iter_mut().zip(&a[..n]) {
        *o = f(*x);
    }
}

fn unsupported(func: Func, what: &str) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("{} has no kernel for {what} values", func.name()),
    )
}

/// Computes `func` on the first `n` values of `args` (all of dtype `sig.compute`, except the
/// bool condition of `where`) into `out` (of dtype `sig.result`), then narrows the result.
pub fn call(func: Func, sig: Signature, args: &[&Reg], out: &mut Reg, n: usize) -> Result<()> {
    // Float results round inside the kernel loop (one pass); everything else narrows after.
    if let (2, Reg::F(a), Reg::F(b), Reg::F(o)) = (
        args.len(),
        args[0],
        args.get(1).copied().unwrap_or(args[0]),
        &mut *out,
    ) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { binary_f_avx2(func, sig.result == DType::F32, a, b, o, n) };
        }
        return if sig.result == DType::F32 {
            binary_f::<true>(func, a, b, o, n)
        } else {
            binary_f::<false>(func, a, b, o, n)
        };
    }
    match args.len() {
        1 if func == Func::Abs && sig.compute == DType::C64 => {
            if let (Reg::C(a), Reg::F(o)) = (args[0], &mut *out) {
                map1(a, o, n, |x: Complex64| complex64_modulus(x.re, x.im));
            } else {
                unary(func, args[0], out, n)?;
            }
        }
        1 => unary(func, args[0], out, n)?,
        2 => binary(func, sig.compute == DType::C64, args[0], args[1], out, n)?,
        _ => ternary(func, args[0], args[1], args[2], out, n)?,
    }
    narrow(out, sig.result, n);
    Ok(())
}

/// `|re + i im|` of a complex64 value (its parts as f64), before rounding to float32: the
/// parts square exactly in f64 and their sum cannot overflow, so a plain square root matches
/// hypot to float32 precision, several times faster. The single-precision evaluator uses it
/// too, so both paths give the same bits.
#[inline(always)]
pub fn complex64_modulus(re: f64, im: f64) -> f64 {
    (re * re + im * im).sqrt()
}

#[inline(always)]
fn rnd<const R32: bool>(x: f64) -> f64 {
    if R32 {
        x as f32 as f64
    } else {
        x
    }
}

/// [`binary_f`] compiled for AVX2 (chosen at run time when the CPU has it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn binary_f_avx2(
    func: Func,
    r32: bool,
    a: &[f64],
    b: &[f64],
    o: &mut [f64],
    n: usize,
) -> Result<()> {
    if r32 {
        binary_f::<true>(func, a, b, o, n)
    } else {
        binary_f::<false>(func, a, b, o, n)
    }
}

/// Binary float kernels; with `R32` each result is rounded to float32 in the same loop.
#[inline(always)]
fn binary_f<const R32: bool>(
    func: Func,
    a: &[f64],
    b: &[f64],
    o: &mut [f64],
    n: usize,
) -> Result<()> {
    use Func::*;
    match func {
        Add => zip2(a, b, o, n, |x, y| rnd::<R32>(x + y)),
        Subtract => zip2(a, b, o, n, |x, y| rnd::<R32>(x - y)),
        Multiply => zip2(a, b, o, n, |x, y| rnd::<R32>(x * y)),
        Divide => zip2(a, b, o, n, |x, y| rnd::<R32>(x / y)),
        FloorDivide => zip2(a, b, o, n, |x, y| rnd::<R32>(float_divmod(x, y).0)),
        Remainder => zip2(a, b, o, n, |x, y| rnd::<R32>(float_divmod(x, y).1)),
        Power => zip2(a, b, o, n, |x: f64, y| rnd::<R32>(x.powf(y))),
        Maximum => zip2(a, b, o, n, |x, y| rnd::<R32>(fmax(x, y))),
        Minimum => zip2(a, b, o, n, |x, y| rnd::<R32>(fmin(x, y))),
        Fmax => zip2(a, b, o, n, |x, y| rnd::<R32>(nan_skipping_max(x, y))),
        Fmin => zip2(a, b, o, n, |x, y| rnd::<R32>(nan_skipping_min(x, y))),
        Arctan2 => zip2(a, b, o, n, |x: f64, y| rnd::<R32>(x.atan2(y))),
        Hypot => zip2(a, b, o, n, |x: f64, y| rnd::<R32>(x.hypot(y))),
        _ => return Err(unsupported(func, "float")),
    }
    Ok(())
}

fn unary(func: Func, a: &Reg, out: &mut Reg, n: usize) -> Result<()> {
    use Func::*;
    match (a, out) {
        (Reg::B(a), Reg::B(o)) => match func {
            LogicalNot => map1(a, o, n, |x| !x),
            Abs | Floor | Ceil | Trunc => map1(a, o, n, |x| x),
            IsNan | IsInf => map1(a, o, n, |_| false),
            IsFinite => map1(a, o, n, |_| true),
            _ => return Err(unsupported(func, "bool")),
        },
        (Reg::I(_) | Reg::U(_), Reg::B(o)) if matches!(func, IsNan | IsInf | IsFinite) => {
            let finite = func == IsFinite;
            o[..n].iter_mut().for_each(|v| *v = finite);
        }
        (Reg::F(a), Reg::B(o)) if matches!(func, IsNan | IsInf | IsFinite) => match func {
            IsNan => map1(a, o, n, |x: f64| x.is_nan()),
            IsInf => map1(a, o, n, |x: f64| x.is_infinite()),
            _ => map1(a, o, n, |x: f64| x.is_finite()),
        },
        (Reg::C(a), Reg::B(o)) if matches!(func, IsNan | IsInf | IsFinite) => match func {
            IsNan => map1(a, o, n, |x: Complex64| x.re.is_nan() || x.im.is_nan()),
            IsInf => map1(a, o, n, |x: Complex64| {
                x.re.is_infinite() || x.im.is_infinite()
            }),
            _ => map1(a, o, n, |x: Complex64| x.re.is_finite() && x.im.is_finite()),
        },
        (Reg::I(a), Reg::B(o)) if func == LogicalNot => map1(a, o, n, |x| x == 0),
        (Reg::U(a), Reg::B(o)) if func == LogicalNot => map1(a, o, n, |x| x == 0),
        (Reg::F(a), Reg::B(o)) if func == LogicalNot => map1(a, o, n, |x| x == 0.0),
        (Reg::C(a), Reg::B(o)) if func == LogicalNot => {
            map1(a, o, n, |x| x.re == 0.0 && x.im == 0.0)
        }
        (Reg::I(a), Reg::I(o)) => match func {
            Negative => map1(a, o, n, |x: i64| x.wrapping_neg()),
            Abs => map1(a, o, n, |x: i64| x.wrapping_abs()),
            Floor | Ceil | Trunc => map1(a, o, n, |x| x),
            Square => map1(a, o, n, |x: i64| x.wrapping_mul(x)),
            Sign => map1(a, o, n, i64::signum),
            _ => return Err(unsupported(func, "integer")),
        },
        (Reg::U(a), Reg::U(o)) => match func {
            Negative => map1(a, o, n, |x: u64| x.wrapping_neg()),
            Abs | Floor | Ceil | Trunc => map1(a, o, n, |x| x),
            Square => map1(a, o, n, |x: u64| x.wrapping_mul(x)),
            Sign => map1(a, o, n, |x: u64| u64::from(x > 0)),
            _ => return Err(unsupported(func, "uint64")),
        },
        (Reg::F(a), Reg::F(o)) => match func {
            Negative => map1(a, o, n, |x: f64| -x),
            Abs => map1(a, o, n, f64::abs),
            Sqrt => map1(a, o, n, f64::sqrt),
            Exp => map1(a, o, n, f64::exp),
            Log => map1(a, o, n, f64::ln),
            Sin => map1(a, o, n, f64::sin),
            Cos => map1(a, o, n, f64::cos),
            Floor => map1(a, o, n, f64::floor),
            Ceil => map1(a, o, n, f64::ceil),
            Trunc => map1(a, o, n, f64::trunc),
            Rint => map1(a, o, n, f64::round_ties_even),
            Square => map1(a, o, n, |x: f64| x * x),
            Sign => map1(a, o, n, float_sign),
            Log1p => map1(a, o, n, f64::ln_1p),
            Expm1 => map1(a, o, n, f64::exp_m1),
            Exp2 => map1(a, o, n, f64::exp2),
            Log2 => map1(a, o, n, f64::log2),
            Log10 => map1(a, o, n, f64::log10),
            Tan => map1(a, o, n, f64::tan),
            Arcsin => map1(a, o, n, f64::asin),
            Arccos => map1(a, o, n, f64::acos),
            Arctan => map1(a, o, n, f64::atan),
            Sinh => map1(a, o, n, f64::sinh),
            Cosh => map1(a, o, n, f64::cosh),
            Tanh => map1(a, o, n, f64::tanh),
            _ => return Err(unsupported(func, "float")),
        },
        (Reg::C(a), Reg::F(o)) if func == Abs => map1(a, o, n, |x: Complex64| x.norm()),
        (Reg::C(a), Reg::C(o)) => match func {
            Negative => map1(a, o, n, |x: Complex64| -x),
            Sqrt => map1(a, o, n, |x: Complex64| x.sqrt()),
            Exp => map1(a, o, n, cexp),
            Log => map1(a, o, n, |x: Complex64| x.ln()),
            Sin => map1(a, o, n, |x: Complex64| x.sin()),
            Cos => map1(a, o, n, |x: Complex64| x.cos()),
            Square => map1(a, o, n, |x: Complex64| x * x),
            _ => return Err(unsupported(func, "complex")),
        },
        _ => return Err(unsupported(func, "these")),
    }
    Ok(())
}

/// Binary kernels; `r32` says complex values are complex64 (their powers round as numpy's
/// complex64 arithmetic does).
fn binary(func: Func, r32: bool, a: &Reg, b: &Reg, out: &mut Reg, n: usize) -> Result<()> {
    use Func::*;
    match (a, b, out) {
        (Reg::B(a), Reg::B(b), Reg::B(o)) => match func {
            Add | LogicalOr | Maximum | Fmax => zip2(a, b, o, n, |x, y| x | y),
            Multiply | LogicalAnd | Minimum | Fmin => zip2(a, b, o, n, |x, y| x & y),
            LogicalXor | NotEqual => zip2(a, b, o, n, |x, y| x ^ y),
            Equal => zip2(a, b, o, n, |x, y| x == y),
            Less => zip2(a, b, o, n, |x, y| !x & y),
            LessEqual => zip2(a, b, o, n, |x, y| !x | y),
            Greater => zip2(a, b, o, n, |x, y| x & !y),
            GreaterEqual => zip2(a, b, o, n, |x, y| x | !y),
            _ => return Err(unsupported(func, "bool")),
        },
        (Reg::I(a), Reg::I(b), Reg::I(o)) => match func {
            Add => zip2(a, b, o, n, |x: i64, y| x.wrapping_add(y)),
            Subtract => zip2(a, b, o, n, |x: i64, y| x.wrapping_sub(y)),
            Multiply => zip2(a, b, o, n, |x: i64, y| x.wrapping_mul(y)),
            FloorDivide => zip2(a, b, o, n, int_floordiv),
            Remainder => zip2(a, b, o, n, int_rem),
            Power => {
                if b[..n].iter().any(|&y| y < 0) {
                    return Err(Error::new(
                        ErrorKind::Plan,
                        "integers to negative integer powers are not allowed",
                    ));
                }
                zip2(a, b, o, n, |x, y| int_pow(x, y as u64))
            }
            Maximum | Fmax => zip2(a, b, o, n, |x: i64, y| x.max(y)),
            Minimum | Fmin => zip2(a, b, o, n, |x: i64, y| x.min(y)),
            _ => return Err(unsupported(func, "integer")),
        },
        (Reg::I(a), Reg::I(b), Reg::B(o)) => cmp(func, a, b, o, n)?,
        (Reg::U(a), Reg::U(b), Reg::U(o)) => match func {
            Add => zip2(a, b, o, n, |x: u64, y| x.wrapping_add(y)),
            Subtract => zip2(a, b, o, n, |x: u64, y| x.wrapping_sub(y)),
            Multiply => zip2(a, b, o, n, |x: u64, y| x.wrapping_mul(y)),
            FloorDivide => zip2(a, b, o, n, |x: u64, y| x.checked_div(y).unwrap_or(0)),
            Remainder => zip2(a, b, o, n, |x: u64, y| x.checked_rem(y).unwrap_or(0)),
            Power => zip2(a, b, o, n, uint_pow),
            Maximum | Fmax => zip2(a, b, o, n, |x: u64, y| x.max(y)),
            Minimum | Fmin => zip2(a, b, o, n, |x: u64, y| x.min(y)),
            _ => return Err(unsupported(func, "uint64")),
        },
        (Reg::U(a), Reg::U(b), Reg::B(o)) => cmp(func, a, b, o, n)?,
        (Reg::F(a), Reg::F(b), Reg::F(o)) => match func {
            Add => zip2(a, b, o, n, |x, y| x + y),
            Subtract => zip2(a, b, o, n, |x, y| x - y),
            Multiply => zip2(a, b, o, n, |x, y| x * y),
            Divide => zip2(a, b, o, n, |x, y| x / y),
            FloorDivide => zip2(a, b, o, n, |x, y| float_divmod(x, y).0),
            Remainder => zip2(a, b, o, n, |x, y| float_divmod(x, y).1),
            Power => zip2(a, b, o, n, f64::powf),
            Maximum => zip2(a, b, o, n, fmax),
            Minimum => zip2(a, b, o, n, fmin),
            _ => return Err(unsupported(func, "float")),
        },
        (Reg::F(a), Reg::F(b), Reg::B(o)) => cmp(func, a, b, o, n)?,
        (Reg::C(a), Reg::C(b), Reg::C(o)) => match func {
            Add => zip2(a, b, o, n, |x, y| x + y),
            Subtract => zip2(a, b, o, n, |x, y| x - y),
            Multiply => zip2(a, b, o, n, |x, y| x * y),
            Divide if r32 => zip2(a, b, o, n, complex64_div),
            Divide => zip2(a, b, o, n, complex_div),
            Power => zip2(a, b, o, n, |x, y| complex_pow(x, y, r32)),
            Maximum => zip2(a, b, o, n, |x, y| if clt(x, y) { y } else { x }),
            Minimum => zip2(a, b, o, n, |x, y| if clt(y, x) { y } else { x }),
            _ => return Err(unsupported(func, "complex")),
        },
        (Reg::C(a), Reg::C(b), Reg::B(o)) => match func {
            Equal => zip2(a, b, o, n, |x, y| x == y),
            NotEqual => zip2(a, b, o, n, |x, y| x != y),
            Less => zip2(a, b, o, n, clt),
            Greater => zip2(a, b, o, n, |x, y| clt(y, x)),
            LessEqual => zip2(a, b, o, n, |x, y| clt(x, y) || x == y),
            GreaterEqual => zip2(a, b, o, n, |x, y| clt(y, x) || x == y),
            _ => return Err(unsupported(func, "complex")),
        },
        _ => return Err(unsupported(func, "mixed")),
    }
    Ok(())
}

fn cmp<T: PartialOrd + Copy>(func: Func, a: &[T], b: &[T], o: &mut [bool], n: usize) -> Result<()> {
    use Func::*;
    match func {
        Equal => zip2(a, b, o, n, |x, y| x == y),
        NotEqual => zip2(a, b, o, n, |x, y| x != y),
        Less => zip2(a, b, o, n, |x, y| x < y),
        LessEqual => zip2(a, b, o, n, |x, y| x <= y),
        Greater => zip2(a, b, o, n, |x, y| x > y),
        GreaterEqual => zip2(a, b, o, n, |x, y| x >= y),
        _ => return Err(unsupported(func, "comparison")),
    }
    Ok(())
}

fn select<T: Copy>(c: &[bool], a: &[T], b: &[T], o: &mut [T], n: usize) {
    // Zipped slices of exactly `n`: no bounds checks, so the loop vectorizes (a blend).
    for (((o, &c), &a), &b) in o[..n].iter_mut().zip(&c[..n]).zip(&a[..n]).zip(&b[..n]) {
        *o = if c { a } else { b };
    }
}

fn ternary(func: Func, x: &Reg, y: &Reg, z: &Reg, out: &mut Reg, n: usize) -> Result<()> {
    match func {
        Func::Where => {
            let Reg::B(c) = x else {
                return Err(Error::internal("where: condition is not bool"));
            };
            match (y, z, out) {
                (Reg::B(a), Reg::B(b), Reg::B(o)) => select(c, a, b, o, n),
                (Reg::I(a), Reg::I(b), Reg::I(o)) => select(c, a, b, o, n),
                (Reg::U(a), Reg::U(b), Reg::U(o)) => select(c, a, b, o, n),
                (Reg::F(a), Reg::F(b), Reg::F(o)) => select(c, a, b, o, n),
                (Reg::C(a), Reg::C(b), Reg::C(o)) => select(c, a, b, o, n),
                _ => return Err(unsupported(func, "mixed")),
            }
        }
        Func::Clip => match (x, y, z, out) {
            // numpy: minimum(maximum(x, lo), hi), NaN propagating.
            (Reg::I(a), Reg::I(l), Reg::I(h), Reg::I(o)) => {
                for i in 0..n {
                    o[i] = a[i].max(l[i]).min(h[i]);
                }
            }
            (Reg::U(a), Reg::U(l), Reg::U(h), Reg::U(o)) => {
                for i in 0..n {
                    o[i] = a[i].max(l[i]).min(h[i]);
                }
            }
            (Reg::F(a), Reg::F(l), Reg::F(h), Reg::F(o)) => {
                for i in 0..n {
                    o[i] = fmin(fmax(a[i], l[i]), h[i]);
                }
            }
            (Reg::B(a), Reg::B(l), Reg::B(h), Reg::B(o)) => {
                for i in 0..n {
                    o[i] = (a[i] | l[i]) & h[i];
                }
            }
            _ => return Err(unsupported(func, "these")),
        },
        _ => return Err(unsupported(func, "three")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complex_powers_follow_numpy() {
        let c = Complex64::new;
        // 32 ** 32 overflows complex64 while squaring: inf, and inf * 0 makes the imaginary
        // part nan (numpy: inf+nanj); complex128 holds it.
        let p = complex_pow(c(32.0, 0.0), c(32.0, 0.0), true);
        assert!(p.re == f64::INFINITY && p.im.is_nan(), "{p}");
        assert_eq!(
            complex_pow(c(32.0, 0.0), c(32.0, 0.0), false),
            c(2f64.powi(160), 0.0)
        );
        assert_eq!(complex_pow(c(1.0, 1.0), c(3.0, 0.0), false), c(-2.0, 2.0));
        assert_eq!(complex_pow(c(0.0, 2.0), c(-2.0, 0.0), false), c(-0.25, 0.0));
        assert_eq!(complex_pow(c(0.0, 0.0), c(2.0, 0.0), false), c(0.0, 0.0));
        assert!(complex_pow(c(0.0, 0.0), c(-2.0, 0.0), false).re.is_nan());
        assert_eq!(complex_pow(c(0.0, 0.0), c(0.0, 0.0), false), c(1.0, 0.0));
        let principal = complex_pow(c(-1.0, 0.0), c(0.5, 0.0), false);
        assert!((principal - c(0.0, 1.0)).norm() < 1e-15, "{principal}");
        let e = cexp(c(1000.0, -0.0));
        assert!(
            e.re == f64::INFINITY && e.im == 0.0 && e.im.is_sign_negative(),
            "{e}"
        );
        // Beyond squaring, an overflowing real power is inf + 0j (numpy: C's cpow).
        assert_eq!(
            complex_pow(c(575.0, 0.0), c(575.0, 0.0), true),
            c(f64::INFINITY, 0.0)
        );
    }

    #[test]
    fn float_divmod_matches_python() {
        assert_eq!(float_divmod(7.0, -2.0), (-4.0, -1.0));
        assert_eq!(float_divmod(-7.0, 2.0), (-4.0, 1.0));
        assert_eq!(float_divmod(7.5, 2.0), (3.0, 1.5));
        let (d, m) = float_divmod(1.0, 0.0);
        assert!(d.is_infinite() && m.is_nan());
    }

    #[test]
    fn integer_floor_division_and_remainder_match_python() {
        assert_eq!(int_floordiv(-7, 2), -4);
        assert_eq!(int_rem(-7, 2), 1);
        assert_eq!(int_rem(7, -2), -1);
        assert_eq!(int_floordiv(5, 0), 0);
    }
}
