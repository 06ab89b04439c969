//! The scheduler: admits tasks in order while their projected memory fits the budget, runs
//! IO on the stores' IO threads and compute on the rayon pool, and never blocks a compute
//! thread on IO.
//!
//! A task moves through: reserve → read batch 0 (and prefetch batch 1) → process batch 0 on
//! rayon → read batch 2 while processing batch 1 → … → finish → write → release. Callbacks
//! carry it from one stage to the next; the dispatching thread only waits for budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

mod shared;

use self::shared::{Computing, Shared};
use super::memory::{Budget, Reservation};
use super::progress::Progress;
use super::task::{Processor, ReadOp, Task, TaskContext, WriteOp};
use crate::error::{Error, Result};
use crate::store::{ReadRequest, Store};

/// Runs stages of tasks.
pub struct Scheduler {
    pool: Arc<rayon::ThreadPool>,
    budget: Arc<Budget>,
    progress: Arc<Progress>,
    cancel: Arc<AtomicBool>,
}

struct Running {
    label: String,
    processor: Option<Box<dyn Processor>>,
    batches: Vec<Option<Vec<ReadOp>>>,
    n_batches: usize,
    arrived: HashMap<usize, Vec<Option<crate::store::Value>>>,
    next: usize,
    busy: bool,
    processed_all: bool,
    writes_pending: usize,
    /// Writes the last processed batch issued: the next batch waits until no more than these
    /// are pending, so a task holds at most two batches' encoded output.
    write_allowance: usize,
    reservation: Option<Reservation>,
    ended: bool,
    /// Ended while writes were in flight: the stage waits for them (a write cut off when
    /// the run returns would leave its temporary file behind) and counts the task finished
    /// when the last one lands.
    finish_when_written: bool,
}

type TaskRef = Arc<Mutex<Running>>;

/// The reads of one batch that go to one store: positions in the batch, and requests.
type StoreGroup = (Arc<dyn Store>, Vec<usize>, Vec<ReadRequest>);

struct Ctx {
    pool: Arc<rayon::ThreadPool>,
    progress: Arc<Progress>,
    shared: Arc<Shared>,
    cancel: Arc<AtomicBool>,
    /// The tasks started (those ended drop out as their last reference goes), so Ctrl-C can
    /// end the ones that only wait for reads.
    started: Mutex<Vec<Weak<Mutex<Running>>>>,
}

