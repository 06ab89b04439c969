//! Decoded chunks kept across reads within a byte budget, the least recently used dropped
//! first: a training loop whose batches share chunks (windows near each other in a
//! chunk-aware order) decodes each of them once while it stays in the cache.
//!
//! The cache assumes the arrays it serves do not change while it is used (training data).
//! A child process forked after the cache was filled starts with an empty one of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::fork_safe::ForkSafe;

/// What identifies a decoded chunk: the array's URL, whether the index is in its inner
/// (sub-chunk) grid, and the index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    array: Arc<str>,
    inner: bool,
    idx: Vec<u64>,
}

impl CacheKey {
    /// The key of chunk `idx` (of the inner grid when `inner`) of the array at `array`.
    pub(crate) fn new(array: &Arc<str>, inner: bool, idx: &[u64]) -> Self {
        CacheKey {
            array: array.clone(),
            inner,
            idx: idx.to_vec(),
        }
    }
}

/// What the cache has done since it was made (or cleared).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the chunk.
    pub hits: u64,
    /// Lookups that did not (the chunk was decoded).
    pub misses: u64,
    /// Decoded bytes held now (buffer capacities).
    pub bytes: usize,
    /// Chunks held now.
    pub entries: usize,
}

/// One held chunk: its decoded bytes (a C-ordered prefix of the chunk, or all of it) and
/// when it was last used.
struct Held {
    data: Arc<Vec<u8>>,
    used: u64,
}

/// The entries, ordered by last use.
#[derive(Default)]
struct Lru {
    held: HashMap<CacheKey, Held>,
    by_use: BTreeMap<u64, CacheKey>,
    clock: u64,
    stats: CacheStats,
}

impl Lru {
    fn touch(&mut self, key: &CacheKey) {
        self.clock += 1;
        let now = self.clock;
        if let Some(h) = self.held.get_mut(key) {
            self.by_use.remove(&h.used);
            h.used = now;
            self.by_use.insert(now, key.clone());
        }
    }

    /// Holds `data` at `key`, dropping the least recently used entries to stay within
    /// `budget` bytes.
    fn insert(&mut self, key: CacheKey, data: Vec<u8>, budget: usize) {
        let size = data.capacity();
        self.remove(&key);
        while self.stats.bytes + size > budget {
            let Some(oldest) = self.by_use.first_key_value().map(|(_, k)| k.clone()) else {
                break;
            };
            self.remove(&oldest);
        }
        self.clock += 1;
        let used = self.clock;
        self.by_use.insert(used, key.clone());
        self.held.insert(
            key,
            Held {
                data: Arc::new(data),
                used,
            },
        );
        self.stats.bytes += size;
        self.stats.entries += 1;
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(h) = self.held.remove(key) {
            self.by_use.remove(&h.used);
            self.stats.bytes -= h.data.capacity();
            self.stats.entries -= 1;
            if let Some(v) = Arc::into_inner(h.data) {
                crate::array::pool::give(v);
            }
        }
    }
}

/// Decoded chunks within `budget` bytes, shared by every read given it (several arrays may
/// share one cache and its budget).
pub struct ChunkCache {
    budget: usize,
    lru: ForkSafe<Mutex<Lru>>,
}

impl ChunkCache {
    /// An empty cache that holds at most `budget` bytes of decoded chunks (0: holds none).
    pub fn new(budget: usize) -> Self {
        ChunkCache {
            budget,
            lru: ForkSafe::new(),
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Runs `f` on the entries (this process's: a forked child starts empty). `None` when
    /// the lock is poisoned (a panic while held): the cache is then unused, not the read
    /// failed.
    fn with<R>(&self, f: impl FnOnce(&mut Lru) -> R) -> Option<R> {
        let lru = self.lru.get_or_init(|| Mutex::new(Lru::default()));
        let mut guard = lru.lock().ok()?;
        Some(f(&mut guard))
    }

    /// The decoded chunk at `key` when it holds at least `need` bytes (from the chunk's
    /// start, C order), marked as just used.
    pub(crate) fn get(&self, key: &CacheKey, need: usize) -> Option<Arc<Vec<u8>>> {
        self.with(|lru| {
            let found = lru
                .held
                .get(key)
                .filter(|h| h.data.len() >= need)
                .map(|h| h.data.clone());
            match found {
                Some(data) => {
                    lru.stats.hits += 1;
                    lru.touch(key);
                    Some(data)
                }
                None => {
                    lru.stats.misses += 1;
                    None
                }
            }
        })
        .flatten()
    }

    /// Whether some of the chunk at `key` is held (a prefix too short for a read counts).
    pub(crate) fn holds(&self, key: &CacheKey) -> bool {
        self.with(|lru| lru.held.contains_key(key)).unwrap_or(false)
    }

    /// Keeps `data` (the decoded chunk at `key`, or a C-ordered prefix of it), dropping the
    /// least recently used chunks to stay within the budget. A chunk larger than the whole
    /// budget is not kept.
    pub(crate) fn put(&self, key: CacheKey, data: Vec<u8>) {
        let size = data.capacity();
        if size > self.budget {
            crate::array::pool::give(data);
            return;
        }
        self.with(|lru| lru.insert(key, data, self.budget));
    }

    /// Hits, misses and what is held now.
    pub fn stats(&self) -> CacheStats {
        self.with(|lru| lru.stats).unwrap_or_default()
    }

    /// Drops every held chunk and zeroes the counts.
    pub fn clear(&self) {
        self.with(|lru| {
            let keys: Vec<CacheKey> = lru.held.keys().cloned().collect();
            for k in keys {
                lru.remove(&k);
            }
            lru.stats = CacheStats::default();
        });
    }
}
