//! Reading one region of a fused value: which chunks each leaf needs, and assembling the
//! decoded chunks into one buffer per leaf (the decoded chunk itself when it is exactly the
//! region needed).

use std::sync::Arc;

use rayon::prelude::*;

use crate::array::buffer::copy_region;
use crate::array::grid::c_strides;
use crate::array::{Buffer, Region};
use crate::error::Result;
use crate::exec::task::{ReadOp, TaskContext};
use crate::kernels::LeafInput;
use crate::optimize::fuse::Fused;
use crate::plan::graph::ViewAxis;
use crate::store::ReadRequest;
use crate::zarr::ZarrArray;

/// The opened materialized arrays of a run, indexed by `MatId`.
pub type Arrays = Arc<Vec<Arc<ZarrArray>>>;

/// What one leaf needs for a region.
#[derive(Debug, Clone)]
pub struct LeafRead {
    /// The leaf's material.
    pub mat: usize,
    /// The box of the material the region touches.
    pub bbox: Region,
    /// Chunks of the material overlapping the box, in C order.
    pub chunks: Vec<Vec<u64>>,
    /// Element strides of the box buffer per region axis (0 where the leaf broadcasts).
    pub strides: Vec<usize>,
}

/// The reads of one region of a fused value.
#[derive(Debug, Clone)]
pub struct RegionRead {
    /// The region, in the fused value's coordinates.
    pub region: Region,
    /// One entry per leaf.
    pub leaves: Vec<LeafRead>,
}

impl RegionRead {
    /// Plans the reads of `region` of `fused`.
    pub fn plan(fused: &Fused, arrays: &[Arc<ZarrArray>], region: &Region) -> RegionRead {
        let leaves = fused
            .leaves
            .iter()
            .map(|leaf| {
                let arr = &arrays[leaf.mat];
                let (start, shape): (Vec<u64>, Vec<u64>) = leaf
                    .view
                    .axes
                    .iter()
                    .map(|a| match *a {
                        ViewAxis::Fixed(i) => (i, 1),
                        ViewAxis::Mapped {
                            out_axis,
                            start,
                            step,
                        } => {
                            let n = region.shape[out_axis];
                            let s = start + step * region.start[out_axis];
                            (s, if n == 0 { 0 } else { step * (n - 1) + 1 })
                        }
                    })
                    .unzip();
                let bbox = Region { start, shape };
                let bs = c_strides(&bbox.shape);
                let mut strides = vec![0usize; region.rank()];
                for (j, a) in leaf.view.axes.iter().enumerate() {
                    if let ViewAxis::Mapped { out_axis, step, .. } = *a {
                        strides[out_axis] += (bs[j] * step) as usize;
                    }
                }
                let chunks = if bbox.is_empty() {
                    Vec::new()
                } else {
                    arr.grid().chunks_overlapping(&bbox)
                };
                LeafRead {
                    mat: leaf.mat,
                    bbox,
                    chunks,
                    strides,
                }
            })
            .collect();
        RegionRead {
            region: region.clone(),
            leaves,
        }
    }

    /// Every (leaf, chunk) pair in read order.
    pub fn pairs(&self) -> Vec<(usize, Vec<u64>)> {
        self.leaves
            .iter()
            .enumerate()
            .flat_map(|(l, lr)| lr.chunks.iter().map(move |c| (l, c.clone())))
            .collect()
    }

    /// The reads, in [`pairs`](Self::pairs) order.
    pub fn read_ops(&self, arrays: &[Arc<ZarrArray>]) -> Vec<ReadOp> {
        self.pairs()
            .into_iter()
            .map(|(l, c)| {
                let arr = &arrays[self.leaves[l].mat];
                ReadOp {
                    store: arr.store().clone(),
                    req: ReadRequest::whole(arr.chunk_key(&c)),
                }
            })
            .collect()
    }

