//! Process resources that survive `fork`.
//!
//! A child made by `fork` has one thread, the one that forked: every thread pool, IO runtime
//! and io_uring thread of its parent is gone, though their handles were copied with the
//! parent's memory. Using one (a PyTorch DataLoader worker reading its first batch) waits
//! forever for threads that do not exist. A [`ForkSafe`] value is made again on first use in
//! each process: the child makes its own pools, runtimes and rings, and never touches the
//! parent's (which it leaks: dropping them would join threads that are not there).
//!
//! The process's generation counts the forks between the process that first used the engine
//! and this one: a `pthread_atfork` child handler, registered on first use, increments it.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Once};

static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    // Only async-signal-safe work here: one atomic increment.
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// How many forks separate this process from the one that first asked (0 there).
pub fn generation() -> u64 {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a handler that only increments an atomic, which is safe in the
        // child between fork and exec. A failure (ENOMEM) leaves forks undetected, as before.
        unsafe {
            libc::pthread_atfork(None, None, Some(forked_child));
        }
    });
    GENERATION.load(Ordering::SeqCst)
}

/// One generation's value.
struct Entry<T> {
    generation: u64,
    value: Arc<T>,
}

/// A value made on first use in each process: a child forked after it was made gets a new
/// one on its first use, and the parent's is never dropped there.
///
/// Reads take no lock (one atomic load), so a lock held by a thread of the parent at the
/// moment of the fork cannot leave the child waiting.
pub struct ForkSafe<T> {
    slot: AtomicPtr<Entry<T>>,
}

impl<T> ForkSafe<T> {
    /// An empty slot (usable in a `static`).
    pub const fn new() -> Self {
        ForkSafe {
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This process's value, made with `make` on first use here. When two threads race to
    /// make it, one value wins and both get it; the other is dropped.
    pub fn get_or_try_init<E>(
        &self,
        make: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<Arc<T>, E> {
        let generation = generation();
        let mut make = Some(make);
        loop {
            let current = self.slot.load(Ordering::Acquire);
            // SAFETY: a published entry is freed only by `Drop` (which has `&mut self`) or
            // never (an older generation's, leaked), so it is alive while `self` is borrowed.
            if let Some(entry) = unsafe { current.as_ref() } {
                if entry.generation == generation {
                    return Ok(entry.value.clone());
                }
            }
            let Some(make) = make.take() else {
                // Another thread of this process published its value since we looked.
                continue;
            };
            let fresh = Box::into_raw(Box::new(Entry {
                generation,
                value: Arc::new(make()?),
            }));
            match self
                .slot
                .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The replaced entry (if any) belongs to a parent process: leaked.
                // SAFETY: `fresh` was just published and is never freed while `self` lives.
                Ok(_) => return Ok(unsafe { (*fresh).value.clone() }),
                Err(_) => {
                    // Lost the race: ours was never published; drop it and take theirs.
                    // SAFETY: `fresh` came from `Box::into_raw` above and nobody else saw it.
                    drop(unsafe { Box::from_raw(fresh) });
                }
            }
        }
    }

    /// This process's value, made with `make` on first use here.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> Arc<T> {
        match self.get_or_try_init(|| Ok::<T, std::convert::Infallible>(make())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// This process's value if it was made here.
    pub fn get(&self) -> Option<Arc<T>> {
        let current = self.slot.load(Ordering::Acquire);
        // SAFETY: as in `get_or_try_init`.
        unsafe { current.as_ref() }
            .filter(|e| e.generation == generation())
            .map(|e| e.value.clone())
    }
}

impl<T> Default for ForkSafe<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        let current = *self.slot.get_mut();
        if current.is_null() {
            return;
        }
        // SAFETY: `&mut self`: no reader holds the entry; it came from `Box::into_raw`.
        let entry = unsafe { Box::from_raw(current) };
        if entry.generation != generation() {
            // Made by a parent process: its threads are not here to be joined.
            std::mem::forget(entry);
        }
    }
}

// SAFETY: the slot only hands out `Arc<T>` clones; sending or sharing the slot is sharing
// `Arc<T>`, which needs `T: Send + Sync`.
unsafe impl<T: Send + Sync> Send for ForkSafe<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for ForkSafe<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn made_once_per_process_and_shared_by_threads() {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let slot: Arc<ForkSafe<usize>> = Arc::new(ForkSafe::new());
        assert!(slot.get().is_none());
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let slot = slot.clone();
                std::thread::spawn(move || {
                    *slot.get_or_init(|| MADE.fetch_add(1, Ordering::SeqCst) + 100)
                })
            })
            .map(|h| h.join().unwrap())
            .collect();
        let first = handles[0];
        assert!(handles.iter().all(|&v| v == first));
        assert_eq!(*slot.get().unwrap(), first);
    }

    #[test]
    fn a_failed_make_leaves_the_slot_empty() {
        let slot: ForkSafe<u32> = ForkSafe::new();
        assert_eq!(slot.get_or_try_init(|| Err("no")), Err("no"));
        assert!(slot.get().is_none());
        assert_eq!(*slot.get_or_try_init(|| Ok::<_, ()>(7)).unwrap(), 7);
    }

    /// A child forked after the value was made gets its own, made there; the parent keeps
    /// its own.
    #[test]
    fn a_forked_child_makes_its_own_value() {
        let slot: ForkSafe<(u32, u64)> = ForkSafe::new();
        let parent = slot.get_or_init(|| (std::process::id(), generation()));
        // SAFETY: the child only runs code that does not need other threads (the slot and
        // a pipe write) and leaves with `_exit`.
        let mut fds = [0i32; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let child = slot.get_or_init(|| (std::process::id(), generation()));
            let ok = child.0 != parent.0 && child.1 == parent.1 + 1;
            let byte = [u8::from(ok)];
            unsafe {
                libc::write(fds[1], byte.as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = [0u8];
        let n = unsafe { libc::read(fds[0], byte.as_mut_ptr().cast(), 1) };
        let mut status = 0;
        unsafe {
            libc::waitpid(pid, &mut status, 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!((n, byte[0]), (1, 1), "the child saw the parent's value");
        assert_eq!(*slot.get().unwrap(), *parent);
    }
}
