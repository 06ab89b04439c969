//! Which band of an FFT's input each block of a compute stage reads (see
//! [`LeafBand`](crate::physical::fused::LeafBand)).
//!
//! A transform along an axis its input splits finely needs, for every output block, a slab
//! of many input chunks; blocks side by side need the same chunks again. Rather than each
//! block decoding them, the stage runs band by band: a band of the input is decoded once and
//! held in memory, the blocks whose reads lie inside it run, and the band is let go.

use super::ops::compute::{self, block_grid, block_region};
use super::ops::region::read::RegionRead;
use crate::array::grid::indices_in;
use crate::array::Region;
use crate::error::Result;
use crate::exec::held::Materials;
use crate::physical::fused::Fused;
use crate::zarr::ZarrArray;

/// Blocks of a compute stage that run together, and the band of material `mat` held in
/// memory while they do.
#[derive(Debug, Clone, PartialEq)]
pub struct BandGroup {
    /// The material.
    pub mat: usize,
    /// The region of it held.
    pub band: Region,
    /// Indices of blocks (in the grid of the stage's blocks).
    pub blocks: Vec<Vec<u64>>,
}

/// The read boxes of a compute stage's blocks in the material of its FFT leaf read in bands,
/// from which the stage's bands are drawn, and what its tasks hold beside a band.
#[derive(Debug, Clone)]
pub struct BlockBoxes {
    mat: usize,
    axis: usize,
    /// The most values along `axis` a band holds, as planned.
    pub max_len: u64,
    /// The most bytes one of the stage's tasks holds while its band is held.
    pub largest_task: u64,
    /// Each block and its read box, ordered along the band axis.
    boxes: Vec<(Vec<u64>, Region)>,
}

impl BlockBoxes {
    /// The blocks of a compute stage of `fused` into `out` (blocks of `block` output chunks,
    /// tasks reading in batches of about `batch_limit` bytes, run by `threads`) with their read
    /// boxes; `None` when no leaf of `fused` is an FFT read in bands.
    pub fn of(
        fused: &Fused,
        arrays: &Materials,
        out: &ZarrArray,
        block: &[u64],
        batch_limit: u64,
        threads: usize,
    ) -> Result<Option<BlockBoxes>> {
        let Some((leaf, band)) = fused
            .leaves
            .iter()
            .enumerate()
            .find_map(|(i, l)| l.band.map(|b| (i, b)))
        else {
            return Ok(None);
        };
        let axis = band.axis;
        let mut largest_task = 0;
        let mut boxes = Vec::new();
        for b in indices_in(&block_grid(out.grid(), block)) {
            let (chunks, region) = block_region(out.grid(), block, &b);
            let read = RegionRead::plan(fused, arrays, &region);
            let rbox = read.leaves[leaf].read_box.clone();
            let memory = compute::block_memory(
                fused,
                arrays,
                out,
                &read.assuming_bands_held(),
                &region,
                chunks.len(),
                batch_limit,
                threads,
            )?;
            largest_task = largest_task.max(memory);
            boxes.push((b, rbox));
        }
        boxes.sort_by_key(|(b, r)| (r.start[axis], r.end(axis), b.clone()));
        Ok(Some(BlockBoxes {
            mat: fused.leaves[leaf].mat,
            axis,
            max_len: band.max_len,
            largest_task,
            boxes,
        }))
    }

    /// The blocks grouped by band, in band order: a band holds the read boxes of its blocks,
    /// at most `max_len` along the band axis unless one block alone needs more.
    pub fn groups(&self, max_len: u64) -> Vec<BandGroup> {
        let axis = self.axis;
        let mut groups: Vec<BandGroup> = Vec::new();
        for (b, rbox) in &self.boxes {
            if let Some(g) = groups.last_mut() {
                let hull = bounding_box(&g.band, rbox);
                if hull.shape[axis] <= max_len {
                    g.band = hull;
                    g.blocks.push(b.clone());
                    continue;
                }
            }
            groups.push(BandGroup {
                mat: self.mat,
                band: rbox.clone(),
                blocks: vec![b.clone()],
            });
        }
        groups
    }
}

/// The smallest region holding both `a` and `b`.
fn bounding_box(a: &Region, b: &Region) -> Region {
    let start: Vec<u64> = a
        .start
        .iter()
        .zip(&b.start)
        .map(|(x, y)| *x.min(y))
        .collect();
    let shape = (0..a.rank())
        .map(|d| a.end(d).max(b.end(d)) - start[d])
        .collect();
    Region { start, shape }
}
