//! What an array carries beside its values and layout: attributes, dimension names and the
//! value xarray reads as missing, kept the same across Zarr v2 and v3.
//!
//! Zarr v3 keeps dimension names in `dimension_names`; v2 has no such field, and xarray keeps
//! them in the `_ARRAY_DIMENSIONS` attribute. The value xarray masks as missing (CF's
//! `_FillValue`) is a v2 array's `fill_value`, but a v3 array's `_FillValue` attribute
//! (encoded as xarray encodes it: floats as the base64 of their little-endian float64 bytes).
//! [`ArrayAttrs`] holds both in the v3 form, so an array copied from one format to the other
//! opens in xarray as the original does.

use serde_json::{json, Map, Value};

use crate::array::DType;

/// The v2 attribute holding dimension names (xarray's convention).
pub const V2_DIMENSIONS: &str = "_ARRAY_DIMENSIONS";
/// The attribute naming the value xarray masks as missing (CF's `_FillValue`).
pub const FILL_ATTR: &str = "_FillValue";
/// The attribute that marks the target of an unfinished job (see [`job_marker`]).
pub const JOB_ATTR: &str = "chunkfuse";

/// Attributes and dimension names of an array, in Zarr v3's form (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArrayAttrs {
    /// User attributes. Never `_ARRAY_DIMENSIONS` (that is `dimension_names`) nor the job
    /// marker (that describes one store's array, not the data).
    pub attributes: Map<String, Value>,
    /// One name (or none) per axis.
    pub dimension_names: Option<Vec<Option<String>>>,
    /// A Zarr v2 array with no fill value (`fill_value` null) and no dimension names: a v2
    /// copy keeps it null rather than taking the reader's default.
    pub null_v2_fill: bool,
}

impl ArrayAttrs {
    /// The attributes and dimension names of a Zarr v3 array's `zarr.json` document.
    pub fn from_v3(doc: &Value) -> ArrayAttrs {
        let mut attributes = doc
            .get("attributes")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        attributes.remove(JOB_ATTR);
        let dimension_names = doc
            .get("dimension_names")
            .and_then(Value::as_array)
            .map(|names| names.iter().map(|n| n.as_str().map(String::from)).collect());
        ArrayAttrs {
            attributes,
            dimension_names,
            null_v2_fill: false,
        }
    }

    /// The attributes and dimension names of a Zarr v2 array from its `.zattrs` and the
    /// `fill_value` of its `.zarray` (`None` when null). An array xarray made (one with
    /// dimension names) and a fill value gets that value as its `_FillValue` attribute,
    /// unless it has one.
    pub fn from_v2(zattrs: &Map<String, Value>, fill: Option<(DType, &[u8])>) -> ArrayAttrs {
        let mut attributes = zattrs.clone();
        attributes.remove(JOB_ATTR);
        let dimension_names = attributes.remove(V2_DIMENSIONS).and_then(|v| {
            v.as_array()
                .map(|a| a.iter().map(|n| n.as_str().map(String::from)).collect())
        });
        if let (Some(_), Some((dtype, fill))) = (&dimension_names, fill) {
            if !attributes.contains_key(FILL_ATTR) {
                attributes.insert(FILL_ATTR.to_string(), encode_fill(dtype, fill));
            }
        }
        ArrayAttrs {
            attributes,
            null_v2_fill: dimension_names.is_none() && fill.is_none(),
            dimension_names,
        }
    }

    /// The `attributes` and `dimension_names` fields of a v3 document, with `marker` (the job
    /// marker's value) under [`JOB_ATTR`].
    pub fn v3_fields(&self, marker: Option<&Value>) -> (Value, Option<Value>) {
        let mut attributes = self.attributes.clone();
        if let Some(m) = marker {
            attributes.insert(JOB_ATTR.to_string(), m.clone());
        }
        let names = self.dimension_names.as_ref().map(|n| json!(n));
        (Value::Object(attributes), names)
    }

