//! A pool of large byte buffers, so chunk-sized allocations are reused instead of mapped,
//! faulted in, zeroed and unmapped for every chunk (which costs more than decoding small
//! chunks).
//!
//! The pool holds at most its capacity (a share the memory budget sets aside) plus what the
//! budget lends it, up to that capacity again: bytes of the budget no task has reserved. A
//! task's reservation takes its bytes back from the pool before the task allocates anything,
//! so tasks' buffers and the pool together stay within the budget. Buffers beyond the limit
//! are freed.

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, Once};

/// Buffers smaller than this are not pooled.
pub const MIN_POOLED: usize = 64 * 1024;

/// Fresh buffers are made this many steps per doubling of size larger than asked, at most
/// (see [`size_class`]).
const CLASSES_PER_DOUBLING: usize = 16;

/// The capacity a fresh buffer of `len` bytes gets: `len` rounded up to the next of 16 sizes
/// per doubling (at most 1/16 more). Requests of nearly the same size (a chunk's compressed
/// bytes vary by a few kB from chunk to chunk) then find each other's buffers: made to their
/// exact lengths, a buffer freed for a chunk of 3,158,000 bytes never served the next one of
/// 3,159,000, and io_uring reads (which read into pooled buffers rather than mapping) faulted
/// in fresh memory for almost every chunk.
fn size_class(len: usize) -> usize {
    if len < MIN_POOLED {
        return len;
    }
    let octave = 1usize << (usize::BITS - 1 - len.leading_zeros());
    let step = (octave / CLASSES_PER_DOUBLING).max(1);
    len.div_ceil(step).saturating_mul(step)
}

/// Free buffers and the limits on the bytes they may hold.
#[derive(Debug)]
struct Pool {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: Vec<Vec<u8>>,
    held: u64,
    capacity: u64,
    /// Unreserved budget bytes the pool may hold on top of its capacity (counted up to the
    /// capacity: the pool never grows past twice its share).
    lent: u64,
}

impl State {
    fn limit(&self) -> u64 {
        self.capacity.saturating_add(self.lent.min(self.capacity))
    }

    /// Removes buffers, largest first, until the pool is within its limit; returns them so
    /// they are freed after the lock is released.
    fn trim(&mut self) -> Vec<Vec<u8>> {
        let limit = self.limit();
        let mut dropped = Vec::new();
        if self.held <= limit {
            return dropped;
        }
        self.free.sort_by_key(Vec::capacity);
        while self.held > limit {
            let Some(v) = self.free.pop() else { break };
            self.held -= v.capacity() as u64;
            dropped.push(v);
        }
        dropped
    }
}

impl Pool {
    const fn new(capacity: u64) -> Self {
        Pool {
            state: Mutex::new(State {
                free: Vec::new(),
                held: 0,
                capacity,
                lent: 0,
            }),
        }
    }

