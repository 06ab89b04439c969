//! Local filesystem store: positional reads (pread) on a pool of IO threads, atomic writes
//! (temporary name in the same directory, then rename).

use std::fs::{self, File};
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use super::{ByteRange, ReadBatch, ReadCallback, ReadRequest, Store, Value, WriteCallback};
use crate::error::{Error, ErrorKind, Result};
use crate::fork_safe::ForkSafe;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of threads that run blocking IO jobs, apart from the compute pool.
pub struct IoPool {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl IoPool {
    /// Starts `threads` IO threads.
    pub fn new(threads: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                thread::Builder::new()
                    .name(format!("chunkfuse-io-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock() {
                            Ok(guard) => guard.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    })
            })
            .filter_map(|h| h.ok())
            .collect();
        IoPool {
            sender: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
        }
    }

    /// Queues `job`; runs it inline if the pool has shut down.
    pub fn spawn(&self, job: Job) {
        let sent = match self.sender.lock() {
            Ok(guard) => match guard.as_ref() {
                Some(tx) => tx.send(job).map_err(|e| e.0),
                None => Err(job),
            },
            Err(_) => Err(job),
        };
        if let Err(job) = sent {
            job();
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        if let Ok(mut s) = self.sender.lock() {
            s.take();
        }
        if let Ok(mut w) = self.workers.lock() {
            let me = thread::current().id();
            for h in w.drain(..) {
                if h.thread().id() != me {
                    let _ = h.join();
                }
            }
        }
    }
}

/// A store rooted at a local directory.
pub struct FsStore {
    root: PathBuf,
    url: String,
    /// The IO threads of this process (a forked child starts its own).
    pool: ForkSafe<IoPool>,
    io_threads: usize,
    /// Reads go through io_uring when set (see `uring::io_mode`): the mode, and whether
    /// reads are O_DIRECT; else the pool.
    uring: Option<(super::uring::IoMode, bool)>,
    /// In `auto` mode, large whole values are mapped, not read (zero copies on warm data).
    map_large: bool,
    /// Values being written in parts.
    parts: Arc<super::parts::PartTracker>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Values (whole files or ranges) at least this large are mapped rather than copied out of
/// the page cache.
const MAP_THRESHOLD: usize = super::uring::MAP_THRESHOLD as usize;

impl FsStore {
    /// A store rooted at `root` (which need not exist yet) with `io_threads` IO threads.
    pub fn new(root: impl AsRef<Path>, io_threads: usize) -> Result<Self> {
        Self::with_io(root, io_threads, super::uring::io_mode(), None)
    }

    /// A store reading per `mode` (see [`super::uring::IoMode`]); `direct` asks for O_DIRECT
    /// io_uring reads (`None`: as `$CHUNKFUSE_IO_DIRECT` says).
    pub fn with_io(
        root: impl AsRef<Path>,
        io_threads: usize,
        mode: super::uring::IoMode,
        direct: Option<bool>,
    ) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let url = root.display().to_string();
        let direct = direct.unwrap_or_else(super::uring::direct_wanted);
        let uring = super::uring::reader_for(mode, Some(direct))
            .map_err(|e| e.with_store(&url))?
            .map(|_| (mode, direct));
        Ok(FsStore {
            root,
            url,
            pool: ForkSafe::new(),
            io_threads,
            uring,
            map_large: mode == super::uring::IoMode::Auto,
            parts: Arc::default(),
        })
    }

