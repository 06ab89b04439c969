//! The floors the benchmarks compare runs with: decoding (and encoding) alone, no IO timed;
//! and reading and decoding through the scheduler, with no compute and no writes.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::array::buffer::copy_region;
use crate::array::{Buffer, ChunkGrid, Region};
use crate::error::{Error, Result};
use crate::exec::memory::default_max_mem;
use crate::exec::{Budget, Progress, Scheduler};
use crate::store::open_store;
use crate::zarr::{ArraySpec, Codec, ZarrArray};

/// Timings of the codec floors.
#[derive(Debug, Clone, Serialize)]
pub struct CodecFloor {
    /// Decode (and, for `codec`, encode) time.
    pub seconds: f64,
    /// Time to decode every source chunk.
    pub decode_seconds: f64,
    /// Time to encode every target chunk (0 for `decode`).
    pub encode_seconds: f64,
    /// Decoded bytes.
    pub decoded_bytes: u64,
    /// Compute threads.
    pub threads: usize,
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::internal(e.to_string()))
}

/// An array, its chunks' indices and their stored bytes (`None`: not stored).
pub(super) type StoredChunks = (ZarrArray, Vec<Vec<u64>>, Vec<Option<crate::store::Value>>);

/// Every chunk of `url` (inner chunk, for a sharded array, as runs read them) read into
/// memory as stored.
pub(super) fn stored_chunks(url: &str) -> Result<StoredChunks> {
    let store = open_store(url, 8)?;
    let arr = ZarrArray::open(store.clone())?.with_inner_reads();
    let indices = arr.read_grid().chunk_indices();
    let encoded = store.get_many(
        indices
            .iter()
            .map(|i| arr.read_request(i))
            .collect::<Result<Vec<_>>>()?,
    )?;
    Ok((arr, indices, encoded))
}

