//! nvCOMP's batched zstd decoder (and encoder), loaded at run time as the driver and NVRTC are: from
//! `CHUNKFUSE_NVCOMP` (the library, or a folder holding it; the Python package points it at
//! the `nvidia-libnvcomp` wheel's), else by name from the system's library path. Without it,
//! device reads decode on the CPU and upload the values.

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::driver::sys::CUstream;

/// The oldest nvCOMP whose batched zstd API this binding follows (the options structs and
/// the total-size argument came with it).
const MIN_MAJOR: u32 = 6;
/// Names the library is looked up by on the system's path.
const SONAMES: [&str; 2] = ["libnvcomp.so.6", "libnvcomp.so"];
/// The variable naming the library or its folder.
pub const NVCOMP_VAR: &str = "CHUNKFUSE_NVCOMP";

/// `nvcompBatchedZstdDecompressOpts_t`: the backend (0: nvCOMP chooses) and reserved zeros.
#[repr(C)]
#[derive(Clone, Copy)]
struct DecompressOpts {
    backend: i32,
    reserved: [u8; 60],
}

const DEFAULT_OPTS: DecompressOpts = DecompressOpts {
    backend: 0,
    reserved: [0; 60],
};

/// `nvcompBatchedZstdCompressOpts_t`: reserved zeros (nvCOMP picks its own level).
#[repr(C)]
#[derive(Clone, Copy)]
struct CompressOpts {
    reserved: [u8; 64],
}

const COMPRESS_OPTS: CompressOpts = CompressOpts { reserved: [0; 64] };

/// The largest chunk nvCOMP's zstd encoder takes.
pub const MAX_ENCODE_CHUNK: usize = 16 << 20;

/// `nvcompProperties_t`.
#[repr(C)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

/// `nvcompAlignmentRequirements_t`: the alignment each input, output and temporary buffer
/// needs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Alignments {
    /// Of each compressed chunk.
    pub input: usize,
    /// Of each decoded chunk.
    pub output: usize,
    /// Of the temporary buffer.
    pub temp: usize,
}

type GetProperties = unsafe extern "C" fn(*mut Properties) -> i32;
type GetAlignments = unsafe extern "C" fn(DecompressOpts, *mut Alignments) -> i32;
type GetTempSize =
    unsafe extern "C" fn(usize, usize, DecompressOpts, *mut usize, usize, CUstream) -> i32;
type DecompressAsync = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    *const usize,
    *mut usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    DecompressOpts,
    *mut i32,
    CUstream,
) -> i32;

type GetCompressAlignments = unsafe extern "C" fn(CompressOpts, *mut Alignments) -> i32;
type GetCompressTempSize =
    unsafe extern "C" fn(usize, usize, CompressOpts, *mut usize, usize, CUstream) -> i32;
type GetMaxCompressed = unsafe extern "C" fn(usize, CompressOpts, *mut usize) -> i32;
type CompressAsync = unsafe extern "C" fn(
    *const *const c_void,
    *const usize,
    usize,
    usize,
    *mut c_void,
    usize,
    *const *mut c_void,
    *mut usize,
    CompressOpts,
    *mut i32,
    CUstream,
) -> i32;

/// The encoder's entry points and the alignments it needs.
pub struct Encoder {
    temp_size: GetCompressTempSize,
    max_compressed: GetMaxCompressed,
    compress: CompressAsync,
    /// Buffer alignments the encoder needs.
    pub alignments: Alignments,
}

/// The loaded library and the entry points the decoder calls.
pub struct Nvcomp {
    _lib: libloading::Library,
    temp_size: GetTempSize,
    decompress: DecompressAsync,
    /// The batched zstd encoder, or why the library has none.
    pub encoder: std::result::Result<Encoder, String>,
    /// Buffer alignments the decoder needs.
    pub alignments: Alignments,
    /// `major.minor.patch`, for reports.
    pub version: String,
    /// Where the library was loaded from.
    pub path: String,
}

