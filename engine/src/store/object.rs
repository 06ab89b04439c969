//! Object storage (`s3://`, `gs://`, `http(s)://`) through the object_store crate.
//!
//! Requests run on one process-wide tokio runtime, never on compute threads. A batch groups
//! its ranged reads per object so object_store coalesces nearby ranges into few GETs; whole
//! reads are plain GETs (no HEAD first). Credentials, region and endpoint come from each
//! cloud's standard environment variables; with no credentials in the environment, requests
//! go unsigned (public buckets). Transient failures (5xx, dropped connections, requests that
//! time out) are retried with exponential backoff; `CHUNKFUSE_IO_RETRIES` and
//! `CHUNKFUSE_IO_RETRY_TIMEOUT_S` override the defaults (10 retries within 60 s).
//!
//! A server that accepts the connection and never answers fails a request after the request
//! timeout (`CHUNKFUSE_IO_TIMEOUT_S`, 30 s); connecting gives up after the connect timeout
//! (`CHUNKFUSE_IO_CONNECT_TIMEOUT_S`, 10 s). With retries, a stalled server gives an error
//! naming the URL after at most [`Timeouts::worst_case`] (the retry window, one request
//! timeout and the longest backoff: 95 s by default). [`set_timeouts`] sets all three for
//! stores opened afterwards. Ctrl-C ends the wait at once (see [`crate::cancel`]).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

use super::{ReadBatch, ReadCallback, ReadRequest, Store, Value, WriteCallback};
use crate::error::{Error, Result};
use crate::fork_safe::ForkSafe;

/// Requests in flight at once across every object store of the process.
const MAX_IN_FLIGHT: usize = 64;

/// The runtime that serves every object-store request of the process (made again in a
/// forked child: the parent's worker threads are not there).
fn runtime() -> Result<Arc<Runtime>> {
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

fn in_flight() -> Arc<Semaphore> {
    static SEM: ForkSafe<Arc<Semaphore>> = ForkSafe::new();
    SEM.get_or_init(|| Arc::new(Semaphore::new(MAX_IN_FLIGHT)))
        .as_ref()
        .clone()
}

/// The longest wait between two retries.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

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
fn retry_config(timeouts: &Timeouts) -> RetryConfig {
    let mut retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: MAX_BACKOFF,
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: timeouts.retry,
    };
    if let Some(n) = env_seconds("CHUNKFUSE_IO_RETRIES") {
        retry.max_retries = n as usize;
    }
    retry
}

fn client_options(timeouts: &Timeouts) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(timeouts.connect.max(Duration::from_millis(1)))
        .with_timeout(timeouts.request.max(Duration::from_millis(1)))
        .with_pool_max_idle_per_host(MAX_IN_FLIGHT)
}

/// The configuration keys a builder knows among the environment variables starting with
/// `prefix` (as object_store's `from_env` reads them).
fn env_config<K: std::str::FromStr>(prefix: &str) -> Vec<(K, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(k, v)| Some((k.to_ascii_lowercase().parse().ok()?, v)))
        .collect()
}

/// True when any of `names` is set in the environment.
fn any_env(names: &[&str]) -> bool {
    names.iter().any(|n| std::env::var_os(n).is_some())
}

/// The rustls crypto provider (ring), installed once before the first TLS connection.
fn install_crypto_provider() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // Another library may have installed one already; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Makes the client of a store (again in each forked child: a client's pooled connections
/// belong to the runtime and sockets of the process that made them).
type Connect = Arc<dyn Fn() -> Result<Arc<dyn ObjectStore>> + Send + Sync>;

/// A store on object storage: a bucket (or HTTP server) and a path prefix inside it.
pub struct ObjectBackend {
    url: String,
    client: ForkSafe<Arc<dyn ObjectStore>>,
    connect: Connect,
    prefix: String,
}

/// Splits `scheme://bucket/some/prefix` into the bucket URL and the prefix inside it.
fn split_bucket(url: &str) -> Result<(String, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::store(url, "not a URL"))?;
    let rest = rest.trim_end_matches('/');
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::store(url, "the URL names no bucket"));
    }
    Ok((format!("{scheme}://{bucket}"), prefix.to_string()))
}

impl ObjectBackend {
    /// Opens `url` (`s3://bucket/prefix`, `gs://bucket/prefix`, `http(s)://host/path`).
    pub fn open(url: &str) -> Result<Self> {
        let (client, prefix) = Self::client_for(url)?;
        let owned = url.to_string();
        let connect: Connect = Arc::new(move || Self::client_for(&owned).map(|(c, _)| c));
        let backend = Self::with_connect(url, connect, &prefix);
        // The client just made serves this process; children make their own.
        backend.client.get_or_init(|| client);
        Ok(backend)
    }

