//! Where a tile's float32 results go: written, added to running sums, or added to float32
//! running sums skipping NaNs (and counting what they add).

use super::SumMode;

/// Where a program's `n` float32 results of a tile go, given in order.
pub(super) trait Sink {
    /// Takes the `n` values.
    fn put(self, n: usize, values: impl Iterator<Item = f32>);
}

/// Written to a slice, exactly (f32, or f64 which holds every f32).
pub(super) struct Write<'a, T>(pub(super) &'a mut [T]);

/// Added to a slice's running sums.
pub(super) struct Add<'a, T>(pub(super) &'a mut [T]);

/// Added to float32 running sums unless NaN, and counted when counts are given; with
/// [`SumMode::Start`], written as the sums' first values (0 for NaN) and counts (1, or 0).
pub(super) struct SkipNan<'a>(
    pub(super) &'a mut [f32],
    pub(super) Option<&'a mut [u8]>,
    pub(super) SumMode,
);

impl<T: Copy + From<f32>> Sink for Write<'_, T> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        self.0[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(o, x)| *o = T::from(x));
    }
}

impl<T: Copy + From<f32> + std::ops::AddAssign> Sink for Add<'_, T> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        self.0[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(o, x)| *o += T::from(x));
    }
}

impl Sink for SkipNan<'_> {
    #[inline(always)]
    fn put(self, n: usize, values: impl Iterator<Item = f32>) {
        match self.2 {
            SumMode::Add => {
                skip_nan_into(self.0, self.1, n, values, |s, x| *s += x, |c, k| *c += k)
            }
            SumMode::Start => {
                skip_nan_into(self.0, self.1, n, values, |s, x| *s = x, |c, k| *c = k)
            }
        }
    }
}

/// Each of `n` values (0 where NaN) into `sums` by `sum`, and 1 (0 where NaN) into `counts`
/// by `count` when given. Branch-free, so the loops vectorize.
#[inline(always)]
fn skip_nan_into(
    sums: &mut [f32],
    counts: Option<&mut [u8]>,
    n: usize,
    values: impl Iterator<Item = f32>,
    sum: impl Fn(&mut f32, f32),
    count: impl Fn(&mut u8, u8),
) {
    match counts {
        None => sums[..n]
            .iter_mut()
            .zip(values)
            .for_each(|(s, x)| sum(s, if x.is_nan() { 0.0 } else { x })),
        Some(counts) => {
            for ((s, c), x) in sums[..n].iter_mut().zip(&mut counts[..n]).zip(values) {
                let seen = !x.is_nan();
                sum(s, if seen { x } else { 0.0 });
                count(c, seen as u8);
            }
        }
    }
}
