//! The loops every reduction family folds and merges with: values onto one element or spread
//! over consecutive or strided elements, and the fresh state they start from.

use crate::array::{Buffer, DType};
use crate::kernels::eval::tiles::TileTarget;

/// `vals` folded into `a` by `f` through `LANES` running values that start at `identity`
/// (f's identity element) and join `a` at the end: independent chains the CPU runs side by
/// side and vectorizes, where a single chain waits on every step. Sums add in another order
/// than one chain would (in f64 either way); min and max give the same result.
#[inline(always)]
fn fold_lanes(a: f64, vals: &[f64], identity: f64, f: impl Fn(f64, f64) -> f64) -> f64 {
    const LANES: usize = 8;
    let mut lanes = [identity; LANES];
    let mut chunks = vals.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = f(*l, *v);
        }
    }
    let a = lanes.into_iter().fold(a, &f);
    chunks.remainder().iter().fold(a, |a, v| f(a, *v))
}

/// `vals` folded by `f` into the elements of `acc` from `o`, `stride` (at least 1) apart:
/// one value per element.
#[inline(always)]
fn fold_spread<T: Copy, V: Copy>(
    acc: &mut [T],
    o: usize,
    stride: usize,
    vals: &[V],
    f: impl Fn(T, V) -> T,
) {
    if stride == 1 {
        for (a, v) in acc[o..o + vals.len()].iter_mut().zip(vals) {
            *a = f(*a, *v);
        }
    } else {
        for (k, v) in vals.iter().enumerate() {
            let a = &mut acc[o + k * stride];
            *a = f(*a, *v);
        }
    }
}

/// `vals` folded by `f` into the elements of `acc` that `at` names: all onto one element in
/// one chain (stride 0), or one value per element.
#[inline(always)]
pub(super) fn fold_into<T: Copy, V: Copy>(
    acc: &mut [T],
    vals: &[V],
    at: TileTarget,
    f: impl Fn(T, V) -> T,
) {
    let o = at.offset;
    if at.stride == 0 {
        let mut a = acc[o];
        for v in vals {
            a = f(a, *v);
        }
        acc[o] = a;
    } else {
        fold_spread(acc, o, at.stride, vals, f);
    }
}

/// [`fold_into`] of floats: a tile that lands on one element folds in interleaved lanes
/// started at `identity`, f's identity element (see [`fold_lanes`]).
#[inline(always)]
pub(super) fn fold_floats(
    acc: &mut [f64],
    vals: &[f64],
    at: TileTarget,
    identity: f64,
    f: impl Fn(f64, f64) -> f64,
) {
    if at.stride == 0 {
        acc[at.offset] = fold_lanes(acc[at.offset], vals, identity, f);
    } else {
        fold_spread(acc, at.offset, at.stride, vals, f);
    }
}

/// Each element of `a` replaced by `f` of it and the element of `b` at its index (a merge).
pub(super) fn each<T: Copy>(a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = f(*x, *y);
    }
}

/// `len` copies of `v` as f64 in pooled memory.
pub(super) fn f64_state(len: usize, v: f64) -> Buffer {
    Buffer::filled(DType::F64, len, &v.to_ne_bytes())
}

/// `len` copies of `value`, each written here. `vec![0; len]` would come from calloc: fresh
/// pages the accumulator first reads map the shared zero page, so the first write to each takes
/// a second fault that copies the page and interrupts every core to flush its TLB.
pub(super) fn written<T: Clone>(value: T, len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    v.resize(len, value);
    v
}
