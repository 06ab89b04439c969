//! Placing decoded chunks' parts into a device array: one descriptor per part (source and
//! destination addresses, the part's shape and both sides' element strides) and a kernel
//! that copies them row by row (the last axis is contiguous on both sides).

use crate::array::grid::c_strides;
use crate::error::{Error, ErrorKind, Result};

/// Axes a descriptor holds.
pub const MAX_RANK: usize = 8;

/// The kernel's name.
pub const PLACE_KERNEL: &str = "cf_place";

/// CUDA C of the placing kernel: block row `y` copies part `y`, blocks along `x` share its
/// rows, threads copy along a row.
pub const PLACE_SOURCE: &str = r#"
struct Piece {
    unsigned long long src, dst;
    long long rows, row_len, rank;
    long long shape[8];
    long long sstr[8];
    long long dstr[8];
};
struct V16 { unsigned long long a, b; };
template <typename T>
__device__ void copy_rows(const Piece& p) {
    for (long long r = blockIdx.x; r < p.rows; r += gridDim.x) {
        long long rem = r, so = 0, dof = 0;
        for (int d = (int)p.rank - 2; d >= 0; --d) {
            long long c = rem % p.shape[d];
            rem /= p.shape[d];
            so += c * p.sstr[d];
            dof += c * p.dstr[d];
        }
        const T* s = (const T*)p.src + so;
        T* t = (T*)p.dst + dof;
        for (long long i = threadIdx.x; i < p.row_len; i += blockDim.x) t[i] = s[i];
    }
}
extern "C" __global__ void cf_place(const Piece* pieces, int elem) {
    const Piece& p = pieces[blockIdx.y];
    switch (elem) {
        case 1: copy_rows<unsigned char>(p); break;
        case 2: copy_rows<unsigned short>(p); break;
        case 4: copy_rows<unsigned int>(p); break;
        case 8: copy_rows<unsigned long long>(p); break;
        default: copy_rows<V16>(p); break;
    }
}
"#;

/// One side of a copy: a C-ordered block of `shape` at device address `base`, and where the
/// part starts in it.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    /// The block's device address.
    pub base: u64,
    /// The block's shape.
    pub shape: &'a [u64],
    /// Where the part starts in the block.
    pub at: &'a [u64],
}

/// One part to copy, as the kernel reads it (`struct Piece`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PieceDesc {
    src: u64,
    dst: u64,
    rows: i64,
    row_len: i64,
    rank: i64,
    shape: [i64; MAX_RANK],
    sstr: [i64; MAX_RANK],
    dstr: [i64; MAX_RANK],
}

impl PieceDesc {
    /// The part of `shape` copied from `src` to `dst`; `elem` bytes per value. Rank 0 is
    /// taken as one axis of one value.
    pub fn new(src: Side<'_>, dst: Side<'_>, shape: &[u64], elem: usize) -> Result<PieceDesc> {
        let rank = shape.len();
        if rank > MAX_RANK {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("device reads take arrays of at most {MAX_RANK} axes, not {rank}"),
            ));
        }
        if [src.shape, src.at, dst.shape, dst.at]
            .iter()
            .any(|v| v.len() != rank)
        {
            return Err(Error::internal("piece of mixed ranks"));
        }
        let (sstr, dstr) = (c_strides(src.shape), c_strides(dst.shape));
        let dot = |at: &[u64], strides: &[u64]| -> u64 {
            at.iter().zip(strides).map(|(a, s)| a * s).sum::<u64>() * elem as u64
        };
        let mut d = PieceDesc {
            src: src.base + dot(src.at, &sstr),
            dst: dst.base + dot(dst.at, &dstr),
            rank: rank.max(1) as i64,
            ..Default::default()
        };
        if rank == 0 {
            d.shape[0] = 1;
            d.sstr[0] = 1;
            d.dstr[0] = 1;
        }
        for a in 0..rank {
            d.shape[a] = shape[a] as i64;
            d.sstr[a] = sstr[a] as i64;
            d.dstr[a] = dstr[a] as i64;
        }
        let last = d.rank as usize - 1;
        d.row_len = d.shape[last];
        d.rows = d.shape[..last].iter().product();
        Ok(d)
    }

    /// Rows the part has.
    pub fn rows(&self) -> i64 {
        self.rows
    }
}

