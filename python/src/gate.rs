//! The one gate every engine call from Python goes through.
//!
//! The work runs on a thread of its own, inside a cancel scope (`chunkfuse_engine::cancel`),
//! while the calling thread waits with the GIL released, waking every 50 ms to run Python's
//! signal handlers. Ctrl-C (or an exception from `tick`) raises the call's cancel flag: the
//! engine's waits on IO end within one poll, the work returns, and the exception is raised
//! here. The calling thread always waits for the work to return, so nothing the call borrowed
//! (an output buffer) is used after it returns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;

use chunkfuse_engine::cancel;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;

use crate::to_py;

/// Raised by [`interrupt_all`]: calls that began before it stop as if Ctrl-C reached them.
static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

/// Stops every engine call of this process in progress, as Ctrl-C stops the one on the main
/// thread: those on other threads (a Dask scheduler's pool running engine batches) see no
/// signal of their own.
pub fn interrupt_all() {
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// Runs `job` behind the gate and converts its error (see the module doc).
pub fn call<T: Send>(
    py: Python<'_>,
    job: impl FnOnce() -> chunkfuse_engine::Result<T> + Send,
) -> PyResult<T> {
    let flag = Arc::new(AtomicBool::new(false));
    run(py, flag, job, || Ok(()))?.map_err(to_py)
}

/// Runs `job` with `flag` as its cancel flag, calling `tick` (with the GIL) at every wake-up.
/// `Err` is the exception that interrupted the call (Ctrl-C's KeyboardInterrupt, or `tick`'s),
/// raised once the job has stopped; `Ok` holds the job's own outcome.
pub fn run<T: Send>(
    py: Python<'_>,
    flag: Arc<AtomicBool>,
    job: impl FnOnce() -> chunkfuse_engine::Result<T> + Send,
    mut tick: impl FnMut() -> PyResult<()>,
) -> PyResult<chunkfuse_engine::Result<T>> {
    let (tx, rx) = mpsc::channel::<()>();
    let epoch = INTERRUPTS.load(Ordering::SeqCst);
    std::thread::scope(|scope| {
        let worker_flag = flag.clone();
        let worker = std::thread::Builder::new()
            .name("chunkfuse-call".into())
            .spawn_scoped(scope, move || {
                let outcome = cancel::scope(worker_flag, job);
                // The receiver waits until this arrives; nothing to report if it is gone.
                let _ = tx.send(());
                outcome
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start an engine thread: {e}")))?;
        let mut interrupted: Option<PyErr> = None;
        let mut rx = rx;
        loop {
            // The receiver is not Sync, so it moves into the GIL-free closure and back out.
            let (back, received) = py.detach(move || {
                let received = rx.recv_timeout(cancel::POLL);
                (rx, received)
            });
            rx = back;
            match received {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) if interrupted.is_none() => {
                    let interrupted_elsewhere = || {
                        if INTERRUPTS.load(Ordering::SeqCst) == epoch {
                            Ok(())
                        } else {
                            Err(PyKeyboardInterrupt::new_err(
                                "interrupted: Ctrl-C reached another thread of this process",
                            ))
                        }
                    };
                    let checked = py.check_signals().and_then(|()| interrupted_elsewhere());
                    if let Err(e) = checked.and_then(|()| tick()) {
                        flag.store(true, Ordering::SeqCst);
                        interrupted = Some(e);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        let outcome = py
            .detach(move || worker.join())
            .map_err(|_| PyRuntimeError::new_err("an engine thread panicked"))?;
        match interrupted {
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    })
}
