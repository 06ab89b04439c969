//! The zstd encode floor: every chunk of an array decoded into memory (untimed), then encoded
//! by libzstd on all cores and, asked for, by nvCOMP on the GPU (timed by events, the upload
//! timed apart), each frame nvCOMP made checked by decoding it with libzstd. It says whether
//! encoding on the device can pay for a write stage kept there.

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::array::Buffer;
use crate::error::{Error, Result};

/// Encode timings of one array's chunks.
#[derive(Debug, Clone, Serialize)]
pub struct EncodeFloor {
    /// Chunks encoded.
    pub chunks: usize,
    /// Their decoded bytes.
    pub decoded_bytes: u64,
    /// libzstd's level.
    pub level: i32,
    /// CPU threads.
    pub threads: usize,
    /// libzstd's time on `threads` threads.
    pub cpu_seconds: f64,
    /// libzstd's frames' bytes.
    pub cpu_compressed_bytes: u64,
    /// nvCOMP's figures, when asked for.
    pub device: Option<DeviceEncodeFloor>,
}

/// nvCOMP's encode of the same chunks.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceEncodeFloor {
    /// The device.
    pub device: String,
    /// Copying the chunks to the device (wall clock).
    pub upload_seconds: f64,
    /// The encode call, between CUDA events.
    pub encode_seconds: f64,
    /// nvCOMP's frames' bytes.
    pub compressed_bytes: u64,
    /// Frames libzstd decoded back to their chunk's bytes.
    pub frames_verified: usize,
    /// Frames whose header records their decoded size (readers that size their output from
    /// it need this).
    pub frames_with_content_size: usize,
}

/// Every chunk (inner chunk, for a sharded array) of `url` read and decoded.
fn decoded_chunks(url: &str, pool: &rayon::ThreadPool) -> Result<Vec<Buffer>> {
    let (arr, indices, encoded) = super::floor::stored_chunks(url)?;
    pool.install(|| {
        encoded
            .into_par_iter()
            .zip(indices.par_iter())
            .map(|(b, i)| arr.decode_read(i, b))
            .collect()
    })
}

/// Times encoding every chunk of `url` with libzstd at `level` on `threads` threads (0: all
/// cores) and, with `on_gpu`, with nvCOMP on the GPU.
pub fn encode_floor(url: &str, threads: usize, level: i32, on_gpu: bool) -> Result<EncodeFloor> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::internal(e.to_string()))?;
    let chunks = decoded_chunks(url, &pool)?;
    let t0 = Instant::now();
    let frames: Vec<Vec<u8>> = pool.install(|| {
        chunks
            .par_iter()
            .map(|c| {
                zstd::bulk::compress(c.bytes(), level).map_err(|e| {
                    Error::internal(format!("zstd cannot encode a chunk: {e}")).with_store(url)
                })
            })
            .collect::<Result<_>>()
    })?;
    let cpu_seconds = t0.elapsed().as_secs_f64();
    let device = if on_gpu {
        Some(on_device(&chunks, &pool)?)
    } else {
        None
    };
    Ok(EncodeFloor {
        chunks: chunks.len(),
        decoded_bytes: chunks.iter().map(|c| c.bytes().len() as u64).sum(),
        level,
        threads: pool.current_num_threads(),
        cpu_seconds,
        cpu_compressed_bytes: frames.iter().map(|f| f.len() as u64).sum(),
        device,
    })
}

#[cfg(feature = "cuda")]
fn on_device(chunks: &[Buffer], pool: &rayon::ThreadPool) -> Result<DeviceEncodeFloor> {
    use zstd::zstd_safe::get_frame_content_size;
    let gpu = crate::kernels::eval::gpu::gpu()?;
    let bytes: Vec<&[u8]> = chunks.iter().map(|c| c.bytes()).collect();
    let t0 = Instant::now();
    let (values, pieces) = gpu.upload_pieces(&bytes)?;
    let upload_seconds = t0.elapsed().as_secs_f64();
    let encoded = gpu.encode_zstd(&values, &pieces)?;
    let checks: Vec<(bool, bool)> = pool.install(|| {
        encoded
            .frames
            .par_iter()
            .zip(&bytes)
            .map(|(f, want)| {
                let back = zstd::bulk::decompress(f, want.len()).is_ok_and(|b| b == *want);
                let sized =
                    matches!(get_frame_content_size(f), Ok(Some(n)) if n == want.len() as u64);
                (back, sized)
            })
            .collect()
    });
    Ok(DeviceEncodeFloor {
        device: gpu.describe(),
        upload_seconds,
        encode_seconds: encoded.seconds,
        compressed_bytes: encoded.frames.iter().map(|f| f.len() as u64).sum(),
        frames_verified: checks.iter().filter(|c| c.0).count(),
        frames_with_content_size: checks.iter().filter(|c| c.1).count(),
    })
}

#[cfg(not(feature = "cuda"))]
fn on_device(_chunks: &[Buffer], _pool: &rayon::ThreadPool) -> Result<DeviceEncodeFloor> {
    Err(Error::new(
        crate::error::ErrorKind::Unsupported,
        "device 'cuda' is not available: this chunkfuse was built without the cuda feature",
    ))
}
