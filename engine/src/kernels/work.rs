//! Working representations of values inside fused kernels.
//!
//! Every dtype computes in one of five working types (bool, i64, u64, f64, complex f64) and
//! is narrowed back to its own dtype after each operation: integer results wrap as numpy's
//! do, float32 results are rounded to float32 (for + − × ÷ and sqrt, computing in f64 and
//! rounding once gives exactly the float32 result).

use num_complex::Complex64;

use crate::array::{Buffer, DType};
use crate::error::Result;
use crate::plan::Scalar;

/// Tile length in elements: an f64 register is 2 KiB, so the registers of a fused expression
/// and the reduction sink's data stay in L1 (1024 measured slower on the ERA5 sum: its
/// registers spilled to L2).
pub const TILE: usize = 256;

/// Which working type a dtype computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// bool
    B,
    /// every signed integer and the unsigned ones up to 32 bits
    I,
    /// uint64
    U,
    /// float32 and float64
    F,
    /// complex64 and complex128
    C,
}

/// The working type of `dtype`.
pub fn work_of(dtype: DType) -> Work {
    match dtype {
        DType::Bool => Work::B,
        DType::U64 => Work::U,
        DType::F32 | DType::F64 => Work::F,
        DType::C64 | DType::C128 => Work::C,
        _ => Work::I,
    }
}

/// A register: one tile of values in a working type.
#[derive(Debug, Clone)]
pub enum Reg {
    /// bool values
    B(Vec<bool>),
    /// i64 values
    I(Vec<i64>),
    /// u64 values
    U(Vec<u64>),
    /// f64 values
    F(Vec<f64>),
    /// complex values
    C(Vec<Complex64>),
}

impl Reg {
    /// A register for `dtype` with room for a tile.
    pub fn for_dtype(dtype: DType) -> Reg {
        match work_of(dtype) {
            Work::B => Reg::B(vec![false; TILE]),
            Work::I => Reg::I(vec![0; TILE]),
            Work::U => Reg::U(vec![0; TILE]),
            Work::F => Reg::F(vec![0.0; TILE]),
            Work::C => Reg::C(vec![Complex64::new(0.0, 0.0); TILE]),
        }
    }
}

/// Wraps an i64 to the range of integer `dtype` (as numpy's fixed-width arithmetic does).
#[inline(always)]
pub fn wrap_int(v: i64, dtype: DType) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U8 => v as u8 as i64,
        DType::U16 => v as u16 as i64,
        DType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// Narrows the first `n` values of `reg` to `dtype`'s range and precision.
pub fn narrow(reg: &mut Reg, dtype: DType, n: usize) {
    match (reg, dtype) {
        (Reg::I(v), DType::I64) => {
            let _ = v;
        }
        (Reg::I(v), d) => v[..n].iter_mut().for_each(|x| *x = wrap_int(*x, d)),
        (Reg::F(v), DType::F32) => v[..n].iter_mut().for_each(|x| *x = *x as f32 as f64),
        (Reg::C(v), DType::C64) => v[..n].iter_mut().for_each(|x| {
            *x = Complex64::new(x.re as f32 as f64, x.im as f32 as f64);
        }),
        _ => {}
    }
}

/// Fills the first `n` values of `reg` (of dtype `dtype`) with the constant `value`.
pub fn fill_const(reg: &mut Reg, value: Scalar, dtype: DType) {
    let (re, im, int, truth) = match value {
        Scalar::Bool(b) => (b as u8 as f64, 0.0, b as i128, b),
        Scalar::Int(i) => (i as f64, 0.0, i, i != 0),
        Scalar::Float(f) => (f, 0.0, f as i128, f != 0.0),
        Scalar::Complex(r, i) => (r, i, r as i128, r != 0.0 || i != 0.0),
    };
    match reg {
        Reg::B(v) => v.fill(truth),
        Reg::I(v) => v.fill(wrap_int(int as i64, dtype)),
        Reg::U(v) => v.fill(int as u64),
        Reg::F(v) => v.fill(if dtype == DType::F32 {
            re as f32 as f64
        } else {
            re
        }),
        Reg::C(v) => {
            let c = if dtype == DType::C64 {
                Complex64::new(re as f32 as f64, im as f32 as f64)
            } else {
                Complex64::new(re, im)
            };
            v.fill(c)
        }
    }
}

/// Where a tile's values come from inside a leaf buffer.
#[derive(Debug, Clone, Copy)]
pub struct Strided {
    /// Element offset of the first value.
    pub offset: usize,
    /// Element stride between values (0: one value broadcast).
    pub stride: usize,
}