    /// This process's IO threads.
    fn io_pool(&self) -> Arc<IoPool> {
        self.pool.get_or_init(|| IoPool::new(self.io_threads))
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn read_one(path: &Path, range: Option<ByteRange>) -> std::io::Result<Option<Value>> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if file.metadata()?.is_dir() {
            return Ok(None);
        }
        match range {
            None => {
                let size = file.metadata()?.len() as usize;
                if size >= MAP_THRESHOLD {
                    return Value::map_file(&file, 0, size).map(Some);
                }
                let mut v = crate::array::pool::take(size);
                (&file).read_to_end(&mut v)?;
                Ok(Some(Value::Owned(v)))
            }
            Some(r) => {
                let size = file.metadata()?.len();
                let (start, end) = r.resolve(size).ok_or_else(|| r.past_end(size))?;
                let len = (end - start) as usize;
                if len >= MAP_THRESHOLD {
                    // An inner chunk of a shard, or a run of them: mapped like a whole file.
                    return Value::map_file(&file, start, len).map(Some);
                }
                // Every byte is read over: a pooled buffer needs no zeroing.
                let mut v = crate::array::pool::take_filled(len);
                file.read_exact_at(&mut v, start)?;
                Ok(Some(Value::Owned(v)))
            }
        }
    }

    fn write_atomic(path: &Path, value: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".{name}.partial-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(value)?;
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The temporary file a value written in parts is built in, beside its key.
    fn parts_path(path: &Path) -> PathBuf {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        dir.join(format!(".{name}.partial-{}-parts", std::process::id()))
    }

    /// Writes `bytes` at `offset` of the value being built for `path`.
    fn write_part(path: &Path, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = Self::parts_path(path);
        if let Some(dir) = tmp.parent() {
            fs::create_dir_all(dir)?;
        }
        // Not truncated: other parts may be in it already. A stale file of an earlier,
        // abandoned attempt is cut to length when the value is published.
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&tmp)?;
        f.write_all_at(bytes, offset)
    }

    /// Publishes the value built for `path`, `total` bytes long.
    fn publish_parts(path: &Path, total: u64) -> std::io::Result<()> {
        let tmp = Self::parts_path(path);
        let f = fs::OpenOptions::new().write(true).open(&tmp)?;
        f.set_len(total)?;
        drop(f);
        fs::rename(&tmp, path)
    }

    fn list_into(&self, dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&self.url, "", e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&self.url, prefix, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains(".partial-") {
                continue;
            }
            let key = format!("{prefix}{name}");
            if entry.path().is_dir() {
                self.list_into(&entry.path(), &format!("{key}/"), out)?;
            } else {
                out.push(key);
            }
        }
        Ok(())
    }
}

fn io_error(url: &str, key: &str, e: std::io::Error) -> Error {
    let kind = if e.kind() == IoKind::UnexpectedEof {
        ErrorKind::Corrupt
    } else {
        ErrorKind::Store
    };
    let mut err = Error::new(kind, e.to_string()).with_store(url);
    if !key.is_empty() {
        err = err.with_chunk_key(key);
    }
    err
}

struct BatchState {
    results: Mutex<Vec<Option<Value>>>,
    remaining: AtomicUsize,
    failed: Mutex<Option<Error>>,
    done: Mutex<Option<ReadCallback>>,
}

impl BatchState {
    fn finish_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let cb = self.done.lock().ok().and_then(|mut d| d.take());
        let Some(cb) = cb else { return };
        let failed = self.failed.lock().ok().and_then(|mut f| f.take());
        match failed {
            Some(e) => cb(Err(e)),
            None => {
                let results = self
                    .results
                    .lock()
                    .map(|mut r| std::mem::take(&mut *r))
                    .unwrap_or_default();
                cb(Ok(results))
            }
        }
    }
}

impl FsStore {
    /// Reads `reqs` on this process's IO threads.
    fn read_on_pool(&self, reqs: Vec<ReadRequest>, done: ReadCallback) {
        let n = reqs.len();
        let state = Arc::new(BatchState {
            results: Mutex::new((0..n).map(|_| None).collect()),
            remaining: AtomicUsize::new(n),
            failed: Mutex::new(None),
            done: Mutex::new(Some(done)),
        });
        let pool = self.io_pool();
        for (i, req) in reqs.into_iter().enumerate() {
            let state = state.clone();
            let path = self.path_of(&req.key);
            let url = self.url.clone();
            pool.spawn(Box::new(move || {
                match FsStore::read_one(&path, req.range) {
                    Ok(v) => {
                        if let Ok(mut r) = state.results.lock() {
                            r[i] = v;
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = state.failed.lock() {
                            f.get_or_insert_with(|| io_error(&url, &req.key, e));
                        }
                    }
                }
                state.finish_one();
            }));
        }
    }
}

impl Store for FsStore {
    fn url(&self) -> &str {
        &self.url
    }

