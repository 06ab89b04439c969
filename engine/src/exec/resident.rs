//! Small arrays that many tasks of a stage read are read and decoded once and shared.
//!
//! An anomaly subtracts the time mean from every time step: without sharing, each of the
//! stage's tasks reads and decodes the whole mean again (as many decodes of it as there are
//! time steps). A leaf array that is small next to the value it feeds is instead loaded by
//! one task before the stage starts, held in memory against the budget while the stage
//! runs, and read in place by every task ([`Held::resident`]).

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::held::{Held, Materials};
use super::memory::Reservation;
use super::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::array::{Buffer, ChunkGrid, Region};
use crate::error::{Error, Result};
use crate::physical::fused::{Fused, Leaf};
use crate::physical::stage::Stage;
use crate::read::Destination;
use crate::store::Value;
use crate::zarr::ZarrArray;

/// Arrays held in memory for one stage; dropping this releases them and their budget.
#[derive(Default)]
pub struct SharedLeaves {
    holds: Vec<Arc<Held>>,
    held: Arc<Mutex<Vec<Reservation>>>,
}

impl Drop for SharedLeaves {
    fn drop(&mut self) {
        for h in &self.holds {
            h.set_resident(None);
        }
    }
}

impl SharedLeaves {
    /// True when no array is held.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }
}

/// Decoded bytes of the whole of `arr`.
fn array_bytes(arr: &ZarrArray) -> u64 {
    arr.shape().iter().product::<u64>() * arr.dtype().size() as u64
}

/// The leaf arrays of `fused` worth sharing, within `limit` bytes in all: plain (not FFT)
/// leaves of a value with several leaves, each at most a quarter of the value's size, so that
/// the stage's tasks would read each of their chunks several times.
pub fn worth_sharing(fused: &Fused, arrays: &Materials, limit: u64) -> Vec<usize> {
    if fused.leaves.len() < 2 {
        return Vec::new();
    }
    let value_bytes = fused.shape.iter().product::<u64>() * fused.dtype().size() as u64;
    let mut chosen: Vec<usize> = Vec::new();
    let mut total = 0u64;
    for leaf in &fused.leaves {
        let bytes = array_bytes(&arrays[leaf.mat]);
        if !leaf.is_plain()
            || chosen.contains(&leaf.mat)
            || arrays.held(leaf.mat).resident().is_some()
            || bytes.saturating_mul(4) > value_bytes
            || total + bytes > limit
        {
            continue;
        }
        total += bytes;
        chosen.push(leaf.mat);
    }
    chosen
}

/// The tasks that load `mats` whole (reads in batches of about `batch_bytes`), and the handle
/// that holds them once the tasks have run.
pub fn load_tasks(
    mats: &[usize],
    arrays: &Materials,
    batch_bytes: u64,
) -> Result<(Vec<Task>, SharedLeaves)> {
    let shared = SharedLeaves {
        holds: mats.iter().map(|&m| arrays.held(m).clone()).collect(),
        held: Arc::default(),
    };
    let tasks = mats
        .iter()
        .map(|&m| {
            let arr = &arrays[m];
            let whole = Region::whole(&arr.shape());
            let label = format!("loading {} to share it", arr.url());
            region_task(
                (arr.clone(), arrays.held(m).clone()),
                whole,
                Holder::Whole,
                shared.held.clone(),
                batch_bytes,
                None,
                label,
            )
        })
        .collect::<Result<_>>()?;
    Ok((tasks, shared))
}

/// Materials that stage `at` of `stages` reads chunk by chunk (through plain leaves, or as
/// parts of joined leaves) and that later stages read the same way again before anything
/// writes them, each with the last of those stages: their chunks kept from stage `at` through
/// that one (see `exec::chunk_cache`), they are read and decoded once instead of once per
/// stage (an anomaly's input, read for its mean and again to subtract it; a groupby's input,
/// read once per group). A copy stage that reads a material ends its run of readers: it reads
/// chunks itself.
pub fn read_again(stages: &[Stage], at: usize) -> Vec<(usize, usize)> {
    let Some(stage) = stages.get(at) else {
        return Vec::new();
    };
    let reads = |input: &Fused, mat: usize| {
        input
            .leaves
            .iter()
            .any(|l| l.mat == mat || chunk_read_mats(l).any(|m| m == mat))
    };
    let chunk_reads = |s: &Stage, mat: usize| match s {
        Stage::Stream { .. } => false,
        Stage::Compute { input, .. } | Stage::Reduce { input, .. } => input
            .leaves
            .iter()
            .any(|l| chunk_read_mats(l).any(|m| m == mat)),
    };
    let writes = |s: &Stage, mat: usize| match s {
        Stage::Compute { out, .. } | Stage::Stream { out, .. } | Stage::Reduce { out, .. } => {
            *out == mat
        }
    };
    let mut mats: Vec<usize> = Vec::new();
    if let Stage::Compute { input, .. } | Stage::Reduce { input, .. } = stage {
        for mat in input.leaves.iter().flat_map(chunk_read_mats) {
            if !mats.contains(&mat) {
                mats.push(mat);
            }
        }
    }
    mats.into_iter()
        .filter_map(|mat| {
            let mut last = None;
            for (i, s) in stages.iter().enumerate().skip(at + 1) {
                if writes(s, mat) || matches!(s, Stage::Stream { input, .. } if reads(input, mat)) {
                    break;
                }
                if chunk_reads(s, mat) {
                    last = Some(i);
                }
            }
            last.map(|l| (mat, l))
        })
        .collect()
}

