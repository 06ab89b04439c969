//! Planning an FFT: output chunks whose transformed axes are whole and whose other axes are
//! small enough for the budget. When tasks would re-read the same input chunks many times (an
//! FFT along an axis the input splits finely), the cheaper of two ways: the input held in
//! memory band by band while its consumers run, or a bounded-memory rechunk of the input into
//! an intermediate first.

use super::bands::{cheapest_bands, room_for_band, SPILL_COST};
use super::copy::plan_copy;
use super::materials::sharded_intermediate;
use crate::array::{ChunkGrid, DType, Region};
use crate::error::{Error, Result};
use crate::physical::fused::{Fused, LeafBand, LeafFft};
use crate::physical::material::{Material, MaterialOrigin};
use crate::physical::options::PlanOptions;
use crate::physical::regions::input_region;
use crate::physical::stage::Stage;
use crate::plan::fft_params::FftStep;
use crate::plan::node::FftSpec;

/// Bytes an FFT task holds for output region `out`: its leaf buffers and reads in flight,
/// the input cast to the compute dtype, the kernel's blocks before and after each step
/// (complex), and the encoded output.
fn task_bytes(
    steps: &[FftStep],
    in_shape: &[u64],
    out: &Region,
    leaf_itemsize: u64,
    compute: DType,
    out_dtype: DType,
    batch_bytes: u64,
) -> u64 {
    let input = input_region(steps, in_shape, out);
    let complex = compute.to_complex().size() as u64;
    let mut shape = input.shape.clone();
    let mut largest = shape.iter().product::<u64>();
    for s in steps {
        shape[s.axis] = s.n.max(s.kind.out_len(s.n)) as u64;
        largest = largest.max(shape.iter().product());
    }
    let in_elems = input.len();
    in_elems * leaf_itemsize
        + in_elems * compute.size() as u64
        + 3 * largest * complex
        + out.len() * out_dtype.size() as u64
        + 2 * batch_bytes
}

/// How many tasks read each input chunk when output chunks are `out_chunks` (transformed
/// axes excluded: every task reads them whole).
fn read_amplification(input: &ChunkGrid, out_chunks: &[u64], transformed: &[usize]) -> u64 {
    let in_chunks = input.chunk_shape();
    (0..in_chunks.len())
        .filter(|d| !transformed.contains(d))
        .map(|d| in_chunks[d].div_ceil(out_chunks[d].max(1)).max(1))
        .product()
}

/// Chunks of the rechunked copy an FFT reads: the FFT's own chunks on the other axes; along
/// a single transformed axis, as many steps as a one-stage copy from the input can fill (a
/// block of whole input chunks within `limit`); the FFT then reads several of them per region,
/// each once. Several transformed axes are each kept whole.
fn spill_chunks(
    spec: &FftSpec,
    input: &Fused,
    chunks: &[u64],
    limit: u64,
    threads: usize,
) -> Vec<u64> {
    let axes = spec.axes();
    let in_chunks = input.grid.chunk_shape();
    let mut mid: Vec<u64> = (0..chunks.len())
        .map(|d| {
            if axes.contains(&d) {
                input.shape[d].max(1)
            } else {
                chunks[d]
            }
        })
        .collect();
    if let [axis] = axes[..] {
        // Elements of one step along the axis in a copy block (whole input chunks across).
        let across: u64 = (0..mid.len())
            .filter(|&d| d != axis)
            .map(|d| {
                let (a, b) = (in_chunks[d].max(1), mid[d]);
                (a * b / super::rechunk::gcd(a, b))
                    .min(input.shape[d])
                    .max(1)
            })
            .product();
        let itemsize = input.dtype().size() as u64;
        // The copy holds the block's values, its output and encoded chunks: about 4x.
        let steps = (limit / (4 * across * itemsize).max(1)).max(1);
        // At least two copy tasks per thread, so a large budget still keeps every core busy.
        let spread = input.shape[axis].div_ceil(2 * threads.max(1) as u64).max(1);
        let steps = steps.min(spread);
        let unit = in_chunks[axis].max(1);
        let steps = (steps / unit).max(1) * unit;
        mid[axis] = steps.min(input.shape[axis]).max(1);
    }
    mid
}

/// Output chunk shape: the node's (transformed axes whole), its other axes halved, largest
/// first, until a task fits `limit`.
fn fitting_chunks(
    spec: &FftSpec,
    input: &Fused,
    out_shape: &[u64],
    natural: &[u64],
    out_dtype: DType,
    limit: u64,
    batch: u64,
) -> Result<Vec<u64>> {
    let axes = spec.axes();
    let leaf_itemsize = input
        .leaves
        .iter()
        .map(|l| l.dtype.size() as u64)
        .sum::<u64>()
        .max(1);
    let mut chunks = natural.to_vec();
    loop {
        let region = Region {
            start: vec![0; chunks.len()],
            shape: chunks
                .iter()
                .zip(out_shape)
                .map(|(c, n)| (*c).min(*n))
                .collect(),
        };
        let bytes = task_bytes(
            &spec.steps,
            &input.shape,
            &region,
            leaf_itemsize,
            spec.compute,
            out_dtype,
            batch,
        );
        if bytes <= limit {
            return Ok(chunks);
        }
        let widest = (0..chunks.len())
            .filter(|d| !axes.contains(d) && chunks[*d] > 1)
            .max_by_key(|d| chunks[*d]);
        match widest {
            Some(d) => chunks[d] = chunks[d].div_ceil(2),
            None => {
                return Err(Error::new(
                    crate::error::ErrorKind::Memory,
                    format!(
                        "one FFT lane group along axes {axes:?} needs {bytes} bytes, more than \
                         the budget allows ({limit} bytes per task): raise max_mem"
                    ),
                ))
            }
        }
    }
}

