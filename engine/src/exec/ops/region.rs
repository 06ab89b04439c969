//! Reading one region of a fused value: which chunks each leaf needs, and assembling the
//! decoded chunks into one buffer per leaf (the decoded chunk itself when it is exactly the
//! region needed).

use std::sync::Arc;

use rayon::prelude::*;

use crate::array::buffer::{copy_region, reverse_axes};
use crate::array::grid::c_strides;
use crate::array::{Buffer, Region};
use crate::error::Result;
use crate::exec::task::{ReadOp, TaskContext};
use crate::kernels::fft::{rfft_of_box, transform, Block};
use crate::kernels::{eval_into, Inst, LeafInput, Program};
use crate::physical::fused::{Fused, LeafConcat, LeafFft};
use crate::physical::regions::input_region;
use crate::plan::view::ViewAxis;
use crate::zarr::ZarrArray;

/// The opened materialized arrays of a run, indexed by `MatId`.
pub type Arrays = Arc<Vec<Arc<ZarrArray>>>;

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
enum Placement {
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
}

impl LeafRead {
    /// Whether every chunk's region maps straight to the leaf's coordinates.
    fn direct(&self, arrays: &[Arc<ZarrArray>]) -> bool {
        let rank = self.read_box.rank();
        self.concat.as_ref().is_none_or(|c| {
            c.parts
                .iter()
                .all(|p| p.is_whole(rank, &arrays[p.mat].shape()))
        })
    }

