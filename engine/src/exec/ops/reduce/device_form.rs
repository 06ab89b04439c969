//! Whether a reduction stage runs whole on a GPU, and if not why: its value must be one
//! material's values (shifted at most) through a fused program the device compiles, reduced
//! by a function the device has. Pure: no device is opened, so plans are explained alike on
//! every machine.

use crate::array::DType;
use crate::kernels::device::gpu_reduce_form;
use crate::physical::fused::{Fused, Leaf};
use crate::physical::stage::Stage;
use crate::plan::view::ViewAxis;

/// A reduction stage as the device runs it.
#[derive(Debug)]
pub struct DeviceReduce<'a> {
    /// The one input the stage's value reads.
    pub leaf: &'a Leaf,
    /// Where the value's origin lies in the input's material.
    pub start: Vec<u64>,
}

/// The material offsets of a view that only shifts every axis in place; `None` otherwise.
fn shift_of(leaf: &Leaf, rank: usize) -> Option<Vec<u64>> {
    if leaf.view.axes.len() != rank {
        return None;
    }
    leaf.view
        .axes
        .iter()
        .enumerate()
        .map(|(d, a)| match *a {
            ViewAxis::Mapped {
                out_axis,
                start,
                step: 1,
            } if out_axis == d => Some(start),
            _ => None,
        })
        .collect()
}

/// The one plain input of `input`, with its shift, or why there is none the device takes.
fn single_input(input: &Fused) -> Result<(&Leaf, Vec<u64>), String> {
    let [leaf] = input.leaves.as_slice() else {
        return Err(format!(
            "its value reads {} arrays; the device reduces one array's values",
            input.leaves.len()
        ));
    };
    if !leaf.is_plain() {
        return Err("its value is an FFT or joins arrays; those are reduced on the CPU".into());
    }
    let start = shift_of(leaf, input.shape.len()).ok_or_else(|| {
        "its value reads its array through a strided, reordered or broadcast view".to_string()
    })?;
    Ok((leaf, start))
}

/// How `stage` (whose output has `out_dtype`) runs on a GPU; `Err` says why it does not.
pub fn device_reduce(stage: &Stage, out_dtype: DType) -> Result<DeviceReduce<'_>, String> {
    let Stage::Reduce {
        input, func, axes, ..
    } = stage
    else {
        return Err("not a reduction".into());
    };
    let rank = input.shape.len();
    if func.is_arg() && axes.len() != 1 && axes.len() != rank {
        return Err(format!(
            "{} over {} of {rank} axes runs on the CPU (the device takes one axis or all)",
            func.name(),
            axes.len()
        ));
    }
    let (leaf, start) = single_input(input)?;
    gpu_reduce_form(*func, &input.program, leaf.dtype, out_dtype)?;
    Ok(DeviceReduce { leaf, start })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::ChunkGrid;
    use crate::plan::view::View;
    use crate::plan::ReduceFunc;

    fn sum_of(input: Fused, func: ReduceFunc) -> Stage {
        Stage::Reduce {
            input,
            out: 1,
            func,
            axes: vec![0],
            keepdims: false,
            ddof: 0.0,
            label: "sum".into(),
        }
    }

    fn material() -> Fused {
        let grid = ChunkGrid::regular(&[8, 6], &[4, 3]).unwrap();
        Fused::material(0, &[8, 6], DType::F32, grid)
    }

    #[test]
    fn a_float_sum_of_one_shifted_array_runs_on_the_device() {
        let mut input = material();
        let plain = sum_of(input.clone(), ReduceFunc::Sum);
        let placed = device_reduce(&plain, DType::F32);
        #[cfg(feature = "cuda")]
        assert_eq!(placed.map(|d| d.start).ok(), Some(vec![0, 0]));
        #[cfg(not(feature = "cuda"))]
        assert!(placed.is_err());
        input.leaves[0].view = View {
            axes: vec![
                ViewAxis::Mapped {
                    out_axis: 0,
                    start: 2,
                    step: 1,
                },
                ViewAxis::Mapped {
                    out_axis: 1,
                    start: 1,
                    step: 1,
                },
            ],
        };
        let stage = sum_of(input, ReduceFunc::Sum);
        #[cfg(feature = "cuda")]
        assert_eq!(
            device_reduce(&stage, DType::F32).map(|d| d.start).ok(),
            Some(vec![2, 1])
        );
        let _ = stage;
    }

    #[test]
    fn what_the_device_does_not_reduce_is_named() {
        let why = |stage: &Stage| device_reduce(stage, DType::F32).unwrap_err();
        let mut strided = material();
        strided.leaves[0].view = View {
            axes: vec![
                ViewAxis::Mapped {
                    out_axis: 0,
                    start: 0,
                    step: 2,
                },
                ViewAxis::Mapped {
                    out_axis: 1,
                    start: 0,
                    step: 1,
                },
            ],
        };
        assert!(why(&sum_of(strided, ReduceFunc::Sum)).contains("strided"));
        let mut two = material();
        two.leaves.push(two.leaves[0].clone());
        assert!(why(&sum_of(two, ReduceFunc::Sum)).contains("reads 2 arrays"));
        #[cfg(feature = "cuda")]
        assert_eq!(
            why(&sum_of(material(), ReduceFunc::Prod)),
            "prod has no device form yet"
        );
        let mut corner = sum_of(material(), ReduceFunc::Argmax);
        if let Stage::Reduce { axes, .. } = &mut corner {
            *axes = vec![0, 1];
        }
        // Over every axis: the flat index, which the device gives.
        #[cfg(feature = "cuda")]
        assert!(device_reduce(&corner, DType::I64).is_ok());
        let mut three = material();
        three.shape = vec![8, 6, 1];
        let mut some = sum_of(three, ReduceFunc::Argmax);
        if let Stage::Reduce { axes, .. } = &mut some {
            *axes = vec![0, 1];
        }
        assert!(
            why(&some).contains("argmax over 2 of 3 axes runs on the CPU"),
            "{}",
            why(&some)
        );
        let mut none = sum_of(material(), ReduceFunc::Argmin);
        if let Stage::Reduce { axes, .. } = &mut none {
            axes.clear();
        }
        assert!(
            why(&none).contains("argmin over 0 of 2 axes"),
            "{}",
            why(&none)
        );
    }
}
