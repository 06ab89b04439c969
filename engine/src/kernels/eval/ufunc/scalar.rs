//! numpy's arithmetic on single values where Rust's differs: floor division, remainder and
//! powers of integers, NaN-aware maxima and minima, sign, complex division, powers, exp and
//! order.

use num_complex::Complex64;

/// numpy's floor division and remainder of floats (`npy_divmod`).
#[inline]
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

#[inline]
pub(super) fn int_floordiv(a: i64, b: i64) -> i64 {
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

#[inline]
pub(super) fn int_rem(a: i64, b: i64) -> i64 {
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

#[inline]
pub(super) fn int_pow(mut base: i64, mut exp: u64) -> i64 {
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

#[inline]
pub(super) fn uint_pow(mut base: u64, mut exp: u64) -> u64 {
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
#[inline]
pub(super) fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// numpy's `minimum`: NaN propagates, and of equal values (`-0.0` and `0.0`) the second.
#[inline]
pub(super) fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// numpy's `fmax`: a NaN is passed over unless both are NaN (the sign of a zero tie is not
/// fixed: numpy's own loops differ).
#[inline]
pub(super) fn nan_skipping_max(a: f64, b: f64) -> f64 {
    if b.is_nan() || a >= b {
        a
    } else {
        b
    }
}

/// numpy's `fmin`: a NaN is passed over unless both are NaN.
#[inline]
pub(super) fn nan_skipping_min(a: f64, b: f64) -> f64 {
    if b.is_nan() || a <= b {
        a
    } else {
        b
    }
}

/// numpy's `sign` of a float: -1, 0 or 1, NaN for NaN (and +0 for either zero).
#[inline]
pub(super) fn float_sign(x: f64) -> f64 {
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
#[inline]
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
#[inline]
pub(super) fn complex_div(x: Complex64, y: Complex64) -> Complex64 {
    let (re, im) = smith_div(x.re, x.im, y.re, y.im);
    Complex64::new(re, im)
}

/// [`smith_div`] of complex64 values, each step in float32 as numpy's complex64 loop takes
/// it: a tiny divisor's reciprocal overflows there (`1e-45 / 1e-45` is inf + nan j), not in
/// float64.
#[inline]
pub(super) fn complex64_div(x: Complex64, y: Complex64) -> Complex64 {
    let (re, im) = smith_div(x.re as f32, x.im as f32, y.re as f32, y.im as f32);
    Complex64::new(re as f64, im as f64)
}

/// numpy's complex power (`nc_pow`): `x ** 0` is 1; a zero base gives 0 for an exponent with
/// a positive real part and nan + nan j otherwise; integer exponents below 100 in magnitude multiply by
/// squaring (as numpy does, so overflow turns into inf and nan the same way), in float32 for
/// complex64 (`r32`); anything else is the principal value.
#[inline]
pub(super) fn complex_pow(x: Complex64, y: Complex64, r32: bool) -> Complex64 {
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
#[inline]
pub(super) fn cexp(z: Complex64) -> Complex64 {
    if z.im == 0.0 {
        Complex64::new(z.re.exp(), z.im)
    } else {
        z.exp()
    }
}

/// numpy orders complex numbers lexicographically (real part first).
#[inline]
pub(super) fn clt(a: Complex64, b: Complex64) -> bool {
    a.re < b.re || (a.re == b.re && a.im < b.im)
}
