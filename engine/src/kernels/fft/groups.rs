//! Every lane of a block transformed by rustfft, groups of lanes in parallel on rayon: each
//! group gathered into a contiguous work buffer, transformed in place and scattered back.

use num_complex::Complex;
use rayon::prelude::*;

use super::lanes::{read_row, Lanes, SharedOut, GROUP};
use super::precision::{plan, Precision};

/// Transforms every lane, groups of lanes in parallel: each group's lanes are gathered
/// through `load` (zero-padded to `n`), transformed, and scattered to `out` through `store`.
pub(super) fn for_each_group<T, I, O>(
    input: &[I],
    lanes: &Lanes,
    n: usize,
    inverse: bool,
    load: impl Fn(I) -> Complex<T> + Sync,
    store: impl Fn(Complex<T>) -> O + Sync,
    out: &mut [O],
) where
    T: Precision,
    I: Copy + Default + Sync,
    O: Copy + Default + Send + Sync,
{
    debug_assert_eq!(out.len(), lanes.out_elements());
    let fft = plan::<T>(n, inverse);
    let shared = SharedOut(out.as_mut_ptr());
    let used = lanes.len.min(n);
    let out_len = lanes.out_len;
    let inner = lanes.inner;
    (0..lanes.groups()).into_par_iter().for_each_init(
        || {
            (
                // Only as many lanes as a group holds: a long transform of few lanes (a 1-d
                // FFT) must not allocate GROUP lanes' worth.
                vec![Complex::<T>::default(); GROUP.min(inner) * n],
                vec![Complex::<T>::default(); fft.get_inplace_scratch_len()],
            )
        },
        |(work, scratch), g| {
            let (o, i0, count) = lanes.group(g);
            let work = &mut work[..count * n];
            // Gather: GROUP x GROUP tiles, read along rows and written along lanes, so both
            // sides stay in cache lines.
            let mut tile = [[I::default(); GROUP]; GROUP];
            for kb in (0..used).step_by(GROUP) {
                let kn = GROUP.min(used - kb);
                for (kk, t) in tile.iter_mut().enumerate().take(kn) {
                    let row = (o * lanes.len + kb + kk) * inner + i0;
                    read_row(t, &input[row..row + count]);
                }
                for (j, lane) in work.chunks_exact_mut(n).enumerate() {
                    for (kk, dst) in lane[kb..kb + kn].iter_mut().enumerate() {
                        *dst = load(tile[kk][j]);
                    }
                }
            }
            for lane in work.chunks_exact_mut(n) {
                lane[used..].fill(Complex::default());
            }
            fft.process_with_scratch(work, scratch);
            // Scatter: the same tiles the other way round.
            let mut tile = [[O::default(); GROUP]; GROUP];
            for kb in (0..out_len).step_by(GROUP) {
                let kn = GROUP.min(out_len - kb);
                for (j, lane) in work.chunks_exact(n).enumerate() {
                    for (kk, v) in lane[kb..kb + kn].iter().enumerate() {
                        tile[kk][j] = store(*v);
                    }
                }
                for (kk, t) in tile.iter().enumerate().take(kn) {
                    let row = (o * out_len + kb + kk) * inner + i0;
                    // SAFETY: `row..row + count` are lanes (o, i0..i0 + count) at position
                    // kb + kk: in bounds, and only this group writes those lanes.
                    unsafe { shared.write_row(row, &t[..count]) };
                }
            }
        },
    );
}