    /// The pool's state, locked. The first call registers fork handlers that hold the lock
    /// across `fork`, so a child never inherits it locked by a thread that is not there.
    fn lock(&self) -> std::sync::LockResult<MutexGuard<'_, State>> {
        static REGISTER: Once = Once::new();
        REGISTER.call_once(|| {
            // SAFETY: the handlers only lock and unlock the pool's mutex on the forking thread.
            unsafe {
                libc::pthread_atfork(
                    Some(lock_for_fork),
                    Some(unlock_after_fork),
                    Some(unlock_after_fork),
                );
            }
        });
        self.state.lock()
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let dropped = match self.lock() {
            Ok(mut s) => {
                f(&mut s);
                s.trim()
            }
            Err(_) => Vec::new(),
        };
        drop(dropped);
    }

    fn held(&self) -> u64 {
        self.lock().map(|s| s.held).unwrap_or(0)
    }

    /// The smallest pooled buffer that holds `len` bytes (at most twice as large), with the
    /// contents it had when given back.
    fn take_used(&self, len: usize) -> Option<Vec<u8>> {
        if len < MIN_POOLED {
            return None;
        }
        let mut s = self.lock().ok()?;
        // The smallest buffer that fits, so small requests leave large buffers to the requests
        // that need them.
        let i = s
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len && v.capacity() <= len.saturating_mul(2))
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)?;
        let v = s.free.swap_remove(i);
        s.held -= v.capacity() as u64;
        Some(v)
    }

    fn take(&self, len: usize) -> Vec<u8> {
        match self.take_used(len) {
            Some(mut v) => {
                v.clear();
                v
            }
            None => {
                let mut v = Vec::with_capacity(size_class(len));
                advise_huge_pages(&mut v);
                v
            }
        }
    }

    fn take_zeroed(&self, len: usize) -> Vec<u8> {
        match self.take_used(len) {
            Some(mut v) => {
                v.clear();
                v.resize(len, 0);
                v
            }
            // Written here, not left to calloc: zeroed buffers are read before they are
            // written (accumulators), and a page first read maps the shared zero page, so
            // its first write would take a second fault that copies the page and flushes
            // every core's TLB.
            #[allow(clippy::slow_vector_initialization)] // the point: written, not calloc'd
            None => {
                let mut v = Vec::with_capacity(size_class(len));
                advise_huge_pages(&mut v);
                v.resize(len, 0);
                v
            }
        }
    }

    fn take_filled(&self, len: usize) -> Vec<u8> {
        match self.take_used(len) {
            Some(mut v) => {
                // Only bytes the buffer never held are written (as zeros).
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, 0);
                }
                v
            }
            // Zeroed by the allocator: fresh pages arrive zeroed, nothing is written here
            // (nor in the spare capacity, which is never touched until a later use).
            None => {
                let mut v = vec![0; size_class(len)];
                v.truncate(len);
                advise_huge_pages(&mut v);
                v
            }
        }
    }

    /// Keeps `v` for reuse. When the pool is full, the buffers given back longest ago make
    /// room for it (the sizes just in use are the ones asked for next: a pool full of small
    /// decode buffers would otherwise turn away every large read buffer, and each read would
    /// fault in fresh memory); a buffer larger than the whole limit is freed.
    fn give(&self, v: Vec<u8>) {
        let cap = v.capacity() as u64;
        if v.capacity() < MIN_POOLED {
            return;
        }
        let mut evicted = Vec::new();
        if let Ok(mut s) = self.lock() {
            if cap > s.limit() {
                return;
            }
            // Oldest first: buffers are pushed at the back. Ends, since `cap` fits the limit.
            while s.held + cap > s.limit() && !s.free.is_empty() {
                let old = s.free.remove(0);
                s.held -= old.capacity() as u64;
                evicted.push(old);
            }
            s.held += cap;
            s.free.push(v);
        }
        drop(evicted);
    }
}

/// Fresh buffers at least this large (one huge page) are backed by transparent huge pages
/// where the system allows them on request (see [`advise_huge_pages`]). Buffers below the
/// allocator's mmap threshold (`exec::memory`: up to 16 MiB) are carved out of a heap, so
/// only the huge pages that lie wholly inside the buffer are advised, never memory beside it.
pub const HUGE_PAGES_MIN: usize = 2 << 20;

