//! Decoded chunks kept for a later stage that reads them again.
//!
//! An anomaly reads its input twice: for the time mean, then again to subtract it. When the
//! input fits a share of the budget, the first stage keeps each chunk it decodes (in the
//! buffer it decoded into, no copy) and the second reads the chunks in place: one fetch and
//! one decode per chunk instead of two. Each chunk kept holds its bytes of the budget until
//! the cache is dropped after the last stage that reads it; a chunk that does not fit the
//! cache's limit or the budget's free room at the time is not kept, and is read again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::memory::Reservation;
use super::task::TaskContext;
use crate::array::Buffer;

/// Decoded chunks of one array, keyed by their index in its read grid.
#[derive(Debug)]
pub struct ChunkCache {
    limit: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    chunks: HashMap<Vec<u64>, Arc<Buffer>>,
    bytes: u64,
    held: Vec<Reservation>,
}

impl ChunkCache {
    /// An empty cache that keeps at most `limit` decoded bytes.
    pub fn new(limit: u64) -> Self {
        ChunkCache {
            limit,
            inner: Mutex::default(),
        }
    }

    /// The decoded chunk `idx`, when kept.
    pub fn get(&self, idx: &[u64]) -> Option<Arc<Buffer>> {
        self.inner.lock().ok()?.chunks.get(idx).cloned()
    }

    /// Keeps chunk `idx`'s decoded `values` when they fit the limit and the budget of `ctx`'s
    /// task has room for them now (never waits). Returns whether they were kept.
    pub fn offer(&self, idx: &[u64], values: &Arc<Buffer>, ctx: &TaskContext) -> bool {
        let bytes = values.bytes().len() as u64;
        let Ok(mut inner) = self.inner.lock() else {
            return false;
        };
        if inner.chunks.contains_key(idx) || inner.bytes + bytes > self.limit {
            return false;
        }
        let Some(reservation) = ctx.try_reserve(bytes) else {
            return false;
        };
        inner.held.push(reservation);
        inner.bytes += bytes;
        inner.chunks.insert(idx.to_vec(), values.clone());
        true
    }

    /// Decoded bytes kept.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().map(|i| i.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::DType;
    use crate::exec::memory::Budget;
    use crate::exec::progress::Progress;
    use std::sync::atomic::AtomicBool;

    fn values(n: usize) -> Arc<Buffer> {
        Arc::new(Buffer::zeros(DType::F32, n))
    }

    #[test]
    fn chunks_are_kept_within_the_limit_and_the_budget() {
        let budget = Budget::new(1000);
        let stop = AtomicBool::new(false);
        let progress = Progress::new(false);
        let mut task = budget.reserve(600, "task", &stop).unwrap();
        let ctx = TaskContext::new(&progress, &mut task);
        let cache = ChunkCache::new(250);
        // 100 bytes each: two fit the limit, the third does not.
        assert!(cache.offer(&[0], &values(25), &ctx));
        assert!(!cache.offer(&[0], &values(25), &ctx), "kept twice");
        assert!(cache.offer(&[1], &values(25), &ctx));
        assert!(!cache.offer(&[2], &values(25), &ctx));
        assert_eq!(cache.bytes(), 200);
        assert_eq!(budget.used(), 800);
        assert!(cache.get(&[1]).is_some() && cache.get(&[2]).is_none());
        // The budget's free room bounds it too: 200 bytes left, not 300.
        let big = ChunkCache::new(10_000);
        assert!(!big.offer(&[0], &values(75), &ctx));
        assert!(big.offer(&[0], &values(50), &ctx));
        assert_eq!(budget.used(), 1000);
        // Dropping a cache hands its bytes back.
        drop(cache);
        drop(big);
        drop(task);
        assert_eq!(budget.used(), 0);
    }
}