impl Scheduler {
    /// A scheduler with `threads` compute threads (all cores when 0) and a `budget`.
    pub fn new(
        threads: usize,
        budget: Arc<Budget>,
        progress: Arc<Progress>,
        cancel: Arc<AtomicBool>,
    ) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("chunkfuse-compute-{i}"))
            .build()
            .map_err(|e| Error::internal(format!("cannot start compute threads: {e}")))?;
        Ok(Scheduler {
            pool: Arc::new(pool),
            budget,
            progress,
            cancel,
        })
    }

    /// Number of compute threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Most tasks in flight at once.
    fn max_in_flight(&self) -> usize {
        2 * self.threads() + 2
    }

    /// The memory budget.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The metrics.
    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Runs `f` on the compute pool and waits (for work outside tasks, such as planning).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Runs every task of a stage and returns when all have finished, or the first error
    /// once every started task has stopped.
    ///
    /// Ctrl-C (the cancel flag) stops the stage within a fraction of a second: a watcher ends
    /// the tasks that only wait for reads (a server that accepted the connection and never
    /// answers cannot hold the run), tasks computing finish their batch and stop (the stage
    /// returns only once none computes), and writes still in flight get [`WRITE_GRACE`] to
    /// land (each write is whole or absent).
    pub fn run(&self, tasks: Vec<Task>) -> Result<()> {
        self.run_lazily(tasks.into_iter().map(Ok))
    }

    /// [`Scheduler::run`] over tasks made as they are started (a stage of many tasks never
    /// holds them all); a task that cannot be made stops the stage with that error.
    pub fn run_lazily(&self, tasks: impl Iterator<Item = Result<Task>>) -> Result<()> {
        let shared = Arc::new(Shared::new());
        let ctx = Arc::new(Ctx {
            pool: self.pool.clone(),
            progress: self.progress.clone(),
            shared: shared.clone(),
            cancel: self.cancel.clone(),
            started: Mutex::new(Vec::new()),
        });
        let (finished, finished_rx) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let watched = ctx.clone();
            scope.spawn(move || watch_cancel(&watched, finished_rx));
            let result = self.dispatch_and_wait(&ctx, tasks);
            drop(finished);
            result
        })
    }

    /// Starts the tasks as memory allows and waits for them.
    fn dispatch_and_wait(
        &self,
        ctx: &Arc<Ctx>,
        tasks: impl Iterator<Item = Result<Task>>,
    ) -> Result<()> {
        let shared = &ctx.shared;
        for task in tasks {
            let task = match task {
                Ok(t) => t,
                Err(e) => {
                    shared.fail(e);
                    break;
                }
            };
            if self.cancel.load(Ordering::SeqCst) {
                shared.fail(Error::cancelled());
            }
            if shared.stop.load(Ordering::SeqCst) {
                break;
            }
            // Only a few tasks per compute thread are in flight: enough to keep reads ahead
            // of compute, few enough that their buffers cycle through the pool.
            if !wait_for_slot(shared, self.max_in_flight()) {
                break;
            }
            let reservation = match self.budget.reserve(task.memory, &task.label, &shared.stop) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    shared.fail(e);
                    break;
                }
            };
            if let Ok(mut a) = shared.active.lock() {
                *a += 1;
            }
            start(ctx, task, reservation);
        }
        // Wait for every started task and every batch still computing (an ended task's
        // included), watching for Ctrl-C.
        let mut active = shared
            .active
            .lock()
            .map_err(|_| Error::internal("scheduler lock poisoned"))?;
        let mut cancelled_at = None;
        while *active > 0 || shared.computing() > 0 {
            if self.cancel.load(Ordering::SeqCst) {
                shared.fail(Error::cancelled());
                let at = *cancelled_at.get_or_insert_with(Instant::now);
                if at.elapsed() >= WRITE_GRACE && shared.computing() == 0 {
                    // Writes to a store that does not answer are abandoned (never partial).
                    break;
                }
            }
            active = shared
                .idle
                .wait_timeout(active, crate::cancel::POLL)
                .map_err(|_| Error::internal("scheduler lock poisoned"))?
                .0;
        }
        drop(active);
        if self.cancel.load(Ordering::SeqCst) {
            return Err(Error::cancelled());
        }
        match shared.error.lock().ok().and_then(|mut e| e.take()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How long a cancelled stage waits for writes in flight before it returns.
pub const WRITE_GRACE: Duration = Duration::from_millis(500);

/// Until the stage is over (`finished` disconnects): on Ctrl-C, stops the stage and ends the
/// tasks that wait for reads.
fn watch_cancel(ctx: &Arc<Ctx>, finished: mpsc::Receiver<()>) {
    loop {
        match finished.recv_timeout(crate::cancel::POLL) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if ctx.cancel.load(Ordering::SeqCst) {
            ctx.shared.fail(Error::cancelled());
            let started: Vec<TaskRef> = match ctx.started.lock() {
                Ok(s) => s.iter().filter_map(Weak::upgrade).collect(),
                Err(_) => Vec::new(),
            };
            for t in started {
                // Neither computing, nor finishing, nor writing: waiting for reads, whose
                // answers (if they ever come) find the task ended.
                end_if(ctx, &t, Some(Error::cancelled()), |r| {
                    !r.busy && r.processor.is_some() && r.writes_pending == 0
                });
            }
        }
    }
}

/// Waits until fewer than `max` tasks are active; false when the stage is stopping.
fn wait_for_slot(shared: &Shared, max: usize) -> bool {
    let Ok(mut active) = shared.active.lock() else {
        return false;
    };
    while *active >= max {
        if shared.stop.load(Ordering::SeqCst) {
            return false;
        }
        active = match shared
            .idle
            .wait_timeout(active, std::time::Duration::from_millis(50))
        {
            Ok(g) => g.0,
            Err(_) => return false,
        };
    }
    true
}

fn start(ctx: &Arc<Ctx>, task: Task, reservation: Reservation) {
    let n = task.batches.len();
    let t: TaskRef = Arc::new(Mutex::new(Running {
        label: task.label,
        processor: Some(task.processor),
        batches: task.batches.into_iter().map(Some).collect(),
        n_batches: n,
        arrived: HashMap::new(),
        next: 0,
        busy: false,
        processed_all: false,
        writes_pending: 0,
        finish_when_written: false,
        write_allowance: 0,
        reservation: Some(reservation),
        ended: false,
    }));
    if let Ok(mut started) = ctx.started.lock() {
        // Ended tasks drop out now and then, so the list stays near the tasks in flight.
        if started.len() >= 64 && started.len().is_power_of_two() {
            started.retain(|w| w.strong_count() > 0);
        }
        started.push(Arc::downgrade(&t));
    }
    if n == 0 {
        spawn_finish(ctx, &t);
        return;
    }
    issue_read(ctx, &t, 0);
    if n > 1 {
        issue_read(ctx, &t, 1);
    }
}

/// Ends a task once: releases its memory and tells the dispatcher.
fn end(ctx: &Arc<Ctx>, t: &TaskRef, error: Option<Error>) {
    end_if(ctx, t, error, |_| true);
}

/// Ends a task once if `now` holds for it (checked under the task's lock).
fn end_if(ctx: &Arc<Ctx>, t: &TaskRef, error: Option<Error>, now: impl Fn(&Running) -> bool) {
    let (label, was_ended, reservation, writing) = match t.lock() {
        Ok(mut r) => {
            if !r.ended && !now(&r) {
                return;
            }
            let was = r.ended;
            r.ended = true;
            r.processor = None;
            r.arrived.clear();
            let writing = r.writes_pending > 0;
            if !was && writing {
                r.finish_when_written = true;
            }
            (r.label.clone(), was, r.reservation.take(), writing)
        }
        Err(_) => (String::new(), false, None, false),
    };
    if was_ended {
        return;
    }
    drop(reservation);
    match error {
        Some(e) => {
            let mut e = e;
            if e.context.array.is_none() && e.context.chunk_key.is_none() {
                e.message = format!("{} (in {label})", e.message);
            }
            ctx.shared.fail(e)
        }
        None => ctx.progress.task_done(),
    }
    if !writing {
        ctx.shared.task_finished();
    }
}

fn stopped(ctx: &Ctx) -> bool {
    ctx.shared.stop.load(Ordering::SeqCst) || ctx.cancel.load(Ordering::SeqCst)
}

fn issue_read(ctx: &Arc<Ctx>, t: &TaskRef, i: usize) {
    let ops = match t.lock() {
        Ok(mut r) => r.batches.get_mut(i).and_then(|b| b.take()),
        Err(_) => None,
    };
    let Some(ops) = ops else { return };
    // Group by store, keeping the request order for the processor.
    let mut groups: Vec<StoreGroup> = Vec::new();
    for (k, op) in ops.into_iter().enumerate() {
        match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, &op.store)) {
            Some(g) => {
                g.1.push(k);
                g.2.push(op.req);
            }
            None => groups.push((op.store, vec![k], vec![op.req])),
        }
    }
    let total: usize = groups.iter().map(|g| g.1.len()).sum();
    let join = Arc::new(Mutex::new((
        (0..total)
            .map(|_| None)
            .collect::<Vec<Option<crate::store::Value>>>(),
        groups.len(),
        None::<Error>,
    )));
    if groups.is_empty() {
        on_data(ctx, t, i, Vec::new());
        return;
    }
    for (store, positions, reqs) in groups {
        let ctx2 = ctx.clone();
        let t2 = t.clone();
        let join = join.clone();
        store.read_batch(
            reqs,
            Box::new(move |res| {
                let finished = match join.lock() {
                    Ok(mut j) => {
                        match res {
                            Ok(values) => {
                                for (p, v) in positions.into_iter().zip(values) {
                                    if let Some(v) = &v {
                                        ctx2.progress
                                            .bytes_read
                                            .fetch_add(v.len() as u64, Ordering::Relaxed);
                                    }
                                    j.0[p] = v;
                                }
                            }
                            Err(e) => {
                                j.2.get_or_insert(e);
                            }
                        }
                        j.1 -= 1;
                        if j.1 == 0 {
                            Some((std::mem::take(&mut j.0), j.2.take()))
                        } else {
                            None
                        }
                    }
                    Err(_) => Some((Vec::new(), Some(Error::internal("read join poisoned")))),
                };
                match finished {
                    Some((_, Some(e))) => end(&ctx2, &t2, Some(e)),
                    Some((data, None)) => on_data(&ctx2, &t2, i, data),
                    None => {}
                }
            }),
        );
    }
}