macro_rules! gather {
    ($src:expr, $dst:expr, $at:expr, $n:expr, $conv:expr) => {{
        let src = $src;
        let dst = &mut $dst[..$n];
        let conv = $conv;
        if $at.stride == 1 {
            for (d, s) in dst.iter_mut().zip(&src[$at.offset..$at.offset + $n]) {
                *d = conv(*s);
            }
        } else if $at.stride == 0 {
            let v = conv(src[$at.offset]);
            dst.fill(v);
        } else {
            for (k, d) in dst.iter_mut().enumerate() {
                *d = conv(src[$at.offset + k * $at.stride]);
            }
        }
    }};
}

/// Loads `n` values of `buf` at `at` into `reg`, converting to the register's working type.
pub fn load(buf: &Buffer, at: Strided, n: usize, reg: &mut Reg) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { load_avx2(buf, at, n, reg) };
    }
    load_impl(buf, at, n, reg)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn load_avx2(buf: &Buffer, at: Strided, n: usize, reg: &mut Reg) -> Result<()> {
    load_impl(buf, at, n, reg)
}

#[inline(always)]
fn load_impl(buf: &Buffer, at: Strided, n: usize, reg: &mut Reg) -> Result<()> {
    match (buf.dtype(), reg) {
        (DType::Bool, Reg::B(r)) => gather!(buf.as_slice::<u8>()?, r, at, n, |x: u8| x != 0),
        (DType::I8, Reg::I(r)) => gather!(buf.as_slice::<i8>()?, r, at, n, |x: i8| x as i64),
        (DType::I16, Reg::I(r)) => gather!(buf.as_slice::<i16>()?, r, at, n, |x: i16| x as i64),
        (DType::I32, Reg::I(r)) => gather!(buf.as_slice::<i32>()?, r, at, n, |x: i32| x as i64),
        (DType::I64, Reg::I(r)) => gather!(buf.as_slice::<i64>()?, r, at, n, |x: i64| x),
        (DType::U8, Reg::I(r)) => gather!(buf.as_slice::<u8>()?, r, at, n, |x: u8| x as i64),
        (DType::U16, Reg::I(r)) => gather!(buf.as_slice::<u16>()?, r, at, n, |x: u16| x as i64),
        (DType::U32, Reg::I(r)) => gather!(buf.as_slice::<u32>()?, r, at, n, |x: u32| x as i64),
        (DType::U64, Reg::U(r)) => gather!(buf.as_slice::<u64>()?, r, at, n, |x: u64| x),
        (DType::F32, Reg::F(r)) => gather!(buf.as_slice::<f32>()?, r, at, n, |x: f32| x as f64),
        (DType::F64, Reg::F(r)) => gather!(buf.as_slice::<f64>()?, r, at, n, |x: f64| x),
        (DType::C64, Reg::C(r)) => gather!(buf.as_slice::<[f32; 2]>()?, r, at, n, |x: [f32; 2]| {
            Complex64::new(x[0] as f64, x[1] as f64)
        }),
        (DType::C128, Reg::C(r)) => {
            gather!(buf.as_slice::<[f64; 2]>()?, r, at, n, |x: [f64; 2]| {
                Complex64::new(x[0], x[1])
            })
        }
        (d, _) => Err(crate::error::Error::internal(format!(
            "load of {d} into a mismatched register"
        )))?,
    }
    Ok(())
}

macro_rules! scatter {
    ($dst:expr, $src:expr, $offset:expr, $n:expr, $conv:expr) => {{
        let conv = $conv;
        for (d, s) in $dst[$offset..$offset + $n].iter_mut().zip(&$src[..$n]) {
            *d = conv(*s);
        }
    }};
}

