//! A pool of large byte buffers, so chunk-sized allocations are reused instead of mapped,
//! faulted in, zeroed and unmapped for every chunk (which costs more than decoding small
//! chunks). The pool holds at most its capacity; buffers beyond it are freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Buffers smaller than this are not pooled.
pub const MIN_POOLED: usize = 64 * 1024;

struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
    held: AtomicU64,
    capacity: AtomicU64,
}

static POOL: Pool = Pool {
    free: Mutex::new(Vec::new()),
    held: AtomicU64::new(0),
    capacity: AtomicU64::new(64 << 20),
};

/// Sets how many bytes the pool may hold (the memory budget sets aside this much).
pub fn set_capacity(bytes: u64) {
    POOL.capacity.store(bytes, Ordering::Relaxed);
    if POOL.held.load(Ordering::Relaxed) > bytes {
        if let Ok(mut free) = POOL.free.lock() {
            free.clear();
            POOL.held.store(0, Ordering::Relaxed);
        }
    }
}

/// Bytes currently held by the pool.
pub fn held() -> u64 {
    POOL.held.load(Ordering::Relaxed)
}

/// An empty vector with capacity for at least `len` bytes, reused when one fits (at most
/// twice as large).
pub fn take(len: usize) -> Vec<u8> {
    if len >= MIN_POOLED {
        if let Ok(mut free) = POOL.free.lock() {
            if let Some(i) = free
                .iter()
                .position(|v| v.capacity() >= len && v.capacity() <= len.saturating_mul(2))
            {
                let mut v = free.swap_remove(i);
                POOL.held.fetch_sub(v.capacity() as u64, Ordering::Relaxed);
                v.clear();
                return v;
            }
        }
    }
    Vec::with_capacity(len)
}

/// Returns a buffer to the pool (or frees it when the pool is full or it is small).
pub fn give(v: Vec<u8>) {
    let cap = v.capacity() as u64;
    if v.capacity() < MIN_POOLED {
        return;
    }
    if POOL.held.load(Ordering::Relaxed) + cap > POOL.capacity.load(Ordering::Relaxed) {
        return;
    }
    if let Ok(mut free) = POOL.free.lock() {
        POOL.held.fetch_add(cap, Ordering::Relaxed);
        free.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused() {
        let v = take(100_000);
        let ptr = v.as_ptr();
        give(v);
        let w = take(90_000);
        assert_eq!(w.as_ptr(), ptr);
        assert!(w.is_empty() && w.capacity() >= 90_000);
        give(w);
    }
}
