//! Reading one region of a fused value: which chunks each leaf needs, and where each chunk's
//! values go in the leaf's box.

use std::sync::Arc;

use crate::array::grid::c_strides;
use crate::array::{Buffer, Region};
use crate::error::Result;
use crate::exec::held::Materials;
use crate::exec::task::ReadOp;
use crate::physical::fused::{Fused, LeafConcat, LeafFft};
use crate::physical::regions::input_region;
use crate::plan::view::ViewAxis;
use crate::zarr::ZarrArray;

/// The opened materialized arrays of a run, indexed by `MatId`.
pub type Arrays = Arc<Materials>;

/// A chunk a leaf reads: chunk `idx` of material `mat`, of part `part` of a leaf that joins
/// materials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafChunk {
    /// The material.
    pub mat: usize,
    /// The chunk's grid index in it.
    pub idx: Vec<u64>,
    /// The part of the joined leaf (0 unless it joins materials).
    pub part: usize,
}

/// Where a chunk's values go in a leaf's box.
pub(super) enum Placement {
    /// The chunk's region, in the leaf's coordinates: copied as it is.
    Direct(Region),
    /// A joined part read through a view that is not the identity: `input` (the chunk's
    /// values the box needs, in the material's coordinates, inside `chunk`, the chunk's
    /// region) holds the values of `out` (in the leaf's coordinates) in the same order.
    Boxed {
        chunk: Region,
        input: Region,
        out: Region,
    },
    /// The chunk holds none of the box's values.
    Outside,
}

/// What one leaf needs for a region.
#[derive(Debug, Clone)]
pub struct LeafRead {
    /// The leaf's material.
    pub mat: usize,
    /// The box of the leaf's values the region touches.
    pub bbox: Region,
    /// The box of the material read: `bbox`, or for an FFT leaf what its transform needs
    /// (transformed axes whole).
    pub read_box: Region,
    /// Chunks of the material overlapping `read_box`, in C order (for a joined leaf, part
    /// by part).
    pub chunks: Vec<LeafChunk>,
    /// The materials the leaf joins, if it does.
    pub concat: Option<Arc<LeafConcat>>,
    /// Element strides of the box buffer per region axis (0 where the leaf broadcasts).
    pub strides: Vec<usize>,
    /// The FFT the leaf's values are, if any.
    pub fft: Option<Arc<LeafFft>>,
    /// The whole material, when the stage shares it in memory (nothing is read then;
    /// `strides` and `offset` address this buffer instead of the box).
    pub resident: Option<Arc<Buffer>>,
    /// Element offset of the box's origin in `resident`.
    pub offset: usize,
    /// For a leaf read in bands, the band of its material held in memory that contains `read_box`
    /// (its region and values), or for a leaf reading a shared material backwards, that
    /// whole material: the box is copied from it, nothing is read.
    pub band: Option<(Region, Arc<Buffer>)>,
    /// Whether the stage holds the leaf's material in memory band by band (see
    /// [`LeafBand`](crate::physical::fused::LeafBand)).
    pub in_bands: bool,
    /// Axes of `bbox` the leaf's view walks backwards: its buffer is reversed along them
    /// once assembled (and transformed), so `strides` step forwards through it.
    pub reversed: Vec<usize>,
    /// How the leaf's view maps the region's axes to its material's.
    pub view: Vec<ViewAxis>,
    /// The decoded chunks overlapping `read_box`, with their regions, when an earlier stage
    /// kept all of them (see `exec::chunk_cache`): nothing is read then.
    pub cached: Vec<(Region, Arc<Buffer>)>,
    /// For a joined leaf, the decoded chunks of its parts overlapping `read_box`, when an
    /// earlier stage kept all of them (a groupby's groups, each a join of slices of one
    /// array, read by a stage each): nothing is read then.
    pub cached_joined: Vec<(LeafChunk, Arc<Buffer>)>,
}

impl LeafRead {
    /// Whether every chunk's region maps straight to the leaf's coordinates.
    pub(super) fn direct(&self, arrays: &[Arc<ZarrArray>]) -> bool {
        let rank = self.read_box.rank();
        self.concat.as_ref().is_none_or(|c| {
            c.parts
                .iter()
                .all(|p| p.is_whole(rank, &arrays[p.mat].shape()))
        })
    }

