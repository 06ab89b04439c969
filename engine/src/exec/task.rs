//! What the scheduler runs: tasks that read batches of keys, process each batch on the
//! compute pool, and write results.

use std::sync::Arc;

use super::memory::Reservation;
use super::progress::Progress;
use crate::error::Result;
use crate::store::{ReadRequest, Store};

/// One read of a task.
#[derive(Clone)]
pub struct ReadOp {
    /// Where.
    pub store: Arc<dyn Store>,
    /// What.
    pub req: ReadRequest,
}

/// One write of a task: `value` `None` erases the key (a chunk equal to the fill value).
pub struct WriteOp {
    /// Where.
    pub store: Arc<dyn Store>,
    /// The key.
    pub key: String,
    /// The bytes, or `None` to erase.
    pub value: Option<Vec<u8>>,
    /// Set when `value` is one part of a value written in parts (see
    /// [`Store::write_part_async`]).
    pub part: Option<Part>,
}

/// Where a part goes in its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Byte offset of the part.
    pub offset: u64,
    /// The value's length, on the last part issued.
    pub total: Option<u64>,
}

impl WriteOp {
    /// Writes `value` whole at `key` (erases `key` for `None`).
    pub fn whole(store: Arc<dyn Store>, key: String, value: Option<Vec<u8>>) -> Self {
        WriteOp {
            store,
            key,
            value,
            part: None,
        }
    }

    /// Writes `bytes` as the part of `key`'s value at `part`.
    pub fn part(store: Arc<dyn Store>, key: String, bytes: Vec<u8>, part: Part) -> Self {
        WriteOp {
            store,
            key,
            value: Some(bytes),
            part: Some(part),
        }
    }
}

/// What a task's processor can use while it runs.
pub struct TaskContext<'a> {
    /// Run metrics.
    pub progress: &'a Progress,
    reservation: &'a mut Option<Reservation>,
}

impl<'a> TaskContext<'a> {
    /// A context over `progress` and the task's reservation.
    pub fn new(progress: &'a Progress, reservation: &'a mut Option<Reservation>) -> Self {
        TaskContext {
            progress,
            reservation,
        }
    }

    /// Splits `bytes` off the task's reservation for state that outlives the task.
    pub fn detach(&mut self, bytes: u64) -> Option<Reservation> {
        self.reservation.as_mut().map(|r| r.split(bytes))
    }

    /// More of the task's budget, `bytes` of it, for state that outlives the task, when the
    /// budget has room for them now (never waits).
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        self.reservation.as_ref()?.try_another(bytes)
    }

    /// Records decoded bytes for the metrics.
    pub fn add_decoded(&self, bytes: u64) {
        self.progress
            .decoded_bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The compute side of a task: called once per read batch, in order, then once at the end.
pub trait Processor: Send {
    /// Processes read batch `batch` (values in request order, `None` for missing keys).
    fn process(
        &mut self,
        batch: usize,
        data: Vec<Option<crate::store::Value>>,
        ctx: &mut TaskContext,
    ) -> Result<Vec<WriteOp>>;

    /// Finishes after the last batch.
    fn finish(self: Box<Self>, ctx: &mut TaskContext) -> Result<Vec<WriteOp>>;

    /// Told before the task starts, in a resumed run, which of its output keys exist
    /// already: processors that can leave those chunks alone do.
    fn keep_existing(&mut self, _existing: &std::collections::HashSet<String>) {}

    /// Bytes that other tasks of the same stage may hold after they end (detached from their
    /// reservations, such as a reduction's partial results waiting to be merged) while this
    /// task waits to start, at most: the budget must hold them and this task at once.
    fn held_by_others(&self) -> u64 {
        0
    }
}

/// A unit of scheduling.
pub struct Task {
    /// For progress and errors (`"sum of y: output chunk 0.0, inputs 0..16"`).
    pub label: String,
    /// Projected peak bytes, reserved before the task starts.
    pub memory: u64,
    /// Read batches; batch `i + 1` is prefetched while batch `i` is processed.
    pub batches: Vec<Vec<ReadOp>>,
    /// The compute.
    pub processor: Box<dyn Processor>,
    /// The chunk keys the task writes, all in one output store; a resumed run skips a task
    /// whose keys all exist. Empty for tasks that are never skipped (reductions).
    pub outputs: Vec<String>,
    /// Which part of its stage the task belongs to, numbered from 0 in task order. The
    /// tasks of one part run together, in one process (a reduction's groups for one output
    /// chunk merge their partial results in memory); different parts may run apart.
    pub part: usize,
}
