//! Cost formulas both the planner and the executor need: the bytes a task holds, how a
//! compute task batches its encodes, the shape of a stream copy's groups.

use crate::array::ChunkGrid;

/// Largest shard of an intermediate, in bytes: a share of the budget small enough that the
/// allocator reuses freed shard buffers (see `exec::memory::scale_allocator_to_budget`)
/// rather than mapping and faulting in fresh pages for each.
pub fn shard_bytes(budget: u64) -> u64 {
    (budget / 64).clamp(1 << 20, 16 << 20)
}

/// Output chunks a compute task encodes per batch: a few per thread, so their writes overlap
/// the next batch's encoding.
pub fn chunks_per_encode(threads: usize) -> usize {
    (2 * threads).max(1)
}

/// Encoded bytes a compute task holds at most: the scheduler lets one encode batch's writes be
/// in flight while the next batch is encoded (at most the decoded size each).
pub fn encoded_in_flight(out_bytes: u64, out_chunk_bytes: u64, threads: usize) -> u64 {
    out_bytes.min(2 * chunks_per_encode(threads) as u64 * out_chunk_bytes)
}

/// Bytes a compute task is projected to hold: its leaf buffers, its output values (none for a
/// plain copy, whose leaf buffer is the output), the encoded chunks in flight, and two batches
/// of reads in flight.
pub fn compute_task_bytes(
    leaf_bytes: u64,
    out_bytes: u64,
    plain_copy: bool,
    batch_bytes: u64,
    encoded_bytes: u64,
) -> u64 {
    let values = if plain_copy { 0 } else { out_bytes };
    leaf_bytes + values + encoded_bytes + 2 * batch_bytes
}

/// [`compute_task_bytes`] for a block of `elements` output elements in chunks of
/// `chunk_elements`.
pub fn block_task_bytes(
    elements: u64,
    chunk_elements: u64,
    itemsize: u64,
    in_itemsize: u64,
    plain_copy: bool,
    batch_bytes: u64,
    threads: usize,
) -> u64 {
    compute_task_bytes(
        elements * in_itemsize,
        elements * itemsize,
        plain_copy,
        batch_bytes,
        encoded_in_flight(elements * itemsize, chunk_elements * itemsize, threads),
    )
}

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

/// Bytes a task of `streams` output chunks holds: the streams' encoder state and pending
/// encoded bytes (two parts at most, or a whole chunk of `chunk_bytes` and the encoder's
/// margin), the decoded input of one batch, and two batches of reads in flight.
pub fn task_bytes(streams: u64, stream_bytes: u64, chunk_bytes: u64, batch_bytes: u64) -> u64 {
    let pending = (2 * PART_BYTES as u64).min(chunk_bytes + (128 << 10));
    streams * (stream_bytes + pending) + 3 * batch_bytes
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
