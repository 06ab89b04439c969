//! Run metrics and the progress bar (shown only when stderr is a terminal).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Counters updated by tasks, read by the progress bar and the run summary.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    /// Tasks finished.
    pub tasks_done: AtomicU64,
    /// Tasks in every stage planned so far.
    pub tasks_total: AtomicU64,
    /// Bytes read from stores.
    pub bytes_read: AtomicU64,
    /// Bytes written to stores.
    pub bytes_written: AtomicU64,
    /// Bytes of decoded chunk data.
    pub decoded_bytes: AtomicU64,
    /// Blocks of output whose fused program ran on a GPU.
    pub gpu_blocks: AtomicU64,
    bar: Mutex<Option<indicatif::ProgressBar>>,
}

impl Progress {
    /// New counters; `show` asks for a bar, which appears only on a terminal.
    pub fn new(show: bool) -> Self {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(0);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tasks {msg}",
            ) {
                b.set_style(style);
            }
            b
        });
        Progress {
            started: Instant::now(),
            tasks_done: AtomicU64::new(0),
            tasks_total: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            decoded_bytes: AtomicU64::new(0),
            gpu_blocks: AtomicU64::new(0),
            bar: Mutex::new(bar),
        }
    }

    /// Seconds since the counters were made.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Adds `n` tasks to the total.
    pub fn add_tasks(&self, n: u64) {
        let total = self.tasks_total.fetch_add(n, Ordering::Relaxed) + n;
        if let Ok(bar) = self.bar.lock() {
            if let Some(b) = bar.as_ref() {
                b.set_length(total);
            }
        }
    }

    /// Records a finished task and refreshes the bar.
    pub fn task_done(&self) {
        let done = self.tasks_done.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(bar) = self.bar.lock() {
            if let Some(b) = bar.as_ref() {
                b.set_position(done);
                let gbs = self.decoded_bytes.load(Ordering::Relaxed) as f64
                    / 1e9
                    / self.elapsed().max(1e-9);
                b.set_message(format!("{gbs:.2} GB/s decoded"));
            }
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        if let Ok(mut bar) = self.bar.lock() {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
        }
    }
}
