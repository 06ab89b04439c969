//! The fuzz harness: every target of `chunkfuse_engine::fuzz` runs on its committed corpus
//! (`engine/fuzz/corpus/TARGET`), on seeds the engine makes (valid chunks of every codec
//! fixture, the plans in plans/, the fixtures' metadata), then on mutations of them for
//! `CHUNKFUSE_FUZZ_SECONDS` seconds per target (default 10; `make fuzz` runs 600). A panic, an
//! input that runs over `HANG_SECONDS`, or one allocation over `ALLOC_LIMIT` bytes fails the
//! test; failing inputs are written to target/fuzz-failures/. Mutations are random but
//! reproducible: `CHUNKFUSE_FUZZ_SEED` (default 0) seeds them. With `CHUNKFUSE_FUZZ_REPORT`
//! set, a JSON line per target (runs, corpus size, seconds, failures) is appended to that
//! file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chunkfuse_engine::fuzz;

/// One allocation larger than this fails the input: no input here declares more than a few
/// MiB of data, so such a request trusts a size field it should have checked.
const ALLOC_LIMIT: usize = 1 << 30;
/// An input running longer than this is a hang.
const HANG_SECONDS: u64 = 20;
/// Inputs longer than this are cut when mutated.
const MAX_LEN: usize = 1 << 16;

/// The system allocator, refusing (and reporting) single allocations over [`ALLOC_LIMIT`].
struct Guarded;

static OVERSIZED: AtomicUsize = AtomicUsize::new(0);

/// Whether a request of `size` bytes is over the limit (then recorded and reported).
fn refused(size: usize) -> bool {
    if size <= ALLOC_LIMIT {
        return false;
    }
    OVERSIZED.store(size, Ordering::SeqCst);
    report_current(b"allocation over the limit");
    true
}

// SAFETY: forwards to the system allocator unchanged, except that it returns null (an
// allocation failure, which Rust reports and aborts on) for requests over the limit.
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if refused(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Guarded = Guarded;

/// The input being run, kept where the allocator and the watchdog can print it without
/// allocating: its length (`usize::MAX`: none) and bytes.
static CURRENT_LEN: AtomicUsize = AtomicUsize::new(usize::MAX);
static mut CURRENT: [u8; MAX_LEN + 1] = [0; MAX_LEN + 1];

/// Writes `why` and the current input (hex) to stderr without allocating.
fn report_current(why: &[u8]) {
    let write = |b: &[u8]| {
        // SAFETY: writes `b` to stderr.
        unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
    };
    write(b"\nfuzz: ");
    write(why);
    write(b"; input (hex): ");
    let len = CURRENT_LEN.load(Ordering::SeqCst);
    if len != usize::MAX {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        // SAFETY: read only; the runner writes the buffer before publishing its length and
        // not again until the input is done (a report comes while it runs).
        let bytes = unsafe { &*std::ptr::addr_of!(CURRENT) };
        for &b in &bytes[..len.min(MAX_LEN)] {
            write(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    }
    write(b"\n");
}

/// SplitMix64: the mutations' random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Numbers that break size arithmetic, for number tokens of JSON inputs.
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "255",
    "65536",
    "2147483648",
    "4294967296",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-0",
    "0.5",
    "[]",
    "null",
    "\"\"",
];

/// One mutation of `input` (a random edit, or a splice with `other`).
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    let edits = 1 + rng.below(4);
    for _ in 0..edits {
        let len = v.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = [0u8, 0xff, 0x7f, 0x80, 1, b'"', b'{', b'[', b'9'][rng.below(9)];
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                v.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let piece = v[i..i + n].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 | 7 => replace_number(rng, &mut v),
            _ if len > 0 => v.truncate(rng.below(len)),
            _ => {}
        }
    }
    v.truncate(MAX_LEN);
    v
}

/// Replaces a run of digits (a JSON number, a size field) with one of [`NUMBERS`].
fn replace_number(rng: &mut Rng, v: &mut Vec<u8>) {
    let digits: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_ascii_digit()).collect();
    if digits.is_empty() {
        return;
    }
    let mut start = digits[rng.below(digits.len())];
    while start > 0 && (v[start - 1].is_ascii_digit() || v[start - 1] == b'-') {
        start -= 1;
    }
    let mut end = start;
    while end < v.len() && (v[end].is_ascii_digit() || v[end] == b'-' || v[end] == b'.') {
        end += 1;
    }
    let number = NUMBERS[rng.below(NUMBERS.len())].as_bytes().to_vec();
    v.splice(start..end, number);
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The committed corpus of `target`, then the seeds the engine and the repository give it.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let mut inputs = Vec::new();
    let dir = repo().join("engine/fuzz/corpus").join(target);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        inputs.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()));
    }
    match target {
        "chunk" => inputs.extend(fuzz::chunk_seeds()),
        "plan" => {
            if let Ok(entries) = std::fs::read_dir(repo().join("plans")) {
                let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                paths.sort();
                inputs.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()));
            }
        }
        "metadata" => inputs.extend(fuzz::metadata_seeds()),
        _ => {}
    }
    inputs
}

