//! Stores: where Zarr keys live. One trait, one file per backend.
//!
//! Reads come in batches (many keys or byte ranges per call) and complete through a callback,
//! so the scheduler never blocks a compute thread on IO; `get_many` is the blocking form for
//! callers outside the hot path. Writes are atomic per key: a reader sees the old value, the
//! new value, or nothing, never a part.

pub mod fs;
pub mod memory;
pub mod object;
pub mod parts;
pub mod uring;

use std::sync::{mpsc, Arc};

use crate::error::{Error, Result};

/// One read: a whole key, or `len` bytes from `offset` (`len == None`: to the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// Key relative to the store root, `/`-separated.
    pub key: String,
    /// Byte range, or `None` for the whole value.
    pub range: Option<ByteRange>,
}

/// A byte range of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte (counted from the end when `from_end`).
    pub offset: u64,
    /// Number of bytes, or `None` for "to the end".
    pub len: Option<u64>,
    /// The range is the last `offset` bytes (`len` is ignored): read without knowing the
    /// value's size, as a shard index at the end is.
    pub from_end: bool,
}

impl ByteRange {
    /// `len` bytes from `offset` (`None`: to the end).
    pub fn new(offset: u64, len: Option<u64>) -> Self {
        ByteRange {
            offset,
            len,
            from_end: false,
        }
    }

    /// The last `n` bytes.
    pub fn last(n: u64) -> Self {
        ByteRange {
            offset: n,
            len: None,
            from_end: true,
        }
    }

    /// The absolute `(start, end)` of the range in a value of `size` bytes, or `None` when it
    /// does not fit.
    pub fn resolve(&self, size: u64) -> Option<(u64, u64)> {
        if self.from_end {
            return (self.offset <= size).then(|| (size - self.offset, size));
        }
        let end = self
            .len
            .map_or(Some(size), |l| self.offset.checked_add(l))?;
        (end <= size && self.offset <= end).then_some((self.offset, end))
    }

    /// The error for this range when it does not fit a value of `size` bytes.
    pub(crate) fn past_end(&self, size: u64) -> std::io::Error {
        let what = if self.from_end {
            format!("the last {} bytes", self.offset)
        } else {
            format!(
                "byte range {}..{}",
                self.offset,
                self.len.map_or(size, |l| self.offset.saturating_add(l))
            )
        };
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{what} lie past the end ({size} bytes)"),
        )
    }
}

impl ReadRequest {
    /// A read of the whole value at `key`.
    pub fn whole(key: impl Into<String>) -> Self {
        ReadRequest {
            key: key.into(),
            range: None,
        }
    }
}

/// A value read from a store: owned bytes, or a read-only mapping of a local file (no copy
/// out of the page cache). Files are replaced by rename, never rewritten in place, by the
/// engine; a file truncated by another program while mapped would fault the reader.
pub enum Value {
    /// Bytes in memory.
    Owned(Vec<u8>),
    /// A mapped file.
    Mapped(memmap2::Mmap),
}

impl Value {
    /// A read-only mapping of `len` bytes of `file` from byte `offset` (any offset: the
    /// mapping starts at the page holding it).
    pub(crate) fn map_file(
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<Value> {
        // SAFETY: the mapping is read-only and private to this value; the engine replaces
        // files by rename and never writes into a file it reads.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(file)?
        };
        Ok(Value::Mapped(map))
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Value::Owned(v) => v,
            Value::Mapped(m) => m,
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value({} bytes)", self.len())
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Value {
    /// Hands owned bytes back to the buffer pool.
    pub fn recycle(self) {
        if let Value::Owned(v) = self {
            crate::array::pool::give(v);
        }
    }

    /// The bytes as a vector (copying a mapping).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Value::Owned(v) => v,
            Value::Mapped(m) => m.to_vec(),
        }
    }
}

/// The result of a batch: one entry per request, `None` where the key does not exist.
pub type ReadBatch = Vec<Option<Value>>;

