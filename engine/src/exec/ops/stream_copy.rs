//! Stream-copy stage: a plain copy into output chunks that each gather a slice of many input
//! chunks along the first axis, and lie inside one input chunk along every other axis (ERA5
//! time steps rechunked into time series). Each task holds one encoder stream per output
//! chunk of a group; it reads the input chunks in order along the first axis, decodes each
//! once, and appends every output chunk's slice of it to that chunk's stream, whose encoded
//! bytes go out as parts of the chunk's value. No intermediate array, no chunk-sized
//! output buffers; each output chunk appears whole when its last part is written.

use std::sync::Arc;

use rayon::prelude::*;

use super::region::assemble::Assembler;
use super::region::read::RegionRead;
use crate::array::grid::indices_between;
use crate::array::Region;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::task::{Part, Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::physical::cost::{task_bytes, PART_BYTES};
use crate::physical::fused::Fused;
use crate::zarr::stream::ChunkStream;
use crate::zarr::ZarrArray;

/// One output chunk being streamed.
struct Stream {
    region: Region,
    stream: ChunkStream,
}

struct StreamProcessor {
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    /// The reads of each batch: input chunks in order along the first axis.
    reads: Vec<RegionRead>,
    /// Output chunks, made at the first batch (a stage's tasks all exist at once; their
    /// encoder contexts should not).
    chunks: Vec<Vec<u64>>,
    streams: Option<Vec<Stream>>,
}

impl StreamProcessor {
    fn error(&self, key: &str, e: String) -> Error {
        Error::new(ErrorKind::Internal, format!("cannot encode chunk: {e}"))
            .with_chunk_key(key)
            .with_store(self.out.store().url())
    }

    fn part(&self, key: &str, offset: u64, bytes: Vec<u8>, total: Option<u64>) -> WriteOp {
        WriteOp::part(
            self.out.store().clone(),
            key.to_string(),
            bytes,
            Part { offset, total },
        )
    }

    fn open_streams(&self) -> Result<Vec<Stream>> {
        self.chunks
            .iter()
            .map(|idx| {
                Ok(Stream {
                    region: self.out.grid().chunk_region(idx),
                    stream: self.out.chunk_stream(idx)?,
                })
            })
            .collect()
    }
}

impl Processor for StreamProcessor {
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let read = self
            .reads
            .get(batch)
            .cloned()
            .ok_or_else(|| Error::internal(format!("stream copy has no batch {batch}")))?;
        let rows = (read.region.start[0], read.region.end(0));
        let mut assembler = Assembler::new(read).keeping_chunks(&self.arrays);
        assembler.accept(data, &self.arrays, ctx)?;
        let mut streams = match self.streams.take() {
            Some(s) => s,
            None => self.open_streams()?,
        };
        let item = self.out.dtype().size();
        let this = &*self;
        let writes: Result<Vec<Option<WriteOp>>> = streams
            .par_iter_mut()
            .map(|s| {
                let start = rows.0.max(s.region.start[0]);
                let end = rows.1.min(s.region.end(0));
                if start >= end {
                    return Ok(None);
                }
                let mut part = s.region.clone();
                part.start[0] = start;
                part.shape[0] = end - start;
                let mut values = crate::array::pool::take(part.len() as usize * item);
                values.resize(part.len() as usize * item, 0);
                assembler.copy_into_bytes(&part, item, &mut values);
                let fed = s.stream.feed_rows(&values);
                crate::array::pool::give(values);
                fed.map_err(|e| this.error(s.stream.key(), e))?;
                Ok(s.stream
                    .take_part(PART_BYTES)
                    .map(|(offset, bytes)| this.part(s.stream.key(), offset, bytes, None)))
            })
            .collect();
        self.streams = Some(streams);
        Ok(writes?.into_iter().flatten().collect())
    }

    fn finish(mut self: Box<Self>, _ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        let streams = match self.streams.take() {
            Some(s) => s,
            None => self.open_streams()?,
        };
        let this = &*self;
        streams
            .into_par_iter()
            .map(|s| {
                let key = s.stream.key().to_string();
                let (offset, bytes, total) = s.stream.finish().map_err(|e| this.error(&key, e))?;
                Ok(this.part(&key, offset, bytes, Some(total)))
            })
            .collect()
    }

    fn keep_existing(&mut self, existing: &std::collections::HashSet<String>) {
        let out = &self.out;
        self.chunks
            .retain(|c| !existing.contains(&out.chunk_key(c)));
    }
}

