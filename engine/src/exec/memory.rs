//! The memory budget: tasks reserve their projected bytes before they start; a reservation
//! is an RAII guard that returns its bytes on drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// A byte budget shared by every running task.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
    /// Whether the buffer pool may hold the bytes no task has reserved.
    lends_to_pool: bool,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Self::build(limit, false)
    }

    /// A budget of `limit` bytes whose unreserved part the buffer pool may fill with freed
    /// buffers (see [`crate::array::pool::lend`]): each reservation takes its bytes back from
    /// the pool before the task allocates, so small budgets reuse buffers instead of mapping
    /// fresh ones. With several live at once the pool follows the one that changed last, and
    /// the process stays within the sum of their limits.
    pub fn lending_to_pool(limit: u64) -> Arc<Self> {
        crate::array::pool::lend(limit);
        Self::build(limit, true)
    }

    fn build(limit: u64, lends_to_pool: bool) -> Arc<Self> {
        Arc::new(Budget {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
            lends_to_pool,
        })
    }

    /// Tells the pool how much of the budget is unreserved (called with `used` locked, so
    /// updates reach the pool in the order they happened).
    fn lend_rest(&self, used: u64) {
        if self.lends_to_pool {
            crate::array::pool::lend(self.limit.saturating_sub(used));
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes currently reserved.
    pub fn used(&self) -> u64 {
        self.used.lock().map(|u| *u).unwrap_or(0)
    }

    /// Waits until `bytes` fit under the limit and reserves them. Returns `Ok(None)` when
    /// `stop` is raised while waiting. A request larger than the whole budget is an error
    /// naming `who`.
    pub fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        who: &str,
        stop: &AtomicBool,
    ) -> Result<Option<Reservation>> {
        if bytes > self.limit {
            return Err(Error::new(
                ErrorKind::Memory,
                format!(
                    "{who} needs {} but the budget is {}; raise the memory budget (--max-mem, max_mem=) or use smaller chunks",
                    human_bytes(bytes),
                    human_bytes(self.limit)
                ),
            ));
        }
        let mut used = self
            .used
            .lock()
            .map_err(|_| Error::internal("memory budget lock poisoned"))?;
        while *used + bytes > self.limit {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            used = self
                .freed
                .wait_timeout(used, Duration::from_millis(50))
                .map_err(|_| Error::internal("memory budget lock poisoned"))?
                .0;
        }
        *used += bytes;
        self.lend_rest(*used);
        Ok(Some(Reservation {
            budget: self.clone(),
            bytes,
        }))
    }

    /// Reserves `bytes` when they fit under the limit now; `None` otherwise (never waits).
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        let mut used = self.used.lock().ok()?;
        if *used + bytes > self.limit {
            return None;
        }
        *used += bytes;
        self.lend_rest(*used);
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn release(&self, bytes: u64) {
        if let Ok(mut used) = self.used.lock() {
            *used = used.saturating_sub(bytes);
            self.lend_rest(*used);
        }
        self.freed.notify_all();
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        if self.lends_to_pool {
            crate::array::pool::lend(0);
        }
    }
}

/// Bytes held against a [`Budget`]; returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A new reservation of `bytes` from the same budget when they fit under its limit now.
    pub fn try_another(&self, bytes: u64) -> Option<Reservation> {
        self.budget.try_reserve(bytes)
    }

    /// Moves up to `bytes` of this reservation into a new one (for state that outlives the
    /// task, such as a partial reduction waiting to be merged).
    pub fn split(&mut self, bytes: u64) -> Reservation {
        let take = bytes.min(self.bytes);
        self.bytes -= take;
        Reservation {
            budget: self.budget.clone(),
            bytes: take,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.release(self.bytes);
        }
    }
}

/// Formats a byte count with a binary unit (`1.5 GiB`).
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Parses a size such as `2GB`, `512MiB`, `1.5G` or `1000000` (bytes), as Dask and Cubed
/// do: decimal units (KB, MB, GB, TB, PB and the bare K, M, G, T, P) are powers of 1000,
/// binary ones (KiB, MiB, GiB, TiB, PiB, or Ki, Mi, Gi, Ti, Pi) of 1024.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        Error::new(
            ErrorKind::Plan,
            format!("invalid size \"{text}\"; use e.g. 2GB, 512MiB or 1000000"),
        )
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        // As Dask's and Cubed's sizes: a letter alone is decimal, an `i` makes it binary.
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "p" | "pb" => 1e15,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024f64.powi(2),
        "gi" | "gib" => 1024f64.powi(3),
        "ti" | "tib" => 1024f64.powi(4),
        "pi" | "pib" => 1024f64.powi(5),
        other => {
            return Err(Error::new(
                ErrorKind::Plan,
                format!(
                "invalid size unit \"{other}\" in \"{text}\"; use B, KB, MB, GB, TB, PB (or K, M, G, T, P: powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024)"
            ),
            ))
        }
    };
    let bytes = value * mult;
    if bytes.is_nan() || bytes >= 2f64.powi(63) {
        return Err(Error::new(
            ErrorKind::Plan,
            format!("size \"{text}\" is too large: sizes go up to 8 EiB"),
        ));
    }
    if bytes < 1.0 {
        return Err(Error::new(
            ErrorKind::Plan,
            format!("size \"{text}\" must be at least one byte"),
        ));
    }
    Ok(bytes as u64)
}