    /// The `.zattrs` document of a v2 array and its `fill_value` as it should be written,
    /// given the array's own fill value `fill` (native-endian bytes): for an array with
    /// dimension names (xarray's), the `_FillValue` attribute becomes the fill value (null
    /// without one: xarray masks nothing); for any other array, `fill` is, unless it came
    /// from a v2 array without one (null stays null).
    pub fn v2_fields(&self, dtype: DType, fill: &[u8], marker: Option<&Value>) -> (Value, Value) {
        let mut attributes = self.attributes.clone();
        let fill_value = match &self.dimension_names {
            None if self.null_v2_fill => Value::Null,
            None => fill_json(dtype, fill),
            Some(names) => {
                let decoded = attributes
                    .get(FILL_ATTR)
                    .map(|v| decode_fill(dtype, v).map(|b| fill_json(dtype, &b)));
                let fill_value = match decoded {
                    None => Value::Null,
                    Some(Some(v)) => {
                        attributes.remove(FILL_ATTR);
                        v
                    }
                    // An attribute xarray could not have written: kept as it is.
                    Some(None) => fill_json(dtype, fill),
                };
                attributes.insert(V2_DIMENSIONS.to_string(), json!(names));
                fill_value
            }
        };
        if let Some(m) = marker {
            attributes.insert(JOB_ATTR.to_string(), m.clone());
        }
        (Value::Object(attributes), fill_value)
    }
}

/// The value of the [`JOB_ATTR`] attribute of a target that job `job` has not finished.
pub fn job_marker(job: &str) -> Value {
    json!({"incomplete": true, "job": job})
}

/// A fill value in Zarr's JSON form (`"NaN"`, `"Infinity"`, numbers, `[re, im]`).
pub fn fill_json(dtype: DType, fill: &[u8]) -> Value {
    fn float(v: f64) -> Value {
        if v.is_nan() {
            json!("NaN")
        } else if v.is_infinite() {
            json!(if v > 0.0 { "Infinity" } else { "-Infinity" })
        } else {
            json!(v)
        }
    }
    match scalar(dtype, fill) {
        Scalar::Bool(b) => json!(b),
        Scalar::Int(i) => json!(i),
        Scalar::UInt(u) => json!(u),
        Scalar::Float(f) => float(f),
        Scalar::Complex(re, im) => json!([float(re), float(im)]),
    }
}

/// The value of one element, widened.
enum Scalar {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Complex(f64, f64),
}

fn scalar(dtype: DType, b: &[u8]) -> Scalar {
    let n = |k: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        let k = k.min(b.len());
        a[..k].copy_from_slice(&b[..k]);
        a
    };
    let f32_at = |o: usize| {
        let a = n(o + 4);
        f32::from_ne_bytes([a[o], a[o + 1], a[o + 2], a[o + 3]]) as f64
    };
    let f64_at = |o: usize| {
        let mut a = [0u8; 8];
        if b.len() >= o + 8 {
            a.copy_from_slice(&b[o..o + 8]);
        }
        f64::from_ne_bytes(a)
    };
    let a = n(8);
    match dtype {
        DType::Bool => Scalar::Bool(a[0] != 0),
        DType::I8 => Scalar::Int(a[0] as i8 as i64),
        DType::U8 => Scalar::UInt(a[0] as u64),
        DType::I16 => Scalar::Int(i16::from_ne_bytes([a[0], a[1]]) as i64),
        DType::U16 => Scalar::UInt(u16::from_ne_bytes([a[0], a[1]]) as u64),
        DType::I32 => Scalar::Int(i32::from_ne_bytes([a[0], a[1], a[2], a[3]]) as i64),
        DType::U32 => Scalar::UInt(u32::from_ne_bytes([a[0], a[1], a[2], a[3]]) as u64),
        DType::I64 => Scalar::Int(i64::from_ne_bytes(a)),
        DType::U64 => Scalar::UInt(u64::from_ne_bytes(a)),
        DType::F32 => Scalar::Float(f32_at(0)),
        DType::F64 => Scalar::Float(f64_at(0)),
        DType::C64 => Scalar::Complex(f32_at(0), f32_at(4)),
        DType::C128 => Scalar::Complex(f64_at(0), f64_at(8)),
    }
}