fn on_data(ctx: &Arc<Ctx>, t: &TaskRef, i: usize, data: Vec<Option<crate::store::Value>>) {
    if let Ok(mut r) = t.lock() {
        if r.ended {
            return;
        }
        r.arrived.insert(i, data);
    }
    try_process(ctx, t);
}

fn try_process(ctx: &Arc<Ctx>, t: &TaskRef) {
    if stopped(ctx) {
        end(
            ctx,
            t,
            ctx.cancel.load(Ordering::SeqCst).then(Error::cancelled),
        );
        return;
    }
    let job = match t.lock() {
        Ok(mut r) => {
            if r.ended || r.busy || r.processed_all || r.writes_pending > r.write_allowance {
                None
            } else {
                let next = r.next;
                match r.arrived.remove(&next) {
                    Some(data) => r.processor.take().map(|p| {
                        r.busy = true;
                        (next, data, p, r.reservation.take())
                    }),
                    None => None,
                }
            }
        }
        Err(_) => None,
    };
    let Some((i, data, mut processor, mut reservation)) = job else {
        return;
    };
    // Prefetch the batch after the one about to run (batch i + 1 is already in flight).
    issue_read(ctx, t, i + 2);
    let ctx2 = ctx.clone();
    let t2 = t.clone();
    let computing = Computing::start(&ctx.shared);
    ctx.pool.spawn(move || {
        let _computing = computing;
        let result = {
            let mut tctx = TaskContext::new(&ctx2.progress, &mut reservation);
            processor.process(i, data, &mut tctx)
        };
        let last = match t2.lock() {
            Ok(mut r) => {
                r.busy = false;
                r.processor = Some(processor);
                r.reservation = reservation;
                r.next += 1;
                r.next == r.n_batches
            }
            Err(_) => false,
        };
        match result {
            Err(e) => end(&ctx2, &t2, Some(e)),
            Ok(writes) => {
                issue_writes(&ctx2, &t2, writes);
                if last {
                    spawn_finish(&ctx2, &t2);
                } else {
                    try_process(&ctx2, &t2);
                }
            }
        }
    });
}

