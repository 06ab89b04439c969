//! io_uring reads for the local filesystem store: every read of a batch (and of any batches
//! queued behind it) goes into one submission queue, so one thread keeps many positional
//! reads in flight; short reads are resubmitted for the rest. With O_DIRECT, buffers,
//! offsets and lengths are aligned to 4 KiB and the wanted bytes are sliced out.
//!
//! Whether io_uring may be used is probed once per process by creating a ring (never by
//! kernel version: container seccomp profiles refuse it on kernels that have it); when it is
//! refused, the store reads with its pread pool and the reason is logged once.

use std::fs::File;
use std::io::ErrorKind as IoKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use io_uring::{opcode, types, IoUring};

use super::{ByteRange, ReadCallback, Value};
use crate::error::{Error, ErrorKind, Result};
use crate::fork_safe::ForkSafe;

/// Submission queue entries per ring: reads kept in flight at once.
const QUEUE_DEPTH: u32 = 64;
/// O_DIRECT alignment (logical block size upper bound on common devices).
const ALIGN: u64 = 4096;
/// Largest single read the kernel takes (`len` is 32 bits); longer reads go in parts.
const MAX_READ: u64 = 1 << 30;

/// How the local filesystem store reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// io_uring when the probe succeeds, else the pread pool.
    Auto,
    /// io_uring, or an error when it is refused.
    Uring,
    /// The pread pool (and read-only mappings of large whole values).
    Pread,
}

impl IoMode {
    /// Parses `auto`, `uring` (or `io_uring`) and `pread`.
    pub fn parse(text: &str) -> Result<IoMode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(IoMode::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(IoMode::Uring),
            "pread" => Ok(IoMode::Pread),
            other => Err(Error::plan(
                "io",
                format!("unknown IO back end \"{other}\": use auto, uring or pread"),
            )),
        }
    }

    /// The name `parse` reads back.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Auto => "auto",
            IoMode::Uring => "uring",
            IoMode::Pread => "pread",
        }
    }
}

static MODE: Mutex<Option<IoMode>> = Mutex::new(None);

/// Sets how local stores opened from now on read (process-wide).
pub fn set_io_mode(mode: IoMode) {
    if let Ok(mut m) = MODE.lock() {
        *m = Some(mode);
    }
}

/// How local stores read: as last set, else `$CHUNKFUSE_IO` (`auto` when unset or invalid).
pub fn io_mode() -> IoMode {
    let set = MODE.lock().ok().and_then(|m| *m);
    set.unwrap_or_else(|| {
        std::env::var("CHUNKFUSE_IO")
            .ok()
            .and_then(|v| IoMode::parse(&v).ok())
            .unwrap_or(IoMode::Auto)
    })
}

/// True when `$CHUNKFUSE_IO_DIRECT` asks for O_DIRECT reads (bypassing the page cache: for
/// one-pass reads of data larger than memory; it slows repeated reads).
pub(crate) fn direct_wanted() -> bool {
    matches!(
        std::env::var("CHUNKFUSE_IO_DIRECT").ok().as_deref(),
        Some("1" | "true" | "yes")
    )
}

type Probe = std::result::Result<Arc<UringReader>, String>;

/// The outcome of the process's io_uring probe: the shared reader (one for buffered reads,
/// one for O_DIRECT reads), or why not. A forked child probes again and gets rings and
/// threads of its own (the parent's ring thread is not there).
fn probed(direct: bool) -> Arc<Probe> {
    static BUFFERED: ForkSafe<Probe> = ForkSafe::new();
    static DIRECT: ForkSafe<Probe> = ForkSafe::new();
    let cell = if direct { &DIRECT } else { &BUFFERED };
    cell.get_or_init(|| UringReader::start(|| IoUring::new(QUEUE_DEPTH), direct))
}