// SAFETY: a repr(C) struct of integers with no padding (two u64 then 27 i64).
unsafe impl bytemuck::Zeroable for PieceDesc {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for PieceDesc {}

/// The host's reading of the kernel: copies the part `d` describes between two host buffers
/// standing at device addresses `src_base` and `dst_base` (the tests check the descriptors
/// with it).
#[cfg(test)]
fn place_on_host(d: &PieceDesc, src: (&[u8], u64), dst: (&mut [u8], u64), elem: usize) {
    let ((src, src_base), (dst, dst_base)) = (src, dst);
    let rank = d.rank as usize;
    for r in 0..d.rows {
        let (mut rem, mut so, mut dof) = (r, 0i64, 0i64);
        for a in (0..rank - 1).rev() {
            let c = rem % d.shape[a];
            rem /= d.shape[a];
            so += c * d.sstr[a];
            dof += c * d.dstr[a];
        }
        let s = (d.src - src_base) as usize + so as usize * elem;
        let t = (d.dst - dst_base) as usize + dof as usize * elem;
        let n = d.row_len as usize * elem;
        dst[t..t + n].copy_from_slice(&src[s..s + n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_places_a_part_of_a_chunk_into_its_window() {
        // A 4x5 chunk of u16 holding 0..20; its part [1..3, 2..5] goes to [0..2, 1..4] of a
        // 3x6 window.
        let elem = 2;
        let chunk: Vec<u8> = (0u16..20).flat_map(|v| v.to_le_bytes()).collect();
        let src = Side {
            base: 1000,
            shape: &[4, 5],
            at: &[1, 2],
        };
        let dst = Side {
            base: 5000,
            shape: &[3, 6],
            at: &[0, 1],
        };
        let d = PieceDesc::new(src, dst, &[2, 3], elem).unwrap();
        assert_eq!((d.rows(), d.row_len), (2, 3));
        let mut window = vec![0u8; 3 * 6 * elem];
        place_on_host(&d, (&chunk, 1000), (&mut window, 5000), elem);
        let got: Vec<u16> = window
            .chunks(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let mut want = vec![0u16; 18];
        for (r, row) in [[7, 8, 9], [12, 13, 14]].iter().enumerate() {
            want[r * 6 + 1..r * 6 + 4].copy_from_slice(row);
        }
        assert_eq!(got, want);
        assert_eq!(std::mem::size_of::<PieceDesc>(), 8 * (5 + 3 * MAX_RANK));
    }

    #[test]
    fn scalars_are_one_value_and_too_many_axes_are_named() {
        let none = |base| Side {
            base,
            shape: &[],
            at: &[],
        };
        let d = PieceDesc::new(none(0), none(64), &[], 8).unwrap();
        assert_eq!((d.rows(), d.row_len, d.rank), (1, 1, 1));
        let nine = [1u64; 9];
        let side = Side {
            base: 0,
            shape: &nine,
            at: &nine,
        };
        let e = PieceDesc::new(side, side, &nine, 4).unwrap_err();
        assert!(e.to_string().contains("at most 8 axes"), "{e}");
    }

    /// CUDA's qualifiers and builtins for one host thread, and a driver that walks the grid
    /// as the device would run it.
    const HOST_SHIM: &str = "#define __device__\n#define __global__\n\
        struct cf_dim { unsigned int x, y, z; };\n\
        static cf_dim blockIdx, threadIdx, blockDim, gridDim;\n";
    const HOST_DRIVER: &str = r#"
extern "C" void cf_place_grid(const Piece* pieces, int elem, unsigned gx, unsigned gy, unsigned bx) {
    gridDim.x = gx; gridDim.y = gy; blockDim.x = bx;
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned t = 0; t < bx; ++t) {
                blockIdx.x = x; blockIdx.y = y; threadIdx.x = t;
                cf_place(pieces, elem);
            }
}
"#;

    type Grid = unsafe extern "C" fn(*const PieceDesc, i32, u32, u32, u32);

    #[test]
    fn the_kernel_compiled_for_the_host_places_what_the_descriptors_say() {
        let dir = tempfile::tempdir().unwrap();
        let (src, lib) = (dir.path().join("place.cpp"), dir.path().join("place.so"));
        std::fs::write(&src, format!("{HOST_SHIM}{PLACE_SOURCE}{HOST_DRIVER}")).unwrap();
        let out = std::process::Command::new("c++")
            .args(["-O1", "-fPIC", "-shared", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("a C++ compiler (c++)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = std::ffi::CString::new(lib.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a library this test just built, defining functions only.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null());
        // SAFETY: the symbol is the driver above, of this type.
        let grid: Grid = unsafe {
            std::mem::transmute::<*mut libc::c_void, Grid>(libc::dlsym(
                handle,
                c"cf_place_grid".as_ptr(),
            ))
        };
        // A 3 x 5 x 7 chunk; two parts of it go to two windows of 4 x 6 x 8.
        let (chunk, window) = ([3u64, 5, 7], [4u64, 6, 8]);
        // (from, to, shape, window) of each part.
        type PartAt = ([u64; 3], [u64; 3], [u64; 3], u64);
        let parts: [PartAt; 2] = [
            ([0, 1, 2], [1, 0, 3], [3, 4, 5], 0),
            ([2, 0, 0], [0, 5, 1], [1, 5, 7], 1),
        ];
        for elem in [1usize, 2, 4, 8, 16] {
            let values: Vec<u8> = (0..105 * elem).map(|i| (i * 7 + 3) as u8).collect();
            let window_bytes = 4 * 6 * 8 * elem;
            let (mut got, mut want) = (vec![0u8; 2 * window_bytes], vec![0u8; 2 * window_bytes]);
            let got_base = got.as_mut_ptr() as u64;
            let descs: Vec<PieceDesc> = parts
                .iter()
                .map(|(from, to, shape, w)| {
                    let src = Side {
                        base: values.as_ptr() as u64,
                        shape: &chunk,
                        at: from,
                    };
                    let dst = Side {
                        base: got_base + w * window_bytes as u64,
                        shape: &window,
                        at: to,
                    };
                    PieceDesc::new(src, dst, shape, elem).unwrap()
                })
                .collect();
            for d in &descs {
                place_on_host(
                    d,
                    (&values, values.as_ptr() as u64),
                    (&mut want, got_base),
                    elem,
                );
            }
            // SAFETY: every descriptor names ranges inside `values` and `got`.
            unsafe { grid(descs.as_ptr(), elem as i32, 3, 2, 4) };
            assert_eq!(got, want, "elem {elem}");
            assert!(got.iter().any(|&b| b != 0));
        }
        // SAFETY: no function of the library is called after this.
        unsafe { libc::dlclose(handle) };
    }
}
