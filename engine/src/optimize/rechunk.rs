//! Rechunk planning: copy in blocks that hold whole input chunks and whole output chunks, so
//! every chunk is decoded and encoded once; when such a block would not fit the budget, go
//! through an intermediate array whose chunks keep both stages' blocks small.

use crate::array::{AxisChunks, ChunkGrid};

/// Greatest common divisor.
pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// The smallest block length along one axis that holds whole chunks of both splits, in
/// elements (capped at the axis length).
pub fn block_len(input: &AxisChunks, output: &AxisChunks) -> u64 {
    let len = output.len();
    match (input.regular_size(), output.regular_size()) {
        (Some(a), Some(b)) => lcm(a, b).min(len).max(1),
        _ if input.is_coarsening_of(output) => input.max_size(),
        _ if output.is_coarsening_of(input) => output.max_size(),
        _ => len.max(1),
    }
}

/// Block shape, in output chunks per axis, for copying `input`'s chunking into `output`'s.
pub fn block_chunks(input: &ChunkGrid, output: &ChunkGrid) -> Vec<u64> {
    input
        .axes()
        .iter()
        .zip(output.axes())
        .map(|(i, o)| {
            let l = block_len(i, o);
            let c = o.max_size().max(1);
            if chained(i, o, l) {
                // Blocks as long as the input's largest chunk decode each input chunk at
                // most twice, and keep the tasks many.
                i.max_size().div_ceil(c).max(1)
            } else {
                l.div_ceil(c).max(1)
            }
        })
        .collect()
}

/// `block` (output chunks per axis) halved along its longest axis until the grid `output`
/// holds at least `spread` blocks, or the block is one chunk: a job run in batches spreads
/// a stage of few large blocks over every batch running at once (each block then decodes
/// the input chunks it overlaps itself).
pub fn spread_block(output: &ChunkGrid, mut block: Vec<u64>, spread: usize) -> Vec<u64> {
    let counts: Vec<u64> = output.axes().iter().map(|a| a.count() as u64).collect();
    let blocks = |b: &[u64]| -> u64 {
        counts
            .iter()
            .zip(b)
            .map(|(&n, &l)| n.div_ceil(l.max(1)))
            .product()
    };
    while blocks(&block) < spread as u64 {
        let Some((d, _)) = block
            .iter()
            .enumerate()
            .filter(|(_, &l)| l > 1)
            .max_by_key(|(_, &l)| l)
        else {
            break;
        };
        block[d] = block[d].div_ceil(2);
    }
    block
}

/// True when splits `input` and `output` never line up inside the axis, so that the only
/// block holding whole chunks of both is the whole axis (`len`), far longer than either
/// split's chunks: a slice whose first chunk is cut short (`x[8:]` in Dask's chunking)
/// written in regular chunks, or a region write off the target's chunk grid.
fn chained(input: &AxisChunks, output: &AxisChunks, len: u64) -> bool {
    let irregular = input.regular_size().is_none() || output.regular_size().is_none();
    irregular && len == output.len() && len > 4 * input.max_size().max(output.max_size())
}

/// Elements in a block of `chunks` output chunks per axis.
pub fn block_elements(output: &ChunkGrid, chunks: &[u64]) -> u64 {
    output
        .axes()
        .iter()
        .zip(chunks)
        .map(|(a, &k)| (k * a.max_size()).min(a.len()).max(1))
        .product()
}

/// Intermediate chunk sizes for a two-stage copy from `input` to `output` chunking (both
/// regular), growing the intermediate along axes where input chunks divide output chunks
/// while a stage-one block stays within `max_block_elements`.
pub fn intermediate_chunks(
    input: &[u64],
    output: &[u64],
    shape: &[u64],
    max_block_elements: u64,
) -> Vec<u64> {
    let rank = shape.len();
    let mut inter: Vec<u64> = (0..rank)
        .map(|d| {
            let (a, b) = (input[d].max(1), output[d].max(1));
            if b % a == 0 || a % b == 0 {
                a.min(b)
            } else {
                b
            }
        })
        .collect();
    let stage1 = |inter: &[u64]| -> u64 {
        (0..rank)
            .map(|d| lcm(input[d].max(1), inter[d]).min(shape[d]).max(1))
            .product()
    };
    loop {
        let mut grew = false;
        for d in 0..rank {
            let (a, b) = (input[d].max(1), output[d].max(1));
            let next = inter[d] * 2;
            if b % a == 0 && next <= b && b % next == 0 && next < shape[d] {
                let mut trial = inter.clone();
                trial[d] = next;
                if stage1(&trial) <= max_block_elements {
                    inter = trial;
                    grew = true;
                }
            }
        }
        if !grew {
            return inter;
        }
    }
}