    /// Where chunk `c`'s values go in the leaf's box.
    pub(super) fn place(&self, c: &LeafChunk, arrays: &[Arc<ZarrArray>]) -> Placement {
        let mut region = arrays[c.mat].read_grid().chunk_region(&c.idx);
        let Some(part) = self.concat.as_ref().and_then(|j| j.parts.get(c.part)) else {
            return Placement::Direct(region);
        };
        let rank = self.read_box.rank();
        if part.is_whole(rank, &arrays[c.mat].shape()) {
            for (s, shift) in region.start.iter_mut().zip(&part.start) {
                *s += shift;
            }
            return Placement::Direct(region);
        }
        // The box in the part's coordinates, then in the material's.
        let Some(part_box) = part.meets(&self.read_box) else {
            return Placement::Outside;
        };
        let Some(input) = region.intersect(&part.view.input_box(&part_box)) else {
            return Placement::Outside;
        };
        let mut out = part.view.output_box(&input, rank);
        for (s, shift) in out.start.iter_mut().zip(&part.start) {
            *s += shift;
        }
        Placement::Boxed {
            chunk: region,
            input,
            out,
        }
    }

    /// The transformed block of an FFT leaf: `read_box` with the transformed axes whole in
    /// the output.
    pub(super) fn fft_block(&self, fft: &LeafFft) -> Region {
        let mut block = self.read_box.clone();
        for s in &fft.steps {
            block.start[s.axis] = 0;
            block.shape[s.axis] = fft.shape[s.axis];
        }
        block
    }
}

