//! Accepting a region's decoded chunks: into one buffer per leaf, kept as they are for plain
//! copies, or read where they lie; then the leaves' inputs for the kernels.

use std::sync::Arc;

use rayon::prelude::*;

use super::fft_leaf::{transform_in_band, transform_leaf};
use super::read::{leaf_strides, LeafChunk, LeafRead, Placement, RegionRead};
use crate::array::buffer::{copy_region, reverse_axes};
use crate::array::grid::c_strides;
use crate::array::{Buffer, Region};
use crate::error::Result;
use crate::exec::held::Materials;
use crate::exec::task::TaskContext;
use crate::kernels::LeafInput;
use crate::zarr::ZarrArray;

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
            && self.read.leaves[0].cached_joined.is_empty()
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
        arrays: &Materials,
        ctx: &TaskContext,
    ) -> Result<()> {
        let start = self.next;
        let end = start + data.len();
        self.next = end;
        // Taken out while the batch is placed, and put back whatever the outcome.
        let all = std::mem::take(&mut self.pairs);
        let accepted = self.accept_batch(data, &all[start..end], arrays, ctx);
        self.pairs = all;
        accepted
    }

    /// [`accept`](Self::accept) for the chunks of `pairs`.
    fn accept_batch(
        &mut self,
        data: Vec<Option<crate::store::Value>>,
        pairs: &[(usize, LeafChunk)],
        arrays: &Materials,
        ctx: &TaskContext,
    ) -> Result<()> {
        let keeps = self.kept.is_some();
        let placed = self.placements(pairs, arrays);
        let in_place = self.in_place_flags(pairs, &placed);
        let decoded = decode_all(data, pairs, &placed, arrays, ctx, keeps);
        for (((decoded, (l, c)), placed), in_place) in
            decoded.into_iter().zip(pairs).zip(placed).zip(in_place)
        {
            let decoded = decoded?;
            ctx.add_decoded(decoded.bytes().len() as u64);
            self.put(*l, c, decoded, placed, in_place, arrays);
        }
        Ok(())
    }

    /// Where each chunk of `pairs` goes, and whether it is its leaf's whole box (its decoded
    /// buffer then serves as the leaf's).
    fn placements(
        &self,
        pairs: &[(usize, LeafChunk)],
        arrays: &[Arc<ZarrArray>],
    ) -> Vec<(Placement, bool)> {
        pairs
            .iter()
            .map(|(l, c)| {
                let lr = &self.read.leaves[*l];
                let placement = lr.place(c, arrays);
                let whole = lr.chunks.len() == 1
                    && matches!(&placement, Placement::Direct(r) if *r == lr.read_box);
                (placement, whole)
            })
            .collect()
    }

    /// Whether each chunk of `pairs` is read in place (see
    /// [`reading_in_place`](Self::reading_in_place)).
    fn in_place_flags(
        &self,
        pairs: &[(usize, LeafChunk)],
        placed: &[(Placement, bool)],
    ) -> Vec<bool> {
        pairs
            .iter()
            .zip(placed)
            .map(|((l, _), (placement, whole))| {
                let lr = &self.read.leaves[*l];
                self.in_place
                    && !whole
                    && lr.chunks.len() == 1
                    && matches!(placement, Placement::Direct(r) if readable_in_place(lr, r))
            })
            .collect()
    }

    /// Puts decoded chunk `c` of leaf `l` where `placed` says: kept as it is, as the leaf's
    /// buffer, read in place, or copied into the leaf's buffer.
    fn put(
        &mut self,
        l: usize,
        c: &LeafChunk,
        decoded: Decoded,
        (placement, whole): (Placement, bool),
        in_place: bool,
        arrays: &[Arc<ZarrArray>],
    ) {
        let lr = &self.read.leaves[l];
        let arr = &arrays[c.mat];
        let decoded = match (decoded, &placement) {
            (Decoded::Values(buf), Placement::Direct(region)) if self.kept.is_some() => {
                if let Some(kept) = self.kept.as_mut() {
                    kept.push((region.clone(), buf));
                }
                return;
            }
            (Decoded::Values(buf), _) if whole => {
                self.bufs[l] = Some(buf);
                return;
            }
            (Decoded::Values(buf), Placement::Direct(chunk)) if in_place => {
                self.views[l] = Some(InPlace::new(lr, chunk.clone(), Arc::new(buf)));
                return;
            }
            // A kept chunk that is the leaf's box, or holds it, is read where it lies.
            (Decoded::Shared(buf), Placement::Direct(chunk))
                if lr.chunks.len() == 1 && readable_in_place(lr, chunk) =>
            {
                self.views[l] = Some(InPlace::new(lr, chunk.clone(), buf));
                return;
            }
            (other, _) => other,
        };
        let dest = self.bufs[l].get_or_insert_with(|| leaf_buffer(lr, arr));
        copy_placed(decoded.bytes(), placement, lr, arr, dest);
        decoded.recycle();
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
            // Chunks of a joined leaf's parts an earlier stage kept, copied out of them.
            if b.is_none() && !lr.cached_joined.is_empty() {
                let mut buf = leaf_buffer(lr, &arrays[lr.mat]);
                for (c, values) in &lr.cached_joined {
                    let placement = lr.place(c, arrays);
                    copy_placed(values.bytes(), placement, lr, &arrays[c.mat], &mut buf);
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

/// Copies the decoded `values` of a chunk of `arr` where `placement` puts them in leaf `lr`'s
/// box buffer `dest`.
fn copy_placed(
    values: &[u8],
    placement: Placement,
    lr: &LeafRead,
    arr: &ZarrArray,
    dest: &mut Buffer,
) {
    let size = arr.dtype().size();
    match placement {
        Placement::Direct(region) => {
            if let Some(overlap) = region.intersect(&lr.read_box) {
                let dst = dest.bytes_mut();
                copy_region(values, &region, dst, &lr.read_box, &overlap, size);
            }
        }
        Placement::Boxed { chunk, input, out } => {
            // The values wanted, cut from the chunk, are the box's values in order.
            let mut cut = Buffer::for_overwrite(arr.dtype(), input.len() as usize);
            copy_region(values, &chunk, cut.bytes_mut(), &input, &input, size);
            let dst = dest.bytes_mut();
            copy_region(cut.bytes(), &out, dst, &lr.read_box, &out, size);
        }
        Placement::Outside => {}
    }
}

/// Decodes the chunks `data` of `pairs` in parallel; chunks a later stage reads again are
/// offered to their array's chunk cache (not when `keeps`: kept for plain copies here).
fn decode_all(
    data: Vec<Option<crate::store::Value>>,
    pairs: &[(usize, LeafChunk)],
    placed: &[(Placement, bool)],
    arrays: &Materials,
    ctx: &TaskContext,
    keeps: bool,
) -> Vec<Result<Decoded>> {
    let caches: Vec<_> = pairs
        .iter()
        .map(|(_, c)| (!keeps).then(|| arrays.held(c.mat).chunk_cache()).flatten())
        .collect();
    data.into_par_iter()
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
                            Arc::try_unwrap(shared).map_or_else(Decoded::Shared, Decoded::Values)
                        }
                        None => Decoded::Values(values),
                    })
                }
            }
        })
        .collect()
}