/// Shard shape for an array of `chunks` written in blocks of `block` chunks per axis: whole
/// chunks, grown from the last axis (contiguous rows first) by divisors of the block, so
/// that every block holds whole shards, while a shard stays within `max_bytes`.
pub fn shard_shape(chunks: &[u64], block: &[u64], itemsize: u64, max_bytes: u64) -> Vec<u64> {
    let mut per_shard = vec![1u64; chunks.len()];
    let bytes = |per: &[u64]| -> u64 {
        chunks.iter().zip(per).map(|(c, k)| c * k).product::<u64>() * itemsize
    };
    for d in (0..chunks.len()).rev() {
        let fitting = (1..=block[d].max(1))
            .rev()
            .filter(|&k| block[d].is_multiple_of(k))
            .find(|&k| {
                let mut trial = per_shard.clone();
                trial[d] = k;
                bytes(&trial) <= max_bytes
            })
            .unwrap_or(1);
        per_shard[d] = fitting;
        if fitting < block[d] {
            break;
        }
    }
    chunks.iter().zip(&per_shard).map(|(c, k)| c * k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_blocks_are_halved_until_there_are_enough() {
        let output = ChunkGrid::regular(&[64, 721, 1440], &[64, 73, 144]).unwrap();
        let whole = vec![1, 10, 10];
        assert_eq!(spread_block(&output, whole.clone(), 0), whole);
        assert_eq!(spread_block(&output, whole.clone(), 2), vec![1, 10, 5]);
        assert_eq!(spread_block(&output, whole.clone(), 8), vec![1, 5, 3]);
        // Never past one chunk.
        assert_eq!(spread_block(&output, whole, 1000), vec![1, 1, 1]);
    }

    #[test]
    fn era5_blocks() {
        let shape = [256, 721, 1440];
        let input = ChunkGrid::regular(&shape, &[1, 721, 1440]).unwrap();
        let output = ChunkGrid::regular(&shape, &[256, 73, 144]).unwrap();
        // One block is the whole array: every input chunk feeds every output chunk row.
        assert_eq!(
            block_elements(&output, &block_chunks(&input, &output)),
            256 * 721 * 1440
        );
        let inter = intermediate_chunks(&[1, 721, 1440], &[256, 73, 144], &shape, 32 * 721 * 1440);
        assert_eq!(inter, vec![32, 73, 144]);
    }

    #[test]
    fn shards_grow_along_rows_within_the_block() {
        // ERA5 copied into (30, 73, 144) chunks in blocks of 1 x 10 x 10 chunks.
        let chunk_bytes = 30 * 73 * 144 * 4;
        assert_eq!(
            shard_shape(&[30, 73, 144], &[1, 10, 10], 4, 16 << 20),
            vec![30, 73, 1440]
        );
        // Too small for a row of ten: the largest divisor of the block that fits.
        assert_eq!(
            shard_shape(&[30, 73, 144], &[1, 10, 10], 4, 6 * chunk_bytes),
            vec![30, 73, 720]
        );
        // Room for whole blocks.
        assert_eq!(
            shard_shape(&[30, 73, 144], &[1, 10, 10], 4, 1 << 30),
            vec![30, 730, 1440]
        );
        // Not even one chunk fits: the chunk itself.
        assert_eq!(
            shard_shape(&[30, 73, 144], &[1, 10, 10], 4, 1),
            vec![30, 73, 144]
        );
    }

    #[test]
    fn splits_that_never_line_up_take_blocks_of_one_input_chunk() {
        // x[8:] of 16-step chunks (Dask's chunking: 8, then 16s) written in 16-step chunks.
        let mut sizes = vec![8];
        sizes.extend([16; 15]);
        let sliced = ChunkGrid::new(vec![
            AxisChunks::from_sizes(&sizes).unwrap(),
            AxisChunks::regular(64, 64).unwrap(),
        ]);
        let regular = ChunkGrid::regular(&[248, 64], &[16, 64]).unwrap();
        assert_eq!(block_chunks(&sliced, &regular), vec![1, 1]);
        // Into 4-step chunks: four of them hold the input's largest chunk.
        let fine = ChunkGrid::regular(&[248, 64], &[4, 64]).unwrap();
        assert_eq!(block_chunks(&sliced, &fine), vec![4, 1]);
        // Splits that line up somewhere keep blocks of whole chunks of both.
        let coarse = ChunkGrid::new(vec![
            AxisChunks::from_sizes(&[8, 240]).unwrap(),
            AxisChunks::regular(64, 64).unwrap(),
        ]);
        assert_eq!(block_chunks(&coarse, &regular), vec![16, 1]);
    }

    #[test]
    fn aligned_rechunk_blocks_are_small() {
        let shape = [100, 100];
        let input = ChunkGrid::regular(&shape, &[10, 50]).unwrap();
        let output = ChunkGrid::regular(&shape, &[20, 25]).unwrap();
        assert_eq!(block_chunks(&input, &output), vec![1, 2]);
    }
}