/// What one target's run found.
struct Outcome {
    runs: u64,
    corpus: usize,
    seconds: f64,
    failures: Vec<Vec<u8>>,
}

/// Runs `run` on the corpus, then on mutations until `budget` is spent.
fn drive(name: &str, run: fn(&[u8]), budget: Duration, seed: u64) -> Outcome {
    let inputs = corpus(name);
    let started = Instant::now();
    let mut rng = Rng(seed
        ^ name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31) ^ b as u64));
    let mut failures = Vec::new();
    let mut runs = 0u64;
    let one = |input: &[u8], failures: &mut Vec<Vec<u8>>| {
        let len = input.len().min(MAX_LEN);
        // SAFETY: only this thread writes the buffer, while no input is published.
        unsafe {
            std::ptr::copy_nonoverlapping(
                input.as_ptr(),
                std::ptr::addr_of_mut!(CURRENT).cast::<u8>(),
                len,
            )
        };
        CURRENT_LEN.store(len, Ordering::SeqCst);
        STARTED.store(now_ms(), Ordering::SeqCst);
        let ok = catch_unwind(AssertUnwindSafe(|| run(input))).is_ok();
        STARTED.store(0, Ordering::SeqCst);
        CURRENT_LEN.store(usize::MAX, Ordering::SeqCst);
        if !ok {
            failures.push(input.to_vec());
        }
    };
    for input in &inputs {
        one(input, &mut failures);
        runs += 1;
    }
    while started.elapsed() < budget && !inputs.is_empty() {
        let a = &inputs[rng.below(inputs.len())];
        let b = &inputs[rng.below(inputs.len())];
        // Mutate a mutation now and then: deeper changes from one seed.
        let mut input = mutate(&mut rng, a, b);
        if rng.below(4) == 0 {
            input = mutate(&mut rng, &input, b);
        }
        one(&input, &mut failures);
        runs += 1;
    }
    Outcome {
        runs,
        corpus: inputs.len(),
        seconds: started.elapsed().as_secs_f64(),
        failures,
    }
}

/// When the current input started (ms since the harness began; 0: none running).
static STARTED: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Aborts the process, printing the input, when one runs over [`HANG_SECONDS`].
fn watchdog(done: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            let at = STARTED.load(Ordering::SeqCst);
            if at != 0 && now_ms().saturating_sub(at) > HANG_SECONDS * 1000 {
                report_current(b"input ran over the hang limit");
                std::process::abort();
            }
        }
    });
}

#[test]
fn every_fuzz_target_survives_its_corpus_and_mutations() {
    let seconds: u64 = std::env::var("CHUNKFUSE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("CHUNKFUSE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let only = std::env::var("CHUNKFUSE_FUZZ_TARGET").ok();
    // Panics are caught and counted: keep their messages out of the output.
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "fuzz: panic: {info}");
    }));
    let done = Arc::new(AtomicBool::new(false));
    watchdog(done.clone());
    let failed_dir = repo().join("target/fuzz-failures");
    let mut failed = Vec::new();
    for &(name, run) in fuzz::TARGETS {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let out = drive(name, run, Duration::from_secs(seconds), seed);
        assert!(out.corpus > 0, "target {name} has no corpus");
        let line = format!(
            "{{\"target\": \"{name}\", \"runs\": {}, \"corpus\": {}, \"seconds\": {:.1}, \
             \"seed\": {seed}, \"failures\": {}}}",
            out.runs,
            out.corpus,
            out.seconds,
            out.failures.len()
        );
        println!("{line}");
        if let Ok(path) = std::env::var("CHUNKFUSE_FUZZ_REPORT") {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
        for (i, input) in out.failures.iter().enumerate() {
            let _ = std::fs::create_dir_all(&failed_dir);
            let path = failed_dir.join(format!("{name}-{i}"));
            let _ = std::fs::write(&path, input);
            failed.push(path.display().to_string());
        }
    }
    done.store(true, Ordering::SeqCst);
    let _ = std::panic::take_hook();
    assert_eq!(OVERSIZED.load(Ordering::SeqCst), 0);
    assert!(failed.is_empty(), "inputs that panicked: {failed:?}");
}