    fn read_batch(&self, reqs: Vec<ReadRequest>, done: ReadCallback) {
        if reqs.is_empty() {
            done(Ok(ReadBatch::new()));
            return;
        }
        if let Some((mode, direct)) = self.uring {
            // This process's ring (a forked child makes its own).
            let uring = match super::uring::reader_for(mode, Some(direct)) {
                Ok(Some(uring)) => uring,
                Ok(None) => return self.read_on_pool(reqs, done),
                Err(e) => return done(Err(e.with_store(&self.url))),
            };
            let reads = reqs
                .into_iter()
                .map(|r| {
                    let path = self.path_of(&r.key);
                    (r.key, path, r.range)
                })
                .collect();
            let url = self.url.clone();
            let done: ReadCallback = Box::new(move |r| done(r.map_err(|e| e.with_store(url))));
            uring.read(reads, self.map_large, done);
            return;
        }
        self.read_on_pool(reqs, done);
    }

    fn write_async(&self, key: String, value: Vec<u8>, done: WriteCallback) {
        let path = self.path_of(&key);
        let url = self.url.clone();
        self.io_pool().spawn(Box::new(move || {
            done(FsStore::write_atomic(&path, &value).map_err(|e| io_error(&url, &key, e)))
        }));
    }

    fn erase(&self, key: &str) -> Result<()> {
        match fs::remove_file(self.path_of(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&self.url, key, e)),
        }
    }