fn spawn_finish(ctx: &Arc<Ctx>, t: &TaskRef) {
    let job = match t.lock() {
        Ok(mut r) => r.processor.take().map(|p| (p, r.reservation.take())),
        Err(_) => None,
    };
    let Some((processor, mut reservation)) = job else {
        return;
    };
    let ctx2 = ctx.clone();
    let t2 = t.clone();
    let computing = Computing::start(&ctx.shared);
    ctx.pool.spawn(move || {
        let _computing = computing;
        if stopped(&ctx2) {
            end(&ctx2, &t2, None);
            return;
        }
        let result = {
            let mut tctx = TaskContext::new(&ctx2.progress, &mut reservation);
            processor.finish(&mut tctx)
        };
        if let Ok(mut r) = t2.lock() {
            r.reservation = reservation;
            r.processed_all = true;
        }
        match result {
            Err(e) => end(&ctx2, &t2, Some(e)),
            Ok(writes) => {
                issue_writes(&ctx2, &t2, writes);
                check_done(&ctx2, &t2);
            }
        }
    });
}

fn issue_writes(ctx: &Arc<Ctx>, t: &TaskRef, writes: Vec<WriteOp>) {
    if writes.is_empty() {
        return;
    }
    match t.lock() {
        // A task ended (failed, or stopped with its stage) while this batch ran has been
        // counted out of the stage: a write issued now would outlive the stage, and a
        // process exiting on the stage's error would cut it short, leaving a temporary.
        Ok(r) if r.ended => return,
        Ok(mut r) => {
            (r.writes_pending, r.write_allowance) = (r.writes_pending + writes.len(), writes.len())
        }
        Err(_) => {}
    }
    for w in writes {
        let ctx2 = ctx.clone();
        let t2 = t.clone();
        let done = Box::new(move |res: Result<()>| {
            let last_of_ended = match t2.lock() {
                Ok(mut r) => {
                    r.writes_pending -= 1;
                    let last = r.finish_when_written && r.writes_pending == 0;
                    if last {
                        r.finish_when_written = false;
                    }
                    last
                }
                Err(_) => false,
            };
            if last_of_ended {
                if let Err(e) = res {
                    ctx2.shared.fail(e);
                }
                ctx2.shared.task_finished();
                return;
            }
            match res {
                Err(e) => end(&ctx2, &t2, Some(e)),
                Ok(()) => {
                    // A batch held back by this task's pending writes may go now.
                    try_process(&ctx2, &t2);
                    check_done(&ctx2, &t2);
                }
            }
        });
        match (w.value, w.part) {
            (Some(v), part) => {
                ctx.progress
                    .bytes_written
                    .fetch_add(v.len() as u64, Ordering::Relaxed);
                match part {
                    Some(p) => w.store.write_part_async(w.key, p.offset, v, p.total, done),
                    None => w.store.write_async(w.key, v, done),
                }
            }
            (None, _) => done(w.store.erase(&w.key)),
        }
    }
}

fn check_done(ctx: &Arc<Ctx>, t: &TaskRef) {
    let finished = match t.lock() {
        Ok(r) => r.processed_all && r.writes_pending == 0 && !r.ended,
        Err(_) => false,
    };
    if finished {
        end(ctx, t, None);
    }
}

#[cfg(test)]
mod tests;