impl std::fmt::Debug for Nvcomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nvCOMP {} ({})", self.version, self.path)
    }
}

/// nvCOMP, loaded on first use; why not when it cannot be.
pub fn nvcomp() -> std::result::Result<&'static Nvcomp, String> {
    static NVCOMP: OnceLock<std::result::Result<Nvcomp, String>> = OnceLock::new();
    NVCOMP.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The paths tried, in order: what `CHUNKFUSE_NVCOMP` names, else the system's sonames.
fn candidates(var: Option<String>) -> Vec<PathBuf> {
    match var.filter(|v| !v.trim().is_empty()) {
        Some(v) => {
            let p = PathBuf::from(v.trim());
            if p.is_dir() {
                let mut found = Vec::new();
                for dir in [p.clone(), p.join("lib64"), p.join("lib")] {
                    found.extend(SONAMES.iter().map(|n| dir.join(n)));
                }
                found
            } else {
                vec![p]
            }
        }
        None => SONAMES.iter().map(PathBuf::from).collect(),
    }
}

fn load() -> std::result::Result<Nvcomp, String> {
    let var = std::env::var(NVCOMP_VAR).ok();
    let named = var.is_some();
    let mut tried = Vec::new();
    for path in candidates(var) {
        if named && path.is_absolute() && !path.exists() {
            continue;
        }
        // SAFETY: loading runs the library's initialisers, nvCOMP's own; nothing of ours.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return bind(lib, &path),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    let hint = if named {
        format!("{NVCOMP_VAR} names no loadable libnvcomp.so")
    } else {
        format!(
            "libnvcomp.so.6 is not on the library path: pip install nvidia-libnvcomp-cu13 (or \
             -cu12), or set {NVCOMP_VAR} to the library"
        )
    };
    if tried.is_empty() {
        return Err(format!("nvCOMP not found: {hint}"));
    }
    Err(format!(
        "nvCOMP not found: {hint} (tried {})",
        tried.join("; ")
    ))
}

