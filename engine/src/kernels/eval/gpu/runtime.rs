//! The CUDA device: opened once per process through the driver library loaded at run time,
//! kernels compiled by NVRTC for the device's architecture and cached by source, and fused
//! elementwise programs evaluated over a region (leaves copied in, values copied out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::CompileOptions;

use super::codegen::{kernel_source, KERNEL_NAME};
use super::failure::{cuda_error, guarded, panic_message};
use super::launch::LaunchArgs;
use super::read_staging::ReadStaging;
use super::staging::with_staging;
use crate::array::{Buffer, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::eval::program::Program;
use crate::kernels::eval::tiles::LeafInput;

/// Threads per block of the elementwise kernel.
const BLOCK_THREADS: u32 = 256;
/// Blocks per launch at most (the kernel strides over the rest).
const MAX_BLOCKS: u32 = 65_535;

/// An open CUDA device.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    /// `compute_XY` of the device.
    arch: String,
    /// The device's name, for reports.
    name: String,
    /// Compiled modules by source (a source may hold several kernels).
    kernels: Mutex<HashMap<String, Arc<cudarc::driver::CudaModule>>>,
    /// Resident memory that opening the device and NVRTC took.
    driver_bytes: u64,
    /// The device's ordinal.
    ordinal: usize,
    /// The buffers device reads reuse (one read at a time).
    read_staging: Mutex<Option<Vec<ReadStaging>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({}, {})", self.name, self.arch)
    }
}

/// The device chosen by `CHUNKFUSE_CUDA_DEVICE` (an ordinal, 0 by default), opened on first
/// use; the reason when there is none (no driver, no NVRTC, no device, or a process forked
/// from one that had opened it).
pub fn gpu() -> Result<&'static Gpu> {
    static GPU: OnceLock<(u32, std::result::Result<Gpu, String>)> = OnceLock::new();
    let (opener, opened) = GPU.get_or_init(|| {
        // A panic here (a library lacking a symbol) means no usable device.
        let opened = std::panic::catch_unwind(open)
            .unwrap_or_else(|panic| Err(panic_message(panic.as_ref())));
        (std::process::id(), opened)
    });
    let unavailable = |why: &str| {
        Error::new(
            ErrorKind::Unsupported,
            format!("device 'cuda' is not available: {why}"),
        )
    };
    let gpu = opened.as_ref().map_err(|why| unavailable(why))?;
    usable_after_fork(*opener, std::process::id()).map_err(|why| unavailable(&why))?;
    Ok(gpu)
}

/// Whether a device opened by process `opener` can be used by process `current`: CUDA's
/// state does not survive `fork`, so a child of the process that opened it cannot (its calls
/// would fail or hang); it must be started by spawning.
fn usable_after_fork(opener: u32, current: u32) -> std::result::Result<(), String> {
    if opener == current {
        return Ok(());
    }
    Err(format!(
        "this process was forked from process {opener}, which had opened the GPU, and CUDA \
         cannot be used after fork: start worker processes with the \"spawn\" or \
         \"forkserver\" method (multiprocessing_context=\"spawn\" for a DataLoader), or \
         open the GPU only in the workers"
    ))
}

fn open() -> std::result::Result<Gpu, String> {
    // SAFETY: probing loads the libraries by name and calls nothing in them.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) was found".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(
            "NVRTC (libnvrtc.so), which compiles the kernels, was not found: add the \
                    CUDA toolkit's lib64 to LD_LIBRARY_PATH"
                .into(),
        );
    }
    let ordinal = match std::env::var("CHUNKFUSE_CUDA_DEVICE") {
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("CHUNKFUSE_CUDA_DEVICE={v:?} is not a device ordinal"))?,
        Err(_) => 0,
    };
    let count = CudaContext::device_count().map_err(|e| format!("no CUDA device ({e})"))?;
    if count <= 0 {
        return Err("no CUDA device".into());
    }
    if ordinal >= count as usize {
        return Err(format!(
            "device {ordinal} asked for (CHUNKFUSE_CUDA_DEVICE), {count} present"
        ));
    }
    let before = resident_bytes();
    let ctx =
        CudaContext::new(ordinal).map_err(|e| format!("cannot open device {ordinal}: {e}"))?;
    use cudarc::driver::sys::CUdevice_attribute::*;
    let major = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| e.to_string())?;
    let minor = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| e.to_string())?;
    let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
    let arch = format!("compute_{major}{minor}");
    // Compile one kernel now: NVRTC failing is reported before anything runs, and the
    // memory the driver and NVRTC take is measured with the context's.
    compile_ptx(WARM_UP_KERNEL, &arch).map_err(|e| format!("NVRTC cannot compile: {e}"))?;
    Ok(Gpu {
        ctx,
        arch,
        name,
        kernels: Mutex::new(HashMap::new()),
        driver_bytes: resident_bytes().saturating_sub(before),
        ordinal,
        read_staging: Mutex::new(None),
    })
}

