//! Windows: the box of an existing array that a region write fills.
//!
//! A window's chunks are the target's stored chunks (shards for sharded arrays) cut to the
//! box, in box coordinates: along each axis the first and last may be parts of a target
//! chunk when the box's edges fall off the chunk grid. Window chunk `i` is target chunk
//! `first + i`, so each target chunk has one window chunk and one writer. A window chunk
//! that is a whole target chunk is encoded as usual; a part is merged into the target
//! chunk as stored (read, decoded, overwritten in the box, encoded whole), so no value
//! outside the box changes and chunks outside it are never touched.

use std::ops::Range;

use super::ZarrArray;
use crate::array::{AxisChunks, Buffer, ChunkGrid, Region};
use crate::error::{Error, ErrorKind, Result};

/// Where a window lies in its target.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// The box's start in the target.
    start: Vec<u64>,
    /// The target chunk index of window chunk 0.
    first: Vec<u64>,
    /// The target's stored chunk grid.
    target: ChunkGrid,
}

impl Window {
    /// The target chunk index of window chunk `idx`.
    pub(crate) fn target_index(&self, idx: &[u64]) -> Vec<u64> {
        idx.iter().zip(&self.first).map(|(i, f)| i + f).collect()
    }

    /// The target chunk at index `t` (target coordinates).
    pub(crate) fn target_region(&self, t: &[u64]) -> Region {
        self.target.chunk_region(t)
    }

    /// `r`, a region in box coordinates, in target coordinates.
    pub(crate) fn in_target(&self, r: &Region) -> Region {
        Region {
            start: r
                .start
                .iter()
                .zip(&self.start)
                .map(|(a, s)| a + s)
                .collect(),
            shape: r.shape.clone(),
        }
    }
}

/// Checks that the box at `start` of `shape` lies inside an array of shape `target`; the
/// error names both shapes.
pub fn check_box(start: &[u64], shape: &[u64], target: &[u64]) -> std::result::Result<(), String> {
    if start.len() != target.len() || shape.len() != target.len() {
        return Err(format!(
            "a region starting at {start:?} of shape {shape:?} does not have the rank of the \
             target's shape {target:?}"
        ));
    }
    for (d, ((s, n), t)) in start.iter().zip(shape).zip(target).enumerate() {
        if s.checked_add(*n).is_none_or(|end| end > *t) {
            return Err(format!(
                "a region starting at {start:?} of shape {shape:?} reaches past the target's \
                 shape {target:?} along axis {d}"
            ));
        }
    }
    Ok(())
}

/// The target chunks (indices along each axis of `target`) that the box at `start` of
/// `shape` touches.
pub fn touched_chunks(target: &ChunkGrid, start: &[u64], shape: &[u64]) -> Vec<Range<usize>> {
    target
        .axes()
        .iter()
        .zip(start.iter().zip(shape))
        .map(|(a, (&s, &n))| a.overlapping(s, n))
        .collect()
}

/// The grid of the window of the box at `start` of `shape` over stored chunk grid `target`
/// (box coordinates; see the module documentation), and the window. The box must lie
/// inside the target (see [`check_box`]).
pub(crate) fn window(
    target: &ChunkGrid,
    start: &[u64],
    shape: &[u64],
) -> Result<(ChunkGrid, Window)> {
    check_box(start, shape, &target.shape()).map_err(|m| Error::new(ErrorKind::Plan, m))?;
    let ranges = touched_chunks(target, start, shape);
    let axes = target
        .axes()
        .iter()
        .zip(&ranges)
        .zip(start.iter().zip(shape))
        .map(|((a, r), (&s, &n))| {
            let sizes: Vec<u64> = r
                .clone()
                .map(|k| {
                    let (cs, cl) = a.chunk(k);
                    (cs + cl).min(s + n) - cs.max(s)
                })
                .collect();
            AxisChunks::from_sizes(&sizes)
        })
        .collect::<Result<Vec<_>>>()?;
    let window = Window {
        start: start.to_vec(),
        first: ranges.iter().map(|r| r.start as u64).collect(),
        target: target.clone(),
    };
    Ok((ChunkGrid::new(axes), window))
}

/// The grid of the window of the box at `start` of `shape` over `target` (see [`window`]):
/// the chunks a region write's tasks fill.
pub fn box_grid(target: &ChunkGrid, start: &[u64], shape: &[u64]) -> Result<ChunkGrid> {
    window(target, start, shape).map(|(grid, _)| grid)
}

