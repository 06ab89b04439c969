//! Typed, aligned element buffers and strided copies between C-ordered regions.

use super::dtype::DType;
use super::grid::{c_strides, Region};
use crate::error::{Error, Result};

/// Bytes aligned for every element type (16 bytes), owned.
#[derive(Debug, Clone)]
enum Storage {
    /// A byte vector that happens to be 16-byte aligned (checked when adopted).
    Bytes(Vec<u8>),
    /// Words allocated by the engine, `len` bytes in use.
    Words(Vec<u128>, usize),
}

/// A C-ordered buffer of elements of one dtype.
#[derive(Debug, Clone)]
pub struct Buffer {
    dtype: DType,
    storage: Storage,
}

/// Element types a [`Buffer`] can be viewed as.
pub trait Element: bytemuck::Pod {
    /// The dtypes whose elements have this Rust type's layout.
    fn matches(dtype: DType) -> bool;
}

macro_rules! element {
    ($t:ty, $($d:ident),+) => {
        impl Element for $t {
            fn matches(dtype: DType) -> bool {
                matches!(dtype, $(DType::$d)|+)
            }
        }
    };
}
element!(u8, Bool, U8);
element!(i8, I8);
element!(i16, I16);
element!(u16, U16);
element!(i32, I32);
element!(u32, U32);
element!(i64, I64);
element!(u64, U64);
element!(f32, F32);
element!(f64, F64);
element!([f32; 2], C64);
element!([f64; 2], C128);
element!(num_complex::Complex<f32>, C64);
element!(num_complex::Complex<f64>, C128);

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Storage::Bytes(v) = &mut self.storage {
            super::pool::give(std::mem::take(v));
        }
    }
}

impl Buffer {
    /// A zeroed buffer of `len` elements (pooled memory for large buffers).
    pub fn zeros(dtype: DType, len: usize) -> Self {
        Buffer::pooled(dtype, len, super::pool::take_zeroed)
    }

    /// A buffer of `len` elements whose values are unspecified (a pooled buffer's old bytes,
    /// or zeros): for callers that write every element, so no pass zeroes it first.
    pub fn for_overwrite(dtype: DType, len: usize) -> Self {
        #[allow(unused_mut)]
        let mut b = Buffer::pooled(dtype, len, super::pool::take_filled);
        // Unit tests see garbage, so a kernel that leaves an element unwritten fails them.
        #[cfg(test)]
        b.bytes_mut().fill(0xA5);
        b
    }

    /// `len` elements from `take` (pooled memory) when large and 16-byte aligned, else zeroed
    /// words.
    fn pooled(dtype: DType, len: usize, take: fn(usize) -> Vec<u8>) -> Self {
        let bytes = len * dtype.size();
        if bytes >= super::pool::MIN_POOLED {
            let v = take(bytes);
            if (v.as_ptr() as usize).is_multiple_of(16) {
                return Buffer {
                    dtype,
                    storage: Storage::Bytes(v),
                };
            }
            super::pool::give(v);
        }
        Buffer {
            dtype,
            storage: Storage::Words(vec![0u128; bytes.div_ceil(16)], bytes),
        }
    }

    /// A buffer of `len` copies of the element whose native-endian bytes are `fill`.
    pub fn filled(dtype: DType, len: usize, fill: &[u8]) -> Self {
        if fill.iter().all(|&x| x == 0) {
            return Buffer::zeros(dtype, len);
        }
        let mut b = Buffer::for_overwrite(dtype, len);
        let mut chunks = b.bytes_mut().chunks_exact_mut(fill.len());
        for chunk in &mut chunks {
            chunk.copy_from_slice(fill);
        }
        chunks.into_remainder().fill(0);
        b
    }

    /// Adopts decoded bytes, copying only if they are not suitably aligned.
    pub fn from_bytes(dtype: DType, bytes: Vec<u8>) -> Result<Self> {
        if !bytes.len().is_multiple_of(dtype.size()) {
            return Err(Error::internal(format!(
                "{} bytes is not a whole number of {dtype} elements",
                bytes.len()
            )));
        }
        if (bytes.as_ptr() as usize).is_multiple_of(16) {
            return Ok(Buffer {
                dtype,
                storage: Storage::Bytes(bytes),
            });
        }
        let mut b = Buffer::zeros(dtype, bytes.len() / dtype.size());
        b.bytes_mut().copy_from_slice(&bytes);
        Ok(b)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes().len() / self.dtype.size()
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw native-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Bytes(v) => v,
            Storage::Words(w, len) => &bytemuck::cast_slice(w)[..*len],
        }
    }

    /// The raw bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Bytes(v) => v,
            Storage::Words(w, len) => &mut bytemuck::cast_slice_mut(w)[..*len],
        }
    }

    /// Consumes the buffer into its bytes (copying when held as words).
    pub fn into_bytes(mut self) -> Vec<u8> {
        match std::mem::replace(&mut self.storage, Storage::Words(Vec::new(), 0)) {
            Storage::Bytes(v) => v,
            Storage::Words(w, len) => bytemuck::cast_slice(&w)[..len].to_vec(),
        }
    }

    /// The elements as `T`; errors when `T` does not match the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if !T::matches(self.dtype) {
            return Err(Error::internal(format!(
                "buffer of {} viewed as {}",
                self.dtype,
                std::any::type_name::<T>()
            )));
        }
        bytemuck::try_cast_slice(self.bytes()).map_err(|e| Error::internal(e.to_string()))
    }

    /// The elements as `T`, mutable.
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        if !T::matches(self.dtype) {
            return Err(Error::internal(format!(
                "buffer of {} viewed as {}",
                self.dtype,
                std::any::type_name::<T>()
            )));
        }
        bytemuck::try_cast_slice_mut(self.bytes_mut()).map_err(|e| Error::internal(e.to_string()))
    }

    /// True when every element's bytes equal `fill`.
    pub fn all_equal(&self, fill: &[u8]) -> bool {
        self.bytes().chunks_exact(fill.len()).all(|c| c == fill)
    }
}