/// The materials whose decoded chunks `leaf` reads as they are: its own (a plain leaf), its
/// parts' (a joined leaf), none (an FFT's).
fn chunk_read_mats(leaf: &Leaf) -> impl Iterator<Item = usize> + '_ {
    let plain = leaf.is_plain().then_some(leaf.mat);
    let parts = match (&leaf.concat, &leaf.fft) {
        (Some(c), None) => c.parts.as_slice(),
        _ => &[],
    };
    plain.into_iter().chain(parts.iter().map(|p| p.mat))
}

/// Where a loaded region goes once its task has run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// The whole array, for every reader ([`Held::resident`]).
    Whole,
    /// A band, for an FFT stage ([`Held::band`]).
    Band,
}

/// A band of one array held in memory for a stage's FFT tasks (see
/// [`LeafBand`](crate::physical::fused::LeafBand)); dropping this releases it and its budget.
pub struct SharedBand {
    holds: Arc<Held>,
    held: Arc<Mutex<Vec<Reservation>>>,
}

impl SharedBand {
    /// Lets the band go, handing back its memory for the next band when no reader holds it
    /// any more.
    pub fn release(self) -> Option<Vec<u8>> {
        let band = self.holds.band();
        self.holds.set_band(None);
        drop(self);
        band.and_then(|(_, values)| Arc::try_unwrap(values).ok())
            .map(Buffer::into_bytes)
    }
}

impl Drop for SharedBand {
    fn drop(&mut self) {
        self.holds.set_band(None);
        if let Ok(mut held) = self.held.lock() {
            held.clear();
        }
    }
}

/// `chunks` of `grid` (of `itemsize`-byte values) in read batches of about `batch_bytes`
/// decoded (at least one chunk each), and the bytes two batches (one read ahead) hold read and
/// decoded.
fn batch_groups(
    grid: &ChunkGrid,
    chunks: Vec<Vec<u64>>,
    itemsize: u64,
    batch_bytes: u64,
) -> (Vec<Vec<Vec<u64>>>, u64) {
    let largest = chunks
        .iter()
        .map(|c| grid.chunk_region(c).len() * itemsize)
        .max()
        .unwrap_or(0);
    let per_batch = (batch_bytes / largest.max(1)).max(1);
    let groups = chunks
        .chunks(per_batch as usize)
        .map(|g| g.to_vec())
        .collect();
    (groups, 4 * per_batch * largest)
}

/// Bytes the task that loads `band` of `arr` (see [`band_task`]) holds: the band, and two
/// batches of about `batch_bytes` of chunks (one read ahead) read and decoded.
pub fn band_task_memory(arr: &ZarrArray, band: &Region, batch_bytes: u64) -> u64 {
    let grid = arr.read_grid();
    let itemsize = arr.dtype().size() as u64;
    let (_, loading) = batch_groups(grid, grid.chunks_overlapping(band), itemsize, batch_bytes);
    band.len() * itemsize + loading
}

/// The task that loads `band` of `arr` (reads in batches of about `batch_bytes`, each chunk
/// decoded only as far as the band reaches in it where the codec allows), and the handle that
/// holds it once the task has run. The band's values go into `spare` (a previous band's
/// memory) when it is large enough.
pub fn band_task(
    (arr, holds): (Arc<ZarrArray>, Arc<Held>),
    band: Region,
    batch_bytes: u64,
    spare: Option<Vec<u8>>,
) -> Result<(Task, SharedBand)> {
    let held: Arc<Mutex<Vec<Reservation>>> = Arc::default();
    let label = format!("loading {:?} of {} for its FFT", band, arr.url());
    let task = region_task(
        (arr, holds.clone()),
        band,
        Holder::Band,
        held.clone(),
        batch_bytes,
        spare,
        label,
    )?;
    Ok((task, SharedBand { holds, held }))
}