impl ZarrArray {
    /// This array seen as the box at `start` of `shape`: its grid, chunk keys and encoding
    /// become the window's (see the module documentation). A windowed array is written, not
    /// read: plans never read a region write.
    pub fn windowed(mut self, start: &[u64], shape: &[u64]) -> Result<Self> {
        let (grid, window) = window(&self.grid, start, shape)
            .map_err(|e| e.with_array(self.name.clone()).with_store(self.url.clone()))?;
        self.grid = grid;
        self.window = Some(window);
        Ok(self)
    }

    /// Encodes window chunk `idx` from `data` (its values over the window chunk): a whole
    /// target chunk as usual, a part merged into the target chunk as it is stored.
    pub(crate) fn encode_window_chunk(
        &self,
        window: &Window,
        idx: &[u64],
        data: &Buffer,
        threads: usize,
    ) -> Result<Option<Vec<u8>>> {
        let t = window.target_index(idx);
        let stored = window.target_region(&t);
        let part = window.in_target(&self.grid.chunk_region(idx));
        if data.len() as u64 != part.len() || data.dtype() != self.dtype {
            return Err(Error::internal(format!(
                "chunk {idx:?} of the window expects {} {} elements, got {} {}",
                part.len(),
                self.dtype,
                data.len(),
                data.dtype()
            )));
        }
        if part == stored {
            return self.encode_stored(&t, &stored, data, threads);
        }
        let key = self.stored_key(&t);
        let bytes = self.store.get(&key).map_err(|e| {
            e.with_array(self.name.clone())
                .with_chunk_key(key.clone())
                .with_store(self.url.clone())
        })?;
        let mut merged = self.decode_stored(&t, &stored, bytes.map(crate::store::Value::Owned))?;
        crate::array::buffer::copy_region(
            data.bytes(),
            &part,
            merged.bytes_mut(),
            &stored,
            &part,
            self.dtype.size(),
        );
        self.encode_stored(&t, &stored, &merged, threads)
    }

    /// Decodes window chunk `idx` from the bytes of its target chunk: the window's part of it.
    pub(crate) fn decode_window_chunk(
        &self,
        window: &Window,
        idx: &[u64],
        bytes: Option<crate::store::Value>,
    ) -> Result<Buffer> {
        let t = window.target_index(idx);
        let stored = window.target_region(&t);
        let full = self.decode_stored(&t, &stored, bytes)?;
        let part = window.in_target(&self.grid.chunk_region(idx));
        if part == stored {
            return Ok(full);
        }
        let mut out = Buffer::for_overwrite(self.dtype, part.len() as usize);
        crate::array::buffer::copy_region(
            full.bytes(),
            &stored,
            out.bytes_mut(),
            &part,
            &part,
            self.dtype.size(),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_boxes_cut_the_target_chunks() {
        // Appending 5 steps to 735 in chunks of 10: the box is the second half of chunk 73.
        let target = ChunkGrid::regular(&[740, 4], &[10, 4]).unwrap();
        let (grid, w) = window(&target, &[735, 0], &[5, 4]).unwrap();
        assert_eq!(grid.grid_shape(), vec![1, 1]);
        assert_eq!(w.target_index(&[0, 0]), vec![73, 0]);
        assert_eq!(
            w.in_target(&grid.chunk_region(&[0, 0])),
            Region {
                start: vec![735, 0],
                shape: vec![5, 4]
            }
        );
        // A box over parts of two chunks and one whole one between them.
        let (grid, w) = window(&target, &[15, 1], &[20, 2]).unwrap();
        assert_eq!(grid.axes()[0].sizes(), vec![5, 10, 5]);
        assert_eq!(grid.axes()[1].sizes(), vec![2]);
        assert_eq!(w.target_index(&[2, 0]), vec![3, 0]);
        assert_eq!(
            touched_chunks(&target, &[15, 1], &[20, 2]),
            vec![1..4, 0..1]
        );
    }

    #[test]
    fn boxes_past_the_target_are_refused() {
        let err = check_box(&[735, 0], &[10, 4], &[740, 4]).unwrap_err();
        assert!(err.contains("[740, 4]") && err.contains("[10, 4]"), "{err}");
        assert!(check_box(&[0], &[3, 4], &[740, 4]).is_err());
        assert!(check_box(&[730, 0], &[10, 4], &[740, 4]).is_ok());
    }
}