/// Copies `region` (coordinates relative to nothing: absolute) from `src`, a C-ordered buffer
/// covering `src_region`, into `dst`, a C-ordered buffer covering `dst_region`, for elements of
/// `elem` bytes. `region` must lie inside both.
pub fn copy_region(
    src: &[u8],
    src_region: &Region,
    dst: &mut [u8],
    dst_region: &Region,
    region: &Region,
    elem: usize,
) {
    for_each_run(src_region, dst_region, region, elem, |so, doff, n| {
        dst[doff..doff + n].copy_from_slice(&src[so..so + n]);
    });
}

/// Calls `f(src_offset, dst_offset, bytes)` for every contiguous run of `region` between a
/// C-ordered buffer over `src_region` and one over `dst_region` (elements of `elem` bytes),
/// merging trailing axes that are contiguous in both into one run.
pub fn for_each_run(
    src_region: &Region,
    dst_region: &Region,
    region: &Region,
    elem: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = region.rank();
    if region.is_empty() {
        return;
    }
    if rank == 0 {
        f(0, 0, elem);
        return;
    }
    let ss = c_strides(&src_region.shape);
    let ds = c_strides(&dst_region.shape);
    let rel_s = region.relative_to(&src_region.start);
    let rel_d = region.relative_to(&dst_region.start);
    let mut inner = rank - 1;
    let mut run = region.shape[rank - 1];
    while inner > 0
        && region.shape[inner] == src_region.shape[inner]
        && region.shape[inner] == dst_region.shape[inner]
    {
        inner -= 1;
        run *= region.shape[inner];
    }
    let run_bytes = run as usize * elem;
    let outer_shape = &region.shape[..inner];
    let mut idx = vec![0u64; inner];
    let total: u64 = outer_shape.iter().product();
    for _ in 0..total.max(1) {
        let mut so = 0u64;
        let mut doff = 0u64;
        for d in 0..inner {
            so += (rel_s.start[d] + idx[d]) * ss[d];
            doff += (rel_d.start[d] + idx[d]) * ds[d];
        }
        so += rel_s.start[inner] * ss[inner];
        doff += rel_d.start[inner] * ds[inner];
        f(so as usize * elem, doff as usize * elem, run_bytes);
        for d in (0..inner).rev() {
            idx[d] += 1;
            if idx[d] < outer_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Reverses, in place, the order of the values of `bytes` (a C-ordered array of `shape`, of
/// values of `elem` bytes) along each of `axes`.
pub fn reverse_axes(bytes: &mut [u8], shape: &[u64], axes: &[usize], elem: usize) {
    for &axis in axes {
        let len = shape[axis] as usize;
        // The values past `axis` move together: a group per index along it.
        let group = shape[axis + 1..].iter().product::<u64>() as usize * elem;
        if len < 2 || group == 0 {
            continue;
        }
        for block in bytes.chunks_exact_mut(len * group) {
            for j in 0..len / 2 {
                let (front, back) = block.split_at_mut((len - 1 - j) * group);
                front[j * group..(j + 1) * group].swap_with_slice(&mut back[..group]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_axes_matches_reversed_indexing() {
        // 2 x 3 x 2 values of 2 bytes each.
        let shape = [2u64, 3, 2];
        let value = |i: usize, j: usize, k: usize| (100 * i + 10 * j + k) as u16;
        let mut bytes: Vec<u8> = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..2 {
                    bytes.extend(value(i, j, k).to_ne_bytes());
                }
            }
        }
        reverse_axes(&mut bytes, &shape, &[1, 2], 2);
        let got: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .collect();
        let mut want = Vec::new();
        for i in 0..2 {
            for j in (0..3).rev() {
                for k in (0..2).rev() {
                    want.push(value(i, j, k));
                }
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn copy_region_moves_the_overlap() {
        // src covers rows 2..4, cols 0..4 of a 6x4 array with values 10*r + c.
        let src_region = Region {
            start: vec![2, 0],
            shape: vec![2, 4],
        };
        let src: Vec<u8> = (0..8).map(|i| (20 + (i / 4) * 10 + i % 4) as u8).collect();
        let dst_region = Region {
            start: vec![0, 0],
            shape: vec![6, 4],
        };
        let mut dst = vec![0u8; 24];
        let region = Region {
            start: vec![2, 1],
            shape: vec![2, 2],
        };
        copy_region(&src, &src_region, &mut dst, &dst_region, &region, 1);
        assert_eq!(&dst[9..11], &[21, 22]);
        assert_eq!(&dst[13..15], &[31, 32]);
        assert_eq!(dst.iter().filter(|&&x| x != 0).count(), 4);
    }

    #[test]
    fn filled_and_all_equal() {
        let b = Buffer::filled(DType::F32, 5, &1.5f32.to_ne_bytes());
        assert_eq!(b.as_slice::<f32>().unwrap(), &[1.5; 5]);
        assert!(b.all_equal(&1.5f32.to_ne_bytes()));
        assert!(b.as_slice::<f64>().is_err());
    }
}
