//! Fusion: every elementwise and slice node becomes a register program over "leaves", views
//! of materialized arrays (sources, intermediates, written targets). Chains fuse into one
//! program; nothing between leaves and the consumer is ever materialized.

use crate::array::ChunkGrid;
use crate::kernels::{Inst, Program};
use crate::physical::fused::{Fused, Leaf};
use crate::plan::node::TExpr;

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
