//! CF decoding of packed values, as xarray decodes them: each stored value converted to the
//! decoded float type, multiplied by `scale_factor` and shifted by `add_offset` in that type,
//! and NaN where the stored value is the `_FillValue`.

use crate::array::DType;
use crate::error::{Error, Result};

/// Values per parallel piece.
const PIECE: usize = 1 << 16;

/// What decoding does to one variable's stored values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CfDecoding {
    /// `scale_factor`, if any.
    pub scale: Option<f64>,
    /// `add_offset`, if any.
    pub offset: Option<f64>,
    /// `_FillValue` as stored, if any: those values decode to NaN.
    pub fill: Option<f64>,
}

/// Decodes `raw` (values of `stored`) into `out` (as many values of `decoded`, `float32` or
/// `float64`), on `threads` threads (0: one per core).
pub fn decode_cf(
    raw: &[u8],
    stored: DType,
    out: &mut [u8],
    decoded: DType,
    cf: CfDecoding,
    threads: usize,
) -> Result<()> {
    if !matches!(decoded, DType::F32 | DType::F64) {
        return Err(Error::plan(
            "CF decoding",
            format!("decodes to float32 or float64, not {decoded}"),
        ));
    }
    let n = raw.len() / stored.size();
    if !raw.len().is_multiple_of(stored.size()) || out.len() != n * decoded.size() {
        return Err(Error::plan(
            "CF decoding",
            format!(
                "{} bytes of {stored} do not match {} bytes of {decoded}",
                raw.len(),
                out.len()
            ),
        ));
    }
    let pool = super::decode::decode_pool(threads)?;
    match decoded {
        DType::F32 => run::<f32>(raw, stored, out, cf, &pool),
        _ => run::<f64>(raw, stored, out, cf, &pool),
    }
}

/// A decoded float type.
trait Decoded: Copy + Send + Sync + bytemuck::Pod + std::ops::Mul<Output = Self> {
    fn from_f64(v: f64) -> Self;
    fn add(self, other: Self) -> Self;
    const NAN: Self;
}

impl Decoded for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn add(self, other: Self) -> Self {
        self + other
    }
    const NAN: Self = f32::NAN;
}

impl Decoded for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
    fn add(self, other: Self) -> Self {
        self + other
    }
    const NAN: Self = f64::NAN;
}

/// Decodes on `pool`, a piece of values per job.
fn run<T: Decoded>(
    raw: &[u8],
    stored: DType,
    out: &mut [u8],
    cf: CfDecoding,
    pool: &rayon::ThreadPool,
) -> Result<()> {
    use rayon::prelude::*;
    let (width, size) = (stored.size(), std::mem::size_of::<T>());
    pool.install(|| {
        raw.par_chunks(PIECE * width)
            .zip(out.par_chunks_mut(PIECE * size))
            .try_for_each(|(src, dst)| piece::<T>(src, stored, dst, cf))
    })
}

/// Decodes one piece.
fn piece<T: Decoded>(src: &[u8], stored: DType, dst: &mut [u8], cf: CfDecoding) -> Result<()> {
    let scale = cf.scale.map(T::from_f64);
    let offset = cf.offset.map(T::from_f64);
    let size = std::mem::size_of::<T>();
    for (i, d) in dst.chunks_exact_mut(size).enumerate() {
        let v = stored_value(src, stored, i)?;
        let mut x = T::from_f64(v);
        if let Some(s) = scale {
            x = x * s;
        }
        if let Some(o) = offset {
            x = x.add(o);
        }
        if cf.fill.is_some_and(|f| v == f) {
            x = T::NAN;
        }
        d.copy_from_slice(bytemuck::bytes_of(&x));
    }
    Ok(())
}

/// The `i`-th stored value of `src` as f64 (exact for every stored type but 64-bit
/// integers beyond 2^53, which packed data does not use).
fn stored_value(src: &[u8], stored: DType, i: usize) -> Result<f64> {
    macro_rules! at {
        ($t:ty) => {{
            let n = std::mem::size_of::<$t>();
            let mut b = [0u8; std::mem::size_of::<$t>()];
            b.copy_from_slice(&src[i * n..(i + 1) * n]);
            <$t>::from_ne_bytes(b) as f64
        }};
    }
    Ok(match stored {
        DType::I8 => at!(i8),
        DType::I16 => at!(i16),
        DType::I32 => at!(i32),
        DType::I64 => at!(i64),
        DType::U8 | DType::Bool => at!(u8),
        DType::U16 => at!(u16),
        DType::U32 => at!(u32),
        DType::U64 => at!(u64),
        DType::F32 => at!(f32),
        DType::F64 => at!(f64),
        DType::C64 | DType::C128 => {
            return Err(Error::plan(
                "CF decoding",
                format!("{stored} values have no CF decoding"),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_values_decode_as_xarray_does() {
        let raw: Vec<u8> = [0i16, 100, -32767, 7]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let cf = CfDecoding {
            scale: Some(0.1),
            offset: Some(280.0),
            fill: Some(-32767.0),
        };
        let mut out = vec![0u8; 4 * 4];
        decode_cf(&raw, DType::I16, &mut out, DType::F32, cf, 2).unwrap();
        let got: &[f32] = bytemuck::cast_slice(&out);
        // In float32, as xarray: the value, times the scale, plus the offset.
        assert_eq!(got[0], 0f32 * 0.1f32 + 280f32);
        assert_eq!(got[1], 100f32 * 0.1f32 + 280f32);
        assert!(got[2].is_nan());
        assert_eq!(got[3], 7f32 * 0.1f32 + 280f32);
        let mut out = vec![0u8; 4 * 8];
        decode_cf(&raw, DType::I16, &mut out, DType::F64, cf, 1).unwrap();
        let got: &[f64] = bytemuck::cast_slice(&out);
        assert_eq!(got[1], 100.0 * 0.1 + 280.0);
        let err = decode_cf(&raw, DType::I16, &mut out, DType::I32, cf, 1).unwrap_err();
        assert!(err.to_string().contains("float32 or float64"), "{err}");
        let err = decode_cf(&raw, DType::I16, &mut out[..8], DType::F64, cf, 1).unwrap_err();
        assert!(err.to_string().contains("do not match"), "{err}");
    }
}
