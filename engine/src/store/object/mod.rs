//! Object storage (`s3://`, `gs://`, `http(s)://`) through the object_store crate.
//!
//! Requests run on one process-wide tokio runtime, never on compute threads. A batch groups
//! its ranged reads per object so object_store coalesces nearby ranges into few GETs; whole
//! reads are plain GETs (no HEAD first). Credentials, region and endpoint come from each
//! cloud's standard environment variables; with no credentials in the environment, requests
//! go unsigned (public buckets). Transient failures (5xx, dropped connections, requests that
//! time out) are retried with exponential backoff; `CHUNKFUSE_IO_RETRIES` and
//! `CHUNKFUSE_IO_RETRY_TIMEOUT_S` override the defaults (retried for 60 s, at most 100
//! times).
//!
//! A server that accepts the connection and never answers fails a request after the request
//! timeout (`CHUNKFUSE_IO_TIMEOUT_S`, 30 s); connecting gives up after the connect timeout
//! (`CHUNKFUSE_IO_CONNECT_TIMEOUT_S`, 10 s). With retries, a stalled server gives an error
//! naming the URL after at most [`Timeouts::worst_case`] (the retry window, one request
//! timeout and the longest backoff: 95 s by default). [`set_timeouts`] sets all three for
//! stores opened afterwards. Ctrl-C ends the wait at once (see [`crate::cancel`]).

mod connect;
mod errors;
mod reads;
mod runtime;
mod timeouts;

use std::collections::HashMap;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{GetRange, ObjectStore, ObjectStoreExt, PutPayload};

use super::{ReadBatch, ReadCallback, ReadRequest, Store, Value, WriteCallback};
use crate::error::{Error, Result};
use crate::fork_safe::ForkSafe;
use errors::describe;
use reads::{read_object, ObjectReads, ObjectRequests};
use runtime::{in_flight, runtime};
pub use timeouts::{set_timeouts, Timeouts};

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
    use super::connect::split_bucket;
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
