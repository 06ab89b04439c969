//! Small arrays that many tasks of a stage read are read and decoded once and shared.
//!
//! An anomaly subtracts the time mean from every time step: without sharing, each of the
//! stage's tasks reads and decodes the whole mean again (as many decodes of it as there are
//! time steps). A leaf array that is small next to the value it feeds is instead loaded by
//! one task before the stage starts, held in memory against the budget while the stage
//! runs, and read in place by every task ([`ZarrArray::resident`]).

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::memory::Reservation;
use super::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::array::buffer::copy_region;
use crate::array::{Buffer, Region};
use crate::error::{Error, Result};
use crate::optimize::fuse::Fused;
use crate::store::{ReadRequest, Value};
use crate::zarr::ZarrArray;

/// Arrays held in memory for one stage; dropping this releases them and their budget.
#[derive(Default)]
pub struct SharedLeaves {
    arrays: Vec<Arc<ZarrArray>>,
    held: Arc<Mutex<Vec<Reservation>>>,
}

impl Drop for SharedLeaves {
    fn drop(&mut self) {
        for arr in &self.arrays {
            arr.set_resident(None);
        }
    }
}

impl SharedLeaves {
    /// True when no array is held.
    pub fn is_empty(&self) -> bool {
        self.arrays.is_empty()
    }
}

/// Decoded bytes of the whole of `arr`.
fn array_bytes(arr: &ZarrArray) -> u64 {
    arr.shape().iter().product::<u64>() * arr.dtype().size() as u64
}

/// The leaf arrays of `fused` worth sharing, within `limit` bytes in all: plain (not FFT)
/// leaves of a value with several leaves, each at most a quarter of the value's size, so that
/// the stage's tasks would read each of their chunks several times.
pub fn worth_sharing(fused: &Fused, arrays: &[Arc<ZarrArray>], limit: u64) -> Vec<usize> {
    if fused.leaves.len() < 2 {
        return Vec::new();
    }
    let value_bytes = fused.shape.iter().product::<u64>() * fused.dtype().size() as u64;
    let mut chosen: Vec<usize> = Vec::new();
    let mut total = 0u64;
    for leaf in &fused.leaves {
        let bytes = array_bytes(&arrays[leaf.mat]);
        if leaf.fft.is_some()
            || chosen.contains(&leaf.mat)
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

/// The tasks that load `mats` (reads in batches of about `batch_bytes`), and the handle that
/// holds them once the tasks have run.
pub fn load_tasks(
    mats: &[usize],
    arrays: &[Arc<ZarrArray>],
    batch_bytes: u64,
) -> (Vec<Task>, SharedLeaves) {
    let shared = SharedLeaves {
        arrays: mats.iter().map(|&m| arrays[m].clone()).collect(),
        held: Arc::default(),
    };
    let tasks = shared
        .arrays
        .iter()
        .map(|arr| load_task(arr.clone(), shared.held.clone(), batch_bytes))
        .collect();
    (tasks, shared)
}

fn load_task(arr: Arc<ZarrArray>, held: Arc<Mutex<Vec<Reservation>>>, batch_bytes: u64) -> Task {
    let chunks = arr.grid().chunk_indices();
    let chunk_bytes = |c: &Vec<u64>| arr.grid().chunk_region(c).len() * arr.dtype().size() as u64;
    let largest = chunks.iter().map(chunk_bytes).max().unwrap_or(0);
    let per_batch = (batch_bytes / largest.max(1)).max(1) as usize;
    let groups: Vec<Vec<Vec<u64>>> = chunks.chunks(per_batch).map(|g| g.to_vec()).collect();
    let batches = groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|c| ReadOp {
                    store: arr.store().clone(),
                    req: ReadRequest::whole(arr.chunk_key(c)),
                })
                .collect()
        })
        .collect();
    let bytes = array_bytes(&arr);
    // The array, and two batches of chunks (one read ahead) decoded and encoded.
    let memory = bytes + 4 * per_batch as u64 * largest;
    Task {
        label: format!("loading {} to share it", arr.url()),
        memory,
        batches,
        outputs: Vec::new(),
        processor: Box::new(LoadProcessor {
            arr,
            groups,
            values: None,
            held,
        }),
    }
}

struct LoadProcessor {
    arr: Arc<ZarrArray>,
    groups: Vec<Vec<Vec<u64>>>,
    values: Option<Buffer>,
    held: Arc<Mutex<Vec<Reservation>>>,
}

impl Processor for LoadProcessor {
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        let arr = &self.arr;
        let chunks = &self.groups[batch];
        let decoded: Vec<Result<Buffer>> = data
            .into_par_iter()
            .zip(chunks.par_iter())
            .map(|(bytes, idx)| arr.decode_chunk(idx, bytes))
            .collect();
        let shape = arr.shape();
        let whole = Region {
            start: vec![0; shape.len()],
            shape,
        };
        let values = self
            .values
            .get_or_insert_with(|| Buffer::zeros(arr.dtype(), whole.len() as usize));
        for (buf, idx) in decoded.into_iter().zip(chunks) {
            let buf = buf?;
            ctx.add_decoded(buf.bytes().len() as u64);
            let region = arr.grid().chunk_region(idx);
            copy_region(
                buf.bytes(),
                &region,
                values.bytes_mut(),
                &whole,
                &region,
                arr.dtype().size(),
            );
        }
        Ok(Vec::new())
    }

    fn finish(self: Box<Self>, ctx: &mut TaskContext) -> Result<Vec<WriteOp>> {
        let values = match self.values {
            Some(v) => v,
            None => Buffer::zeros(
                self.arr.dtype(),
                self.arr.shape().iter().product::<u64>() as usize,
            ),
        };
        if let Some(r) = ctx.detach(array_bytes(&self.arr)) {
            self.held
                .lock()
                .map_err(|_| Error::internal("shared leaves lock poisoned"))?
                .push(r);
        }
        self.arr.set_resident(Some(Arc::new(values)));
        Ok(Vec::new())
    }
}
