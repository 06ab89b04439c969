//! The engine of one run: its scheduler, counters, budget and device, and the limits derived
//! from them (read batches, reduce task shares, what fits).

use std::sync::Arc;
use std::time::Instant;

use super::options::RunOptions;
use super::record::{RunSummary, StageRecord};
use super::tasks::TaskLimits;
use crate::error::{Error, Result};
use crate::exec::memory::{default_max_mem, peak_rss};
use crate::exec::{Budget, Progress, Scheduler};
use crate::kernels::device::Placement;

/// The scheduler, counters and budget of one run.
pub struct Engine {
    /// Runs the tasks.
    pub scheduler: Scheduler,
    /// The run's counters.
    pub progress: Arc<Progress>,
    /// The whole budget.
    pub max_mem: u64,
    /// What tasks may reserve (the budget less the buffer pool's share).
    pub task_budget: u64,
    /// The device fused elementwise programs run on.
    pub placement: Placement,
    /// Groups a reduction's output chunk is spread over at least (`RunOptions::spread`).
    pub spread: usize,
}

impl Engine {
    /// The engine `opts` ask for: its budget split between the buffer pool, the threads'
    /// overhead, the device's host memory and the tasks.
    pub fn new(opts: &RunOptions) -> Result<Engine> {
        let max_mem = opts.max_mem.unwrap_or_else(default_max_mem);
        let placement = Placement::open(opts.device)?;
        let progress = opts
            .observe
            .clone()
            .unwrap_or_else(|| Arc::new(Progress::new(opts.progress)));
        // An eighth of the budget keeps freed chunk buffers for reuse; tasks get the rest.
        crate::exec::memory::scale_allocator_to_budget(max_mem);
        let pool_bytes = (max_mem / 8).min(256 << 20);
        crate::array::pool::set_capacity(pool_bytes);
        // Each compute thread holds memory no task counts (see `THREAD_OVERHEAD`): small
        // budgets run on fewer threads, and what they hold is set aside.
        let requested = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        };
        let threads = crate::exec::memory::threads_for_budget(max_mem, requested);
        let thread_bytes = crate::exec::memory::thread_overhead(max_mem, threads);
        // A GPU's driver memory and transfer buffers are held for the whole run.
        let device_bytes = placement.host_bytes(threads);
        let task_budget = (max_mem - pool_bytes - thread_bytes)
            .checked_sub(device_bytes)
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                Error::new(
                    crate::error::ErrorKind::Memory,
                    format!(
                        "the budget of {} cannot hold what the GPU keeps in host memory ({}: \
                         its driver, and pinned transfer buffers for {} threads)",
                        crate::exec::memory::human_bytes(max_mem),
                        crate::exec::memory::human_bytes(device_bytes),
                        threads
                    ),
                )
            })?;
        let scheduler = Scheduler::new(
            threads,
            Budget::lending_to_pool(task_budget),
            progress.clone(),
            opts.cancel.clone(),
        )?;
        Ok(Engine {
            scheduler,
            progress,
            max_mem,
            task_budget,
            placement,
            spread: opts.spread,
        })
    }

    /// The summary of a finished run that started at `started`.
    pub fn summary(
        &self,
        plan: String,
        started: Instant,
        stages: Vec<StageRecord>,
        outputs: Vec<String>,
    ) -> RunSummary {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        RunSummary {
            plan,
            seconds: started.elapsed().as_secs_f64(),
            tasks: load(&self.progress.tasks_done),
            stages,
            bytes_read: load(&self.progress.bytes_read),
            bytes_written: load(&self.progress.bytes_written),
            decoded_bytes: load(&self.progress.decoded_bytes),
            peak_rss: peak_rss(),
            max_mem: self.max_mem,
            threads: self.scheduler.threads(),
            outputs,
            device: self.placement.describe(),
            gpu_blocks: load(&self.progress.gpu_blocks),
        }
    }

    /// Bytes of one read batch.
    pub fn batch_limit(&self) -> u64 {
        (self.max_mem / 16).max(1)
    }

    /// The limits stages' tasks are planned within.
    pub fn limits(&self) -> TaskLimits {
        TaskLimits {
            batch_limit: self.batch_limit(),
            task_share: self.task_share(),
            task_budget: self.task_budget,
            workers: self.workers(),
            spread: self.spread,
        }
    }

    /// Tasks that run at once: one per compute thread.
    pub fn workers(&self) -> usize {
        self.scheduler.threads().max(1)
    }

    /// What one reduce task may hold to fold several pieces per pass over its accumulator:
    /// room for two tasks per thread.
    pub fn task_share(&self) -> u64 {
        (self.task_budget / (2 * self.workers() as u64)).max(2 * self.batch_limit())
    }

    /// What tasks could reserve were the run on `threads` compute threads instead: each
    /// thread sets its overhead aside (see [`crate::exec::memory::thread_overhead`]).
    pub fn task_budget_on(&self, threads: usize) -> u64 {
        let pool_bytes = (self.max_mem / 8).min(256 << 20);
        self.max_mem
            .saturating_sub(pool_bytes)
            .saturating_sub(crate::exec::memory::thread_overhead(self.max_mem, threads))
            .saturating_sub(self.placement.host_bytes(threads))
    }

    /// The error for a task that cannot fit the budget, or Ok. A task must fit together with
    /// the state other tasks of its stage may hold while it waits to start (a reduction's
    /// partial results waiting to be merged): were it larger, it would wait for bytes that
    /// only its own run frees.
    pub fn check_fits(&self, tasks: &[crate::exec::task::Task]) -> Result<()> {
        match self.misfit(tasks) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// The largest of `tasks` when it cannot fit the budget (see [`Engine::check_fits`]):
    /// the bytes it needs and the error naming it.
    pub fn misfit(&self, tasks: &[crate::exec::task::Task]) -> Option<(u64, Error)> {
        let t = tasks.iter().max_by_key(|t| task_need(t))?;
        let need = task_need(t);
        if need <= self.task_budget {
            return None;
        }
        let held = t.processor.held_by_others();
        let error = Error::new(
            crate::error::ErrorKind::Memory,
            format!(
                "{} needs {}{} but the budget for tasks is {} (of the memory budget {}); \
                 raise the memory budget (--max-mem, max_mem=) or use smaller chunks",
                t.label,
                crate::exec::memory::human_bytes(need),
                match held {
                    0 => String::new(),
                    h => format!(
                        " ({} of it held by partial results of other tasks)",
                        crate::exec::memory::human_bytes(h)
                    ),
                },
                crate::exec::memory::human_bytes(self.task_budget),
                crate::exec::memory::human_bytes(self.max_mem)
            ),
        );
        Some((need, error))
    }
}

/// The bytes `t` needs of the budget: its own, and what other tasks of its stage may hold
/// while it waits to start.
pub fn task_need(t: &crate::exec::task::Task) -> u64 {
    t.memory + t.processor.held_by_others()
}