/// Element strides, per axis of a region of `rank` axes, of a leaf read through the view
/// `axes` from a buffer of its material's values with element strides `buffer` (one per
/// material axis).
pub(super) fn leaf_strides(axes: &[ViewAxis], buffer: &[u64], rank: usize) -> Vec<usize> {
    let mut strides = vec![0usize; rank];
    for (j, a) in axes.iter().enumerate() {
        if let ViewAxis::Mapped { out_axis, step, .. } = *a {
            strides[out_axis] += (buffer[j] * step.unsigned_abs()) as usize;
        }
    }
    strides
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
    pub fn plan(fused: &Fused, arrays: &Materials, region: &Region) -> RegionRead {
        let leaves = fused
            .leaves
            .iter()
            .map(|leaf| {
                let arr = &arrays[leaf.mat];
                let bbox = leaf.view.input_box(region);
                let read_box = match &leaf.fft {
                    Some(f) => input_region(&f.steps, &arr.shape(), &bbox),
                    None => bbox.clone(),
                };
                let reversed = leaf.view.reversed_axes();
                let holds = arrays.held(leaf.mat);
                let held_whole = if leaf.is_plain() {
                    holds.resident()
                } else {
                    None
                };
                // A shared material read backwards is copied out as a box, then reversed.
                let (resident, whole_band) = match held_whole {
                    Some(whole) if !reversed.is_empty() => {
                        (None, Some((Region::whole(&arr.shape()), whole)))
                    }
                    whole => (whole, None),
                };
                let band = leaf
                    .band
                    .and_then(|_| holds.band())
                    .or(whole_band)
                    .filter(|(r, _)| r.contains(&read_box));
                // A shared material is addressed whole, a box buffer from its origin.
                let (bs, offset) = match &resident {
                    Some(_) => {
                        let full = c_strides(&arr.shape());
                        let origin: u64 = bbox.start.iter().zip(&full).map(|(i, s)| i * s).sum();
                        (full, origin as usize)
                    }
                    None => (c_strides(&bbox.shape), 0),
                };
                let strides = leaf_strides(&leaf.view.axes, &bs, region.rank());
                let held = resident.is_some() || band.is_some();
                let cached = match (held, leaf.is_plain(), holds.chunk_cache()) {
                    (false, true, Some(cache)) if !read_box.is_empty() => {
                        let grid = arr.read_grid();
                        grid.chunks_overlapping(&read_box)
                            .into_iter()
                            .map(|idx| Some((grid.chunk_region(&idx), cache.get(&idx)?)))
                            .collect::<Option<Vec<_>>>()
                            .unwrap_or_default()
                    }
                    _ => Vec::new(),
                };
                let cached_joined = match &leaf.concat {
                    Some(c) if !held && leaf.fft.is_none() && !bbox.is_empty() => {
                        kept_joined(c, arrays, &read_box)
                    }
                    _ => Vec::new(),
                };
                let chunks = if bbox.is_empty()
                    || read_box.is_empty()
                    || held
                    || !cached.is_empty()
                    || !cached_joined.is_empty()
                {
                    Vec::new()
                } else if let Some(c) = &leaf.concat {
                    joined_chunks(c, arrays, &read_box)
                } else {
                    arr.read_grid()
                        .chunks_overlapping(&read_box)
                        .into_iter()
                        .map(|idx| LeafChunk {
                            mat: leaf.mat,
                            idx,
                            part: 0,
                        })
                        .collect()
                };
                LeafRead {
                    mat: leaf.mat,
                    bbox,
                    read_box,
                    chunks,
                    concat: leaf.concat.clone(),
                    strides,
                    fft: leaf.fft.clone(),
                    resident,
                    offset,
                    band,
                    in_bands: leaf.band.is_some(),
                    reversed,
                    view: leaf.view.axes.clone(),
                    cached,
                    cached_joined,
                }
            })
            .collect();
        RegionRead {
            region: region.clone(),
            leaves,
        }
    }

    /// These reads as they stand once the bands of the leaves read in bands are held:
    /// those leaves read no chunks. For sizing tasks only (such a read of a leaf whose band
    /// is not held would see zeros).
    pub fn assuming_bands_held(mut self) -> Self {
        for l in &mut self.leaves {
            if l.in_bands {
                l.chunks.clear();
            }
        }
        self
    }

    /// Every (leaf, chunk) pair in read order.
    pub fn pairs(&self) -> Vec<(usize, LeafChunk)> {
        self.leaves
            .iter()
            .enumerate()
            .flat_map(|(l, lr)| lr.chunks.iter().map(move |c| (l, c.clone())))
            .collect()
    }

    /// The reads, in [`pairs`](Self::pairs) order.
    pub fn read_ops(&self, arrays: &[Arc<ZarrArray>]) -> Result<Vec<ReadOp>> {
        self.pairs()
            .into_iter()
            .map(|(_, c)| {
                let arr = &arrays[c.mat];
                Ok(ReadOp {
                    store: arr.store().clone(),
                    req: arr.read_request(&c.idx)?,
                })
            })
            .collect()
    }

    /// Decoded bytes of the leaf boxes; for FFT leaves, the material read plus the kernel's
    /// complex blocks before and after each step. Shared materials count nothing here (the
    /// stage holds them).
    pub fn leaf_bytes(&self, arrays: &[Arc<ZarrArray>]) -> u64 {
        self.leaves
            .iter()
            .filter(|l| l.resident.is_none())
            .map(|l| {
                let read = l.read_box.len() * arrays[l.mat].dtype().size() as u64;
                match &l.fft {
                    Some(f) => {
                        let complex = f.compute.to_complex().size() as u64;
                        read + 3 * l.fft_block(f).len().max(l.read_box.len()) * complex
                    }
                    None => read,
                }
            })
            .sum()
    }

    /// Decoded bytes of every chunk read (an upper bound for the encoded bytes).
    pub fn chunk_bytes(&self, arrays: &[Arc<ZarrArray>]) -> u64 {
        self.leaves
            .iter()
            .map(|l| {
                l.chunks
                    .iter()
                    .map(|c| {
                        let arr = &arrays[c.mat];
                        arr.read_grid().chunk_region(&c.idx).len() * arr.dtype().size() as u64
                    })
                    .sum::<u64>()
            })
            .sum()
    }
}

/// The chunks of the joined materials `c` overlapping `read_box` (in the joined values),
/// part by part.
/// The chunks of joined leaf `c` overlapping `read_box`, each with its decoded values, when
/// an earlier stage kept every one of them (see `exec::chunk_cache`); else none.
fn kept_joined(
    c: &LeafConcat,
    arrays: &Materials,
    read_box: &Region,
) -> Vec<(LeafChunk, Arc<Buffer>)> {
    joined_chunks(c, arrays, read_box)
        .into_iter()
        .map(|lc| {
            let values = arrays.held(lc.mat).chunk_cache()?.get(&lc.idx)?;
            Some((lc, values))
        })
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}

fn joined_chunks(c: &LeafConcat, arrays: &[Arc<ZarrArray>], read_box: &Region) -> Vec<LeafChunk> {
    let mut chunks = Vec::new();
    for (k, part, part_box) in c.overlapping(read_box) {
        chunks.extend(
            arrays[part.mat]
                .read_grid()
                .chunks_overlapping(&part.view.input_box(&part_box))
                .into_iter()
                .map(|idx| LeafChunk {
                    mat: part.mat,
                    idx,
                    part: k,
                }),
        );
    }
    chunks
}