/// The io_uring reader for local stores, per `mode` (O_DIRECT reads when `direct`, else as
/// `$CHUNKFUSE_IO_DIRECT` says): `Ok(None)` means use the pread pool.
pub fn reader_for(mode: IoMode, direct: Option<bool>) -> Result<Option<Arc<UringReader>>> {
    let direct = direct.unwrap_or_else(direct_wanted);
    let probed = || probed(direct);
    match mode {
        IoMode::Pread => Ok(None),
        IoMode::Uring => match probed().as_ref() {
            Ok(r) => Ok(Some(r.clone())),
            Err(why) => Err(Error::new(
                ErrorKind::Unsupported,
                format!("io_uring is not available here ({why}); use io=\"auto\" or \"pread\""),
            )),
        },
        IoMode::Auto => match probed().as_ref() {
            Ok(r) => Ok(Some(r.clone())),
            Err(why) => {
                static LOGGED: OnceLock<()> = OnceLock::new();
                LOGGED.get_or_init(|| {
                    eprintln!(
                        "chunkfuse: io_uring unavailable ({why}); reading with the pread pool"
                    );
                });
                Ok(None)
            }
        },
    }
}

/// One read of a job.
struct UringRead {
    key: String,
    path: PathBuf,
    range: Option<ByteRange>,
}

/// A batch to read and where its answer goes.
struct UringJob {
    reads: Vec<UringRead>,
    /// Map values (whole files or ranges) of at least `MAP_THRESHOLD` bytes instead of
    /// reading them.
    map_large: bool,
    done: ReadCallback,
}

/// Values (whole files or ranges) at least this large may be mapped rather than read (see
/// `UringReader::read`).
pub const MAP_THRESHOLD: u64 = 256 * 1024;

/// Reads batches on one thread that owns the ring.
pub struct UringReader {
    jobs: Mutex<mpsc::Sender<UringJob>>,
    direct: bool,
}

impl UringReader {
    /// Creates a ring with `make` (the probe) and starts its thread; the error text says why
    /// io_uring cannot be used.
    fn start(make: impl FnOnce() -> std::io::Result<IoUring>, direct: bool) -> Probe {
        let ring = make().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                format!(
                    "io_uring_setup refused: {e} (a seccomp profile or kernel.io_uring_disabled)"
                )
            }
            Some(libc::ENOSYS) => format!("io_uring_setup missing: {e}"),
            _ => format!("io_uring_setup failed: {e}"),
        })?;
        let (tx, rx) = mpsc::channel::<UringJob>();
        std::thread::Builder::new()
            .name("chunkfuse-uring".into())
            .spawn(move || serve(ring, rx, direct))
            .map_err(|e| format!("cannot start the io_uring thread: {e}"))?;
        Ok(Arc::new(UringReader {
            jobs: Mutex::new(tx),
            direct,
        }))
    }

    /// Reads every `(key, path, range)` and calls `done` with the values in order (`None`
    /// for missing files); errors name the key. With `map_large` (and buffered reads), values
    /// (whole files or ranges) of at least [`MAP_THRESHOLD`] bytes are mapped read-only instead: the page
    /// cache is then used in place, which beats copying it out on warm data.
    pub fn read(
        &self,
        reads: Vec<(String, PathBuf, Option<ByteRange>)>,
        map_large: bool,
        done: ReadCallback,
    ) {
        let job = UringJob {
            map_large: map_large && !self.direct,
            reads: reads
                .into_iter()
                .map(|(key, path, range)| UringRead { key, path, range })
                .collect(),
            done,
        };
        let sent = match self.jobs.lock() {
            Ok(tx) => tx.send(job).map_err(|e| e.0),
            Err(_) => Err(job),
        };
        if let Err(job) = sent {
            (job.done)(Err(Error::store(
                "io_uring",
                "the io_uring thread has stopped",
            )));
        }
    }

    /// True when reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }
}

/// A buffer being filled: the bytes wanted start at `skip` and are `want` long.
struct Pending {
    job: usize,
    slot: usize,
    file: File,
    buf: Vec<u8>,
    /// Offset of `buf[0]` in the file.
    file_offset: u64,
    /// Bytes of `buf` already read.
    filled: usize,
    /// Bytes to read into `buf` in all.
    target: usize,
    skip: usize,
    want: usize,
    /// The file's size, for end-of-file checks.
    size: u64,
    /// Reads go to the `ALIGN`-aligned part of `buf` (O_DIRECT).
    aligned: bool,
}