    /// The client for `url` and the path prefix inside its bucket.
    fn client_for(url: &str) -> Result<(Arc<dyn ObjectStore>, String)> {
        install_crypto_provider();
        let fail = |e: object_store::Error| Error::store(url, describe(&e));
        let timeouts = Timeouts::current();
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match scheme {
            "s3" | "s3a" => {
                let (bucket, prefix) = split_bucket(url)?;
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts));
                // The environment (AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, ...) over our defaults.
                for (key, value) in env_config("AWS_") {
                    b = b.with_config(key, value);
                }
                let mut b = b.with_url(bucket);
                let signed = any_env(&[
                    "AWS_ACCESS_KEY_ID",
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                ]);
                if !signed {
                    b = b.with_skip_signature(true);
                }
                (Arc::new(b.build().map_err(fail)?), prefix)
            }
            "gs" | "gcs" => {
                let (bucket, prefix) = split_bucket(url)?;
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts));
                for (key, value) in env_config("GOOGLE_") {
                    b = b.with_config(key, value);
                }
                if let Ok(path) = std::env::var("SERVICE_ACCOUNT") {
                    b = b.with_service_account_path(path);
                }
                let mut b = b.with_url(bucket);
                let signed = any_env(&[
                    "GOOGLE_SERVICE_ACCOUNT",
                    "GOOGLE_SERVICE_ACCOUNT_PATH",
                    "GOOGLE_SERVICE_ACCOUNT_KEY",
                    "GOOGLE_APPLICATION_CREDENTIALS",
                ]);
                if !signed {
                    b = b.with_skip_signature(true);
                }
                (Arc::new(b.build().map_err(fail)?), prefix)
            }
            "http" | "https" => {
                let b = object_store::http::HttpBuilder::new()
                    .with_url(url.trim_end_matches('/'))
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts).with_allow_http(true));
                (Arc::new(b.build().map_err(fail)?), String::new())
            }
            other => {
                return Err(Error::store(
                    url,
                    format!("the \"{other}://\" scheme is not supported; use a local path, file://, s3://, gs://, http(s):// or memory://"),
                ))
            }
        };
        Ok((store, prefix))
    }

    /// A backend over an already built object store (tests use object_store's in-memory one,
    /// which has no threads or connections to remake after a fork).
    pub fn with_store(url: &str, store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self::with_connect(url, Arc::new(move || Ok(store.clone())), prefix)
    }

    fn with_connect(url: &str, connect: Connect, prefix: &str) -> Self {
        ObjectBackend {
            url: url.trim_end_matches('/').to_string(),
            client: ForkSafe::new(),
            connect,
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    /// This process's client.
    fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        self.client
            .get_or_try_init(|| (self.connect)())
            .map(|c| c.as_ref().clone())
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}/{key}", self.url)
    }

    /// Runs `fut` on the IO runtime and waits for it (listing and erasing, not the hot path).
    fn block_on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let handle = runtime()?.spawn(fut);
        let (tx, rx) = std::sync::mpsc::channel();
        runtime()?.spawn(async move {
            let _ = tx.send(handle.await);
        });
        let joined = crate::cancel::recv(&rx, || {
            Error::store(&self.url, "IO runtime ended without an answer")
        })?;
        match joined {
            Ok(r) => r,
            Err(e) => Err(Error::store(&self.url, format!("IO task failed: {e}"))),
        }
    }
}

/// A short description of an object_store error, with the HTTP meaning spelled out.
fn describe(e: &object_store::Error) -> String {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => "not found (HTTP 404)".to_string(),
        E::PermissionDenied { source, .. } => {
            format!(
                "access denied (HTTP 403): check the credentials and the bucket policy ({source})"
            )
        }
        E::Unauthenticated { source, .. } => {
            format!("not authenticated (HTTP 401): set the cloud's credential variables ({source})")
        }
        other if timed_out(other) => {
            let t = Timeouts::current();
            format!(
                "timed out: no answer within {:.0} s per request (CHUNKFUSE_IO_TIMEOUT_S), \
                 {:.0} s to connect (CHUNKFUSE_IO_CONNECT_TIMEOUT_S), retried for {:.0} s \
                 (CHUNKFUSE_IO_RETRY_TIMEOUT_S) ({})",
                t.request.as_secs_f64(),
                t.connect.as_secs_f64(),
                t.retry.as_secs_f64(),
                chain(other)
            )
        }
        other => chain(other),
    }
}

