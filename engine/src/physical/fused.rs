//! Fused values: register programs over leaves, views of materialized arrays (sources,
//! intermediates, written targets), possibly transformed by an FFT or joined from parts.

use std::sync::Arc;

use crate::array::{ChunkGrid, DType, Region};
use crate::kernels::{Inst, Program};
use crate::plan::fft_params::{FftNorm, FftStep};
use crate::plan::view::View;

/// Index of a materialized array in the run's material table.
pub type MatId = usize;

/// An FFT applied to a leaf's values as they are read: the values a leaf stands for are the
/// transform of its material, computed per region from the material's values along whole
/// axes, so FFTs fuse with what consumes them (an elementwise op, a reduction, a write).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeafFft {
    /// The kernel steps.
    pub steps: Vec<FftStep>,
    /// Normalisation.
    pub norm: FftNorm,
    /// The dtype the material's values are cast to before the first step.
    pub compute: DType,
    /// Shape of the transformed values.
    pub shape: Vec<u64>,
}

/// Bands of a leaf's material held in memory in turn: slabs along `axis` (whole along every
/// other axis) of at most `max_len` values along it. Tasks whose regions need the same input
/// chunks (an FFT along an axis the material splits finely, a rechunk whose output chunks each
/// gather a slice of many input chunks) then read them from the band instead of each decoding
/// them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeafBand {
    /// The axis of the material the bands split (never a transformed axis).
    pub axis: usize,
    /// The most values along `axis` one band holds.
    pub max_len: u64,
}

/// One box of a joined leaf's values and the materialized array it reads them from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcatPart {
    /// The array.
    pub mat: MatId,
    /// Maps the part's coordinates (the joined values', from the part's origin `start`) to
    /// the array's; a box view (`View::is_box`): a crop, single indices, new axes of length 1.
    pub view: View,
    /// The part's origin in the joined values, per axis.
    pub start: Vec<u64>,
    /// The part's extent, per axis.
    pub shape: Vec<u64>,
}

impl ConcatPart {
    /// True when the part is its whole array (of shape `array_shape`) read through the
    /// identity, so each chunk's region, shifted by `start`, is where its values go. An
    /// identity view of a crop from the origin maps coordinates alike but is not whole: its
    /// array's chunks hold values past the part's end.
    pub fn is_whole(&self, rank: usize, array_shape: &[u64]) -> bool {
        self.view.is_identity(rank) && array_shape == self.shape.as_slice()
    }

    /// The box of `region` (in the joined values' coordinates) inside this part, in the
    /// part's coordinates; `None` when they do not meet.
    pub fn meets(&self, region: &Region) -> Option<Region> {
        let mut start = Vec::with_capacity(self.start.len());
        let mut shape = Vec::with_capacity(self.start.len());
        for d in 0..self.start.len() {
            let lo = region.start[d].max(self.start[d]);
            let hi = region.end(d).min(self.start[d] + self.shape[d]);
            if lo >= hi {
                return None;
            }
            start.push(lo - self.start[d]);
            shape.push(hi - lo);
        }
        Some(Region { start, shape })
    }
}

/// Materialized arrays of one dtype tiling a value: numpy's `concatenate`, and joins of joins
/// along several axes (Dask's `fftshift` over several axes). A joined leaf's values are read
/// part by part, each chunk from the array holding it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeafConcat {
    /// The joined values' shape.
    pub shape: Vec<u64>,
    /// The parts, in C order of their origins; they tile the joined values without overlap.
    pub parts: Vec<ConcatPart>,
}

impl LeafConcat {
    /// The parts meeting `region`, each with its index and the box of `region` inside it in
    /// the part's coordinates (see [`ConcatPart::meets`]).
    pub fn overlapping<'a>(
        &'a self,
        region: &'a Region,
    ) -> impl Iterator<Item = (usize, &'a ConcatPart, Region)> + 'a {
        self.parts
            .iter()
            .enumerate()
            .filter_map(move |(k, p)| Some((k, p, p.meets(region)?)))
    }
}

/// A view of a materialized array (or of its FFT, or of several joined).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leaf {
    /// The array (for a joined leaf: its first part, which has the leaf's dtype).
    pub mat: MatId,
    /// Maps the fused array's coordinates to the leaf's values' coordinates.
    pub view: View,
    /// The dtype of the leaf's values (the material's, or its FFT's).
    pub dtype: DType,
    /// The transform of the material the leaf's values are, if any.
    pub fft: Option<Arc<LeafFft>>,
    /// When set, the leaf's values are these materials joined (never with `fft`).
    pub concat: Option<Arc<LeafConcat>>,
    /// When set, the stages that consume the leaf hold its material in memory band by band
    /// (each band decoded once) instead of every task reading the chunks it needs (never with
    /// `concat`).
    pub band: Option<LeafBand>,
}

impl Leaf {
    /// True when the leaf's values are its material's own, neither transformed nor joined.
    pub fn is_plain(&self) -> bool {
        self.fft.is_none() && self.concat.is_none()
    }
}

/// A fused virtual array: a program over leaves.
#[derive(Debug, Clone)]
pub struct Fused {
    /// The program; its last register is the value.
    pub program: Program,
    /// The leaves, deduplicated.
    pub leaves: Vec<Leaf>,
    /// Shape.
    pub shape: Vec<u64>,
    /// Natural chunking (the grid regions are computed in).
    pub grid: ChunkGrid,
}