/// A fill value as xarray writes a v3 array's `_FillValue` attribute: floats as the base64 of
/// their little-endian float64 bytes (complex: one such string per part), integers and
/// booleans as they are.
pub fn encode_fill(dtype: DType, fill: &[u8]) -> Value {
    let b64 = |v: f64| json!(base64::encode(&v.to_le_bytes()));
    match scalar(dtype, fill) {
        Scalar::Bool(b) => json!(b),
        Scalar::Int(i) => json!(i),
        Scalar::UInt(u) => json!(u),
        Scalar::Float(f) => b64(f),
        Scalar::Complex(re, im) => json!([b64(re), b64(im)]),
    }
}

/// The native-endian bytes of a `_FillValue` attribute as xarray writes it (see
/// [`encode_fill`]), or as a plain number or Zarr's `"NaN"`-style strings; `None` when the
/// value cannot be one of `dtype`.
pub fn decode_fill(dtype: DType, value: &Value) -> Option<Vec<u8>> {
    let float = |v: &Value| -> Option<f64> {
        match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => match s.as_str() {
                "NaN" | "nan" => Some(f64::NAN),
                "Infinity" | "inf" => Some(f64::INFINITY),
                "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
                s => {
                    let bytes: [u8; 8] = base64::decode(s)?.try_into().ok()?;
                    Some(f64::from_le_bytes(bytes))
                }
            },
            _ => None,
        }
    };
    let int = |v: &Value| -> Option<i128> {
        match v {
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i128)),
            _ => None,
        }
    };
    macro_rules! int_bytes {
        ($t:ty) => {
            <$t>::try_from(int(value)?).ok()?.to_ne_bytes().to_vec()
        };
    }
    Some(match dtype {
        DType::Bool => vec![u8::from(
            value.as_bool().or_else(|| int(value).map(|i| i != 0))?,
        )],
        DType::I8 => int_bytes!(i8),
        DType::U8 => int_bytes!(u8),
        DType::I16 => int_bytes!(i16),
        DType::U16 => int_bytes!(u16),
        DType::I32 => int_bytes!(i32),
        DType::U32 => int_bytes!(u32),
        DType::I64 => int_bytes!(i64),
        DType::U64 => int_bytes!(u64),
        DType::F32 => (float(value)? as f32).to_ne_bytes().to_vec(),
        DType::F64 => float(value)?.to_ne_bytes().to_vec(),
        DType::C64 | DType::C128 => {
            let parts = value.as_array().filter(|p| p.len() == 2)?;
            let (re, im) = (float(&parts[0])?, float(&parts[1])?);
            if dtype == DType::C64 {
                [(re as f32).to_ne_bytes(), (im as f32).to_ne_bytes()].concat()
            } else {
                [re.to_ne_bytes(), im.to_ne_bytes()].concat()
            }
        }
    })
}