/// Copies the entry point `name` out of `lib`.
fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> std::result::Result<T, String> {
    let c_name = format!("{name}\0");
    // SAFETY: `T` is the function pointer type nvCOMP's header gives `name`; the pointer is
    // used only while `lib` stays loaded (both live in one `Nvcomp`).
    unsafe { lib.get::<T>(c_name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("nvCOMP lacks {name}: {e}"))
}

fn bind(lib: libloading::Library, path: &std::path::Path) -> std::result::Result<Nvcomp, String> {
    let properties: GetProperties = symbol(&lib, "nvcompGetProperties")?;
    let mut props = Properties {
        version: 0,
        cudart_version: 0,
    };
    // SAFETY: the struct is nvcompProperties_t, written by the call.
    let status = unsafe { properties(&mut props) };
    if status != 0 {
        return Err(format!("nvCOMP properties: {}", status_name(status)));
    }
    let (major, minor, patch) = (
        props.version / 1000,
        props.version % 1000 / 100,
        props.version % 100,
    );
    let version = format!("{major}.{minor}.{patch}");
    if major < MIN_MAJOR {
        return Err(format!(
            "nvCOMP {version} at {} is older than {MIN_MAJOR}.0, whose batched zstd API this \
             build calls",
            path.display()
        ));
    }
    let alignments_of: GetAlignments =
        symbol(&lib, "nvcompBatchedZstdDecompressGetRequiredAlignments")?;
    let mut alignments = Alignments::default();
    // SAFETY: as above: the options by value and an out-struct.
    let status = unsafe { alignments_of(DEFAULT_OPTS, &mut alignments) };
    if status != 0 {
        return Err(format!("nvCOMP alignments: {}", status_name(status)));
    }
    Ok(Nvcomp {
        temp_size: symbol(&lib, "nvcompBatchedZstdDecompressGetTempSize")?,
        decompress: symbol(&lib, "nvcompBatchedZstdDecompressAsync")?,
        encoder: bind_encoder(&lib),
        _lib: lib,
        alignments,
        version,
        path: path.display().to_string(),
    })
}

/// The encoder's entry points in `lib` (kept loaded by the `Nvcomp` they go into).
fn bind_encoder(lib: &libloading::Library) -> std::result::Result<Encoder, String> {
    let alignments_of: GetCompressAlignments =
        symbol(lib, "nvcompBatchedZstdCompressGetRequiredAlignments")?;
    let mut alignments = Alignments::default();
    // SAFETY: the options by value and an out-struct.
    let status = unsafe { alignments_of(COMPRESS_OPTS, &mut alignments) };
    if status != 0 {
        return Err(format!(
            "nvCOMP encoder alignments: {}",
            status_name(status)
        ));
    }
    Ok(Encoder {
        temp_size: symbol(lib, "nvcompBatchedZstdCompressGetTempSize")?,
        max_compressed: symbol(lib, "nvcompBatchedZstdCompressGetMaxOutputChunkSize")?,
        compress: symbol(lib, "nvcompBatchedZstdCompressAsync")?,
        alignments,
    })
}

/// nvCOMP's name for a status.
pub fn status_name(status: i32) -> String {
    let name = match status {
        0 => "success",
        10 => "invalid value",
        11 => "not supported",
        12 => "cannot decompress (corrupt or not zstd)",
        13 => "bad checksum",
        14 => "cannot verify checksums",
        15 => "output buffer too small",
        16 => "wrong header length",
        17 => "misaligned buffer",
        18 => "chunk too large",
        20 => "wrong input length",
        21 => "batch too large",
        1000 => "CUDA error",
        10000 => "internal error",
        _ => return format!("status {status}"),
    };
    name.to_string()
}

/// The device addresses and sizes of one batch, as nvCOMP takes them.
pub struct DecodeCall {
    /// Device array of the compressed chunks' addresses.
    pub compressed: u64,
    /// Device array of their sizes.
    pub compressed_bytes: u64,
    /// Device array of the decoded buffers' sizes.
    pub buffer_bytes: u64,
    /// Device array the decoded sizes are written to.
    pub actual_bytes: u64,
    /// Device array of the decoded buffers' addresses.
    pub outputs: u64,
    /// Device array of one status per chunk.
    pub statuses: u64,
    /// Chunks in the batch.
    pub count: usize,
    /// Temporary device memory and its size.
    pub temp: (u64, usize),
}

impl Nvcomp {
    /// Temporary device memory a batch of `count` chunks decoding to at most `largest` bytes
    /// each, `total` in all, needs.
    pub fn temp_bytes(&self, count: usize, largest: usize, total: usize) -> Result<usize, String> {
        let mut bytes = 0usize;
        // SAFETY: plain values and an out-value; no stream is used to size.
        let status = unsafe {
            (self.temp_size)(
                count,
                largest,
                DEFAULT_OPTS,
                &mut bytes,
                total,
                std::ptr::null_mut(),
            )
        };
        match status {
            0 => Ok(bytes),
            s => Err(format!("nvCOMP temp size: {}", status_name(s))),
        }
    }

    /// Queues the decode of a batch on `stream`.
    ///
    /// # Safety
    /// Every address in `call` is a device allocation of the size nvCOMP expects for
    /// `call.count` chunks, alive until the stream has run the decode.
    pub unsafe fn decode_async(&self, call: &DecodeCall, stream: CUstream) -> Result<(), String> {
        let status = (self.decompress)(
            call.compressed as *const *const c_void,
            call.compressed_bytes as *const usize,
            call.buffer_bytes as *const usize,
            call.actual_bytes as *mut usize,
            call.count,
            call.temp.0 as *mut c_void,
            call.temp.1,
            call.outputs as *const *mut c_void,
            DEFAULT_OPTS,
            call.statuses as *mut i32,
            stream,
        );
        match status {
            0 => Ok(()),
            s => Err(format!("nvCOMP decode: {}", status_name(s))),
        }
    }
}

/// The device addresses and sizes of one batch to encode, as nvCOMP takes them.
pub struct EncodeCall {
    /// Device array of the chunks' addresses.
    pub inputs: u64,
    /// Device array of their sizes.
    pub input_bytes: u64,
    /// The largest chunk's size.
    pub largest: usize,
    /// Device array of the frames' buffers (each of `max_compressed(largest)` bytes).
    pub outputs: u64,
    /// Device array the frames' sizes are written to.
    pub output_bytes: u64,
    /// Device array of one status per chunk.
    pub statuses: u64,
    /// Chunks in the batch.
    pub count: usize,
    /// Temporary device memory and its size.
    pub temp: (u64, usize),
}

impl Encoder {
    /// The bytes a frame of a chunk of at most `largest` bytes may take.
    pub fn max_compressed(&self, largest: usize) -> Result<usize, String> {
        let mut bytes = 0usize;
        // SAFETY: a plain value and an out-value.
        let status = unsafe { (self.max_compressed)(largest, COMPRESS_OPTS, &mut bytes) };
        match status {
            0 => Ok(bytes),
            s => Err(format!("nvCOMP frame size: {}", status_name(s))),
        }
    }

    /// Temporary device memory encoding `count` chunks of at most `largest` bytes each,
    /// `total` in all, needs.
    pub fn temp_bytes(&self, count: usize, largest: usize, total: usize) -> Result<usize, String> {
        let mut bytes = 0usize;
        // SAFETY: plain values and an out-value; no stream is used to size.
        let status = unsafe {
            (self.temp_size)(
                count,
                largest,
                COMPRESS_OPTS,
                &mut bytes,
                total,
                std::ptr::null_mut(),
            )
        };
        match status {
            0 => Ok(bytes),
            s => Err(format!("nvCOMP encoder temp size: {}", status_name(s))),
        }
    }

    /// Queues the encoding of a batch on `stream`.
    ///
    /// # Safety
    /// Every address in `call` is a device allocation of the size nvCOMP expects for
    /// `call.count` chunks, aligned as [`Encoder::alignments`] says, alive until the stream
    /// has run the encode.
    pub unsafe fn encode_async(&self, call: &EncodeCall, stream: CUstream) -> Result<(), String> {
        let status = (self.compress)(
            call.inputs as *const *const c_void,
            call.input_bytes as *const usize,
            call.largest,
            call.count,
            call.temp.0 as *mut c_void,
            call.temp.1,
            call.outputs as *const *mut c_void,
            call.output_bytes as *mut usize,
            COMPRESS_OPTS,
            call.statuses as *mut i32,
            stream,
        );
        match status {
            0 => Ok(()),
            s => Err(format!("nvCOMP encode: {}", status_name(s))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_in_the_variable_is_searched_with_its_lib_folders() {
        let dir = tempfile::tempdir().unwrap();
        let found = candidates(Some(dir.path().display().to_string()));
        assert!(found.contains(&dir.path().join("lib64").join("libnvcomp.so.6")));
        assert!(found.contains(&dir.path().join("libnvcomp.so")));
        let file = dir.path().join("libnvcomp.so.6");
        std::fs::write(&file, b"not a library").unwrap();
        assert_eq!(candidates(Some(file.display().to_string())), vec![file]);
        assert_eq!(candidates(None)[0], PathBuf::from("libnvcomp.so.6"));
        assert_eq!(
            candidates(Some(" ".into()))[0],
            PathBuf::from("libnvcomp.so.6")
        );
    }

    #[test]
    fn statuses_are_named() {
        assert!(status_name(12).contains("cannot decompress"));
        assert_eq!(status_name(4242), "status 4242");
    }
}