/// Bands of source `mat` for an FFT whose tasks compute output regions of `chunks` or of its
/// `natural` chunks (of an output of `out_shape`), when loading them costs less than spilling
/// a rechunked copy. A band must leave room beside it for the tasks that read it (one per
/// thread) and for the reads that load it.
fn bands_if_cheaper(
    spec: &FftSpec,
    mat: &Material,
    chunks: &[u64],
    natural: &[u64],
    out_shape: &[u64],
    out_dtype: DType,
    opts: PlanOptions,
) -> Option<LeafBand> {
    let MaterialOrigin::Source(arr) = &mat.origin else {
        return None;
    };
    let whole = Region::whole(&mat.shape);
    let read = input_region(&spec.steps, &mat.shape, &whole);
    // Consumers compute regions of the FFT's natural chunks (a write's chunks), which the
    // budget may have made the FFT's own chunks smaller than.
    let out = Region {
        start: vec![0; chunks.len()],
        shape: chunks
            .iter()
            .zip(natural)
            .zip(out_shape)
            .map(|((c, m), n)| (*c).max(*m).min(*n))
            .collect(),
    };
    // A task reading from the band holds its box, the transform, its output and the output
    // encoded, no reads.
    let task = task_bytes(
        &spec.steps,
        &mat.shape,
        &out,
        mat.dtype.size() as u64,
        spec.compute,
        out_dtype,
        0,
    ) + out.len() * out_dtype.size() as u64;
    let limit = room_for_band(task, mat.chunk_bytes(), opts)?;
    let (band, cost) = cheapest_bands(arr, &read, &spec.axes(), &out.shape, limit)?;
    (cost < 1.0 + SPILL_COST).then_some(band)
}

/// Plans the FFT of node `name`: a fused value that computes the transform wherever it is
/// consumed, region by region of a grid whose transformed axes are whole and whose other
/// axes fit the budget. Its input is read straight from a material when that costs one read
/// per chunk. When tasks would re-read the same chunks, the cheaper of two ways is taken:
/// holding a source in memory band by band (each band decoded once; see [`LeafBand`]), or
/// copying the input, bounded, into an intermediate chunked for the transform (always for a
/// fused expression). Bands are considered only with `may_band`: the transform's consumers
/// run as one compute stage, which can run band by band.
#[allow(clippy::too_many_arguments)]
pub fn plan_fft(
    materials: &mut Vec<Material>,
    stages_out: &mut Vec<Stage>,
    spec: &FftSpec,
    input: Fused,
    name: &str,
    out_shape: &[u64],
    out_dtype: DType,
    natural: &ChunkGrid,
    opts: PlanOptions,
    may_band: bool,
) -> Result<Fused> {
    let axes = spec.axes();
    // Two tasks at once keep IO and compute overlapped.
    let limit = (opts.budget / 2).max(1);
    let chunks = fitting_chunks(
        spec,
        &input,
        out_shape,
        &natural.chunk_shape(),
        out_dtype,
        limit,
        opts.batch_bytes,
    )?;
    let plain = input.plain_material();
    let direct = plain.filter(|&m| read_amplification(&materials[m].grid, &chunks, &axes) <= 1);
    let banded = match (direct, plain) {
        (None, Some(m)) if may_band => bands_if_cheaper(
            spec,
            &materials[m],
            &chunks,
            &natural.chunk_shape(),
            out_shape,
            out_dtype,
            opts,
        ),
        _ => None,
    };
    let mat = match (direct, banded, plain) {
        (Some(m), _, _) => m,
        (None, Some(_), Some(m)) => m,
        _ => {
            // Re-reading each input chunk from several tasks costs a decode each time; a
            // rechunked copy costs one decode plus a cheap intermediate.
            let mid_chunks = spill_chunks(spec, &input, &chunks, limit, opts.threads);
            let dtype = input.dtype();
            let shape = input.shape.clone();
            let label = format!("{name} input");
            // Shards of the copy's blocks: the copy writes a few large files, not one per
            // chunk (creating files costs more than writing them), and the transform reads
            // the inner chunks it needs by range.
            let mid_grid = ChunkGrid::regular(&shape, &mid_chunks)?;
            let block = super::rechunk::block_chunks(&input.grid, &mid_grid);
            let shards = super::rechunk::shard_shape(
                &mid_chunks,
                &block,
                dtype.size() as u64,
                crate::physical::cost::shard_bytes(opts.budget),
            );
            let mid =
                sharded_intermediate(materials, &label, &shape, dtype, &mid_chunks, Some(shards))?;
            plan_copy(materials, stages_out, input, mid, &label, opts)?;
            mid
        }
    };
    let grid = ChunkGrid::regular(out_shape, &chunks)?;
    let mut fused = Fused::fft(
        mat,
        LeafFft {
            steps: spec.steps.clone(),
            norm: spec.norm,
            compute: spec.compute,
            shape: out_shape.to_vec(),
        },
        out_dtype,
        grid,
    );
    fused.leaves[0].band = banded;
    Ok(fused)
}
