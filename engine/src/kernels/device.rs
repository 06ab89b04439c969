//! Where a run's fused elementwise programs and reductions execute: the CPU, or a CUDA GPU
//! when the engine is built with the `cuda` feature and the machine has one. FFTs and
//! encoding run on the CPU either way.

use std::fmt;
use std::str::FromStr;

use super::eval::program::Program;
use super::eval::tiles::LeafInput;
use crate::array::Buffer;
use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};

/// The device a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU (rayon), always.
    #[default]
    Cpu,
    /// A CUDA GPU; an error when there is none.
    Cuda,
    /// A CUDA GPU when one is present, else the CPU.
    Auto,
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Device> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            "auto" => Ok(Device::Auto),
            other => Err(Error::new(
                ErrorKind::Plan,
                format!("unknown device {other:?}: expected cpu, cuda or auto"),
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Auto => "auto",
        })
    }
}

/// The device a run's elementwise programs were placed on.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// The CPU.
    Cpu,
    /// An open CUDA device.
    #[cfg(feature = "cuda")]
    Gpu(&'static super::eval::gpu::Gpu),
}

impl Placement {
    /// Opens what `device` asks for: `cuda` fails with the reason when no GPU can be used,
    /// `auto` falls back to the CPU.
    pub fn open(device: Device) -> Result<Placement> {
        match device {
            Device::Cpu => Ok(Placement::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda => super::eval::gpu::gpu().map(Placement::Gpu),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => Err(Error::new(
                ErrorKind::Unsupported,
                "device 'cuda' is not available: this chunkfuse was built without the cuda feature",
            )),
            #[cfg(feature = "cuda")]
            Device::Auto => Ok(super::eval::gpu::gpu().map_or(Placement::Cpu, Placement::Gpu)),
            #[cfg(not(feature = "cuda"))]
            Device::Auto => Ok(Placement::Cpu),
        }
    }

    /// Host memory the device holds for a run on `threads` compute threads: what the driver
    /// took when it opened, and each thread's pinned transfer buffers.
    pub fn host_bytes(&self, threads: usize) -> u64 {
        match self {
            Placement::Cpu => {
                let _ = threads;
                0
            }
            #[cfg(feature = "cuda")]
            Placement::Gpu(g) => {
                g.driver_bytes() + super::eval::gpu::PINNED_BYTES_PER_THREAD * threads as u64
            }
        }
    }

    /// Whether programs are placed on a GPU.
    pub fn is_gpu(&self) -> bool {
        !matches!(self, Placement::Cpu)
    }

    /// `cpu`, or `cuda: NAME (compute_XY)`.
    pub fn describe(&self) -> String {
        match self {
            Placement::Cpu => "cpu".to_string(),
            #[cfg(feature = "cuda")]
            Placement::Gpu(g) => format!("cuda: {}", g.describe()),
        }
    }

    /// `prog` (whose leaves have `leaf_dtypes`, over regions of rank `rank`) ready for the
    /// device: `None` on the CPU, and for programs the GPU does not take (they run on the
    /// CPU).
    pub fn kernel(
        &self,
        prog: &Program,
        leaf_dtypes: &[DType],
        rank: usize,
    ) -> Result<Option<DeviceKernel>> {
        match self {
            Placement::Cpu => {
                let _ = (prog, leaf_dtypes, rank);
                Ok(None)
            }
            #[cfg(feature = "cuda")]
            Placement::Gpu(g) => Ok(g
                .compile(prog, leaf_dtypes, rank)?
                .map(|inner| DeviceKernel { inner })),
        }
    }
}

/// Whether `prog` (whose leaves have `leaf_dtypes`, over regions of rank `rank`) has a GPU
/// form; if not, why (in words for the run's summary). Pure: no device is opened.
pub fn gpu_form(prog: &Program, leaf_dtypes: &[DType], rank: usize) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    return super::eval::gpu::codegen::kernel_source(prog, leaf_dtypes, rank)
        .map(|_| ())
        .map_err(|why| why.0);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (prog, leaf_dtypes, rank);
        Err("this chunkfuse was built without the cuda feature".to_string())
    }
}

/// Whether reducing the values of `prog` (over one input of `leaf_dtype`) by `func` into
/// `out_dtype` has a GPU form; if not, why. Pure: no device is opened.
pub fn gpu_reduce_form(
    func: crate::plan::ReduceFunc,
    prog: &Program,
    leaf_dtype: DType,
    out_dtype: DType,
) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    return super::eval::gpu::reduce_source::reduce_source(func, prog, leaf_dtype, out_dtype)
        .map(|_| ())
        .map_err(|why| why.0);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (func, prog, leaf_dtype, out_dtype);
        Err("this chunkfuse was built without the cuda feature".to_string())
    }
}

/// A fused elementwise program compiled for a device other than the CPU.
#[derive(Debug, Clone)]
pub struct DeviceKernel {
    #[cfg(feature = "cuda")]
    inner: super::eval::gpu::GpuKernel,
}

impl DeviceKernel {
    /// Whether the kernel takes these leaves and output over a region of `shape` (else the
    /// CPU evaluates the block).
    pub fn accepts(&self, leaves: &[LeafInput], shape: &[u64], out: &Buffer) -> bool {
        #[cfg(feature = "cuda")]
        return self.inner.accepts(leaves, shape, out);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (leaves, shape, out);
            false
        }
    }

    /// Evaluates the program over a region of `shape` into `out` (C order).
    pub fn eval_into(&self, leaves: &[LeafInput], shape: &[u64], out: &mut Buffer) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.eval_into(leaves, shape, out);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (leaves, shape, out);
            Err(Error::internal(
                "no device kernels without the cuda feature",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_unknown_ones_are_named() {
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Cpu));
        assert_eq!("CUDA".parse::<Device>().ok(), Some(Device::Cuda));
        assert_eq!("auto".parse::<Device>().ok(), Some(Device::Auto));
        let err = "tpu".parse::<Device>().unwrap_err().to_string();
        assert!(
            err.contains("\"tpu\"") && err.contains("cpu, cuda or auto"),
            "{err}"
        );
    }

    #[test]
    fn the_cpu_compiles_nothing() {
        let prog = Program::default();
        let placed = Placement::open(Device::Cpu).unwrap();
        assert!(placed.kernel(&prog, &[], 1).unwrap().is_none());
        assert_eq!(placed.describe(), "cpu");
    }

    #[test]
    fn auto_always_places_somewhere() {
        // With no GPU (as in CI) auto is the CPU; with one it is that GPU.
        let placed = Placement::open(Device::Auto).unwrap();
        match Placement::open(Device::Cuda) {
            Ok(_) => assert!(placed.describe().starts_with("cuda: ")),
            Err(e) => {
                assert_eq!(placed.describe(), "cpu");
                assert!(
                    e.to_string().contains("device 'cuda' is not available"),
                    "{e}"
                );
            }
        }
    }
}