/// True when `e` (or a cause of it) is a request or connection that timed out.
fn timed_out(e: &object_store::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_timeout())
        {
            return true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        cause = c.source();
    }
    let text = chain(e).to_ascii_lowercase();
    text.contains("timed out") || text.contains("operation timeout")
}

/// `e` and its causes, joined: "builder error" alone says nothing.
fn chain(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The requests of a batch for one object, by request index: whole reads, bounded ranges,
/// and open ranges (to the end, or the last bytes).
type ObjectRequests = (Vec<usize>, Vec<(usize, Range<u64>)>, Vec<(usize, GetRange)>);

/// Reads of one object: whole, or these ranges (with the request index of each).
enum ObjectReads {
    Whole(Vec<usize>),
    Ranges(Vec<(usize, Range<u64>)>, Vec<(usize, GetRange)>),
}

/// Reads everything `reqs` asks of the object at `path`, into `out` by request index.
async fn read_object(
    store: Arc<dyn ObjectStore>,
    path: Path,
    reads: ObjectReads,
) -> std::result::Result<Vec<(usize, Option<Vec<u8>>)>, object_store::Error> {
    let permit = in_flight().acquire_owned().await;
    let missing = |idx: Vec<usize>| idx.into_iter().map(|i| (i, None)).collect();
    let result = match reads {
        ObjectReads::Whole(idx) => match store.get(&path).await {
            Ok(r) => {
                let bytes = r.bytes().await?;
                idx.into_iter().map(|i| (i, Some(bytes.to_vec()))).collect()
            }
            Err(object_store::Error::NotFound { .. }) => missing(idx),
            Err(e) => return Err(e),
        },
        ObjectReads::Ranges(bounded, open) => {
            let mut out = Vec::with_capacity(bounded.len() + open.len());
            if !bounded.is_empty() {
                let ranges: Vec<Range<u64>> = bounded.iter().map(|(_, r)| r.clone()).collect();
                match store.get_ranges(&path, &ranges).await {
                    Ok(parts) => {
                        for ((i, _), b) in bounded.iter().zip(parts) {
                            out.push((*i, Some(b.to_vec())));
                        }
                    }
                    Err(object_store::Error::NotFound { .. }) => {
                        out.extend(bounded.iter().map(|(i, _)| (*i, None)));
                    }
                    Err(e) => return Err(e),
                }
            }
            for (i, range) in open {
                let opts = GetOptions {
                    range: Some(range),
                    ..Default::default()
                };
                match store.get_opts(&path, opts).await {
                    Ok(r) => out.push((i, Some(r.bytes().await?.to_vec()))),
                    Err(object_store::Error::NotFound { .. }) => out.push((i, None)),
                    Err(e) => return Err(e),
                }
            }
            out
        }
    };
    drop(permit);
    Ok(result)
}

impl Store for ObjectBackend {
    fn url(&self) -> &str {
        &self.url
    }

    fn read_batch(&self, reqs: Vec<ReadRequest>, done: ReadCallback) {
        let (rt, store) = match runtime().and_then(|rt| Ok((rt, self.store()?))) {
            Ok(both) => both,
            Err(e) => return done(Err(e)),
        };
        // Group by object: whole reads fetch once; ranges of one object go out together.
        let mut groups: HashMap<&str, ObjectRequests> = HashMap::new();
        for (i, r) in reqs.iter().enumerate() {
            let g = groups.entry(r.key.as_str()).or_default();
            match r.range {
                None => g.0.push(i),
                Some(br) if br.from_end => g.2.push((i, GetRange::Suffix(br.offset))),
                Some(br) => match br.len {
                    Some(len) => g.1.push((i, br.offset..br.offset + len)),
                    None => g.2.push((i, GetRange::Offset(br.offset))),
                },
            }
        }
        let mut jobs = Vec::new();
        for (key, (whole, bounded, open)) in groups {
            let path = self.path(key);
            if !whole.is_empty() {
                jobs.push((key.to_string(), path.clone(), ObjectReads::Whole(whole)));
            }
            if !bounded.is_empty() || !open.is_empty() {
                jobs.push((key.to_string(), path, ObjectReads::Ranges(bounded, open)));
            }
        }
        let n = reqs.len();
        let url = self.url.clone();
        rt.spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            for (key, path, reads) in jobs {
                let store = store.clone();
                set.spawn(async move { (key, read_object(store, path, reads).await) });
            }
            let mut out: Vec<Option<Value>> = (0..n).map(|_| None).collect();
            while let Some(joined) = set.join_next().await {
                match joined {
                    Ok((_, Ok(values))) => {
                        for (i, v) in values {
                            out[i] = v.map(Value::Owned);
                        }
                    }
                    Ok((key, Err(e))) => {
                        set.abort_all();
                        return done(Err(Error::store(format!("{url}/{key}"), describe(&e))));
                    }
                    Err(e) => {
                        set.abort_all();
                        return done(Err(Error::store(&url, format!("IO task failed: {e}"))));
                    }
                }
            }
            done(Ok(out as ReadBatch))
        });
    }

    fn write_async(&self, key: String, value: Vec<u8>, done: WriteCallback) {
        let (rt, store) = match runtime().and_then(|rt| Ok((rt, self.store()?))) {
            Ok(both) => both,
            Err(e) => return done(Err(e)),
        };
        let path = self.path(&key);
        let url = self.key_url(&key);
        rt.spawn(async move {
            let permit = in_flight().acquire_owned().await;
            // A PUT replaces the object whole: readers never see part of it.
            let r = store.put(&path, PutPayload::from(value)).await;
            drop(permit);
            done(r.map(|_| ()).map_err(|e| Error::store(url, describe(&e))));
        });
    }

    fn erase(&self, key: &str) -> Result<()> {
        let store = self.store()?;
        let path = self.path(key);
        let url = self.key_url(key);
        self.block_on(async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(Error::store(url, describe(&e))),
            }
        })
    }

    fn erase_prefix(&self, prefix: &str) -> Result<()> {
        let keys = self.list_prefix(prefix)?;
        let store = self.store()?;
        let paths: Vec<Path> = keys.iter().map(|k| self.path(k)).collect();
        let url = self.url.clone();
        self.block_on(async move {
            let mut set = tokio::task::JoinSet::new();
            for p in paths {
                let store = store.clone();
                set.spawn(async move {
                    match store.delete(&p).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(format!("{p}: {}", describe(&e))),
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(msg)) => return Err(Error::store(&url, msg)),
                    Err(e) => return Err(Error::store(&url, format!("IO task failed: {e}"))),
                }
            }
            Ok(())
        })
    }

    fn list_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        use futures_util::StreamExt;
        let store = self.store()?;
        let root = self.prefix.clone();
        let list_at = match (root.is_empty(), prefix.trim_matches('/')) {
            (true, "") => None,
            (true, p) => Some(Path::from(p)),
            (false, "") => Some(Path::from(root.as_str())),
            (false, p) => Some(Path::from(format!("{root}/{p}"))),
        };
        let url = self.url.clone();
        let want = prefix.to_string();
        self.block_on(async move {
            let mut stream = store.list(list_at.as_ref());
            let mut keys = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| Error::store(&url, describe(&e)))?;
                let full = meta.location.to_string();
                let key = if root.is_empty() {
                    full
                } else {
                    match full.strip_prefix(&format!("{root}/")) {
                        Some(k) => k.to_string(),
                        None => continue,
                    }
                };
                if key.starts_with(&want) {
                    keys.push(key);
                }
            }
            keys.sort();
            Ok(keys)
        })
    }

    fn size_of(&self, key: &str) -> Result<Option<u64>> {
        let store = self.store()?;
        let path = self.path(key);
        let url = self.key_url(key);
        self.block_on(async move {
            match store.head(&path).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Error::store(url, describe(&e))),
            }
        })
    }

    fn supports_partial_reads(&self) -> bool {
        true
    }

    fn latency_bound(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance_over_object_stores_in_memory() {
        let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        super::super::conformance::check_store(&ObjectBackend::with_store(
            "mem://root",
            mem.clone(),
            "",
        ));
        // Under a prefix, other keys of the bucket stay out of sight.
        let other = ObjectBackend::with_store("mem://root/outside", mem.clone(), "outside");
        other.set("zarr.json", b"{}".to_vec()).unwrap();
        super::super::conformance::check_store(&ObjectBackend::with_store(
            "mem://root/data/x.zarr",
            mem,
            "data/x.zarr",
        ));
        assert_eq!(other.list_prefix("").unwrap(), vec!["zarr.json"]);
    }

    #[test]
    fn bucket_and_prefix_split_from_urls() {
        assert_eq!(
            split_bucket("s3://b/a/x.zarr/").unwrap(),
            ("s3://b".to_string(), "a/x.zarr".to_string())
        );
        assert_eq!(
            split_bucket("gs://b").unwrap(),
            ("gs://b".to_string(), String::new())
        );
        assert!(split_bucket("s3:///x").is_err());
        let err = ObjectBackend::open("ftp://host/x").err().unwrap();
        assert!(err.to_string().contains("ftp://"), "{err}");
    }
}
