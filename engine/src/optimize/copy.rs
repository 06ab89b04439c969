//! Copy planning: the stages that copy (and compute) a fused value into a material, in blocks
//! when they fit the budget, as encoder streams, from a source held band by band, through a
//! sharded intermediate, or chunk by chunk.

use super::materials::sharded_intermediate;
use super::{bands, rechunk};
use crate::array::ChunkGrid;
use crate::error::Result;
use crate::physical::cost::{block_task_bytes, shard_bytes};
use crate::physical::fused::{Fused, MatId};
use crate::physical::material::{Material, MaterialOrigin};
use crate::physical::options::PlanOptions;
use crate::physical::stage::Stage;
use crate::zarr::{Codec, ZarrArray};

/// Most passes over the input a stream copy may take (one per group of output chunks): each
/// decodes the input again, and already two cost more than an intermediate array (ERA5
/// rechunk at 400–600 MB: 6.4–7.1 s in two passes, 5.9 s through an intermediate, 5.0–5.5 s
/// in one pass at 1 GB).
const MAX_STREAM_PASSES: u64 = 1;

/// Most decoded input a stream copy's batch holds, in multiples of the usual batch: each
/// stream takes the rows of a whole batch at once, and the more rows, the less its encoder's
/// tables and window are fetched back into cache per row (ERA5 rechunk: 16 rows per batch
/// cost about 10% more time than 64).
const MAX_STREAM_BATCHES: u64 = 4;

/// The group shape, per-stream bytes, batch bytes and codec of a stream copy of `src` into target
/// `out`, when
/// `src` is a plain copy of one array whose chunks hold whole output chunks along every axis
/// but the first, the target is unsharded Zarr v3 in a store that writes values in parts
/// with a codec that streams (zstd or none), and the streams fit `limit` in at most
/// [`MAX_STREAM_PASSES`] groups per row of output chunks.
fn stream_plan(
    materials: &[Material],
    src: &Fused,
    out: MatId,
    batch: u64,
    limit: u64,
) -> Option<(Vec<u64>, u64, u64, Codec)> {
    use crate::physical::cost;
    let mat = &materials[out];
    let MaterialOrigin::Target { url, spec, .. } = &mat.origin else {
        return None;
    };
    // A region write merges the target chunks it covers in part: no streams.
    if !crate::store::writes_in_parts(url) || spec.region.is_some() {
        return None;
    }
    // A target already there (Cubed creates its arrays) streams as its own codecs allow.
    let codec = if spec.existing {
        let store = crate::store::open_store(url, 1).ok()?;
        ZarrArray::open(store).ok()?.stream_codec()?
    } else if spec.shards.is_none() && spec.zarr_format == 3 {
        spec.codec.clone()
    } else {
        return None;
    };
    let [leaf] = src.leaves.as_slice() else {
        return None;
    };
    if !leaf.is_plain() || src.plain_leaf(mat.dtype).is_none() {
        return None;
    }
    if !cost::rows_of_single_chunks(&materials[leaf.mat].grid, &mat.grid) {
        return None;
    }
    let chunk_bytes = mat.chunk_bytes();
    let stream_bytes = match &codec {
        Codec::None => 0,
        Codec::Zstd { level } => crate::zarr::stream::zstd_stream_bytes(*level, chunk_bytes)?,
        _ => return None,
    };
    // A batch holds at least one input chunk along the first axis across the group: at most
    // a whole slab of the array that thick.
    let input = &materials[leaf.mat].grid;
    let slab = input.axes()[0].max_size()
        * mat.shape[1..].iter().product::<u64>()
        * materials[leaf.mat].dtype.size() as u64;
    let batch = batch.max(slab);
    let per_stream = cost::task_bytes(1, stream_bytes, chunk_bytes, 0);
    let streams = limit.checked_sub(cost::task_bytes(0, 0, 0, batch))? / per_stream;
    if streams == 0 {
        return None;
    }
    let group = cost::group_shape(&mat.grid, streams);
    let per_row: u64 = mat.grid.grid_shape()[1..].iter().product();
    let per_group: u64 = group.iter().product();
    if per_row.div_ceil(per_group.max(1)) > MAX_STREAM_PASSES {
        return None;
    }
    // Larger batches where the budget has room beside the streams.
    let room = limit.saturating_sub(cost::task_bytes(per_group, stream_bytes, chunk_bytes, 0));
    let batch_bytes = (room / 3).clamp(batch, MAX_STREAM_BATCHES * batch);
    Some((group, stream_bytes, batch_bytes, codec))
}

