//! An in-process store for tests and small intermediates (`memory://NAME`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use super::{ReadBatch, ReadCallback, ReadRequest, Store, Value, WriteCallback};
use crate::error::{Error, Result};

/// Keys held in memory; stores of the same name share their contents within a process.
pub struct MemoryStore {
    url: String,
    map: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    /// Values being written in parts, outside the map until whole.
    building: Mutex<HashMap<String, Vec<u8>>>,
    parts: super::parts::PartTracker,
}

type Registry = Mutex<HashMap<String, Arc<Mutex<BTreeMap<String, Vec<u8>>>>>>;

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl MemoryStore {
    /// The store named `name` (created empty on first use).
    pub fn named(name: &str) -> Arc<dyn Store> {
        let map = registry()
            .lock()
            .map(|mut r| r.entry(name.to_string()).or_default().clone())
            .unwrap_or_default();
        Arc::new(MemoryStore {
            url: format!("memory://{name}"),
            map,
            building: Mutex::default(),
            parts: super::parts::PartTracker::default(),
        })
    }

    fn with_map<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Vec<u8>>) -> T) -> Result<T> {
        let mut guard = self
            .map
            .lock()
            .map_err(|_| Error::store(&self.url, "store lock poisoned"))?;
        Ok(f(&mut guard))
    }
}

impl Store for MemoryStore {
    fn url(&self) -> &str {
        &self.url
    }

    fn read_batch(&self, reqs: Vec<ReadRequest>, done: ReadCallback) {
        let result = self.with_map(|m| {
            reqs.iter()
                .map(|r| {
                    m.get(&r.key).map(|v| match r.range {
                        None => Value::Owned(v.clone()),
                        Some(br) if br.from_end => {
                            let n = (br.offset as usize).min(v.len());
                            Value::Owned(v[v.len() - n..].to_vec())
                        }
                        Some(br) => {
                            let start = (br.offset as usize).min(v.len());
                            let end = br
                                .len
                                .map(|l| (start + l as usize).min(v.len()))
                                .unwrap_or(v.len());
                            Value::Owned(v[start..end].to_vec())
                        }
                    })
                })
                .collect::<ReadBatch>()
        });
        done(result)
    }

    fn write_async(&self, key: String, value: Vec<u8>, done: WriteCallback) {
        done(self.with_map(|m| {
            m.insert(key, value);
        }))
    }

    fn erase(&self, key: &str) -> Result<()> {
        self.with_map(|m| {
            m.remove(key);
        })
    }

    fn erase_prefix(&self, prefix: &str) -> Result<()> {
        self.with_map(|m| m.retain(|k, _| !k.starts_with(prefix)))
    }

    fn list_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        self.with_map(|m| {
            m.keys()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect()
        })
    }

    fn size_of(&self, key: &str) -> Result<Option<u64>> {
        self.with_map(|m| m.get(key).map(|v| v.len() as u64))
    }

    fn supports_partial_reads(&self) -> bool {
        true
    }

    fn supports_part_writes(&self) -> bool {
        true
    }

    fn write_part_async(
        &self,
        key: String,
        offset: u64,
        bytes: Vec<u8>,
        total: Option<u64>,
        done: WriteCallback,
    ) {
        let poisoned = || Error::store(&self.url, "store lock poisoned");
        let result = (|| {
            let mut building = self.building.lock().map_err(|_| poisoned())?;
            let value = building.entry(key.clone()).or_default();
            let end = offset as usize + bytes.len();
            if value.len() < end {
                value.resize(end, 0);
            }
            value[offset as usize..end].copy_from_slice(&bytes);
            if let super::parts::PartOutcome::Complete { total } =
                self.parts.written(&key, bytes.len() as u64, total)
            {
                let mut value = building.remove(&key).unwrap_or_default();
                value.resize(total as usize, 0);
                self.with_map(|m| {
                    m.insert(key, value);
                })?;
            }
            Ok(())
        })();
        done(result)
    }

    fn discard_parts(&self) {
        self.parts.abandon_all();
        if let Ok(mut b) = self.building.lock() {
            b.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_store_conforms() {
        let s = super::MemoryStore::named("conformance");
        crate::store::conformance::check_store(s.as_ref());
        crate::store::conformance::check_part_writes(s.as_ref());
    }
}
