//! The lanes of a block along one axis and their groups: a group gathers neighbouring lanes
//! into a contiguous work buffer, and groups write disjoint parts of the output in parallel.

/// The lanes of a block along one axis: `outer` × `inner` lanes of `len` values, `inner`
/// apart, and the output's lane length.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lanes {
    pub(super) outer: usize,
    pub(super) len: usize,
    pub(super) inner: usize,
    pub(super) out_len: usize,
}

/// Lanes transformed together: a group gathers up to this many neighbouring lanes.
pub(super) const GROUP: usize = 16;

/// A real forward transform takes up to this many groups side by side per task...
pub(super) const WIDE: usize = 4;
/// ... while their work buffer stays within this many bytes.
pub(super) const WORK_BYTES: usize = 256 * 1024;

impl Lanes {
    pub(super) fn new(shape: &[usize], axis: usize, out_len: usize) -> Lanes {
        Lanes {
            outer: shape[..axis].iter().product(),
            len: shape[axis],
            inner: shape[axis + 1..].iter().product(),
            out_len,
        }
    }

    pub(super) fn groups_per_outer(&self) -> usize {
        self.inner.div_ceil(GROUP)
    }

    pub(super) fn groups(&self) -> usize {
        self.outer * self.groups_per_outer()
    }

    /// (outer index, first inner index, lane count) of group `g`.
    pub(super) fn group(&self, g: usize) -> (usize, usize, usize) {
        let per = self.groups_per_outer();
        let o = g / per;
        let i0 = (g % per) * GROUP;
        (o, i0, GROUP.min(self.inner - i0))
    }

    pub(super) fn out_elements(&self) -> usize {
        self.outer * self.out_len * self.inner
    }
}

/// A pointer to output values that groups write in parallel. Each output element belongs to
/// exactly one lane and each lane to exactly one group, so the writes never overlap.
#[derive(Clone, Copy)]
pub(super) struct SharedOut<T>(pub(super) *mut T);
// SAFETY: groups write disjoint elements (see above) and the vector outlives the parallel loop.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T: Copy> SharedOut<T> {
    /// Writes `values` from `index` on (one vector copy rather than element stores).
    ///
    /// # Safety
    /// `index..index + values.len()` is in bounds and no other thread writes it.
    pub(super) unsafe fn write_row(self, index: usize, values: &[T]) {
        match <&[T; GROUP]>::try_from(values) {
            // A whole group: a fixed-size copy, inlined as vector moves.
            Ok(whole) => self.0.add(index).cast::<[T; GROUP]>().write(*whole),
            Err(_) => {
                std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(index), values.len())
            }
        }
    }
}

/// Copies `src` (at most GROUP values) into the start of `tile`; whole groups copy as one
/// fixed-size block (vector moves, no call).
#[inline(always)]
pub(super) fn read_row<I: Copy>(tile: &mut [I; GROUP], src: &[I]) {
    match <&[I; GROUP]>::try_from(src) {
        Ok(whole) => *tile = *whole,
        Err(_) => {
            for (t, v) in tile.iter_mut().zip(src) {
                *t = *v;
            }
        }
    }
}