/// The ring thread: takes every job queued, reads them together, answers each.
fn serve(mut ring: IoUring, rx: mpsc::Receiver<UringJob>, direct: bool) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(more) = rx.try_recv() {
            jobs.push(more);
        }
        let mut results: Vec<Vec<Option<Value>>> = jobs
            .iter()
            .map(|j| (0..j.reads.len()).map(|_| None).collect())
            .collect();
        let mut errors: Vec<Option<Error>> = jobs.iter().map(|_| None).collect();
        let mut pending = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            for (s, read) in job.reads.iter().enumerate() {
                match prepare(j, s, read, direct, job.map_large) {
                    Ok(Prepared::Empty) => results[j][s] = Some(Value::Owned(Vec::new())),
                    Ok(Prepared::Map(file, offset, len)) => {
                        match Value::map_file(&file, offset, len) {
                            Ok(map) => results[j][s] = Some(map),
                            Err(e) => {
                                errors[j].get_or_insert(io_error(read, e));
                            }
                        }
                    }
                    Ok(Prepared::Read(p)) => pending.push(p),
                    Ok(Prepared::Missing) => {}
                    Err(e) => {
                        errors[j].get_or_insert(io_error(read, e));
                    }
                }
            }
        }
        pending.retain(|p| errors[p.job].is_none());
        if let Err((job, e)) = run_reads(&mut ring, &mut pending) {
            let read = &jobs[pending[job].job].reads[pending[job].slot];
            errors[pending[job].job].get_or_insert(io_error(read, e));
        }
        for p in pending {
            let (job, slot) = (p.job, p.slot);
            if errors[job].is_none() {
                results[job][slot] = Some(finish(p));
            }
        }
        for ((job, result), error) in jobs.into_iter().zip(results).zip(errors) {
            match error {
                Some(e) => (job.done)(Err(e)),
                None => (job.done)(Ok(result)),
            }
        }
    }
}

fn io_error(read: &UringRead, e: std::io::Error) -> Error {
    let kind = if e.kind() == IoKind::UnexpectedEof {
        ErrorKind::Corrupt
    } else {
        ErrorKind::Store
    };
    Error::new(kind, e.to_string()).with_chunk_key(&read.key)
}

/// What one read needs once its file is open.
enum Prepared {
    /// The file does not exist.
    Missing,
    /// Nothing to read (an empty file or range).
    Empty,
    /// A file's bytes to map rather than read: offset and length.
    Map(File, u64, usize),
    /// Bytes to read into a buffer.
    Read(Pending),
}

/// Opens the file of `read` and decides how to serve it: mapped (values of at least
/// `MAP_THRESHOLD` bytes when `map_large`), or read into a pooled buffer sized for it.
fn prepare(
    job: usize,
    slot: usize,
    read: &UringRead,
    direct: bool,
    map_large: bool,
) -> std::io::Result<Prepared> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = match opts.open(&read.path) {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(Prepared::Missing),
        // Filesystems without O_DIRECT (tmpfs) refuse the flag: read through the cache.
        Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
            return prepare(job, slot, read, false, map_large)
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Ok(Prepared::Missing);
    }
    let size = meta.len();
    let (offset, end) = match read.range {
        None => (0, size),
        Some(r) => r.resolve(size).ok_or_else(|| r.past_end(size))?,
    };
    let want = (end - offset) as usize;
    if want == 0 {
        return Ok(Prepared::Empty);
    }
    if map_large && want as u64 >= MAP_THRESHOLD {
        return Ok(Prepared::Map(file, offset, want));
    }
    let (file_offset, target, skip, buf) = if direct {
        let start = offset / ALIGN * ALIGN;
        let stop = end.div_ceil(ALIGN) * ALIGN;
        let target = (stop - start) as usize;
        (
            start,
            target,
            (offset - start) as usize,
            aligned_buffer(target),
        )
    } else {
        (offset, want, 0, vec_with_len(want))
    };
    Ok(Prepared::Read(Pending {
        job,
        slot,
        file,
        buf,
        file_offset,
        filled: 0,
        target,
        skip,
        want,
        size,
        aligned: direct,
    }))
}