    /// Where chunk `c`'s values go in the leaf's box.
    fn place(&self, c: &LeafChunk, arrays: &[Arc<ZarrArray>]) -> Placement {
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
    fn fft_block(&self, fft: &LeafFft) -> Region {
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
fn leaf_strides(axes: &[ViewAxis], buffer: &[u64], rank: usize) -> Vec<usize> {
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
    pub fn plan(fused: &Fused, arrays: &[Arc<ZarrArray>], region: &Region) -> RegionRead {
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
                let held_whole = if leaf.is_plain() {
                    arr.resident()
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
                    .and_then(|_| arr.resident_band())
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
                let cached = match (held, leaf.is_plain(), arr.chunk_cache()) {
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
                let chunks = if bbox.is_empty() || read_box.is_empty() || held || !cached.is_empty()
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

/// The values of FFT leaf `lr`: its material's `values` (over `read_box`) cast to the compute
/// dtype, transformed, and cut to the leaf's box.
fn transform_leaf(values: Buffer, lr: &LeafRead, fft: &LeafFft) -> Result<Buffer> {
    let shape: Vec<usize> = lr.read_box.shape.iter().map(|&n| n as usize).collect();
    let values = if values.dtype() == fft.compute {
        values
    } else {
        let program = Program {
            insts: vec![
                Inst::Load {
                    leaf: 0,
                    dtype: values.dtype(),
                },
                Inst::Cast {
                    arg: 0,
                    to: fft.compute,
                },
            ],
        };
        let strides = c_strides(&lr.read_box.shape)
            .into_iter()
            .map(|s| s as usize)
            .collect();
        let mut cast = Buffer::zeros(fft.compute, values.len());
        let input = [LeafInput {
            buf: &values,
            offset: 0,
            strides,
        }];
        eval_into(&program, &input, &lr.read_box.shape, &mut cast)?;
        cast
    };
    let out = transform(Block { values, shape }, &fft.steps, fft.norm)?;
    Ok(cut_to_leaf(out, lr, fft))
}

/// The transform of FFT leaf `lr` computed from its material's band `(region, values)` where
/// the band holds it, without copying the read box out first; `None` where the kernel cannot
/// read the box in place (see [`rfft_of_box`]), or the values need a cast first.
fn transform_in_band(
    band: &(Region, Arc<Buffer>),
    lr: &LeafRead,
    fft: &LeafFft,
) -> Result<Option<Buffer>> {
    let (region, values) = band;
    let ([step], true) = (fft.steps.as_slice(), values.dtype() == fft.compute) else {
        return Ok(None);
    };
    let strides = c_strides(&region.shape);
    let origin: u64 = (0..region.rank())
        .map(|d| (lr.read_box.start[d] - region.start[d]) * strides[d])
        .sum();
    let strides: Vec<usize> = strides.iter().map(|&s| s as usize).collect();
    let shape: Vec<usize> = lr.read_box.shape.iter().map(|&n| n as usize).collect();
    let out = rfft_of_box(values, origin as usize, &strides, &shape, *step, fft.norm)?;
    Ok(out.map(|block| cut_to_leaf(block, lr, fft)))
}

/// The transformed block `out` of FFT leaf `lr` cut to the leaf's box.
fn cut_to_leaf(out: Block, lr: &LeafRead, fft: &LeafFft) -> Buffer {
    let block = lr.fft_block(fft);
    if block == lr.bbox {
        return out.values;
    }
    let dtype = out.values.dtype();
    let mut cut = Buffer::zeros(dtype, lr.bbox.len() as usize);
    copy_region(
        out.values.bytes(),
        &block,
        cut.bytes_mut(),
        &lr.bbox,
        &lr.bbox,
        dtype.size(),
    );
    cut
}

/// A chunk as accepted: decoded values (kept for a later stage, or not), or the bytes read
/// when they are the values already.
enum Decoded {
    Values(Buffer),
    Shared(Arc<Buffer>),
    Raw(crate::store::Value),
}

impl Decoded {
    fn bytes(&self) -> &[u8] {
        match self {
            Decoded::Values(b) => b.bytes(),
            Decoded::Shared(b) => b.bytes(),
            Decoded::Raw(v) => v,
        }
    }

    /// Hands the memory back (decoded buffers go back to the pool when dropped).
    fn recycle(self) {
        if let Decoded::Raw(v) = self {
            v.recycle();
        }
    }
}

/// The buffer leaf `lr`'s chunks are copied into. The chunks overlapping a box inside the
/// array cover all of it, so its values need no zeroing first; a box reaching past the array
/// (which no chunk covers there) starts zeroed.
fn leaf_buffer(lr: &LeafRead, arr: &ZarrArray) -> Buffer {
    let len = lr.read_box.len() as usize;
    // The leaf's values' shape: its material's, or the joined materials'.
    let shape = match &lr.concat {
        Some(c) => c.shape.clone(),
        None => arr.shape(),
    };
    let inside = lr
        .read_box
        .start
        .iter()
        .zip(&lr.read_box.shape)
        .zip(&shape)
        .all(|((s, n), full)| s + n <= *full);
    if inside {
        Buffer::for_overwrite(arr.dtype(), len)
    } else {
        Buffer::zeros(arr.dtype(), len)
    }
}

/// Decoded leaf buffers of one region, filled batch by batch.
pub struct Assembler {
    read: RegionRead,
    pairs: Vec<(usize, LeafChunk)>,
    next: usize,
    bufs: Vec<Option<Buffer>>,
    /// Which FFT leaves' buffers hold their transform already.
    transformed: Vec<bool>,
    /// Which leaves' buffers are reversed along their view's backward axes already.
    reversed: Vec<bool>,
    /// With `Some`, the decoded chunks of the single leaf are kept as they are (with their
    /// regions) instead of being copied into one buffer: plain copies take each output
    /// chunk's values straight from them.
    kept: Option<Vec<(Region, Buffer)>>,
    /// Whether a leaf whose box lies inside one decoded chunk reads it there (see
    /// [`reading_in_place`](Self::reading_in_place)).
    in_place: bool,
    /// Per leaf read in place: the decoded chunk's region, and the element offset of the
    /// leaf's box and the leaf's strides in it.
    views: Vec<Option<InPlace>>,
}

/// A leaf read where its values lie in one decoded chunk.
struct InPlace {
    chunk: Region,
    values: Arc<Buffer>,
    offset: usize,
    strides: Vec<usize>,
}

impl InPlace {
    /// Leaf `lr` read from `values`, the decoded chunk over `chunk`, which holds its box.
    fn new(lr: &LeafRead, chunk: Region, values: Arc<Buffer>) -> InPlace {
        let chunk_strides = c_strides(&chunk.shape);
        let offset: u64 = (0..chunk.rank())
            .map(|d| (lr.bbox.start[d] - chunk.start[d]) * chunk_strides[d])
            .sum();
        let strides = leaf_strides(&lr.view, &chunk_strides, lr.strides.len());
        InPlace {
            chunk,
            values,
            offset: offset as usize,
            strides,
        }
    }
}

/// Whether leaf `lr` may be read where its box lies in one chunk over `chunk`.
fn readable_in_place(lr: &LeafRead, chunk: &Region) -> bool {
    lr.fft.is_none()
        && lr.concat.is_none()
        && lr.band.is_none()
        && lr.resident.is_none()
        && lr.reversed.is_empty()
        && chunk.contains(&lr.read_box)
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
            transformed: vec![false; n],
            reversed: vec![false; n],
            kept: None,
            in_place: false,
            views: (0..n).map(|_| None).collect(),
        }
    }

    /// Leaves whose box lies inside a single chunk (a slice, an edge, a strided selection)
    /// read its decoded values where they lie, through an offset and strides, instead of
    /// copying the box out first. For readers that only evaluate the leaves (not
    /// [`take_leaf`](Self::take_leaf), which copies such a box out); the decoded chunk is held
    /// in place of the box.
    pub fn reading_in_place(mut self) -> Self {
        self.in_place = self.kept.is_none();
        self
    }

    /// Keeps decoded chunks as they are (see [`copy_into`](Self::copy_into)); only for a
    /// single untransformed leaf read through an identity view.
    pub fn keeping_chunks(mut self, arrays: &[Arc<ZarrArray>]) -> Self {
        let single = self.read.leaves.len() == 1
            && self.read.leaves[0].fft.is_none()
            && !self.read.leaves[0].in_bands
            && self.read.leaves[0].cached.is_empty()
            && self.read.leaves[0].direct(arrays);
        if single {
            self.kept = Some(Vec::new());
        }
        self
    }

    /// True when decoded chunks are kept as they are.
    pub fn keeps_chunks(&self) -> bool {
        self.kept.is_some()
    }

    /// The values of `region` (in the leaf's coordinates) copied from the kept chunks into a
    /// buffer of exactly that region; the kept chunk itself when it is the region.
    pub fn copy_into(
        &self,
        region: &Region,
        dtype: crate::array::DType,
    ) -> std::borrow::Cow<'_, Buffer> {
        let kept = self.kept.as_deref().unwrap_or(&[]);
        if let Some((_, b)) = kept.iter().find(|(r, _)| r == region) {
            return std::borrow::Cow::Borrowed(b);
        }
        let mut dest = Buffer::zeros(dtype, region.len() as usize);
        self.copy_into_bytes(region, dtype.size(), dest.bytes_mut());
        std::borrow::Cow::Owned(dest)
    }

    /// Copies the values of `region` (in the leaf's coordinates) from the kept chunks into
    /// `dst`, which holds exactly that region (C order, `itemsize` bytes per value); values no
    /// kept chunk covers are left as they are.
    pub fn copy_into_bytes(&self, region: &Region, itemsize: usize, dst: &mut [u8]) {
        for (r, b) in self.kept.as_deref().unwrap_or(&[]) {
            if let Some(overlap) = r.intersect(region) {
                copy_region(b.bytes(), r, dst, region, &overlap, itemsize);
            }
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
        let keeps = self.kept.is_some();
        // Where each chunk goes, and whether it is its leaf's whole box (its decoded buffer
        // then serves as the leaf's).
        let placed: Vec<(Placement, bool)> = pairs
            .iter()
            .map(|(l, c)| {
                let lr = &self.read.leaves[*l];
                let placement = lr.place(c, arrays);
                let whole = lr.chunks.len() == 1
                    && matches!(&placement, Placement::Direct(r) if *r == lr.read_box);
                (placement, whole)
            })
            .collect();
        let in_place: Vec<bool> = pairs
            .iter()
            .zip(&placed)
            .map(|((l, _), (placement, whole))| {
                let lr = &self.read.leaves[*l];
                self.in_place
                    && !whole
                    && lr.chunks.len() == 1
                    && matches!(placement, Placement::Direct(r) if readable_in_place(lr, r))
            })
            .collect();
        // Chunks a later stage reads again are kept (not when kept for plain copies here).
        let caches: Vec<_> = pairs
            .iter()
            .map(|(_, c)| (!keeps).then(|| arrays[c.mat].chunk_cache()).flatten())
            .collect();
        let decoded: Vec<Result<Decoded>> = data
            .into_par_iter()
            .zip(pairs.par_iter().zip(placed.par_iter()))
            .zip(caches.par_iter())
            .map(|((bytes, ((_, c), (_, whole))), cache)| {
                let arr = &arrays[c.mat];
                // Uncompressed chunks (intermediates) are copied into the leaf's buffer
                // straight from the bytes read, not first into a buffer of their own.
                match bytes {
                    Some(v)
                        if !keeps
                            && !*whole
                            && cache.is_none()
                            && arr.raw_values(&c.idx, &v).is_some() =>
                    {
                        Ok(Decoded::Raw(v))
                    }
                    bytes => {
                        let values = arr.decode_read(&c.idx, bytes)?;
                        Ok(match cache {
                            Some(cache) => {
                                // Shared once the cache holds it, else still the task's own.
                                let shared = Arc::new(values);
                                cache.offer(&c.idx, &shared, ctx);
                                Arc::try_unwrap(shared)
                                    .map_or_else(Decoded::Shared, Decoded::Values)
                            }
                            None => Decoded::Values(values),
                        })
                    }
                }
            })
            .collect();
        for (((decoded, (l, c)), (placement, whole)), in_place) in
            decoded.into_iter().zip(pairs).zip(placed).zip(in_place)
        {
            let decoded = decoded?;
            ctx.add_decoded(decoded.bytes().len() as u64);
            let lr = &self.read.leaves[*l];
            let arr = &arrays[c.mat];
            let decoded = match (decoded, &placement) {
                (Decoded::Values(buf), Placement::Direct(region)) if self.kept.is_some() => {
                    if let Some(kept) = self.kept.as_mut() {
                        kept.push((region.clone(), buf));
                    }
                    continue;
                }
                (Decoded::Values(buf), _) if whole => {
                    self.bufs[*l] = Some(buf);
                    continue;
                }
                (Decoded::Values(buf), Placement::Direct(chunk)) if in_place => {
                    self.views[*l] = Some(InPlace::new(lr, chunk.clone(), Arc::new(buf)));
                    continue;
                }
                // A kept chunk that is the leaf's box, or holds it, is read where it lies.
                (Decoded::Shared(buf), Placement::Direct(chunk))
                    if lr.chunks.len() == 1 && readable_in_place(lr, chunk) =>
                {
                    self.views[*l] = Some(InPlace::new(lr, chunk.clone(), buf));
                    continue;
                }
                (other, _) => other,
            };
            let dest = self.bufs[*l].get_or_insert_with(|| leaf_buffer(lr, arr));
            let size = arr.dtype().size();
            match placement {
                Placement::Direct(region) => {
                    if let Some(overlap) = region.intersect(&lr.read_box) {
                        let dst = dest.bytes_mut();
                        copy_region(decoded.bytes(), &region, dst, &lr.read_box, &overlap, size);
                    }
                }
                Placement::Boxed { chunk, input, out } => {
                    // The values wanted, cut from the chunk, are the box's values in order.
                    let mut cut = Buffer::for_overwrite(arr.dtype(), input.len() as usize);
                    copy_region(
                        decoded.bytes(),
                        &chunk,
                        cut.bytes_mut(),
                        &input,
                        &input,
                        size,
                    );
                    let dst = dest.bytes_mut();
                    copy_region(cut.bytes(), &out, dst, &lr.read_box, &out, size);
                }
                Placement::Outside => {}
            }
            decoded.recycle();
        }
        Ok(())
    }

    /// The leaf inputs for the kernels (after every chunk was accepted); FFT leaves are
    /// transformed here, once.
    pub fn leaf_inputs(&mut self, arrays: &[Arc<ZarrArray>]) -> Result<Vec<LeafInput<'_>>> {
        for (l, b) in self.bufs.iter_mut().enumerate() {
            let lr = &self.read.leaves[l];
            if lr.resident.is_some() || self.views[l].is_some() {
                continue;
            }
            // Chunks an earlier stage kept: the box is read where it lies in one, else copied
            // out of them.
            if b.is_none() && !lr.cached.is_empty() {
                if let [(chunk, values)] = lr.cached.as_slice() {
                    if readable_in_place(lr, chunk) {
                        self.views[l] = Some(InPlace::new(lr, chunk.clone(), values.clone()));
                        continue;
                    }
                }
                let arr = &arrays[lr.mat];
                let mut buf = leaf_buffer(lr, arr);
                for (chunk, values) in &lr.cached {
                    if let Some(overlap) = chunk.intersect(&lr.read_box) {
                        copy_region(
                            values.bytes(),
                            chunk,
                            buf.bytes_mut(),
                            &lr.read_box,
                            &overlap,
                            arr.dtype().size(),
                        );
                    }
                }
                *b = Some(buf);
            }
            // An FFT read from a band transforms the box where it lies in the band.
            if let (None, Some(band), Some(fft), false) =
                (b.as_ref(), &lr.band, &lr.fft, self.transformed[l])
            {
                if let Some(values) = transform_in_band(band, lr, fft)? {
                    *b = Some(values);
                    self.transformed[l] = true;
                }
            }
            if b.is_none() {
                let dtype = arrays[lr.mat].dtype();
                *b = Some(match &lr.band {
                    Some((region, values)) => {
                        let mut buf = Buffer::for_overwrite(dtype, lr.read_box.len() as usize);
                        copy_region(
                            values.bytes(),
                            region,
                            buf.bytes_mut(),
                            &lr.read_box,
                            &lr.read_box,
                            dtype.size(),
                        );
                        buf
                    }
                    None => Buffer::zeros(dtype, lr.read_box.len() as usize),
                });
            }
            if let (Some(fft), false) = (&lr.fft, self.transformed[l]) {
                if let Some(values) = b.take() {
                    *b = Some(transform_leaf(values, lr, fft)?);
                }
                self.transformed[l] = true;
            }
            if !lr.reversed.is_empty() && !self.reversed[l] {
                if let Some(values) = b.as_mut() {
                    let size = values.dtype().size();
                    reverse_axes(values.bytes_mut(), &lr.bbox.shape, &lr.reversed, size);
                }
                self.reversed[l] = true;
            }
        }
        Ok(self
            .bufs
            .iter()
            .zip(&self.read.leaves)
            .zip(&self.views)
            .filter_map(|((b, lr), view)| match view {
                Some(v) => Some(LeafInput {
                    buf: &v.values,
                    offset: v.offset,
                    strides: v.strides.clone(),
                }),
                None => lr.resident.as_deref().or(b.as_ref()).map(|buf| LeafInput {
                    buf,
                    offset: lr.offset,
                    strides: lr.strides.clone(),
                }),
            })
            .collect())
    }

    /// Takes leaf `l`'s buffer (for plain copies); a shared material's box is copied out.
    pub fn take_leaf(&mut self, l: usize, arrays: &[Arc<ZarrArray>]) -> Option<Buffer> {
        let lr = self.read.leaves.get(l)?;
        if let Some(whole) = &lr.resident {
            let arr = &arrays[lr.mat];
            let full = Region {
                start: vec![0; lr.bbox.rank()],
                shape: arr.shape(),
            };
            let mut out = Buffer::zeros(arr.dtype(), lr.bbox.len() as usize);
            copy_region(
                whole.bytes(),
                &full,
                out.bytes_mut(),
                &lr.bbox,
                &lr.bbox,
                arr.dtype().size(),
            );
            return Some(out);
        }
        let Some(view) = self.views.get_mut(l).and_then(|v| v.take()) else {
            return self.bufs.get_mut(l).and_then(|b| b.take());
        };
        // A box read in place: the chunk itself when it is the box and nothing else holds
        // it, else its values copied out of the chunk.
        let values = match Arc::try_unwrap(view.values) {
            Ok(values) if view.chunk == lr.bbox => return Some(values),
            Ok(values) => Arc::new(values),
            Err(shared) => shared,
        };
        let dtype = values.dtype();
        let mut out = Buffer::for_overwrite(dtype, lr.bbox.len() as usize);
        copy_region(
            values.bytes(),
            &view.chunk,
            out.bytes_mut(),
            &lr.bbox,
            &lr.bbox,
            dtype.size(),
        );
        Some(out)
    }
}
