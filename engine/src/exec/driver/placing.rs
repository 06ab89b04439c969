//! Where each stage's work runs when the run has a GPU: a compute stage's fused elementwise
//! program, and a reduction stage whole (read, decode, program and fold), on the device when
//! they have a device form; everything else on the CPU, each with the reason people read in
//! the run's summary and in `explain`.

use crate::array::DType;
use crate::exec::ops::reduce::device_form::device_reduce;
use crate::kernels::device::gpu_form;
use crate::physical::stage::Stage;

/// The device a stage's work runs on, and why when it is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageDevice {
    /// `gpu` or `cpu`.
    pub device: &'static str,
    /// Why the stage (or part of it) stays on the CPU.
    pub note: Option<String>,
}

impl StageDevice {
    fn cpu(why: impl Into<String>) -> Self {
        StageDevice {
            device: "cpu",
            note: Some(why.into()),
        }
    }
}

/// Where `stage` (whose output has `out_dtype`) runs on a run that placed its programs on a
/// GPU.
pub fn on_a_gpu(stage: &Stage, out_dtype: DType) -> StageDevice {
    match stage {
        Stage::Compute { input, .. } => {
            if input.plain_leaf(input.program.dtype()).is_some() {
                return StageDevice::cpu("a copy: there is nothing to compute");
            }
            let leaf_dtypes: Vec<_> = input.leaves.iter().map(|l| l.dtype).collect();
            match gpu_form(&input.program, &leaf_dtypes, input.shape.len()) {
                Err(why) => StageDevice::cpu(why),
                Ok(()) => StageDevice {
                    device: "gpu",
                    note: input
                        .leaves
                        .iter()
                        .any(|l| l.fft.is_some())
                        .then(|| "its FFTs run on the CPU (no device FFT yet)".to_string()),
                },
            }
        }
        Stage::Stream { .. } => {
            StageDevice::cpu("a copy into other chunks: there is nothing to compute")
        }
        Stage::Reduce { .. } => match device_reduce(stage, out_dtype) {
            Ok(_) => StageDevice {
                device: "gpu",
                note: None,
            },
            Err(why) => StageDevice::cpu(format!("the reduction runs on the CPU: {why}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{ChunkGrid, DType};
    use crate::kernels::Inst;
    use crate::physical::fused::Fused;
    use crate::plan::expr::Signature;
    use crate::plan::{Func, ReduceFunc};

    fn grid() -> ChunkGrid {
        ChunkGrid::regular(&[8, 8], &[4, 4]).unwrap()
    }

    /// `func(x)` of a `dtype` array, computed in `dtype`, as a compute stage.
    fn compute(func: Func, dtype: DType) -> Stage {
        let mut input = Fused::material(0, &[8, 8], dtype, grid());
        input.program.insts.push(Inst::Call {
            func,
            sig: Signature {
                compute: dtype,
                result: dtype,
            },
            args: vec![0, 0],
        });
        Stage::Compute {
            input,
            out: 1,
            block: vec![1, 1],
            label: "write y".into(),
        }
    }

    #[test]
    fn programs_with_a_device_form_run_on_the_gpu() {
        let placed = on_a_gpu(&compute(Func::Add, DType::F32), DType::F32);
        assert_eq!(
            placed,
            StageDevice {
                device: "gpu",
                note: None
            }
        );
    }

    #[test]
    fn the_rest_stays_on_the_cpu_saying_why() {
        let power = on_a_gpu(&compute(Func::Power, DType::I32), DType::I32);
        assert_eq!(power.device, "cpu");
        assert_eq!(
            power.note.as_deref(),
            Some("power of int, int values has no GPU form")
        );
        let complex = on_a_gpu(&compute(Func::Add, DType::C64), DType::C64);
        assert_eq!(
            complex.note.as_deref(),
            Some("complex values (complex64) run on the CPU")
        );
        let copy = Stage::Compute {
            input: Fused::material(0, &[8, 8], DType::F32, grid()),
            out: 1,
            block: vec![1, 1],
            label: "copy".into(),
        };
        assert_eq!(
            on_a_gpu(&copy, DType::F32).note.as_deref(),
            Some("a copy: there is nothing to compute")
        );
        let sum = Stage::Reduce {
            input: Fused::material(0, &[8, 8], DType::F64, grid()),
            out: 1,
            func: ReduceFunc::Sum,
            axes: vec![0],
            keepdims: false,
            ddof: 0.0,
            label: "sum".into(),
        };
        #[cfg(feature = "cuda")]
        assert_eq!(on_a_gpu(&sum, DType::F64).device, "gpu");
        let prod = Stage::Reduce {
            input: Fused::material(0, &[8, 8], DType::F64, grid()),
            out: 1,
            func: ReduceFunc::Prod,
            axes: vec![0],
            keepdims: false,
            ddof: 0.0,
            label: "prod".into(),
        };
        #[cfg(feature = "cuda")]
        assert_eq!(
            on_a_gpu(&prod, DType::F64),
            StageDevice::cpu("the reduction runs on the CPU: prod has no device form yet")
        );
        assert_eq!(on_a_gpu(&prod, DType::F64).device, "cpu");
    }
}