/// `src`, a plain copy of a source, read from the source held in memory band by band (see
/// [`LeafBand`](crate::physical::fused::LeafBand)) when the bands fit the budget and cost less than the other
/// way to copy it: a stream copy encoding with `stream` (see [`bands::most_band_cost`]: the
/// source's first chunk tells how compressible its values are), or else an intermediate
/// array.
fn banded_copy(
    materials: &[Material],
    src: &Fused,
    out: MatId,
    stream: Option<&Codec>,
    opts: PlanOptions,
) -> Option<Fused> {
    let mat = src.plain_material()?;
    let leaf = src.plain_leaf(materials[out].dtype)?;
    let MaterialOrigin::Source(arr) = &materials[mat].origin else {
        return None;
    };
    let compression = stream.and_then(|_| arr.sampled_compression());
    let most = bands::most_band_cost(stream, compression)?;
    // A task holds its output chunk's values and the chunk encoded.
    let task = 3 * materials[out].chunk_bytes();
    let room = bands::room_for_band(task, materials[mat].chunk_bytes(), opts)?;
    let out_chunks = materials[out].grid.chunk_shape();
    let (band, cost) = bands::copy_bands(arr, &out_chunks, room)?;
    if cost > most {
        return None;
    }
    let mut banded = src.clone();
    banded.leaves[leaf].band = Some(band);
    Some(banded)
}

/// Plans the stages that copy (and compute) `src` into material `out`: one stage of blocks
/// when a block fits the budget, else through an intermediate, else chunk by chunk.
pub(super) fn plan_copy(
    materials: &mut Vec<Material>,
    stages: &mut Vec<Stage>,
    src: Fused,
    out: MatId,
    name: &str,
    opts: PlanOptions,
) -> Result<()> {
    let out_grid = materials[out].grid.clone();
    let itemsize = materials[out].dtype.size() as u64;
    let in_itemsize = leaf_itemsize(&src);
    let plain = src.plain_leaf(materials[out].dtype).is_some();
    let in_chunk_bytes = src.grid.chunk_shape().iter().product::<u64>().max(1) * in_itemsize;
    let sizes = CopySizes {
        itemsize,
        in_itemsize,
        batch: opts.batch_bytes.max(in_chunk_bytes),
        threads: opts.threads,
    };
    let limit = opts.budget;
    let ones = vec![1u64; out_grid.rank()];
    let label = format!("write {name}");
    // Chunk-aligned outputs (each output chunk inside one input chunk, or equal): no blocks needed.
    let block = rechunk::block_chunks(&src.grid, &out_grid);
    if block == ones || sizes.task_bytes(&out_grid, &block, in_itemsize, plain) <= limit {
        let block = rechunk::spread_block(&out_grid, block, opts.spread);
        stages.push(Stage::Compute {
            input: src,
            out,
            block,
            label,
        });
        return Ok(());
    }
    // Output chunks that each gather rows of many input chunks: encoded as streams (each
    // input chunk decoded once, no intermediate), or at once from the source held in memory
    // band by band, whichever costs less.
    let stream = stream_plan(materials, &src, out, sizes.batch, limit);
    if let Some(banded) = banded_copy(materials, &src, out, stream.as_ref().map(|s| &s.3), opts) {
        stages.push(Stage::Compute {
            input: banded,
            out,
            block: ones,
            label,
        });
        return Ok(());
    }
    if let Some((group, stream_bytes, batch_bytes, _)) = stream {
        stages.push(Stage::Stream {
            input: src,
            out,
            group,
            stream_bytes,
            batch_bytes,
            label: format!("{label} (streamed)"),
        });
        return Ok(());
    }
    let shape = materials[out].shape.clone();
    if let Some(two) = two_stages(&src, &out_grid, &shape, sizes, plain, limit)? {
        let dtype = materials[out].dtype;
        // Stored in shards of stage 1's blocks (a few files rather than one per chunk);
        // stage 1 writes whole shards, stage 2 reads inner chunks.
        let shards = rechunk::shard_shape(&two.chunks, &two.b1, itemsize, shard_bytes(opts.budget));
        let b1_shards: Vec<u64> = two
            .b1
            .iter()
            .zip(&shards)
            .zip(&two.chunks)
            .map(|((b, s), c)| b / (s / c).max(1))
            .collect();
        let mid = sharded_intermediate(materials, name, &shape, dtype, &two.chunks, Some(shards))?;
        stages.push(Stage::Compute {
            input: src,
            out: mid,
            block: b1_shards,
            label: format!("{label} (stage 1 of 2)"),
        });
        let mid_fused = Fused::material(mid, &shape, dtype, two.grid);
        stages.push(Stage::Compute {
            input: mid_fused,
            out,
            block: two.b2,
            label: format!("{label} (stage 2 of 2)"),
        });
        return Ok(());
    }
    // Chunk by chunk: each output chunk reads the input chunks it overlaps.
    stages.push(Stage::Compute {
        input: src,
        out,
        block: ones,
        label,
    });
    Ok(())
}