    /// Decoded bytes of the leaf boxes.
    pub fn leaf_bytes(&self, arrays: &[Arc<ZarrArray>]) -> u64 {
        self.leaves
            .iter()
            .map(|l| l.bbox.len() * arrays[l.mat].dtype().size() as u64)
            .sum()
    }

    /// Decoded bytes of every chunk read (an upper bound for the encoded bytes).
    pub fn chunk_bytes(&self, arrays: &[Arc<ZarrArray>]) -> u64 {
        self.leaves
            .iter()
            .map(|l| {
                let arr = &arrays[l.mat];
                l.chunks
                    .iter()
                    .map(|c| arr.grid().chunk_region(c).len() * arr.dtype().size() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}

/// Decoded leaf buffers of one region, filled batch by batch.
pub struct Assembler {
    read: RegionRead,
    pairs: Vec<(usize, Vec<u64>)>,
    next: usize,
    bufs: Vec<Option<Buffer>>,
}

impl Assembler {
    /// An empty assembler for `read`.
    pub fn new(read: RegionRead) -> Self {
        let pairs = read.pairs();
        let n = read.leaves.len();
        Assembler {
            read,
            pairs,
            next: 0,
            bufs: (0..n).map(|_| None).collect(),
        }
    }

    /// The region.
    pub fn region(&self) -> &Region {
        &self.read.region
    }

    /// Decodes the next `data.len()` chunks (in parallel) into the leaf buffers.
    pub fn accept(
        &mut self,
        data: Vec<Option<crate::store::Value>>,
        arrays: &[Arc<ZarrArray>],
        ctx: &TaskContext,
    ) -> Result<()> {
        let start = self.next;
        let pairs = &self.pairs[start..start + data.len()];
        self.next += data.len();
        let decoded: Vec<Result<Buffer>> = data
            .into_par_iter()
            .zip(pairs.par_iter())
            .map(|(bytes, (l, idx))| {
                let arr = &arrays[self.read.leaves[*l].mat];
                arr.decode_chunk(idx, bytes)
            })
            .collect();
        for (buf, (l, idx)) in decoded.into_iter().zip(pairs) {
            let buf = buf?;
            ctx.add_decoded(buf.bytes().len() as u64);
            let lr = &self.read.leaves[*l];
            let arr = &arrays[lr.mat];
            let chunk_region = arr.grid().chunk_region(idx);
            if chunk_region == lr.bbox && lr.chunks.len() == 1 {
                self.bufs[*l] = Some(buf);
                continue;
            }
            let dest = self.bufs[*l]
                .get_or_insert_with(|| Buffer::zeros(arr.dtype(), lr.bbox.len() as usize));
            if let Some(overlap) = chunk_region.intersect(&lr.bbox) {
                copy_region(
                    buf.bytes(),
                    &chunk_region,
                    dest.bytes_mut(),
                    &lr.bbox,
                    &overlap,
                    arr.dtype().size(),
                );
            }
        }
        Ok(())
    }

    /// The leaf inputs for the kernels (after every chunk was accepted).
    pub fn leaf_inputs(&mut self, arrays: &[Arc<ZarrArray>]) -> Vec<LeafInput<'_>> {
        for (l, b) in self.bufs.iter_mut().enumerate() {
            if b.is_none() {
                let lr = &self.read.leaves[l];
                *b = Some(Buffer::zeros(
                    arrays[lr.mat].dtype(),
                    lr.bbox.len() as usize,
                ));
            }
        }
        self.bufs
            .iter()
            .zip(&self.read.leaves)
            .filter_map(|(b, lr)| {
                b.as_ref().map(|buf| LeafInput {
                    buf,
                    offset: 0,
                    strides: lr.strides.clone(),
                })
            })
            .collect()
    }

    /// Takes leaf `l`'s buffer (for plain copies).
    pub fn take_leaf(&mut self, l: usize) -> Option<Buffer> {
        self.bufs.get_mut(l).and_then(|b| b.take())
    }
}
