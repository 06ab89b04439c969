//! Request timeouts, the retry policy and the HTTP client options, from the caller or the
//! environment.

use std::time::Duration;

use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use super::runtime::MAX_IN_FLIGHT;
use crate::error::{Error, Result};

/// The longest wait between two retries.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Retries of one request, unless `CHUNKFUSE_IO_RETRIES` says otherwise: more than the retry
/// window holds at [`MAX_BACKOFF`], so the window, not the count, ends them (object_store's
/// jittered backoff spends a count of 10 within a second, too soon to ride out a restart).
const DEFAULT_RETRIES: usize = 100;

/// How long object-storage requests may take (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// Connecting to the server.
    pub connect: Duration,
    /// One request, from sending it to the last byte of the answer.
    pub request: Duration,
    /// Retries of a failed request stop once this long has passed since the first try.
    pub retry: Duration,
}

impl Timeouts {
    /// 10 s to connect, 30 s per request, retried for 60 s.
    pub const DEFAULT: Timeouts = Timeouts {
        connect: Duration::from_secs(10),
        request: Duration::from_secs(30),
        retry: Duration::from_secs(60),
    };

    /// As last given to [`set_timeouts`]; else the environment
    /// (`CHUNKFUSE_IO_CONNECT_TIMEOUT_S`, `CHUNKFUSE_IO_TIMEOUT_S`,
    /// `CHUNKFUSE_IO_RETRY_TIMEOUT_S`, in seconds) over [`Timeouts::DEFAULT`].
    pub fn current() -> Timeouts {
        if let Some(set) = SET_TIMEOUTS.lock().ok().and_then(|t| *t) {
            return set;
        }
        let seconds = |name: &str, default: Duration| {
            env_seconds(name)
                .map(Duration::from_secs_f64)
                .unwrap_or(default)
        };
        let d = Timeouts::DEFAULT;
        Timeouts {
            connect: seconds("CHUNKFUSE_IO_CONNECT_TIMEOUT_S", d.connect),
            request: seconds("CHUNKFUSE_IO_TIMEOUT_S", d.request),
            retry: seconds("CHUNKFUSE_IO_RETRY_TIMEOUT_S", d.retry),
        }
    }

    /// The longest a request to a server that never answers takes to fail: retries stop
    /// after the retry window, the last try times out after one request timeout, and one
    /// backoff may come between.
    pub fn worst_case(&self) -> Duration {
        self.retry + self.request.max(self.connect) + MAX_BACKOFF
    }
}

static SET_TIMEOUTS: std::sync::Mutex<Option<Timeouts>> = std::sync::Mutex::new(None);

/// Sets the timeouts of object stores opened from now on (process-wide); `None` goes back to
/// the environment and the defaults. A zero timeout is refused.
pub fn set_timeouts(timeouts: Option<Timeouts>) -> Result<()> {
    if let Some(t) = timeouts {
        for (name, d) in [("connect", t.connect), ("request", t.request)] {
            if d.is_zero() {
                return Err(Error::plan(
                    format!("{name}_timeout"),
                    "must be more than 0 seconds",
                ));
            }
        }
    }
    if let Ok(mut slot) = SET_TIMEOUTS.lock() {
        *slot = timeouts;
    }
    Ok(())
}

/// A non-negative number of seconds from the environment variable `name`, if set and valid.
fn env_seconds(name: &str) -> Option<f64> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
}

/// Retry policy: object_store's exponential backoff, within the retry window.
pub(super) fn retry_config(timeouts: &Timeouts) -> RetryConfig {
    let mut retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: MAX_BACKOFF,
            base: 2.0,
        },
        max_retries: DEFAULT_RETRIES,
        retry_timeout: timeouts.retry,
    };
    if let Some(n) = env_seconds("CHUNKFUSE_IO_RETRIES") {
        retry.max_retries = n as usize;
    }
    retry
}

pub(super) fn client_options(timeouts: &Timeouts) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(timeouts.connect.max(Duration::from_millis(1)))
        .with_timeout(timeouts.request.max(Duration::from_millis(1)))
        .with_pool_max_idle_per_host(MAX_IN_FLIGHT)
}