/// The task that loads `region` of `arr` for `holder` (see [`band_task`]), its reservation
/// kept in `held`.
fn region_task(
    (arr, holds): (Arc<ZarrArray>, Arc<Held>),
    band: Region,
    holder: Holder,
    held: Arc<Mutex<Vec<Reservation>>>,
    batch_bytes: u64,
    spare: Option<Vec<u8>>,
    label: String,
) -> Result<Task> {
    let grid = arr.read_grid();
    let itemsize = arr.dtype().size() as u64;
    let (groups, loading) =
        batch_groups(grid, grid.chunks_overlapping(&band), itemsize, batch_bytes);
    let batches = groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|c| {
                    Ok(ReadOp {
                        store: arr.store().clone(),
                        req: arr.read_request(c)?,
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let memory = band.len() * itemsize + loading;
    let band_bytes = (band.len() * itemsize) as usize;
    let values = spare
        .filter(|v| v.capacity() >= band_bytes)
        .map(|mut v| {
            v.resize(band_bytes, 0);
            Buffer::from_bytes(arr.dtype(), v)
        })
        .transpose()?;
    let task = Task {
        label,
        memory,
        batches,
        outputs: Vec::new(),
        part: 0,
        processor: Box::new(BandProcessor {
            arr,
            holds,
            band,
            holder,
            groups,
            values,
            held,
        }),
    };
    Ok(task)
}

struct BandProcessor {
    arr: Arc<ZarrArray>,
    /// Where the loaded values are held.
    holds: Arc<Held>,
    band: Region,
    holder: Holder,
    groups: Vec<Vec<Vec<u64>>>,
    values: Option<Buffer>,
    held: Arc<Mutex<Vec<Reservation>>>,
}

/// The decoded values of read unit `idx` of `arr` over `region`, at least as far (in C
/// order) as `part` reaches: only that prefix when the codec allows and it saves enough.
fn decode_to_part(
    arr: &ZarrArray,
    idx: &[u64],
    region: &Region,
    part: &Region,
    bytes: Option<Value>,
) -> Result<Vec<u8>> {
    if std::ptr::eq(arr.read_grid(), arr.grid()) {
        let prefix = region.c_prefix_len(part) as usize * arr.dtype().size();
        arr.decode_chunk_through(idx, bytes, prefix)
    } else {
        Ok(arr.decode_read(idx, bytes)?.into_bytes())
    }
}

/// Where in the band `part` of chunk `region` of `arr` goes, when the chunk's values decode
/// straight into it: `part` is the chunk's first values in C order (all of them, or a head
/// that ends where the band does) and one run of the band. A band taken from the rows at the
/// start of each chunk so skips the copy from a decoded chunk into the band.
fn head_in_band(
    dest: &Destination,
    arr: &ZarrArray,
    region: &Region,
    part: &Region,
    elem: usize,
) -> Option<*mut u8> {
    let head = std::ptr::eq(arr.read_grid(), arr.grid())
        && part.start == region.start
        && region.c_prefix_len(part) == part.len();
    if !head {
        return None;
    }
    dest.contiguous(0, part, elem)
}

impl Processor for BandProcessor {
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let arr = &self.arr;
        let band = &self.band;
        let grid = arr.read_grid();
        let chunks = &self.groups[batch];
        let elem = arr.dtype().size();
        let values = self
            .values
            .get_or_insert_with(|| Buffer::for_overwrite(arr.dtype(), band.len() as usize));
        let band_bytes = values.bytes().len();
        let dest = Destination::over(values.bytes_mut(), band_bytes, vec![band.clone()]);
        // Each chunk is decoded and copied into its own part of the band by one job.
        let decoded: Vec<Result<u64>> = data
            .into_par_iter()
            .zip(chunks.par_iter())
            .map(|(bytes, idx)| {
                let region = grid.chunk_region(idx);
                let part = region
                    .intersect(band)
                    .ok_or_else(|| Error::internal("band chunk outside the band"))?;
                if let Some(at) = head_in_band(&dest, arr, &region, &part, elem) {
                    // SAFETY: `head_in_band` checked that the run of `part.len()` values lies
                    // inside the band, and only this job writes them (see `Destination`).
                    let slot =
                        unsafe { std::slice::from_raw_parts_mut(at, part.len() as usize * elem) };
                    return Ok(arr.decode_chunk_head_into(idx, bytes, slot)? as u64);
                }
                let values = decode_to_part(arr, idx, &region, &part, bytes)?;
                dest.copy_from(0, &region, &part, &values, elem);
                let n = values.len() as u64;
                crate::array::pool::give(values);
                Ok(n)
            })
            .collect();
        for n in decoded {
            ctx.add_decoded(n?);
        }
        Ok(Vec::new())
    }

    fn finish(self: Box<Self>, ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        let bytes = self.band.len() * self.arr.dtype().size() as u64;
        let values = match self.values {
            Some(v) => v,
            None => Buffer::filled(
                self.arr.dtype(),
                self.band.len() as usize,
                self.arr.fill_bytes(),
            ),
        };
        if let Some(r) = ctx.detach(bytes) {
            self.held
                .lock()
                .map_err(|_| Error::internal("shared band lock poisoned"))?
                .push(r);
        }
        match self.holder {
            Holder::Whole => self.holds.set_resident(Some(Arc::new(values))),
            Holder::Band => self.holds.set_band(Some((self.band, Arc::new(values)))),
        }
        Ok(Vec::new())
    }
}