/// An empty buffer with room for `len` bytes: the kernel reads into its spare capacity
/// (nothing is zeroed first), and its length is set once the bytes have arrived.
fn vec_with_len(len: usize) -> Vec<u8> {
    crate::array::pool::take(len)
}

/// An empty buffer with room for `len` bytes from an `ALIGN`-aligned start (see
/// `aligned_start`), pooled like the others.
fn aligned_buffer(len: usize) -> Vec<u8> {
    crate::array::pool::take(len + ALIGN as usize)
}

/// Where the aligned part of `buf` starts.
fn aligned_start(buf: &[u8]) -> usize {
    let addr = buf.as_ptr() as usize;
    (ALIGN as usize - addr % ALIGN as usize) % ALIGN as usize
}

/// Where reads into `p`'s buffer start.
fn read_base(p: &Pending) -> usize {
    if p.aligned {
        aligned_start(&p.buf)
    } else {
        0
    }
}

/// The value read: the wanted bytes of the buffer.
fn finish(mut p: Pending) -> Value {
    let base = read_base(&p);
    // SAFETY: the kernel wrote `filled` bytes from `base` (every read completed), and the
    // wanted bytes `skip..skip + want` lie inside them; capacity covers `base + filled`.
    unsafe { p.buf.set_len(base + p.filled) };
    // Wanted bytes that do not start the buffer move to its front (not into a fresh buffer,
    // which would fault in new memory for every direct read).
    let start = base + p.skip;
    if start > 0 {
        p.buf.copy_within(start..start + p.want, 0);
    }
    p.buf.truncate(p.want);
    Value::Owned(p.buf)
}