/// Bytes per output element of `src`'s leaf buffers; an FFT leaf also holds its complex
/// blocks before and after each step (as `RegionRead::leaf_bytes` counts them).
fn leaf_itemsize(src: &Fused) -> u64 {
    src.leaves
        .iter()
        .map(|l| {
            let own = l.dtype.size() as u64;
            match &l.fft {
                Some(f) => own + 3 * f.compute.to_complex().size() as u64,
                None => own,
            }
        })
        .sum::<u64>()
        .max(1)
}

/// The sizes a copy's task bytes depend on.
#[derive(Debug, Clone, Copy)]
struct CopySizes {
    /// Bytes per output element.
    itemsize: u64,
    /// Bytes per output element of the source's leaf buffers.
    in_itemsize: u64,
    /// Bytes of reads per batch.
    batch: u64,
    /// Compute threads.
    threads: usize,
}

impl CopySizes {
    /// Bytes a task writing `block` chunks of `grid` holds, reading `in_size` bytes per element
    /// (`plain`: a plain copy).
    fn task_bytes(&self, grid: &ChunkGrid, block: &[u64], in_size: u64, plain: bool) -> u64 {
        block_task_bytes(
            rechunk::block_elements(grid, block),
            grid.chunk_shape().iter().product::<u64>().max(1),
            self.itemsize,
            in_size,
            plain,
            self.batch,
            self.threads,
        )
    }
}

/// An intermediate for a copy in two stages: its chunks and grid, and each stage's blocks.
struct TwoStages {
    chunks: Vec<u64>,
    grid: ChunkGrid,
    b1: Vec<u64>,
    b2: Vec<u64>,
}

/// Two stages through an intermediate whose chunks keep both blocks small, when both fit
/// `limit`.
fn two_stages(
    src: &Fused,
    out_grid: &ChunkGrid,
    shape: &[u64],
    sizes: CopySizes,
    plain: bool,
    limit: u64,
) -> Result<Option<TwoStages>> {
    let per_elem = 2 * sizes.itemsize + sizes.in_itemsize;
    let max_block = (limit.saturating_sub(2 * sizes.batch) / per_elem).max(1);
    let src_chunks = src.grid.chunk_shape();
    let out_chunks = out_grid.chunk_shape();
    let chunks = rechunk::intermediate_chunks(&src_chunks, &out_chunks, shape, max_block);
    let grid = ChunkGrid::regular(shape, &chunks)?;
    let b1 = rechunk::block_chunks(&src.grid, &grid);
    let b2 = rechunk::block_chunks(&grid, out_grid);
    let fits = sizes.task_bytes(&grid, &b1, sizes.in_itemsize, plain) <= limit
        && sizes.task_bytes(out_grid, &b2, sizes.itemsize, true) <= limit;
    Ok(fits.then_some(TwoStages {
        chunks,
        grid,
        b1,
        b2,
    }))
}