impl Fused {
    /// A materialized array as a fused value (one leaf, identity view).
    pub fn material(mat: MatId, shape: &[u64], dtype: DType, grid: ChunkGrid) -> Fused {
        Fused::single_leaf(mat, shape.to_vec(), dtype, None, grid)
    }

    /// The FFT `fft` of material `mat` as a fused value of dtype `dtype`, computed where it
    /// is consumed, region by region of `grid` (whose transformed axes are whole).
    pub fn fft(mat: MatId, fft: LeafFft, dtype: DType, grid: ChunkGrid) -> Fused {
        let shape = fft.shape.clone();
        Fused::single_leaf(mat, shape, dtype, Some(Arc::new(fft)), grid)
    }

    /// Materials of dtype `dtype` joined along `concat.axis` into `shape`, in chunks `grid`.
    pub fn concat(concat: LeafConcat, shape: Vec<u64>, dtype: DType, grid: ChunkGrid) -> Fused {
        let mat = concat.parts.first().map_or(0, |p| p.mat);
        let mut f = Fused::single_leaf(mat, shape, dtype, None, grid);
        f.leaves[0].concat = Some(Arc::new(concat));
        f
    }

    /// The leaf of a value that is one material's values read through a box view (see
    /// `View::is_box`), untransformed and not joined.
    pub fn box_leaf(&self) -> Option<&Leaf> {
        let leaf = self.program.as_single_load()?;
        let l = &self.leaves[leaf];
        (l.is_plain() && l.view.is_box(&self.shape)).then_some(l)
    }

    /// The parts of a value that is materials joined and read as they are (all of the
    /// joined values, through the identity).
    pub fn joined(&self) -> Option<&[ConcatPart]> {
        let leaf = self.program.as_single_load()?;
        let l = &self.leaves[leaf];
        let c = l.concat.as_deref()?;
        (l.view.is_identity(self.shape.len()) && c.shape == self.shape)
            .then_some(c.parts.as_slice())
    }

    /// One leaf of material `mat` read through the identity view.
    fn single_leaf(
        mat: MatId,
        shape: Vec<u64>,
        dtype: DType,
        fft: Option<Arc<LeafFft>>,
        grid: ChunkGrid,
    ) -> Fused {
        Fused {
            program: Program {
                insts: vec![Inst::Load { leaf: 0, dtype }],
            },
            leaves: vec![Leaf {
                mat,
                view: View::identity(shape.len()),
                dtype,
                fft,
                concat: None,
                band: None,
            }],
            shape,
            grid,
        }
    }

    /// The material behind a plain, untransformed copy of one leaf through an identity view.
    pub fn plain_material(&self) -> Option<MatId> {
        let leaf = self.program.as_single_load()?;
        let l = &self.leaves[leaf];
        (l.view.is_identity(self.shape.len()) && l.is_plain()).then_some(l.mat)
    }

    /// The result dtype.
    pub fn dtype(&self) -> DType {
        self.program.dtype()
    }

    /// This value seen through `view` (output → this value's coordinates) with a new shape
    /// and grid.
    pub fn through(&self, view: &View, shape: Vec<u64>, grid: ChunkGrid) -> Fused {
        Fused {
            program: self.program.clone(),
            leaves: self
                .leaves
                .iter()
                .map(|l| Leaf {
                    mat: l.mat,
                    view: l.view.compose(view),
                    dtype: l.dtype,
                    fft: l.fft.clone(),
                    concat: l.concat.clone(),
                    band: l.band,
                })
                .collect(),
            shape,
            grid,
        }
    }

    /// When the value is a plain copy of one leaf through an identity view, already of
    /// `dtype`, that leaf: its decoded buffer can serve as the output as it is.
    pub fn plain_leaf(&self, dtype: DType) -> Option<usize> {
        let leaf = self.program.as_single_load()?;
        let l = &self.leaves[leaf];
        (l.view.is_identity(self.shape.len()) && l.dtype == dtype).then_some(leaf)
    }

    /// Appends a cast to `to` unless the value already has that dtype.
    pub fn cast_to(mut self, to: DType) -> Fused {
        if self.dtype() != to {
            let arg = self.program.insts.len() - 1;
            self.program.insts.push(Inst::Cast { arg, to });
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{ConcatPart, LeafConcat, Region, View};

    #[test]
    fn joined_parts_meeting_a_box_are_cut_to_it() {
        let part = |mat, start: u64, len: u64| ConcatPart {
            mat,
            view: View::identity(2),
            start: vec![0, start],
            shape: vec![2, len],
        };
        let c = LeafConcat {
            shape: vec![2, 11],
            parts: vec![part(0, 0, 4), part(1, 4, 0), part(2, 4, 3), part(0, 7, 4)],
        };
        let cols = |start: u64, len: u64| Region {
            start: vec![1, start],
            shape: vec![1, len],
        };
        let got: Vec<(usize, Region)> = c
            .overlapping(&cols(3, 6))
            .map(|(_, p, inside)| (p.mat, inside))
            .collect();
        // Columns 3..9 of row 1: the last column of the first part, all of the third, two
        // of the fourth, in each part's coordinates; the empty part contributes nothing.
        let at = |start: u64, len: u64| Region {
            start: vec![1, start],
            shape: vec![1, len],
        };
        assert_eq!(got, vec![(0, at(3, 1)), (2, at(0, 3)), (0, at(0, 2))]);
        assert_eq!(c.overlapping(&cols(11, 2)).count(), 0);
    }
}