/// Stores `n` values of `reg` (already narrowed to `buf`'s dtype) contiguously at `offset`.
pub fn store(reg: &Reg, n: usize, buf: &mut Buffer, offset: usize) -> Result<()> {
    match (buf.dtype(), reg) {
        (DType::Bool, Reg::B(r)) => {
            scatter!(buf.as_slice_mut::<u8>()?, r, offset, n, |x: bool| x as u8)
        }
        (DType::I8, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<i8>()?, r, offset, n, |x: i64| x as i8)
        }
        (DType::I16, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<i16>()?, r, offset, n, |x: i64| x as i16)
        }
        (DType::I32, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<i32>()?, r, offset, n, |x: i64| x as i32)
        }
        (DType::I64, Reg::I(r)) => scatter!(buf.as_slice_mut::<i64>()?, r, offset, n, |x: i64| x),
        (DType::U8, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<u8>()?, r, offset, n, |x: i64| x as u8)
        }
        (DType::U16, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<u16>()?, r, offset, n, |x: i64| x as u16)
        }
        (DType::U32, Reg::I(r)) => {
            scatter!(buf.as_slice_mut::<u32>()?, r, offset, n, |x: i64| x as u32)
        }
        (DType::U64, Reg::U(r)) => scatter!(buf.as_slice_mut::<u64>()?, r, offset, n, |x: u64| x),
        (DType::F32, Reg::F(r)) => {
            scatter!(buf.as_slice_mut::<f32>()?, r, offset, n, |x: f64| x as f32)
        }
        (DType::F64, Reg::F(r)) => scatter!(buf.as_slice_mut::<f64>()?, r, offset, n, |x: f64| x),
        (DType::C64, Reg::C(r)) => scatter!(
            buf.as_slice_mut::<[f32; 2]>()?,
            r,
            offset,
            n,
            |x: Complex64| { [x.re as f32, x.im as f32] }
        ),
        (DType::C128, Reg::C(r)) => {
            scatter!(
                buf.as_slice_mut::<[f64; 2]>()?,
                r,
                offset,
                n,
                |x: Complex64| [x.re, x.im]
            )
        }
        (d, _) => Err(crate::error::Error::internal(format!(
            "store of a mismatched register into {d}"
        )))?,
    }
    Ok(())
}

/// Casts `n` values of `src` (dtype `from`) into `dst` (dtype `to`) as numpy's `astype` does
/// (float → int truncates toward zero; values numpy leaves undefined saturate).
pub fn cast(src: &Reg, dst: &mut Reg, to: DType, n: usize) {
    fn map<A: Copy, B>(s: &[A], d: &mut [B], n: usize, f: impl Fn(A) -> B) {
        for (x, y) in d[..n].iter_mut().zip(&s[..n]) {
            *x = f(*y);
        }
    }
    match (src, &mut *dst) {
        (Reg::B(s), Reg::B(d)) => d[..n].copy_from_slice(&s[..n]),
        (Reg::B(s), Reg::I(d)) => map(s, d, n, |x| x as i64),
        (Reg::B(s), Reg::U(d)) => map(s, d, n, |x| x as u64),
        (Reg::B(s), Reg::F(d)) => map(s, d, n, |x| x as u8 as f64),
        (Reg::B(s), Reg::C(d)) => map(s, d, n, |x| Complex64::new(x as u8 as f64, 0.0)),
        (Reg::I(s), Reg::B(d)) => map(s, d, n, |x| x != 0),
        (Reg::I(s), Reg::I(d)) => map(s, d, n, |x| x),
        (Reg::I(s), Reg::U(d)) => map(s, d, n, |x| x as u64),
        (Reg::I(s), Reg::F(d)) => map(s, d, n, |x| x as f64),
        (Reg::I(s), Reg::C(d)) => map(s, d, n, |x| Complex64::new(x as f64, 0.0)),
        (Reg::U(s), Reg::B(d)) => map(s, d, n, |x| x != 0),
        (Reg::U(s), Reg::I(d)) => map(s, d, n, |x| x as i64),
        (Reg::U(s), Reg::U(d)) => map(s, d, n, |x| x),
        (Reg::U(s), Reg::F(d)) => map(s, d, n, |x| x as f64),
        (Reg::U(s), Reg::C(d)) => map(s, d, n, |x| Complex64::new(x as f64, 0.0)),
        (Reg::F(s), Reg::B(d)) => map(s, d, n, |x| x != 0.0),
        (Reg::F(s), Reg::I(d)) => {
            if to == DType::U32 || to == DType::U16 || to == DType::U8 {
                map(s, d, n, |x| x as u64 as i64)
            } else {
                map(s, d, n, |x| x as i64)
            }
        }
        (Reg::F(s), Reg::U(d)) => map(
            s,
            d,
            n,
            |x| if x < 0.0 { x as i64 as u64 } else { x as u64 },
        ),
        (Reg::F(s), Reg::F(d)) => map(s, d, n, |x| x),
        (Reg::F(s), Reg::C(d)) => map(s, d, n, |x| Complex64::new(x, 0.0)),
        (Reg::C(s), Reg::B(d)) => map(s, d, n, |x| x.re != 0.0 || x.im != 0.0),
        (Reg::C(s), Reg::I(d)) => map(s, d, n, |x| x.re as i64),
        (Reg::C(s), Reg::U(d)) => map(s, d, n, |x| x.re as u64),
        (Reg::C(s), Reg::F(d)) => map(s, d, n, |x| x.re),
        (Reg::C(s), Reg::C(d)) => map(s, d, n, |x| x),
    }
    narrow(dst, to, n);
}
