//! Cancelling waits on IO: Ctrl-C must stop a call that waits on a server that accepted the
//! connection and never answers, within a fraction of a second, not when the request times out.
//!
//! An entry point (a plan run, a direct read, `info`) runs its work inside [`scope`] with the
//! flag its caller raises on Ctrl-C. Every wait of that thread for an IO answer goes through
//! [`recv`], which wakes every [`POLL`] to look at the flag and gives up with
//! [`ErrorKind::Cancelled`](crate::error::ErrorKind::Cancelled) once it is raised. The request
//! itself is abandoned: its answer, when it comes, goes nowhere. Outside a scope, waits are
//! plain blocking waits.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// How often a cancellable wait looks at its flag.
pub const POLL: Duration = Duration::from_millis(50);

thread_local! {
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Runs `f` with `flag` as this thread's cancel flag (the previous one is restored after).
pub fn scope<R>(flag: Arc<AtomicBool>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CURRENT.with(|c| c.borrow_mut().replace(flag));
    let _restore = Restore(previous);
    f()
}

/// This thread's cancel flag, if it runs inside a [`scope`].
pub fn current() -> Option<Arc<AtomicBool>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// True when this thread's cancel flag is raised.
pub fn requested() -> bool {
    CURRENT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    })
}

/// Waits for the answer on `rx`; `Err(Cancelled)` as soon as this thread's cancel flag is
/// raised. `lost` is the error when the sender went away without answering.
pub fn recv<T>(rx: &Receiver<T>, lost: impl FnOnce() -> Error) -> Result<T> {
    let Some(flag) = current() else {
        return rx.recv().map_err(|_| lost());
    };
    loop {
        if flag.load(Ordering::SeqCst) {
            return Err(Error::cancelled());
        }
        match rx.recv_timeout(POLL) {
            Ok(v) => return Ok(v),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Err(lost()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::sync::mpsc;
    use std::time::Instant;

    #[test]
    fn a_raised_flag_ends_a_wait_that_gets_no_answer() {
        let (_tx, rx) = mpsc::channel::<u32>();
        let flag = Arc::new(AtomicBool::new(false));
        let raiser = {
            let flag = flag.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(120));
                flag.store(true, Ordering::SeqCst);
            })
        };
        let started = Instant::now();
        let r = scope(flag, || recv(&rx, || Error::internal("lost")));
        raiser.join().unwrap();
        assert_eq!(r.unwrap_err().kind, ErrorKind::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(2));
        // The scope is over: no flag on this thread any more.
        assert!(current().is_none());
    }

    #[test]
    fn answers_and_lost_senders_pass_through() {
        let (tx, rx) = mpsc::channel::<u32>();
        tx.send(7).unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        assert_eq!(
            scope(flag.clone(), || recv(&rx, || Error::internal("lost"))).unwrap(),
            7
        );
        drop(tx);
        let e = scope(flag, || recv(&rx, || Error::internal("lost"))).unwrap_err();
        assert!(e.to_string().contains("lost"), "{e}");
        // Outside a scope, a wait is a plain wait.
        let (tx, rx) = mpsc::channel::<u32>();
        tx.send(3).unwrap();
        assert_eq!(recv(&rx, || Error::internal("lost")).unwrap(), 3);
    }

    #[test]
    fn scopes_nest_and_restore() {
        let outer = Arc::new(AtomicBool::new(true));
        let inner = Arc::new(AtomicBool::new(false));
        scope(outer, || {
            assert!(requested());
            scope(inner, || assert!(!requested()));
            assert!(requested());
        });
        assert!(!requested());
    }
}
