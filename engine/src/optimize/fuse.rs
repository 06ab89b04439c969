//! Fusion: every elementwise and slice node becomes a register program over "leaves", views
//! of materialized arrays (sources, intermediates, written targets). Chains fuse into one
//! program; nothing between leaves and the consumer is ever materialized.

use std::sync::Arc;

use crate::array::{ChunkGrid, DType};
use crate::kernels::fft::{FftNorm, FftStep};
use crate::kernels::{Inst, Program};
use crate::plan::graph::{TExpr, View};

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
    /// When set, the stages that consume the transform hold its input in memory band by
    /// band (each band decoded once) instead of every task reading the chunks it needs.
    pub band: Option<FftBand>,
}

/// Bands of an FFT's input held in memory in turn: slabs along `axis` (whole along every other
/// axis) of at most `max_len` values along it. Tasks whose regions need the same input chunks
/// then read them from the band instead of each decoding them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FftBand {
    /// The axis of the material the bands split (never a transformed axis).
    pub axis: usize,
    /// The most values along `axis` one band holds.
    pub max_len: u64,
}

/// A view of a materialized array (or of its FFT).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leaf {
    /// The array.
    pub mat: MatId,
    /// Maps the fused array's coordinates to the leaf's values' coordinates.
    pub view: View,
    /// The dtype of the leaf's values (the material's, or its FFT's).
    pub dtype: DType,
    /// The transform of the material the leaf's values are, if any.
    pub fft: Option<Arc<LeafFft>>,
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
            }],
            shape,
            grid,
        }
    }

    /// The material behind a plain, untransformed copy of one leaf through an identity view.
    pub fn plain_material(&self) -> Option<MatId> {
        let leaf = self.program.as_single_load()?;
        let l = &self.leaves[leaf];
        (l.view.is_identity() && l.fft.is_none()).then_some(l.mat)
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
        (l.view.is_identity() && l.dtype == dtype).then_some(leaf)
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

/// Builds the fused value of an elementwise op from its inputs' fused values (each already
/// broadcast to the op's shape) and its typed expression.
pub fn elementwise(inputs: &[Fused], expr: &TExpr, shape: Vec<u64>, grid: ChunkGrid) -> Fused {
    let mut program = Program::default();
    let mut leaves: Vec<Leaf> = Vec::new();
    let mut input_regs: Vec<Option<usize>> = vec![None; inputs.len()];
    let result = emit(expr, inputs, &mut program, &mut leaves, &mut input_regs);
    // `emit` leaves the result in the last register unless it is an input reused verbatim.
    if result != program.insts.len() - 1 {
        let to = program.insts[result].dtype();
        program.insts.push(Inst::Cast { arg: result, to });
    }
    Fused {
        program,
        leaves,
        shape,
        grid,
    }
}

fn emit(
    e: &TExpr,
    inputs: &[Fused],
    program: &mut Program,
    leaves: &mut Vec<Leaf>,
    input_regs: &mut [Option<usize>],
) -> usize {
    match e {
        TExpr::Input { idx, .. } => {
            if let Some(r) = input_regs[*idx] {
                return r;
            }
            let f = &inputs[*idx];
            let map: Vec<usize> = f
                .leaves
                .iter()
                .map(|l| match leaves.iter().position(|x| x == l) {
                    Some(p) => p,
                    None => {
                        leaves.push(l.clone());
                        leaves.len() - 1
                    }
                })
                .collect();
            let r = program.append(&f.program, &map);
            input_regs[*idx] = Some(r);
            r
        }
        TExpr::Const { value, dtype } => {
            program.insts.push(Inst::Const {
                value: *value,
                dtype: *dtype,
            });
            program.insts.len() - 1
        }
        TExpr::Call { func, sig, args } => {
            let regs: Vec<usize> = args
                .iter()
                .map(|a| emit(a, inputs, program, leaves, input_regs))
                .collect();
            program.insts.push(Inst::Call {
                func: *func,
                sig: *sig,
                args: regs,
            });
            program.insts.len() - 1
        }
        TExpr::Cast { to, arg } => {
            let r = emit(arg, inputs, program, leaves, input_regs);
            program.insts.push(Inst::Cast { arg: r, to: *to });
            program.insts.len() - 1
        }
    }
}