/// A kernel compiled when the device opens.
const WARM_UP_KERNEL: &str = "extern \"C\" __global__ void cf_warm_up(int* x) { *x = 1; }";

/// This process's resident memory in bytes (`VmRSS`), 0 where unknown.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// `src` compiled to PTX for `arch` with the IEEE options the engine's kernels need.
fn compile_ptx(src: &str, arch: &str) -> std::result::Result<cudarc::nvrtc::Ptx, String> {
    let opts = CompileOptions {
        // IEEE results, as the CPU computes them: no fused multiply-adds, no flushing of
        // subnormals, exact division and square root.
        fmad: Some(false),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        options: vec![format!("--gpu-architecture={arch}")],
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| e.to_string())
}

/// A fused elementwise program compiled for the device.
#[derive(Debug, Clone)]
pub struct GpuKernel {
    gpu: &'static Gpu,
    func: CudaFunction,
    leaf_dtypes: Vec<DType>,
    out_dtype: DType,
    rank: usize,
}

impl Gpu {
    /// The device's name and architecture.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the device's context current on this thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_error("binding the context", e))
    }

    /// A new stream on the device.
    pub(super) fn new_stream(&self) -> Result<Arc<cudarc::driver::CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| cuda_error("creating a stream", e))
    }

    /// A new event that records times.
    pub(super) fn new_event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_error("creating an event", e))
    }

    /// Runs `f` with the stagings device reads reuse (made on first use); reads wait here
    /// for each other.
    pub(super) fn with_read_staging<T>(
        &self,
        f: impl FnOnce(&mut [ReadStaging]) -> Result<T>,
    ) -> Result<T> {
        guarded("reading onto the device", || {
            let mut slot = self
                .read_staging
                .lock()
                .map_err(|_| Error::internal("device read staging poisoned"))?;
            if slot.is_none() {
                let stagings = (0..super::read_staging::SLOTS)
                    .map(|_| self.new_stream().map(ReadStaging::new))
                    .collect::<Result<Vec<_>>>()?;
                *slot = Some(stagings);
            }
            match slot.as_mut() {
                Some(st) => f(st),
                None => Err(Error::internal("no device read staging")),
            }
        })
    }

    /// Kernel `name` of CUDA C `src`, compiled on first use and cached by source.
    pub(super) fn function(&self, src: &str, name: &str) -> Result<CudaFunction> {
        let what = format!("compiling kernel {name}");
        let module = {
            let mut cache = self
                .kernels
                .lock()
                .map_err(|_| Error::internal("GPU kernel cache poisoned"))?;
            match cache.get(src) {
                Some(m) => m.clone(),
                None => {
                    let ptx = compile_ptx(src, &self.arch).map_err(|e| cuda_error(&what, e))?;
                    let module = self
                        .ctx
                        .load_module(ptx)
                        .map_err(|e| cuda_error(&what, e))?;
                    cache.insert(src.to_string(), module.clone());
                    module
                }
            }
        };
        module.load_function(name).map_err(|e| cuda_error(&what, e))
    }

    /// Device memory free now, in bytes.
    pub fn free_bytes(&self) -> Result<u64> {
        guarded("asking the device for its free memory", || {
            self.bind()?;
            cudarc::driver::result::mem_get_info()
                .map(|(free, _)| free as u64)
                .map_err(|e| cuda_error("asking the device for its free memory", e))
        })
    }

    /// Resident host memory the CUDA driver and NVRTC took when the device opened (a run's
    /// budget sets it aside).
    pub fn driver_bytes(&self) -> u64 {
        self.driver_bytes
    }

    /// `prog` compiled for regions of rank `rank` whose leaves have `leaf_dtypes`; `None`
    /// when the program has no GPU form (it runs on the CPU).
    pub fn compile(
        &'static self,
        prog: &Program,
        leaf_dtypes: &[DType],
        rank: usize,
    ) -> Result<Option<GpuKernel>> {
        guarded("compiling a fused kernel", || {
            self.compile_unguarded(prog, leaf_dtypes, rank)
        })
    }

    fn compile_unguarded(
        &'static self,
        prog: &Program,
        leaf_dtypes: &[DType],
        rank: usize,
    ) -> Result<Option<GpuKernel>> {
        let Ok(src) = kernel_source(prog, leaf_dtypes, rank) else {
            return Ok(None);
        };
        let func = self.function(&src, KERNEL_NAME)?;
        Ok(Some(GpuKernel {
            gpu: self,
            func,
            leaf_dtypes: leaf_dtypes.to_vec(),
            out_dtype: prog.dtype(),
            rank,
        }))
    }
}

