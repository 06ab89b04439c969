//! The destination of a read: same-shaped windows stacked in one caller buffer, written by
//! many decode jobs at once.

use crate::array::buffer::for_each_run;
use crate::array::Region;

/// The destination: `windows` same-shaped C-ordered boxes stacked in one buffer, written by
/// many decode jobs at once, each to its own (window, chunk) intersections.
pub(crate) struct Destination {
    ptr: *mut u8,
    len: usize,
    window_bytes: usize,
    windows: Vec<Region>,
}

// SAFETY: jobs write through `ptr` only to the bytes of their own (window, chunk)
// intersections, which never overlap: each element of a window lies in exactly one chunk,
// and windows occupy separate slices of the buffer. The buffer outlives every job (they
// finish inside the scope that borrows it).
unsafe impl Send for Destination {}
unsafe impl Sync for Destination {}

impl Destination {
    /// The destination over `out`, which holds `windows` of `window_bytes` each. It must not
    /// outlive `out`, and its users must write disjoint parts (see the `Send`/`Sync` note).
    pub(crate) fn over(out: &mut [u8], window_bytes: usize, windows: Vec<Region>) -> Self {
        Destination {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            window_bytes,
            windows,
        }
    }

    /// Copies `part` (absolute coordinates) of window `w` from `src`, a buffer over `chunk`.
    pub(crate) fn copy_from(
        &self,
        w: usize,
        chunk: &Region,
        part: &Region,
        src: &[u8],
        elem: usize,
    ) {
        let window = &self.windows[w];
        let base = w * self.window_bytes;
        for_each_run(chunk, window, part, elem, |so, doff, n| {
            debug_assert!(base + doff + n <= self.len);
            // SAFETY: the run lies inside window `w` (`part` lies inside it), and no other
            // job writes these bytes (see the `Send`/`Sync` note).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(so), self.ptr.add(base + doff), n);
            }
        });
    }

    /// Where the destination bytes of `part` of window `w` start, when they are one
    /// contiguous run (of `part.len() * elem` bytes).
    pub(crate) fn contiguous(&self, w: usize, part: &Region, elem: usize) -> Option<*mut u8> {
        let window = &self.windows[w];
        let rank = part.rank();
        // Leading axes of extent 1, then whole extents of the window: one run.
        let first = (0..rank).find(|&d| part.shape[d] > 1).unwrap_or(rank);
        let whole_after = (first + 1..rank).all(|d| part.shape[d] == window.shape[d]);
        if !whole_after {
            return None;
        }
        let strides = crate::array::grid::c_strides(&window.shape);
        let rel = part.relative_to(&window.start);
        let offset: u64 = (0..rank).map(|d| rel.start[d] * strides[d]).sum();
        let start = w * self.window_bytes + offset as usize * elem;
        let n = part.len() as usize * elem;
        if start + n > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above).
        Some(unsafe { self.ptr.add(start) })
    }
}