/// Makes freed chunk buffers go back to the OS at once, so the process's resident memory
/// follows the budget: glibc otherwise raises its mmap threshold after large frees and keeps
/// later large buffers in per-thread heaps it rarely trims. Call once at start-up;
/// [`scale_allocator_to_budget`] then relaxes it for the run's budget.
pub fn configure_allocator() {
    set_allocator_thresholds(128 * 1024);
}

/// Bytes each compute thread may hold that no task's projection counts: the pages of its
/// stack it touched, its codec contexts (a zstd encoder keeps its window and tables between
/// chunks) and the freed memory its allocator arena keeps for reuse. The engine sets this much
/// per thread aside from the budget (see [`threads_for_budget`]).
pub const THREAD_OVERHEAD: u64 = 2 << 20;

/// Bytes of budget per compute thread below which fewer threads run: the threads' own
/// overhead ([`THREAD_OVERHEAD`] each) then takes at most a quarter of the budget.
pub const BUDGET_PER_THREAD: u64 = 4 * THREAD_OVERHEAD;

/// The compute threads a budget of `max_mem` bytes affords: `requested`, but no more than one
/// per [`BUDGET_PER_THREAD`] bytes (at least one), so what each thread holds outside every
/// task's projection stays a small, counted share of small budgets (a 32 MB budget runs on
/// three threads however many cores the machine has).
pub fn threads_for_budget(max_mem: u64, requested: usize) -> usize {
    let afforded = usize::try_from(max_mem / BUDGET_PER_THREAD).unwrap_or(usize::MAX);
    requested.clamp(1, afforded.max(1))
}

/// The bytes of a budget of `max_mem` set aside for what `threads` compute threads hold
/// outside every task's projection: [`THREAD_OVERHEAD`] for each thread but the first, whose
/// share is part of the fixed baseline above the budget (at most a quarter of `max_mem`).
pub fn thread_overhead(max_mem: u64, threads: usize) -> u64 {
    (threads.saturating_sub(1) as u64 * THREAD_OVERHEAD).min(max_mem / 4)
}

/// Lets allocations up to 1/16 of the budget (128 KiB to 16 MiB) reuse freed heap memory
/// instead of being mapped, faulted in and unmapped each time: encoded chunks and codec
/// buffers are allocated and freed at a high rate, and that churn cost a third of the CPU time
/// of large rechunks in the kernel (each unmap also flushes every core's TLB). A 256 MB
/// budget so covers ERA5's 4 MB chunks. What the heap may keep stays a small share of the
/// budget: glibc gives threads heaps (arenas) of their own, each keeping up to twice the
/// threshold of freed memory, so the number of arenas is capped at one per 64 MiB of budget
/// (at least one); threads beyond it share them.
pub fn scale_allocator_to_budget(max_mem: u64) {
    let threshold = (max_mem / 16).clamp(128 * 1024, 16 << 20);
    set_allocator_thresholds(threshold as i32);
    let arenas = (max_mem / (64 << 20)).clamp(1, 1024);
    set_allocator_arenas(arenas as i32);
}

/// Gives the pages of freed heap memory back to the OS, those between blocks in use too (glibc
/// returns only the top of a heap on its own): a stage of many small tasks frees their plans
/// among longer-lived buffers, and the holes would otherwise stay resident.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes glibc's arena locks itself and only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn set_allocator_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as for `set_allocator_thresholds`: a tuning parameter glibc reads under its own
    // locks when it would create an arena; arenas made before keep serving their threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

fn set_allocator_thresholds(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters, which glibc reads under its
    // own locks; any value is valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
        libc::mallopt(libc::M_TRIM_THRESHOLD, bytes.saturating_mul(2));
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where unknown.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// A safe default budget: a quarter of the available memory, at least 256 MiB.
pub fn default_max_mem() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(4 << 30);
    (avail / 4).max(256 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("2Gi").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("3k").unwrap(), 3_000);
        assert_eq!(parse_bytes("1PiB").unwrap(), 1 << 50);
        assert!(parse_bytes("lots").is_err());
        let huge = parse_bytes("99999999999999999999").unwrap_err();
        assert!(huge.to_string().contains("too large"), "{huge}");
        assert!(parse_bytes("8TiB").is_ok());
    }

    #[test]
    fn small_budgets_run_on_fewer_threads() {
        // 32 MB affords three threads whatever was asked; a large budget all of them.
        assert_eq!(threads_for_budget(32_000_000, 16), 3);
        assert_eq!(threads_for_budget(64_000_000, 16), 7);
        assert_eq!(threads_for_budget(1 << 30, 16), 16);
        assert_eq!(threads_for_budget(1_000_000, 16), 1);
        assert_eq!(threads_for_budget(1 << 30, 0), 1);
        // What the threads hold is set aside, never more than a quarter of the budget.
        assert_eq!(thread_overhead(32_000_000, 3), 2 * THREAD_OVERHEAD);
        assert_eq!(thread_overhead(1_000_000, 1), 0);
        assert_eq!(thread_overhead(16_000_000, 64), 4_000_000);
    }

    #[test]
    fn reservations_return_their_bytes() {
        let b = Budget::new(100);
        let stop = AtomicBool::new(false);
        let mut r = b.reserve(60, "t", &stop).unwrap().unwrap();
        let kept = r.split(20);
        assert_eq!(b.used(), 60);
        drop(r);
        assert_eq!(b.used(), 20);
        drop(kept);
        assert_eq!(b.used(), 0);
        assert!(b.reserve(101, "big task", &stop).is_err());
    }
}