/// The tasks `range` (all without one; see [`super::compute::cut_to`]) of a stream-copy
/// stage, and how many it has: one per group of `group` output chunks per axis (task `i` is
/// part `i`), each reading its input in batches of about `batch_bytes` decoded bytes.
#[allow(clippy::too_many_arguments)]
pub fn tasks(
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::read::Arrays,
    out: Arc<ZarrArray>,
    group: &[u64],
    stream_bytes: u64,
    label: &str,
    batch_bytes: u64,
    range: Option<std::ops::Range<usize>>,
) -> Result<(Vec<Task>, usize)> {
    let leaf = match fused.leaves.as_slice() {
        [l] if fused.plain_leaf(out.dtype()).is_some() && l.is_plain() => l,
        _ => {
            return Err(Error::internal(
                "a stream copy needs a plain copy of one array",
            ))
        }
    };
    let input = arrays[leaf.mat].read_grid().clone();
    let grid = super::compute::block_grid(out.grid(), group);
    let total = grid.iter().product::<u64>() as usize;
    let range = super::compute::cut_to(range, total);
    let groups = indices_between(&grid, range.start as u64..range.end as u64);
    let tasks = groups
        .into_iter()
        .zip(range)
        .map(|(g, part)| {
            let (chunks, region) = super::compute::block_region(out.grid(), group, &g);
            // Batches of whole input chunks along the first axis, within the byte limit.
            let in_rows = input.axes()[0].overlapping(region.start[0], region.shape[0]);
            let rows_of = |first: usize, last: usize| {
                let start = input.axes()[0].chunk(first).0.max(region.start[0]);
                let (s, l) = input.axes()[0].chunk(last);
                let mut r = region.clone();
                r.start[0] = start;
                r.shape[0] = (s + l).min(region.end(0)) - start;
                r
            };
            let mut reads = Vec::new();
            let mut batches: Vec<Vec<ReadOp>> = Vec::new();
            let mut largest = 0u64;
            let mut first = in_rows.start;
            while first < in_rows.end {
                let mut last = first;
                let mut bytes = 0u64;
                while last < in_rows.end {
                    let add = RegionRead::plan(&fused, &arrays, &rows_of(last, last))
                        .chunk_bytes(&arrays);
                    if last > first && bytes + add > batch_bytes {
                        break;
                    }
                    bytes += add;
                    last += 1;
                }
                let read = RegionRead::plan(&fused, &arrays, &rows_of(first, last - 1));
                batches.push(read.read_ops(&arrays)?);
                largest = largest.max(bytes);
                reads.push(read);
                first = last;
            }
            let chunk_bytes =
                out.grid().chunk_shape().iter().product::<u64>() * out.dtype().size() as u64;
            let memory = task_bytes(chunks.len() as u64, stream_bytes, chunk_bytes, largest);
            let outputs = chunks.iter().map(|c| out.chunk_key(c)).collect();
            Ok(Task {
                label: format!("{label}: chunks {g:?}"),
                memory,
                batches,
                outputs,
                part,
                processor: Box::new(StreamProcessor {
                    arrays: arrays.clone(),
                    out: out.clone(),
                    reads,
                    chunks,
                    streams: None,
                }),
            })
        })
        .collect::<Result<_>>()?;
    Ok((tasks, total))
}