/// Called once when every read of a batch has finished (or the first has failed).
pub type ReadCallback = Box<dyn FnOnce(Result<ReadBatch>) + Send>;

/// Called once when a write has finished.
pub type WriteCallback = Box<dyn FnOnce(Result<()>) + Send>;

/// A key-value store holding Zarr metadata and chunks.
pub trait Store: Send + Sync {
    /// The URL or path the store was opened with, for messages.
    fn url(&self) -> &str;

    /// Starts reading every request of `reqs`; `done` receives the values in request order.
    /// Backends serve the batch concurrently on their own IO threads.
    fn read_batch(&self, reqs: Vec<ReadRequest>, done: ReadCallback);

    /// Starts writing `value` at `key` atomically; `done` receives the outcome.
    fn write_async(&self, key: String, value: Vec<u8>, done: WriteCallback);

    /// Removes `key` if present.
    fn erase(&self, key: &str) -> Result<()>;

    /// Removes every key under `prefix` (all keys for `""`).
    fn erase_prefix(&self, prefix: &str) -> Result<()>;

    /// Every key under `prefix`, sorted.
    fn list_prefix(&self, prefix: &str) -> Result<Vec<String>>;

    /// The size in bytes of the value at `key`, if present.
    fn size_of(&self, key: &str) -> Result<Option<u64>>;

    /// True when the backend reads byte ranges without fetching the whole value.
    fn supports_partial_reads(&self) -> bool;

    /// True when each request pays a network round trip, so readers should keep many
    /// requests in flight rather than a few batches ahead of the decoder.
    fn latency_bound(&self) -> bool {
        false
    }

    /// True when [`write_part_async`](Self::write_part_async) works here.
    fn supports_part_writes(&self) -> bool {
        false
    }

    /// Starts writing `bytes` at `offset` of the value being built in parts for `key` (parts
    /// may be written in any order, each byte by exactly one part). The last part issued
    /// carries the value's `total` length; once every byte is written the value appears under
    /// `key`, whole and atomically. `done` receives this part's outcome.
    fn write_part_async(
        &self,
        key: String,
        offset: u64,
        bytes: Vec<u8>,
        total: Option<u64>,
        done: WriteCallback,
    ) {
        let _ = (offset, bytes, total);
        done(Err(Error::store(
            self.url(),
            format!("cannot write {key} in parts: this store writes whole values only"),
        )))
    }

    /// Removes every value still being built in parts (after a failed or cancelled run):
    /// none of them appears.
    fn discard_parts(&self) {}

    /// Removes what a killed writer left of unfinished atomic writes (never visible as keys).
    /// Stores whose writes leave nothing behind need not override it.
    fn remove_abandoned_writes(&self) -> Result<()> {
        Ok(())
    }

    /// Reads a batch and waits for it (for metadata and tools, not the hot path); Ctrl-C
    /// ends the wait (see [`crate::cancel`]).
    fn get_many(&self, reqs: Vec<ReadRequest>) -> Result<ReadBatch> {
        let (tx, rx) = mpsc::channel();
        self.read_batch(
            reqs,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        crate::cancel::recv(&rx, || {
            Error::store(self.url(), "IO thread ended without an answer")
        })?
    }

    /// Reads one whole value and waits for it.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut v = self.get_many(vec![ReadRequest::whole(key)])?;
        Ok(v.pop().flatten().map(Value::into_vec))
    }

    /// Writes one value and waits for it.
    fn set(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        self.write_async(
            key.to_string(),
            value,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        crate::cancel::recv(&rx, || {
            Error::store(self.url(), "IO thread ended without an answer")
        })?
    }
}

/// True when the store at `url` writes values in parts ([`Store::write_part_async`]):
/// local paths and `memory://`, not object storage.
pub fn writes_in_parts(url: &str) -> bool {
    match url.split_once("://") {
        Some((scheme, _)) => scheme == "file" || scheme == "memory",
        None => true,
    }
}

/// Opens the store at `url`: a local path or `file://` URL, object storage (`s3://`, `gs://`,
/// `http(s)://`), or `memory://NAME` (in-process, for tests).
pub fn open_store(url: &str, io_threads: usize) -> Result<Arc<dyn Store>> {
    if let Some(name) = url.strip_prefix("memory://") {
        return Ok(memory::MemoryStore::named(name));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        if scheme != "file" {
            return Ok(Arc::new(object::ObjectBackend::open(url)?));
        }
    }
    let path = url.strip_prefix("file://").unwrap_or(url);
    Ok(Arc::new(fs::FsStore::new(path, io_threads)?))
}

#[cfg(any(test, feature = "testing"))]
pub mod conformance {
    //! Behaviour every store backend must show; each backend's tests call these.
    use super::*;