    fn erase_prefix(&self, prefix: &str) -> Result<()> {
        if prefix.is_empty() {
            let entries = match fs::read_dir(&self.root) {
                Ok(e) => e,
                Err(e) if e.kind() == IoKind::NotFound => return Ok(()),
                Err(e) => return Err(io_error(&self.url, "", e)),
            };
            for entry in entries {
                let path = entry.map_err(|e| io_error(&self.url, "", e))?.path();
                let r = if path.is_dir() {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                r.map_err(|e| io_error(&self.url, &path.display().to_string(), e))?;
            }
            return Ok(());
        }
        let path = self.path_of(prefix.trim_end_matches('/'));
        let r = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&self.url, prefix, e)),
        }
    }

    fn list_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.list_into(&self.root, "", &mut out)?;
        out.retain(|k| k.starts_with(prefix));
        out.sort();
        Ok(out)
    }

    fn size_of(&self, key: &str) -> Result<Option<u64>> {
        match fs::metadata(self.path_of(key)) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == IoKind::NotFound => Ok(None),
            Err(e) => Err(io_error(&self.url, key, e)),
        }
    }

    fn supports_partial_reads(&self) -> bool {
        true
    }

    fn supports_part_writes(&self) -> bool {
        true
    }

    fn write_part_async(
        &self,
        key: String,
        offset: u64,
        bytes: Vec<u8>,
        total: Option<u64>,
        done: WriteCallback,
    ) {
        let path = self.path_of(&key);
        let url = self.url.clone();
        let parts = self.parts.clone();
        self.io_pool().spawn(Box::new(move || {
            let result = FsStore::write_part(&path, offset, &bytes).and_then(|()| {
                match parts.written(&key, bytes.len() as u64, total) {
                    super::parts::PartOutcome::Complete { total } => {
                        FsStore::publish_parts(&path, total)
                    }
                    super::parts::PartOutcome::Pending => Ok(()),
                }
            });
            done(result.map_err(|e| io_error(&url, &key, e)))
        }));
    }

    fn discard_parts(&self) {
        for key in self.parts.abandon_all() {
            let _ = fs::remove_file(Self::parts_path(&self.path_of(&key)));
        }
    }

    fn remove_abandoned_writes(&self) -> Result<()> {
        // Temporaries of this process may belong to writes in flight; others are abandoned.
        let ours = format!(".partial-{}-", std::process::id());
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == IoKind::NotFound => continue,
                Err(e) => return Err(io_error(&self.url, "", e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&self.url, "", e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if name.contains(".partial-") && !name.contains(&ours) {
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == IoKind::NotFound => {}
                        Err(e) => return Err(io_error(&self.url, &name, e)),
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::uring::IoMode;

    /// A store per back end: the pread pool, and io_uring buffered and O_DIRECT where this
    /// machine allows io_uring (the probe's refusal is itself checked where it does not).
    fn stores(dir: &Path) -> Vec<(String, FsStore)> {
        let mut out = vec![
            (
                "pread".to_string(),
                FsStore::with_io(dir, 3, IoMode::Pread, None).unwrap(),
            ),
            (
                "auto".to_string(),
                FsStore::with_io(dir, 3, IoMode::Auto, Some(false)).unwrap(),
            ),
        ];
        for direct in [false, true] {
            match FsStore::with_io(dir, 3, IoMode::Uring, Some(direct)) {
                Ok(s) => out.push((format!("uring direct={direct}"), s)),
                Err(e) => {
                    assert!(e.to_string().contains("io_uring"), "{e}");
                    let auto = FsStore::with_io(dir, 3, IoMode::Auto, Some(direct)).unwrap();
                    assert!(auto.uring.is_none());
                }
            }
        }
        out
    }

    #[test]
    fn fs_store_conforms_with_every_back_end() {
        let dir = tempfile::tempdir().unwrap();
        for (name, store) in stores(dir.path()) {
            eprintln!("{name}");
            crate::store::conformance::check_store(&store);
            crate::store::conformance::check_part_writes(&store);
        }
        // Nothing of the parts is left behind.
        let mut left = Vec::new();
        let mut dirs = vec![dir.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else {
                    left.push(p);
                }
            }
        }
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn missing_range_past_end_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        for (name, store) in stores(dir.path()) {
            store.set("k", vec![1, 2, 3]).unwrap();
            let err = store
                .get_many(vec![ReadRequest {
                    key: "k".into(),
                    range: Some(ByteRange::new(2, Some(5))),
                }])
                .unwrap_err();
            assert_eq!(err.kind, ErrorKind::Corrupt, "{name}");
            assert_eq!(err.context.chunk_key.as_deref(), Some("k"), "{name}");
        }
    }

    #[test]
    fn back_ends_return_identical_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let backends = stores(dir.path());
        let writer = &backends[0].1;
        // Files of awkward sizes (around the 4 KiB alignment and the mapping threshold).
        let sizes = [
            0usize,
            1,
            4095,
            4096,
            4097,
            100_000,
            MAP_THRESHOLD + 3,
            3 << 20,
        ];
        let mut reqs = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            writer.set(&format!("f/{i}"), bytes).unwrap();
            reqs.push(ReadRequest::whole(format!("f/{i}")));
            if n > 10 {
                for (offset, len) in [(1u64, Some(7u64)), (n as u64 / 3, None), (4093, Some(9))] {
                    if offset + len.unwrap_or(0) <= n as u64 {
                        reqs.push(ReadRequest {
                            key: format!("f/{i}"),
                            range: Some(ByteRange::new(offset, len)),
                        });
                    }
                }
                reqs.push(ReadRequest {
                    key: format!("f/{i}"),
                    range: Some(ByteRange::last(n.min(5000) as u64)),
                });
            }
        }
        reqs.push(ReadRequest::whole("f/missing"));
        let want: Vec<Option<Vec<u8>>> = writer
            .get_many(reqs.clone())
            .unwrap()
            .into_iter()
            .map(|v| v.map(Value::into_vec))
            .collect();
        assert!(want.last().unwrap().is_none());
        for (name, store) in &backends[1..] {
            let got: Vec<Option<Vec<u8>>> = store
                .get_many(reqs.clone())
                .unwrap()
                .into_iter()
                .map(|v| v.map(Value::into_vec))
                .collect();
            assert!(got == want, "{name} differs from pread");
        }
    }
}
