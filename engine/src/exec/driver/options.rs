//! How to run: the budget, threads, work directory, resumption and device.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::exec::Progress;
use crate::kernels::device::Device;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Memory budget in bytes; a quarter of the available memory when `None`.
    pub max_mem: Option<u64>,
    /// Compute threads; all cores when 0.
    pub threads: usize,
    /// IO threads per store.
    pub io_threads: usize,
    /// Where intermediates go; the system temporary directory when `None`.
    pub work_dir: Option<PathBuf>,
    /// Show a progress bar (only on a terminal).
    pub progress: bool,
    /// Raised to cancel (Ctrl-C).
    pub cancel: Arc<AtomicBool>,
    /// Counters to share with the caller, who may poll them while the run goes (the Python
    /// bindings report progress from them); the run makes its own when `None`.
    pub observe: Option<Arc<Progress>>,
    /// Make the run resumable: targets carry a job marker until the run completes (without
    /// `resume`, only those a write may not overwrite do), intermediates live in a work
    /// directory named after the job that outlives a failed run, and rerunning an unfinished
    /// job keeps every chunk it had written.
    pub resume: bool,
    /// Where fused elementwise programs and reductions run (FFTs and codecs stay on the CPU).
    pub device: Device,
    /// The job runs in batches, perhaps in other processes (see `run::Job::attach`): its
    /// targets are marked and its work directory is named after the job whatever `resume`
    /// says, so every process finds them, and it holds the reductions' partial states.
    pub batched: bool,
    /// Batches of the job that run at once (0: it does not run in batches): each output
    /// chunk of a reduction is folded in at least this many groups where it has the pieces,
    /// so its batches spread over every worker.
    pub spread: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_mem: None,
            threads: 0,
            io_threads: 8,
            work_dir: None,
            progress: false,
            cancel: Arc::new(AtomicBool::new(false)),
            observe: None,
            resume: true,
            device: Device::Cpu,
            batched: false,
            spread: 0,
        }
    }
}