/// Submits every pending read, QUEUE_DEPTH at a time, resubmitting short reads until each
/// buffer is full (or the file ends where a direct read's aligned tail lies past it).
fn run_reads(
    ring: &mut IoUring,
    pending: &mut [Pending],
) -> std::result::Result<(), (usize, std::io::Error)> {
    let mut in_flight = 0usize;
    let mut queue: std::collections::VecDeque<usize> = (0..pending.len()).collect();
    while !queue.is_empty() || in_flight > 0 {
        // Fill the submission queue.
        while in_flight < QUEUE_DEPTH as usize {
            let Some(i) = queue.pop_front() else { break };
            let p = &mut pending[i];
            let base = read_base(p);
            let len = ((p.target - p.filled) as u64).min(MAX_READ) as u32;
            let entry = opcode::Read::new(
                types::Fd(p.file.as_raw_fd()),
                // SAFETY (pointer): inside `buf`'s capacity (base + filled + len <= base +
                // target), which stays in place until its completion is reaped below.
                unsafe { p.buf.as_mut_ptr().add(base + p.filled) },
                len,
            )
            .offset(p.file_offset + p.filled as u64)
            .build()
            .user_data(i as u64);
            // SAFETY: the buffer and file outlive the read (they are owned by `pending`, which
            // this function does not return before every submitted read completes).
            if unsafe { ring.submission().push(&entry) }.is_err() {
                queue.push_front(i);
                break;
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        submit_and_wait(ring, pending).map_err(|e| (0, e))?;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        let mut failure = None;
        for (i, res) in done {
            in_flight -= 1;
            let p = &mut pending[i];
            if res < 0 {
                failure.get_or_insert((i, std::io::Error::from_raw_os_error(-res)));
                continue;
            }
            if res == 0 {
                // End of file: a direct read's aligned tail may lie past it.
                let have = p.file_offset + p.filled as u64;
                if have >= p.size && p.filled >= p.skip + p.want {
                    continue;
                }
                failure.get_or_insert((
                    i,
                    std::io::Error::new(IoKind::UnexpectedEof, "file ended before the read did"),
                ));
                continue;
            }
            p.filled += res as usize;
            if p.filled < p.target {
                queue.push_back(i);
            }
        }
        if let Some(f) = failure {
            // Let what is in flight land before the buffers can be dropped.
            while in_flight > 0 {
                if submit_and_wait(ring, pending).is_err() {
                    break;
                }
                in_flight -= ring.completion().count();
            }
            return Err(f);
        }
    }
    Ok(())
}

/// Submits and waits for at least one completion, retrying when a signal interrupts the
/// wait. On any other error the kernel may still own in-flight buffers, so they are leaked
/// rather than freed.
fn submit_and_wait(ring: &mut IoUring, pending: &mut [Pending]) -> std::io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                for p in pending.iter_mut() {
                    std::mem::forget(std::mem::take(&mut p.buf));
                }
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_name_themselves() {
        for m in [IoMode::Auto, IoMode::Uring, IoMode::Pread] {
            assert_eq!(IoMode::parse(m.name()).unwrap(), m);
        }
        let err = IoMode::parse("mmap").unwrap_err();
        assert!(err.to_string().contains("auto, uring or pread"), "{err}");
    }

    #[test]
    fn a_refused_ring_reports_why() {
        let refused = UringReader::start(
            || Err(std::io::Error::from_raw_os_error(libc::EPERM)),
            false,
        );
        let why = refused.err().unwrap();
        assert!(why.contains("refused"), "{why}");
    }

    #[test]
    fn large_files_and_ranges_are_mapped_without_a_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let bytes: Vec<u8> = (0..2 * MAP_THRESHOLD).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let read = |range| UringRead {
            key: "c".into(),
            path: path.clone(),
            range,
        };
        let whole = read(None);
        assert!(matches!(
            prepare(0, 0, &whole, false, true),
            Ok(Prepared::Map(_, 0, n)) if n == bytes.len()
        ));
        // A large range (an inner chunk of a shard) from an offset inside a page.
        let (offset, len) = (4097u64, MAP_THRESHOLD as usize);
        let large = read(Some(ByteRange::new(offset, Some(len as u64))));
        match prepare(0, 0, &large, false, true) {
            Ok(Prepared::Map(file, o, n)) => {
                assert_eq!((o, n), (offset, len));
                let value = Value::map_file(&file, o, n).unwrap();
                assert_eq!(&value[..], &bytes[offset as usize..offset as usize + len]);
            }
            _ => panic!("expected a mapping"),
        }
        // Not mapping, or a small range: read into a buffer sized for the bytes wanted.
        match prepare(0, 0, &whole, false, false) {
            Ok(Prepared::Read(p)) => assert!(p.buf.capacity() >= bytes.len()),
            _ => panic!("expected a buffered read"),
        }
        let part = read(Some(ByteRange::new(10, Some(10))));
        match prepare(0, 0, &part, false, true) {
            Ok(Prepared::Read(p)) => assert_eq!(p.want, 10),
            _ => panic!("expected a buffered read"),
        }
        let empty = read(Some(ByteRange::new(5, Some(0))));
        assert!(matches!(
            prepare(0, 0, &empty, false, true),
            Ok(Prepared::Empty)
        ));
        let missing = UringRead {
            key: "d".into(),
            path: dir.path().join("d"),
            range: None,
        };
        assert!(matches!(
            prepare(0, 0, &missing, false, true),
            Ok(Prepared::Missing)
        ));
    }

    #[test]
    fn direct_reads_hand_back_their_own_buffer() {
        // An O_DIRECT read of bytes 5000..5100: the aligned block 4096..8192 is read, and the
        // wanted bytes are moved to the front of that same (pooled) buffer.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        std::fs::write(&path, [0u8; 8192]).unwrap();
        let (want, skip, target) = (100usize, 5000usize - 4096, 4096usize);
        let mut buf = aligned_buffer(target);
        let base = aligned_start(&buf);
        // What the kernel would have written.
        buf.extend((0..base + target).map(|i| (i.wrapping_sub(base) % 253) as u8));
        buf.truncate(0);
        let ptr = buf.as_ptr();
        let p = Pending {
            job: 0,
            slot: 0,
            file: File::open(&path).unwrap(),
            buf,
            file_offset: 4096,
            filled: target,
            target,
            skip,
            want,
            size: 8192,
            aligned: true,
        };
        let Value::Owned(v) = finish(p) else {
            panic!("expected bytes in memory")
        };
        assert_eq!(v.as_ptr(), ptr, "the read's own buffer, not a copy");
        let expected: Vec<u8> = (skip..skip + want).map(|i| (i % 253) as u8).collect();
        assert_eq!(v, expected);
    }
}