/// Asks the kernel to back the 2 MiB-aligned interior of `v`'s fresh allocation with
/// transparent huge pages, when it is at least [`HUGE_PAGES_MIN`] bytes. Filling such a
/// buffer then takes one page fault per 2 MiB instead of one per 4 KiB. Bands of an FFT's or
/// a rechunk's input (hundreds of MB, written once) and the blocks of a sharded write (one
/// shard's values, 33 MB for ERA5, more than the pool keeps) were faulted in 4 KiB pages:
/// a fifth of the power spectrum's CPU time went to those faults and their TLB misses, a
/// tenth of the anomaly's. Chunk-sized buffers (decoded chunks, a reduction's running sums:
/// 4 MB for an ERA5 plane) are streamed through once per chunk; with the huge pages inside
/// each, the ERA5 sum's fold of a decoded plane into its running sums took 10% less time
/// and its merges 14% less. Where the kernel declines, nothing changes.
fn advise_huge_pages(v: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if v.capacity() < HUGE_PAGES_MIN {
            return;
        }
        let base = v.as_mut_ptr() as usize;
        let start = base.next_multiple_of(HUGE);
        let end = (base + v.capacity()) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside `v`'s allocation, which this function borrows
            // mutably; MADV_HUGEPAGE changes only how the kernel backs those pages, never
            // their contents or their mapping.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

static POOL: Pool = Pool::new(64 << 20);

thread_local! {
    /// The pool's lock, held by the forking thread from just before `fork` to just after.
    static HELD_ACROSS_FORK: RefCell<Option<MutexGuard<'static, State>>> =
        const { RefCell::new(None) };
}

extern "C" fn lock_for_fork() {
    if let Ok(guard) = POOL.state.lock() {
        HELD_ACROSS_FORK.with(|held| *held.borrow_mut() = Some(guard));
    }
}

extern "C" fn unlock_after_fork() {
    HELD_ACROSS_FORK.with(|held| drop(held.borrow_mut().take()));
}

/// Sets how many bytes the pool may hold (the memory budget sets aside this much).
pub fn set_capacity(bytes: u64) {
    POOL.update(|s| s.capacity = bytes);
}

/// Lets the pool hold up to `bytes` more than its capacity (at most the capacity again): the
/// part of a memory budget that no task has reserved. Lowering it frees buffers at once.
pub fn lend(bytes: u64) {
    POOL.update(|s| s.lent = bytes);
}

/// Bytes currently held by the pool.
pub fn held() -> u64 {
    POOL.held()
}

/// An empty vector with capacity for at least `len` bytes: the smallest pooled one that fits
/// (at most twice as large), else a new one.
pub fn take(len: usize) -> Vec<u8> {
    POOL.take(len)
}

/// A vector of `len` zero bytes (a pooled buffer zeroed, or fresh memory the allocator zeroed).
pub fn take_zeroed(len: usize) -> Vec<u8> {
    POOL.take_zeroed(len)
}

/// A vector of `len` bytes whose values are unspecified (what a pooled buffer last held, or
/// zeros): for callers that overwrite every byte, so no pass zeroes it first.
pub fn take_filled(len: usize) -> Vec<u8> {
    POOL.take_filled(len)
}

/// Returns a buffer to the pool (or frees it when the pool is full or it is small).
pub fn give(v: Vec<u8>) {
    POOL.give(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused() {
        let pool = Pool::new(1 << 20);
        let v = pool.take(100_000);
        let ptr = v.as_ptr();
        pool.give(v);
        let w = pool.take(90_000);
        assert_eq!(w.as_ptr(), ptr);
        assert!(w.is_empty() && w.capacity() >= 90_000);
        pool.give(w);
        assert_eq!(pool.held(), size_class(100_000) as u64);
    }

    #[test]
    fn buffers_of_nearly_the_same_size_serve_each_other() {
        let pool = Pool::new(64 << 20);
        // Compressed chunks a few kB apart: the first's buffer serves the larger second.
        let v = pool.take(3_158_000);
        let ptr = v.as_ptr();
        pool.give(v);
        let w = pool.take(3_159_000);
        assert_eq!(w.as_ptr(), ptr);
        pool.give(w);
        for len in [
            MIN_POOLED,
            100_000,
            3_158_000,
            4_152_960,
            1 << 22,
            (1 << 22) + 1,
        ] {
            let class = size_class(len);
            assert!(
                class >= len && class - len <= len / CLASSES_PER_DOUBLING,
                "{len}"
            );
            assert_eq!(size_class(class), class, "a class is its own class");
        }
        assert_eq!(
            size_class(1000),
            1000,
            "small buffers are not pooled: exact"
        );
    }

    #[test]
    fn a_full_pool_makes_room_for_the_buffer_given_back() {
        // Room for three 96 KiB buffers: the fourth given back takes the oldest one's place,
        // then a buffer twice as large takes the next two oldest ones' places.
        const SMALL: usize = 98_304;
        let pool = Pool::new(3 * SMALL as u64);
        let small: Vec<Vec<u8>> = (0..4).map(|_| pool.take(SMALL)).collect();
        let newest = small[3].as_ptr();
        for v in small {
            pool.give(v);
        }
        assert_eq!(pool.held(), 3 * SMALL as u64);
        let large = pool.take(2 * SMALL);
        let ptr = large.as_ptr();
        pool.give(large);
        assert_eq!(pool.held(), 3 * SMALL as u64);
        let again = pool.take(2 * SMALL);
        assert_eq!(again.as_ptr(), ptr, "the large buffer was kept");
        assert_eq!(pool.held(), SMALL as u64, "and taken back out of the pool");
        let left = pool.take(SMALL);
        assert_eq!(left.as_ptr(), newest, "the newest small one stayed");
        assert_eq!(pool.held(), 0);
        // A buffer larger than the whole pool is not kept (nor does it empty the pool).
        pool.give(left);
        pool.give(pool.take(4 * SMALL));
        assert_eq!(pool.held(), SMALL as u64);
        drop(again);
    }

    #[test]
    fn filled_buffers_keep_what_they_held() {
        let pool = Pool::new(1 << 20);
        let fresh = pool.take_filled(100_000);
        assert!(fresh.len() == 100_000 && fresh.iter().all(|&b| b == 0));
        let mut v = fresh;
        v.fill(7);
        v.truncate(80_000);
        pool.give(v);
        // Longer than what the buffer held: the old bytes, then zeros.
        let w = pool.take_filled(90_000);
        assert_eq!(w.len(), 90_000);
        assert!(w[..80_000].iter().all(|&b| b == 7) && w[80_000..].iter().all(|&b| b == 0));
        pool.give(w);
        // `take` hands out an empty vector all the same.
        let e = pool.take(70_000);
        assert!(e.is_empty() && e.capacity() >= 90_000);
    }

    #[test]
    fn lent_bytes_are_held_until_taken_back() {
        // A size fresh buffers get exactly (a size class of its own).
        const LEN: usize = 98_304;
        assert_eq!(size_class(LEN), LEN);
        let pool = Pool::new(LEN as u64);
        let buffers: Vec<Vec<u8>> = (0..3).map(|_| pool.take(LEN)).collect();
        // Only the capacity: one buffer is kept, two are freed.
        for v in buffers {
            pool.give(v);
        }
        assert_eq!(pool.held(), LEN as u64);
        // With three buffers of the budget unreserved, two fit: the loan counts up to the
        // capacity.
        pool.update(|s| s.lent = 3 * LEN as u64);
        let buffers: Vec<Vec<u8>> = (0..3).map(|_| pool.take(LEN)).collect();
        assert_eq!(pool.held(), 0);
        for v in buffers {
            pool.give(v);
        }
        assert_eq!(pool.held(), 2 * LEN as u64);
        // A task reserves most of it: the pool gives back what no longer fits, at once.
        pool.update(|s| s.lent = LEN as u64 / 2);
        assert_eq!(pool.held(), LEN as u64);
        pool.update(|s| s.lent = 0);
        pool.update(|s| s.capacity = 0);
        assert_eq!(pool.held(), 0);
    }

    /// The `smaps` entry of the mapping that holds `addr`, if the kernel lists one.
    #[cfg(target_os = "linux")]
    fn smaps_entry(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut entry: Option<String> = None;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            let bounds = range.and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            // A mapping's header line starts with its address range; its fields do not.
            match bounds {
                Some((start, end)) => {
                    if entry.is_some() {
                        break;
                    }
                    if (start..end).contains(&addr) {
                        entry = Some(String::new());
                    }
                }
                _ => {
                    if let Some(e) = entry.as_mut() {
                        e.push_str(line);
                        e.push('\n');
                    }
                }
            }
        }
        entry
    }

    /// The value of `name` in an `smaps` entry.
    #[cfg(target_os = "linux")]
    fn field<'a>(entry: &'a str, name: &str) -> Option<&'a str> {
        entry.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == name).then(|| v.trim())
        })
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_fresh_buffers_ask_for_huge_pages() {
        // Only where the kernel grants huge pages on request.
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !setting.contains("[madvise]") && !setting.contains("[always]") {
            return;
        }
        let pool = Pool::new(0);
        // Twice the threshold: whatever its alignment, one whole huge page lies inside.
        for big in [
            pool.take_filled(2 * HUGE_PAGES_MIN),
            pool.take_zeroed(2 * HUGE_PAGES_MIN),
            pool.take(2 * HUGE_PAGES_MIN),
        ] {
            let inside = (big.as_ptr() as usize).next_multiple_of(HUGE_PAGES_MIN);
            let entry = smaps_entry(inside).expect("the buffer's mapping is listed");
            assert_eq!(field(&entry, "THPeligible"), Some("1"), "{entry}");
            assert!(big.iter().step_by(4096).all(|&b| b == 0));
        }
    }
}
