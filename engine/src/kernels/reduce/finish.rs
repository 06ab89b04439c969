//! A finished reduction: the values of each family's state, converted to the output dtype
//! in tiles through the cast kernel.

use super::{arg, extremes, logical, sums, variance, Accumulator, Family, State};
use crate::array::{Buffer, DType};
use crate::error::{Error, Result};
use crate::kernels::work::{self, narrow, Reg};
use crate::plan::ReduceFunc;

impl Accumulator {
    /// The result as `out` (dtype `out_dtype`): `count` is the number of values reduced into
    /// each element (for mean), `ddof` the delta degrees of freedom (var, std).
    pub fn finish(self, out_dtype: DType, count: u64, ddof: f64) -> Result<Buffer> {
        use ReduceFunc::*;
        let func = self.func;
        let values = match self.state {
            // Float sums and means convert from their state where it lies (a mean divided in
            // place): no copy of the accumulator in the serial tail of a reduction.
            State::F(mut buf) => {
                if matches!(func, Mean | NanMean) {
                    let n = count as f64;
                    buf.as_slice_mut::<f64>()?.iter_mut().for_each(|s| *s /= n);
                }
                Finished::F64(buf)
            }
            state => Finished::Reg(finished_reg(func, state, count, ddof)?),
        };
        let len = values.len();
        // Every element is stored below.
        let mut out = Buffer::for_overwrite(out_dtype, len);
        let mut converted = Reg::for_dtype(out_dtype);
        let mut tile = values.empty_tile();
        // Convert in tiles through the cast kernel so results narrow exactly like casts.
        let mut start = 0;
        while start < len {
            let n = work::TILE.min(len - start);
            values.copy_tile(start, n, &mut tile)?;
            work::cast(&tile, &mut converted, out_dtype, n);
            narrow(&mut converted, out_dtype, n);
            work::store(&converted, n, &mut out, start)?;
            start += n;
        }
        Ok(out)
    }
}

/// The values of a finished reduction whose state is not a float sum's, mean's, min's or
/// max's f64 state (those convert where they lie, see [`Accumulator::finish`]).
fn finished_reg(func: ReduceFunc, state: State, count: u64, ddof: f64) -> Result<Reg> {
    if let State::F(_) = state {
        return Err(Error::internal(
            "float reduction state converted as a register",
        ));
    }
    match Family::of(func) {
        Family::Sums => sums::finish(func, state, count),
        Family::Extremes => extremes::finish(func, state),
        Family::Logical => logical::finish(func, state),
        Family::Variance => variance::finish(func, state, ddof),
        Family::Arg => arg::finish(func, state),
    }
}

/// A finished reduction's values before their conversion to the output dtype.
enum Finished {
    /// A float sum's or mean's f64 state.
    F64(Buffer),
    /// Every other result.
    Reg(Reg),
}

impl Finished {
    /// The number of values.
    fn len(&self) -> usize {
        match self {
            Finished::F64(buf) => buf.len(),
            Finished::Reg(Reg::B(v)) => v.len(),
            Finished::Reg(Reg::I(v)) => v.len(),
            Finished::Reg(Reg::U(v)) => v.len(),
            Finished::Reg(Reg::F(v)) => v.len(),
            Finished::Reg(Reg::C(v)) => v.len(),
        }
    }

    /// A register of the values' kind, for [`copy_tile`](Self::copy_tile).
    fn empty_tile(&self) -> Reg {
        let cap = work::TILE;
        match self {
            Finished::F64(_) | Finished::Reg(Reg::F(_)) => Reg::F(Vec::with_capacity(cap)),
            Finished::Reg(Reg::B(_)) => Reg::B(Vec::with_capacity(cap)),
            Finished::Reg(Reg::I(_)) => Reg::I(Vec::with_capacity(cap)),
            Finished::Reg(Reg::U(_)) => Reg::U(Vec::with_capacity(cap)),
            Finished::Reg(Reg::C(_)) => Reg::C(Vec::with_capacity(cap)),
        }
    }

    /// Values `start..start + n` into `tile` (made by [`empty_tile`](Self::empty_tile)).
    fn copy_tile(&self, start: usize, n: usize, tile: &mut Reg) -> Result<()> {
        fn put<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
            dst.clear();
            dst.extend_from_slice(src);
        }
        let range = start..start + n;
        match (self, tile) {
            (Finished::F64(buf), Reg::F(t)) => put(t, &buf.as_slice::<f64>()?[range]),
            (Finished::Reg(Reg::F(v)), Reg::F(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::B(v)), Reg::B(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::I(v)), Reg::I(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::U(v)), Reg::U(t)) => put(t, &v[range]),
            (Finished::Reg(Reg::C(v)), Reg::C(t)) => put(t, &v[range]),
            _ => return Err(Error::internal("reduction result tile of another kind")),
        }
        Ok(())
    }
}
