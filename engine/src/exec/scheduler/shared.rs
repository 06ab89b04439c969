//! What a stage's tasks and its dispatching thread share: the first error, the tasks in
//! flight, the batches computing, and the stop flag.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::Error;

/// The state of one stage (see the module docs).
pub(super) struct Shared {
    pub(super) error: Mutex<Option<Error>>,
    /// Tasks started and not yet counted finished.
    pub(super) active: Mutex<usize>,
    /// Notified as tasks finish and batches stop computing.
    pub(super) idle: Condvar,
    pub(super) stop: AtomicBool,
    /// Batches (and finishes) running on the compute pool, those of ended tasks included:
    /// the stage returns only once none is, so no processor (a Python function among them)
    /// runs after the call that ran the stage has returned.
    computing: AtomicUsize,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            error: Mutex::new(None),
            active: Mutex::new(0),
            idle: Condvar::new(),
            stop: AtomicBool::new(false),
            computing: AtomicUsize::new(0),
        }
    }

    /// Keeps the first error and stops the stage.
    pub(super) fn fail(&self, e: Error) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Counts a task out of the stage.
    pub(super) fn task_finished(&self) {
        if let Ok(mut a) = self.active.lock() {
            *a -= 1;
        }
        self.idle.notify_all();
    }

    /// Batches and finishes running now.
    pub(super) fn computing(&self) -> usize {
        self.computing.load(Ordering::SeqCst)
    }
}

/// One batch or finish on the compute pool, counted from before it is spawned until it has
/// run (see [`Shared`]).
pub(super) struct Computing(Arc<Shared>);

impl Computing {
    pub(super) fn start(shared: &Arc<Shared>) -> Computing {
        shared.computing.fetch_add(1, Ordering::SeqCst);
        Computing(shared.clone())
    }
}

impl Drop for Computing {
    fn drop(&mut self) {
        self.0.computing.fetch_sub(1, Ordering::SeqCst);
        // Under the lock the dispatcher waits with, so its wake-up is not missed.
        let _held = self.0.active.lock();
        self.0.idle.notify_all();
    }
}
