//! Stream-copy stage: a plain copy into output chunks that each gather a slice of many input
//! chunks along the first axis, and lie inside one input chunk along every other axis (ERA5
//! time steps rechunked into time series). Each task holds one encoder stream per output
//! chunk of a group; it reads the input chunks in order along the first axis, decodes each
//! once, and appends every output chunk's slice of it to that chunk's stream, whose encoded
//! bytes go out as parts of the chunk's value. No intermediate array, no chunk-sized
//! output buffers; each output chunk appears whole when its last part is written.

use std::sync::Arc;

use rayon::prelude::*;

use super::region::{Assembler, RegionRead};
use crate::array::grid::indices_in;
use crate::array::{ChunkGrid, Region};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::task::{Part, Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::optimize::fuse::Fused;
use crate::zarr::stream::ChunkStream;
use crate::zarr::ZarrArray;

/// Encoded bytes a stream gathers before they go out as one part.
pub const PART_BYTES: usize = 256 << 10;

/// True when `input` chunks along every axis but the first hold each `output` chunk whole
/// (output chunk boundaries along those axes fall inside single input chunks), so an output
/// chunk's share of an input chunk is whole rows of it.
pub fn rows_of_single_chunks(input: &ChunkGrid, output: &ChunkGrid) -> bool {
    input.rank() == output.rank()
        && input.rank() >= 1
        && input.shape() == output.shape()
        && (1..output.rank()).all(|d| {
            let o = &output.axes()[d];
            (0..o.count()).all(|k| {
                let (start, len) = o.chunk(k);
                input.axes()[d].overlapping(start, len).len() <= 1
            })
        })
}

/// Output chunks per task along each axis: 1 along the first, and along the others the
/// largest C-ordered box of at most `streams` chunks (filled from the last axis).
pub fn group_shape(output: &ChunkGrid, streams: u64) -> Vec<u64> {
    let g = output.grid_shape();
    let mut shape = vec![1u64; g.len()];
    let mut room = streams.max(1);
    for d in (1..g.len()).rev() {
        let k = g[d].min(room).max(1);
        shape[d] = k;
        if k < g[d] {
            break;
        }
        room /= k.max(1);
    }
    shape
}

/// One output chunk being streamed.
struct Stream {
    region: Region,
    stream: ChunkStream,
}

struct StreamProcessor {
    arrays: crate::exec::ops::region::Arrays,
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

/// Bytes a task of `streams` output chunks holds: the streams' encoder state and pending
/// encoded bytes (two parts at most, or a whole chunk of `chunk_bytes` and the encoder's
/// margin), the decoded input of one batch, and two batches of reads in flight.
pub fn task_bytes(streams: u64, stream_bytes: u64, chunk_bytes: u64, batch_bytes: u64) -> u64 {
    let pending = (2 * PART_BYTES as u64).min(chunk_bytes + (128 << 10));
    streams * (stream_bytes + pending) + 3 * batch_bytes
}

/// The tasks of a stream-copy stage: one per group of `group` output chunks per axis, each
/// reading its input in batches of about `batch_bytes` decoded bytes.
pub fn tasks(
    fused: Arc<Fused>,
    arrays: crate::exec::ops::region::Arrays,
    out: Arc<ZarrArray>,
    group: &[u64],
    stream_bytes: u64,
    label: &str,
    batch_bytes: u64,
) -> Result<Vec<Task>> {
    let leaf = match fused.leaves.as_slice() {
        [l] if fused.plain_leaf(out.dtype()).is_some() && l.is_plain() => l,
        _ => {
            return Err(Error::internal(
                "a stream copy needs a plain copy of one array",
            ))
        }
    };
    let input = arrays[leaf.mat].read_grid().clone();
    let groups = indices_in(&super::compute::block_grid(out.grid(), group));
    groups
        .into_iter()
        .enumerate()
        .map(|(part, g)| {
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn era5_time_steps_stream_into_time_series() {
        let shape = [256, 721, 1440];
        let input = ChunkGrid::regular(&shape, &[1, 721, 1440]).unwrap();
        let output = ChunkGrid::regular(&shape, &[256, 73, 144]).unwrap();
        assert!(rows_of_single_chunks(&input, &output));
        // Output chunks straddling input chunks along a trailing axis do not.
        let halves = ChunkGrid::regular(&shape, &[1, 361, 1440]).unwrap();
        assert!(!rows_of_single_chunks(&halves, &output));
        // Aligned trailing splits do.
        let bands = ChunkGrid::regular(&shape, &[1, 146, 1440]).unwrap();
        assert!(rows_of_single_chunks(&bands, &output));
    }

    #[test]
    fn groups_are_c_ordered_boxes() {
        let output = ChunkGrid::regular(&[256, 721, 1440], &[256, 73, 144]).unwrap();
        assert_eq!(group_shape(&output, 1000), vec![1, 10, 10]);
        assert_eq!(group_shape(&output, 100), vec![1, 10, 10]);
        assert_eq!(group_shape(&output, 35), vec![1, 3, 10]);
        assert_eq!(group_shape(&output, 7), vec![1, 1, 7]);
        assert_eq!(group_shape(&output, 0), vec![1, 1, 1]);
    }
}