impl GpuKernel {
    /// Evaluates the program over a region of `shape` into `out` (C order): each leaf's
    /// values that the region reaches are copied to the device (through this thread's pinned
    /// buffers), the kernel runs, the values come back.
    pub fn eval_into(&self, leaves: &[LeafInput], shape: &[u64], out: &mut Buffer) -> Result<()> {
        guarded("running a fused kernel", || {
            self.eval_unguarded(leaves, shape, out)
        })
    }

    /// Whether the kernel was compiled for these leaves, this region's rank and this output.
    pub fn accepts(&self, leaves: &[LeafInput], shape: &[u64], out: &Buffer) -> bool {
        shape.len() == self.rank
            && leaves.len() == self.leaf_dtypes.len()
            && out.dtype() == self.out_dtype
            && leaves
                .iter()
                .zip(&self.leaf_dtypes)
                .all(|(l, d)| l.buf.dtype() == *d && l.strides.len() == self.rank)
    }

    fn eval_unguarded(&self, leaves: &[LeafInput], shape: &[u64], out: &mut Buffer) -> Result<()> {
        if !self.accepts(leaves, shape, out) {
            return Err(Error::internal(
                "GPU kernel called with leaves or output it was not compiled for",
            ));
        }
        let args = LaunchArgs::new(leaves, shape)?;
        let n = args.n;
        if n == 0 {
            return Ok(());
        }
        let general = args.general;
        let parts = args.uploads();
        let blocks = n.div_ceil(BLOCK_THREADS as u64).min(MAX_BLOCKS as u64) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        with_staging(&self.gpu.ctx, |staging| {
            let addresses = staging.upload(&parts)?;
            let out_bytes = out.bytes_mut();
            let out_dev = staging.output(out_bytes.len())?;
            let mut launch = staging.stream().launch_builder(&self.func);
            launch.arg(&out_dev);
            for address in &addresses {
                launch.arg(address);
            }
            launch.arg(&general);
            launch.arg(&n);
            // SAFETY: the arguments match the generated kernel's parameters: the output, one
            // pointer per leaf (at the region's origin), the geometry, its flag and the count; the output buffer holds the
            // region's values and the geometry keeps every index in the leaves' spans.
            unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launching a fused kernel", e))?;
            staging.download(out_dev, out_bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_of_the_process_that_opened_the_device_is_refused_with_the_remedy() {
        assert_eq!(usable_after_fork(41, 41), Ok(()));
        let why = usable_after_fork(41, 42).unwrap_err();
        assert!(why.contains("forked from process 41"), "{why}");
        assert!(why.contains("\"spawn\""), "{why}");
    }
}
