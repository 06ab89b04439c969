//! The process-wide IO runtime, the cap on requests in flight, and the TLS provider.

use std::sync::{Arc, OnceLock};

use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::fork_safe::ForkSafe;

/// Requests in flight at once across every object store of the process.
pub(super) const MAX_IN_FLIGHT: usize = 64;

/// The runtime that serves every object-store request of the process (made again in a
/// forked child: the parent's worker threads are not there).
pub(super) fn runtime() -> Result<Arc<Runtime>> {
    static RUNTIME: ForkSafe<Runtime> = ForkSafe::new();
    RUNTIME
        .get_or_try_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("chunkfuse-objio")
                .enable_all()
                .build()
        })
        .map_err(|e| Error::store("object storage", format!("cannot start IO runtime: {e}")))
}

pub(super) fn in_flight() -> Arc<Semaphore> {
    static SEM: ForkSafe<Arc<Semaphore>> = ForkSafe::new();
    SEM.get_or_init(|| Arc::new(Semaphore::new(MAX_IN_FLIGHT)))
        .as_ref()
        .clone()
}

/// The rustls crypto provider (ring), installed once before the first TLS connection.
pub(super) fn install_crypto_provider() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // Another library may have installed one already; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