/// Standard base64 (RFC 4648, padded), for the few bytes of a fill value.
mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// Encodes `bytes`.
    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for group in bytes.chunks(3) {
            let b = [
                group[0],
                *group.get(1).unwrap_or(&0),
                *group.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= group.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// Decodes `text`; `None` when it is not padded standard base64.
    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let bytes = text.as_bytes();
        if !bytes.len().is_multiple_of(4) {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
        for (g, group) in bytes.chunks(4).enumerate() {
            let last = g + 1 == bytes.len() / 4;
            let pad = group.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && !last) {
                return None;
            }
            let mut n = 0u32;
            for &c in &group[..4 - pad] {
                let v = ALPHABET.iter().position(|&a| a == c)? as u32;
                n = (n << 6) | v;
            }
            n <<= 6 * pad as u32;
            let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&decoded[..3 - pad]);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_values_encode_as_xarray_writes_them_and_decode_back() {
        // xarray: base64.standard_b64encode(struct.pack("<d", nan)) == "AAAAAAAA+H8="
        let nan = f32::NAN.to_ne_bytes();
        assert_eq!(encode_fill(DType::F32, &nan), json!("AAAAAAAA+H8="));
        let back = decode_fill(DType::F32, &json!("AAAAAAAA+H8=")).unwrap();
        assert!(f32::from_ne_bytes(back.try_into().unwrap()).is_nan());
        // struct.pack("<d", -32767.0) -> "AAAAAMD/38A="
        let v = (-32767.0f64).to_ne_bytes();
        assert_eq!(encode_fill(DType::F64, &v), json!("AAAAAMD/38A="));
        assert_eq!(decode_fill(DType::F64, &json!("AAAAAMD/38A=")).unwrap(), v);
        assert_eq!(
            encode_fill(DType::I16, &(-32767i16).to_ne_bytes()),
            json!(-32767)
        );
        assert_eq!(
            decode_fill(DType::I16, &json!(-32767)).unwrap(),
            (-32767i16).to_ne_bytes()
        );
        assert_eq!(decode_fill(DType::I8, &json!(300)), None);
        assert_eq!(decode_fill(DType::F32, &json!("not base64!")), None);
        let c = [1.5f32.to_ne_bytes(), (-2.0f32).to_ne_bytes()].concat();
        assert_eq!(
            decode_fill(DType::C64, &encode_fill(DType::C64, &c)).unwrap(),
            c
        );
    }

    #[test]
    fn base64_round_trips_every_length() {
        for len in 0..12u8 {
            let bytes: Vec<u8> = (0..len)
                .map(|i| i.wrapping_mul(97).wrapping_add(200))
                .collect();
            assert_eq!(base64::decode(&base64::encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64::encode(b"foob"), "Zm9vYg==");
        assert_eq!(base64::decode("Zm9vYg=="), Some(b"foob".to_vec()));
        assert_eq!(base64::decode("Zm9=Yg=="), None);
    }

    #[test]
    fn v2_dimensions_and_fill_map_to_v3_and_back() {
        let zattrs = json!({"units": "K", "_ARRAY_DIMENSIONS": ["time", "lat"], "chunkfuse": {}});
        let nan = f32::NAN.to_ne_bytes();
        let a = ArrayAttrs::from_v2(zattrs.as_object().unwrap(), Some((DType::F32, &nan)));
        assert_eq!(
            a.dimension_names,
            Some(vec![Some("time".into()), Some("lat".into())])
        );
        assert_eq!(
            Value::Object(a.attributes.clone()),
            json!({"units": "K", "_FillValue": "AAAAAAAA+H8="})
        );
        let (v3_attrs, names) = a.v3_fields(None);
        assert_eq!(
            v3_attrs,
            json!({"units": "K", "_FillValue": "AAAAAAAA+H8="})
        );
        assert_eq!(names, Some(json!(["time", "lat"])));
        let zero = 0f32.to_ne_bytes();
        let (zattrs2, fill) = a.v2_fields(DType::F32, &zero, Some(&job_marker("j")));
        assert_eq!(fill, json!("NaN"));
        assert_eq!(
            zattrs2,
            json!({"units": "K", "_ARRAY_DIMENSIONS": ["time", "lat"],
                   "chunkfuse": {"incomplete": true, "job": "j"}})
        );
        // No fill value (xarray's integers): no _FillValue, and null again in v2.
        let t = ArrayAttrs::from_v2(
            json!({"_ARRAY_DIMENSIONS": ["time"]}).as_object().unwrap(),
            None,
        );
        assert!(t.attributes.is_empty());
        let (_, fill) = t.v2_fields(DType::I64, &0i64.to_ne_bytes(), None);
        assert_eq!(fill, Value::Null);
        // An array without dimension names keeps its own fill value.
        let plain = ArrayAttrs::default();
        assert_eq!(
            plain.v2_fields(DType::F32, &1.5f32.to_ne_bytes(), None).1,
            json!(1.5)
        );
        // ... and one without a fill value keeps none (v3 takes zarrs' default, 0).
        let none = ArrayAttrs::from_v2(&Map::new(), None);
        assert!(none.null_v2_fill);
        assert_eq!(
            none.v2_fields(DType::I32, &0i32.to_ne_bytes(), None).1,
            Value::Null
        );
    }
}
