//! numpy ufunc semantics on tiles of working values.

use num_complex::Complex64;

use super::work::{narrow, Reg};
use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::expr::Signature;
use crate::plan::Func;

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

/// numpy's floor division and remainder of floats (`npy_divmod`).
pub fn float_divmod(a: f64, b: f64) -> (f64, f64) {
    if b == 0.0 {
        return (a / b, f64::NAN);
    }
    let mut m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m += b;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(b);
    }
    let floordiv = if div != 0.0 {
        let f = div.floor();
        if div - f > 0.5 {
            f + 1.0
        } else {
            f
        }
    } else {
        0.0f64.copysign(a / b)
    };
    (floordiv, m)
}

fn int_floordiv(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn int_rem(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

fn int_pow(mut base: i64, mut exp: u64) -> i64 {
    let mut acc: i64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

fn uint_pow(mut base: u64, mut exp: u64) -> u64 {
    let mut acc: u64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

/// numpy's `maximum`: NaN propagates, and of equal values (`-0.0` and `0.0`) the second.
fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// numpy's `minimum`: NaN propagates, and of equal values (`-0.0` and `0.0`) the second.
fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// numpy's `fmax`: a NaN is passed over unless both are NaN (the sign of a zero tie is not
/// fixed: numpy's own loops differ).
fn nan_skipping_max(a: f64, b: f64) -> f64 {
    if b.is_nan() || a >= b {
        a
    } else {
        b
    }
}

/// numpy's `fmin`: a NaN is passed over unless both are NaN.
fn nan_skipping_min(a: f64, b: f64) -> f64 {
    if b.is_nan() || a <= b {
        a
    } else {
        b
    }
}

/// numpy's `sign` of a float: -1, 0 or 1, NaN for NaN (and +0 for either zero).
fn float_sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x.is_nan() {
        x
    } else {
        0.0
    }
}

/// Complex division as numpy computes it (Smith's method; dividing by zero gives a complex
/// infinity or NaN, not always NaN), in the precision `T` of the parts: `(ar + i ai) /
/// (br + i bi)`.
fn smith_div<T: rustfft::num_traits::Float>(ar: T, ai: T, br: T, bi: T) -> (T, T) {
    if br.abs() >= bi.abs() {
        if br == T::zero() && bi == T::zero() {
            return (ar / br.abs(), ai / br.abs());
        }
        let rat = bi / br;
        let scl = T::one() / (br + bi * rat);
        ((ar + ai * rat) * scl, (ai - ar * rat) * scl)
    } else {
        let rat = br / bi;
        let scl = T::one() / (bi + br * rat);
        ((ar * rat + ai) * scl, (ai * rat - ar) * scl)
    }
}

/// [`smith_div`] of complex128 values.
fn complex_div(x: Complex64, y: Complex64) -> Complex64 {
    let (re, im) = smith_div(x.re, x.im, y.re, y.im);
    Complex64::new(re, im)
}

/// [`smith_div`] of complex64 values, each step in float32 as numpy's complex64 loop takes
/// it: a tiny divisor's reciprocal overflows there (`1e-45 / 1e-45` is inf + nan j), not in
/// float64.
fn complex64_div(x: Complex64, y: Complex64) -> Complex64 {
    let (re, im) = smith_div(x.re as f32, x.im as f32, y.re as f32, y.im as f32);
    Complex64::new(re as f64, im as f64)
}

/// numpy's complex power (`nc_pow`): `x ** 0` is 1; a zero base gives 0 for an exponent with
/// a positive real part and nan + nan j otherwise; integer exponents below 100 in magnitude multiply by
/// squaring (as numpy does, so overflow turns into inf and nan the same way), in float32 for
/// complex64 (`r32`); anything else is the principal value.
fn complex_pow(x: Complex64, y: Complex64, r32: bool) -> Complex64 {
    let round = |z: Complex64| {
        if r32 {
            Complex64::new(z.re as f32 as f64, z.im as f32 as f64)
        } else {
            z
        }
    };
    let mul = |a: Complex64, b: Complex64| {
        round(Complex64::new(
            a.re * b.re - a.im * b.im,
            a.re * b.im + a.im * b.re,
        ))
    };
    if y.re == 0.0 && y.im == 0.0 {
        return Complex64::new(1.0, 0.0);
    }
    if x.re == 0.0 && x.im == 0.0 {
        return if y.re > 0.0 {
            Complex64::new(0.0, 0.0)
        } else {
            Complex64::new(f64::NAN, f64::NAN)
        };
    }
    if y.im == 0.0 && y.re == y.re.trunc() && y.re.abs() < 100.0 {
        let n = y.re as i64;
        match n {
            1 => return x,
            2 => return mul(x, x),
            3 => return mul(x, mul(x, x)),
            _ => {}
        }
        let m = n.unsigned_abs();
        let (mut acc, mut p, mut mask) = (Complex64::new(1.0, 0.0), x, 1u64);
        loop {
            if m & mask != 0 {
                acc = mul(acc, p);
            }
            mask <<= 1;
            if m < mask {
                break;
            }
            p = mul(p, p);
        }
        return if n < 0 {
            round(complex_div(Complex64::new(1.0, 0.0), acc))
        } else {
            acc
        };
    }
    cexp(y * x.ln())
}

/// The complex exponential as C's `cexp` (which numpy uses): a real argument (imaginary part
/// ±0) gives a real result with that zero even when it overflows, inf ± 0j rather than
/// inf × (cos 0 + j sin 0) = inf + nan j.
fn cexp(z: Complex64) -> Complex64 {
    if z.im == 0.0 {
        Complex64::new(z.re.exp(), z.im)
    } else {
        z.exp()
    }
}

/// numpy orders complex numbers lexicographically (real part first).
fn clt(a: Complex64, b: Complex64) -> bool {
    a.re < b.re || (a.re == b.re && a.im < b.im)
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