    /// Writes, reads (whole and ranged), lists, and erases keys.
    pub fn check_store(store: &dyn Store) {
        store.set("a/b/c", b"hello world".to_vec()).unwrap();
        store.set("a/d", b"xyz".to_vec()).unwrap();
        assert_eq!(
            store.get("a/b/c").unwrap().as_deref(),
            Some(&b"hello world"[..])
        );
        assert_eq!(store.get("missing").unwrap(), None);
        let r = store
            .get_many(vec![
                ReadRequest {
                    key: "a/b/c".into(),
                    range: Some(ByteRange::new(6, Some(5))),
                },
                ReadRequest {
                    key: "a/b/c".into(),
                    range: Some(ByteRange::new(2, None)),
                },
                ReadRequest {
                    key: "a/b/c".into(),
                    range: Some(ByteRange::last(4)),
                },
                ReadRequest::whole("nope"),
                ReadRequest::whole("a/d"),
            ])
            .unwrap();
        assert_eq!(r[0].as_deref(), Some(&b"world"[..]));
        assert_eq!(r[1].as_deref(), Some(&b"llo world"[..]));
        assert_eq!(r[2].as_deref(), Some(&b"orld"[..]));
        assert!(r[3].is_none());
        assert_eq!(r[4].as_deref(), Some(&b"xyz"[..]));
        assert_eq!(store.size_of("a/d").unwrap(), Some(3));
        assert_eq!(store.list_prefix("a/").unwrap(), vec!["a/b/c", "a/d"]);
        store.set("a/d", b"replaced".to_vec()).unwrap();
        assert_eq!(store.get("a/d").unwrap().as_deref(), Some(&b"replaced"[..]));
        store.erase("a/d").unwrap();
        assert_eq!(store.get("a/d").unwrap(), None);
        store.erase_prefix("").unwrap();
        assert!(store.list_prefix("").unwrap().is_empty());
    }

    fn write_part(store: &dyn Store, key: &str, offset: u64, bytes: &[u8], total: Option<u64>) {
        let (tx, rx) = mpsc::channel();
        store.write_part_async(
            key.to_string(),
            offset,
            bytes.to_vec(),
            total,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().unwrap().unwrap();
    }

    /// Values written in parts, out of order, appear whole once every byte is written and
    /// not before; a discarded value never appears.
    pub fn check_part_writes(store: &dyn Store) {
        assert!(store.supports_part_writes());
        write_part(store, "c/0", 6, b"world", Some(11));
        assert_eq!(store.get("c/0").unwrap(), None);
        assert!(store.list_prefix("").unwrap().is_empty());
        write_part(store, "c/0", 0, b"hello ", None);
        assert_eq!(
            store.get("c/0").unwrap().as_deref(),
            Some(&b"hello world"[..])
        );
        // A value built again over a longer stale attempt is cut to its length.
        write_part(store, "c/1", 0, b"a longer first attempt", None);
        store.discard_parts();
        write_part(store, "c/1", 0, b"short", Some(5));
        assert_eq!(store.get("c/1").unwrap().as_deref(), Some(&b"short"[..]));
        write_part(store, "c/2", 0, b"never finished", None);
        store.discard_parts();
        assert_eq!(store.list_prefix("").unwrap(), vec!["c/0", "c/1"]);
        store.erase_prefix("").unwrap();
    }
}