/// Reads every chunk of `url` into memory (untimed), then times decoding all of them on
/// `threads` threads; with `target_chunks`, also times encoding the array as those chunks
/// with `codec` (the rechunk codec floor). No IO is timed.
pub fn codec_floor(
    url: &str,
    threads: usize,
    target: Option<(&[u64], &Codec)>,
) -> Result<CodecFloor> {
    let (arr, indices, encoded) = stored_chunks(url)?;
    let pool = pool(threads)?;
    let shape = arr.shape();
    let whole = Region::whole(&shape);
    let size = arr.dtype().size();
    let t0 = Instant::now();
    // Decode only: each buffer goes back to the pool at once, as in a streaming run.
    let Some((chunks, codec)) = target else {
        let decoded_bytes: u64 = pool.install(|| {
            encoded
                .into_par_iter()
                .zip(indices.par_iter())
                .map(|(b, i)| arr.decode_read(i, b).map(|buf| buf.bytes().len() as u64))
                .sum::<Result<u64>>()
        })?;
        let decode_seconds = t0.elapsed().as_secs_f64();
        return Ok(CodecFloor {
            seconds: decode_seconds,
            decode_seconds,
            encode_seconds: 0.0,
            decoded_bytes,
            threads: pool.current_num_threads(),
        });
    };
    let decoded: Vec<Buffer> = pool.install(|| {
        encoded
            .into_par_iter()
            .zip(indices.par_iter())
            .map(|(b, i)| arr.decode_read(i, b))
            .collect::<Result<Vec<_>>>()
    })?;
    let decode_seconds = t0.elapsed().as_secs_f64();
    let decoded_bytes: u64 = decoded.iter().map(|b| b.bytes().len() as u64).sum();
    let encode_seconds = {
        let mut full = Buffer::zeros(arr.dtype(), whole.len() as usize);
        for (b, i) in decoded.iter().zip(&indices) {
            let r = arr.read_grid().chunk_region(i);
            copy_region(b.bytes(), &r, full.bytes_mut(), &whole, &r, size);
        }
        drop(decoded);
        let spec = ArraySpec {
            shape: shape.clone(),
            dtype: arr.dtype(),
            chunks: chunks.to_vec(),
            shards: None,
            codec: codec.clone(),
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let target = ZarrArray::create(
            crate::store::memory::MemoryStore::named("codec-floor"),
            &spec,
        )?;
        let grid = ChunkGrid::regular(&shape, chunks)?;
        let t1 = Instant::now();
        pool.install(|| {
            grid.chunk_indices()
                .par_iter()
                .try_for_each(|i| -> Result<()> {
                    let r = grid.chunk_region(i);
                    let mut c = Buffer::zeros(arr.dtype(), r.len() as usize);
                    copy_region(full.bytes(), &whole, c.bytes_mut(), &r, &r, size);
                    target.encode_chunk(i, &c).map(|_| ())
                })
        })?;
        t1.elapsed().as_secs_f64()
    };
    Ok(CodecFloor {
        seconds: decode_seconds + encode_seconds,
        decode_seconds,
        encode_seconds,
        decoded_bytes,
        threads: pool.current_num_threads(),
    })
}

/// Decodes every chunk of one batch and drops it: the read floor's only work.
struct DecodeOnly {
    array: Arc<ZarrArray>,
    chunks: Vec<Vec<u64>>,
    next: usize,
}

impl crate::exec::Processor for DecodeOnly {
    fn process(
        &mut self,
        _batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut crate::exec::TaskContext,
    ) -> Result<Vec<crate::exec::WriteOp>> {
        let idx = &self.chunks[self.next..self.next + data.len()];
        self.next += data.len();
        let bytes: u64 = data
            .into_par_iter()
            .zip(idx.par_iter())
            .map(|(b, i)| {
                self.array
                    .decode_read(i, b)
                    .map(|buf| buf.bytes().len() as u64)
            })
            .sum::<Result<u64>>()?;
        ctx.add_decoded(bytes);
        Ok(Vec::new())
    }

    fn finish(
        self: Box<Self>,
        _ctx: &mut crate::exec::TaskContext,
    ) -> Result<Vec<crate::exec::WriteOp>> {
        Ok(Vec::new())
    }
}

/// The read floor: reads and decodes every chunk of `url` through the scheduler and the IO
/// threads, as a run does, with no compute and no writes. Timed as a run is: from before the
/// array is opened and the scheduler made.
pub fn read_floor(url: &str, threads: usize, max_mem: Option<u64>) -> Result<CodecFloor> {
    let t0 = Instant::now();
    let max_mem = max_mem.unwrap_or_else(default_max_mem);
    let array = Arc::new(ZarrArray::open(open_store(url, 8)?)?.with_inner_reads());
    let progress = Arc::new(Progress::new(false));
    let scheduler = Scheduler::new(
        threads,
        Budget::new(max_mem),
        progress.clone(),
        Arc::new(AtomicBool::new(false)),
    )?;
    // What a run's tasks read one at a time: chunks, or inner chunks of a sharded array.
    let grid = array.read_grid();
    let indices = grid.chunk_indices();
    let chunk_bytes = grid.chunk_shape().iter().product::<u64>() * array.dtype().size() as u64;
    // Tasks of about 64 MiB of chunks, read in batches of one chunk per thread.
    let per_task = ((64u64 << 20) / chunk_bytes.max(1)).max(1) as usize;
    let per_batch = scheduler.threads().max(1);
    let tasks = indices
        .chunks(per_task)
        .map(|group| {
            Ok(crate::exec::Task {
                label: format!("read {url}"),
                memory: 3 * per_batch as u64 * chunk_bytes,
                batches: group
                    .chunks(per_batch)
                    .map(|b| {
                        b.iter()
                            .map(|i| {
                                Ok(crate::exec::ReadOp {
                                    store: array.store().clone(),
                                    req: array.read_request(i)?,
                                })
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                    .collect::<Result<Vec<_>>>()?,
                outputs: Vec::new(),
                part: 0,
                processor: Box::new(DecodeOnly {
                    array: array.clone(),
                    chunks: group.to_vec(),
                    next: 0,
                }),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    scheduler.run(tasks)?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(CodecFloor {
        seconds,
        decode_seconds: seconds,
        encode_seconds: 0.0,
        decoded_bytes: progress
            .decoded_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        threads: scheduler.threads(),
    })
}
