//! Targets of jobs: an array created with its attributes, marked unfinished while its job
//! runs (an attribute zarr-python and xarray show: see [`attrs::job_marker`]), reopened when
//! the same job runs again, and never put where something else is unless asked to.

use std::sync::Arc;

use serde_json::Value;

use super::attrs::{self, ArrayAttrs, JOB_ATTR};
use super::{create, metadata, window, ArraySpec, ZarrArray};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{ReadRequest, Store};

const V3_KEY: &str = "zarr.json";
const V2_ARRAY_KEY: &str = ".zarray";
const V2_GROUP_KEY: &str = ".zgroup";
const V2_ATTRS_KEY: &str = ".zattrs";

/// What the root of a store holds, as a job's target sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetState {
    /// No Zarr array or group.
    Absent,
    /// An array or group (`what`) that job `job` began and has not finished.
    Unfinished {
        /// `"array"` or `"group"`.
        what: &'static str,
        /// The job's fingerprint.
        job: String,
    },
    /// A finished array or group (`what`), or one another tool made.
    Present {
        /// `"array"` or `"group"`.
        what: &'static str,
    },
}

impl TargetState {
    /// Reads what the root of `store` holds.
    pub fn of(store: &dyn Store) -> Result<TargetState> {
        let url = store.url().to_string();
        let corrupt = |key: &str, e: serde_json::Error| {
            Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}"))
                .with_chunk_key(key)
                .with_store(&url)
        };
        let docs = store.get_many(vec![
            ReadRequest::whole(V3_KEY),
            ReadRequest::whole(V2_ARRAY_KEY),
            ReadRequest::whole(V2_GROUP_KEY),
            ReadRequest::whole(V2_ATTRS_KEY),
        ])?;
        let mut docs = docs.into_iter();
        let (v3, v2_array, v2_group, v2_attrs) = (
            docs.next().flatten(),
            docs.next().flatten(),
            docs.next().flatten(),
            docs.next().flatten(),
        );
        let (what, attributes) = if let Some(doc) = v3 {
            let doc: Value = serde_json::from_slice(&doc).map_err(|e| corrupt(V3_KEY, e))?;
            let what = match doc.get("node_type").and_then(Value::as_str) {
                Some("group") => "group",
                _ => "array",
            };
            (what, doc.get("attributes").cloned())
        } else if v2_array.is_some() || v2_group.is_some() {
            let what = if v2_array.is_some() { "array" } else { "group" };
            let attributes = match v2_attrs {
                Some(a) => Some(serde_json::from_slice(&a).map_err(|e| corrupt(V2_ATTRS_KEY, e))?),
                None => None,
            };
            (what, attributes)
        } else {
            return Ok(TargetState::Absent);
        };
        let marker = attributes.as_ref().and_then(|a| a.get(JOB_ATTR));
        let unfinished = marker.and_then(|m| {
            let incomplete = m.get("incomplete").and_then(Value::as_bool) == Some(true);
            let job = m.get("job").and_then(Value::as_str)?;
            incomplete.then(|| job.to_string())
        });
        Ok(match unfinished {
            Some(job) => TargetState::Unfinished { what, job },
            None => TargetState::Present { what },
        })
    }
}

/// Checks that job `job` may write its target at the root of `store`: nothing is there, or the
/// job's own unfinished output (which it resumes or replaces), or `overwrite` allows
/// replacing whatever is. The error names the store.
pub fn check_target(store: &dyn Store, overwrite: bool, job: &str) -> Result<()> {
    let refuse = |msg: String| Err(Error::new(ErrorKind::Plan, msg).with_store(store.url()));
    match TargetState::of(store)? {
        TargetState::Absent => Ok(()),
        TargetState::Unfinished { job: j, .. } if j == job => Ok(()),
        _ if overwrite => Ok(()),
        TargetState::Unfinished { what, .. } => refuse(format!(
            "the target holds a Zarr {what} that another job left unfinished; pass \
             overwrite=True (CLI --overwrite) to replace it"
        )),
        TargetState::Present { what } => refuse(format!(
            "the target already holds a Zarr {what}; pass overwrite=True (CLI --overwrite) to \
             replace it (only a target that this same job left unfinished is resumed)"
        )),
    }
}

impl ZarrArray {
    /// Creates the array of `spec` with `attrs` in `store` (replacing an existing array or
    /// group when `spec.overwrite`) and writes its metadata; with `job`, marked as that job's
    /// unfinished target. With `spec.existing`, opens the array already there instead.
    pub fn create_with(
        store: Arc<dyn Store>,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        job: Option<&str>,
    ) -> Result<Self> {
        if spec.existing && metadata::exists(store.as_ref())? {
            let array = Self::open(store)?;
            array.check_matches(spec)?;
            return match &spec.region {
                Some(start) => array.windowed(start, &spec.shape),
                None => Ok(array),
            };
        }
        if let Some(start) = &spec.region {
            // No array there (a planning stand-in): one reaching to the box's end, chunked
            // as the target, whose window has the target window's grid.
            let mut whole = spec.clone();
            whole.shape = start.iter().zip(&spec.shape).map(|(s, n)| s + n).collect();
            whole.region = None;
            whole.existing = false;
            let existing = node_exists(store.as_ref())?;
            return Self::create_over(store, &whole, attrs, job, existing)?
                .windowed(start, &spec.shape);
        }
        let existing = node_exists(store.as_ref())?;
        Self::create_over(store, spec, attrs, job, existing)
    }

    /// [`create_with`](Self::create_with) (not `spec.existing`) where the caller knows
    /// whether an array or group is there.
    fn create_over(
        store: Arc<dyn Store>,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        job: Option<&str>,
        existing: bool,
    ) -> Result<Self> {
        let url = store.url().to_string();
        let marker = job.map(attrs::job_marker);
        let docs = create::metadata_documents(spec, attrs, marker.as_ref())
            .map_err(|e| e.with_store(&url))?;
        let (metadata, raw) = metadata::parse_documents(&docs).map_err(|e| e.with_store(&url))?;
        if existing && !spec.overwrite {
            return Err(Error::store(
                &url,
                "an array already exists here (set \"overwrite\": true to replace it)",
            ));
        }
        if existing {
            store.erase_prefix("")?;
        }
        let array = Self::from_metadata(store.clone(), metadata, raw)?;
        if marker.is_some() {
            array.keep_finished_docs(spec, attrs, &docs)?;
        }
        for (key, doc) in docs {
            store.set(&key, doc).map_err(|e| e.with_store(&url))?;
        }
        Ok(array)
    }

    /// Keeps the documents that complete this target: those of `spec` and `attrs` without
    /// the marker that differ from its marked documents `marked`.
    fn keep_finished_docs(
        &self,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        marked: &[(String, Vec<u8>)],
    ) -> Result<()> {
        let mut finished = create::metadata_documents(spec, attrs, None)?;
        finished.retain(|doc| !marked.contains(doc));
        if let Ok(mut slot) = self.finished_docs.lock() {
            *slot = Some(finished);
        }
        Ok(())
    }

    /// Opens the target of job `job` in `store`: with `resume`, the array an unfinished run
    /// of the same job left (same marker, same metadata), so its written chunks are kept;
    /// otherwise creates it as [`create_with`](Self::create_with) does, marked by `job`
    /// (replacing the job's own unfinished output even without `spec.overwrite`). Returns
    /// whether it resumed.
    pub fn open_target(
        store: Arc<dyn Store>,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        job: &str,
        resume: bool,
    ) -> Result<(Self, bool)> {
        if spec.existing {
            let array = Self::create_with(store, spec, attrs, None)?;
            // A write of a whole existing array (xarray's and Dask's targets) marks it too;
            // a region write shares its array with other writers and leaves it as it is.
            if spec.region.is_none() {
                array.mark_existing(job)?;
            }
            return Ok((array, false));
        }
        let url = store.url().to_string();
        if !resume && spec.overwrite {
            // Whatever is there goes: no need to know what it is.
            let existing = node_exists(store.as_ref())?;
            return Ok((
                Self::create_over(store, spec, attrs, Some(job), existing)?,
                false,
            ));
        }
        let state = TargetState::of(store.as_ref())?;
        let own = matches!(&state, TargetState::Unfinished { job: j, .. } if j == job);
        if own && resume {
            let marker = attrs::job_marker(job);
            let docs = create::metadata_documents(spec, attrs, Some(&marker))
                .map_err(|e| e.with_store(&url))?;
            let mut same = true;
            for (key, doc) in &docs {
                same &= store.get(key).map_err(|e| e.with_store(&url))?.as_deref() == Some(doc);
            }
            if same {
                store.remove_abandoned_writes()?;
                let array = Self::open(store)?;
                array.keep_finished_docs(spec, attrs, &docs)?;
                return Ok((array, true));
            }
        }
        let mut spec = spec.clone();
        spec.overwrite |= own;
        let existing = state != TargetState::Absent;
        Ok((
            Self::create_over(store, &spec, attrs, Some(job), existing)?,
            false,
        ))
    }

    /// Opens the target of job `job` that another process created with
    /// [`open_target`](Self::open_target), writing nothing: it must be the job's unfinished
    /// output (an error naming what is there otherwise). [`finish_job`](Self::finish_job)
    /// completes it as it would the creator's.
    pub fn attach_target(
        store: Arc<dyn Store>,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        job: &str,
    ) -> Result<Self> {
        let url = store.url().to_string();
        match TargetState::of(store.as_ref())? {
            TargetState::Unfinished { job: j, .. } if j == job => {}
            state => {
                return Err(Error::store(
                    &url,
                    format!(
                        "is not the unfinished output of job {job} ({state:?}): the job \
                         finished or was replaced, so this batch writes nothing"
                    ),
                ))
            }
        }
        let marker = attrs::job_marker(job);
        let docs = create::metadata_documents(spec, attrs, Some(&marker))
            .map_err(|e| e.with_store(&url))?;
        let array = Self::open(store)?;
        array.keep_finished_docs(spec, attrs, &docs)?;
        Ok(array)
    }

    /// Marks this existing array (made by another tool) as job `job`'s unfinished output
    /// until [`finish_job`](Self::finish_job), which puts back its attributes as they were
    /// (less the marker a killed run of any job left there).
    fn mark_existing(&self, job: &str) -> Result<()> {
        let url = &self.url;
        let store = self.store.as_ref();
        let (key, bytes, mut doc) = attributes_document(store)?.unwrap_or_else(|| {
            (
                V2_ATTRS_KEY,
                b"{}".to_vec(),
                Value::Object(Default::default()),
            )
        });
        let not_object = || {
            Error::new(ErrorKind::Corrupt, "attributes are not a JSON object")
                .with_chunk_key(key)
                .with_store(url)
        };
        let stale = attributes_in(&mut doc, key)
            .ok_or_else(not_object)?
            .remove(JOB_ATTR)
            .is_some();
        let finished = if stale { pretty(&doc)? } else { bytes };
        attributes_in(&mut doc, key)
            .ok_or_else(not_object)?
            .insert(JOB_ATTR.to_string(), attrs::job_marker(job));
        store
            .set(key, pretty(&doc)?)
            .map_err(|e| e.with_store(url))?;
        if let Ok(mut slot) = self.finished_docs.lock() {
            *slot = Some(vec![(key.to_string(), finished)]);
        }
        Ok(())
    }

    /// Opens, in a process that runs batches of job `job`, the existing array (made by
    /// another tool) that the job's [`open_target`](Self::open_target) marked, writing
    /// nothing; [`finish_job`](Self::finish_job) takes the job's marker off it as the
    /// creator's would. An array not marked by this job (a region write's) is left as it is.
    pub fn attach_existing(
        store: Arc<dyn Store>,
        spec: &ArraySpec,
        attrs: &ArrayAttrs,
        job: &str,
    ) -> Result<Self> {
        let array = Self::create_with(store, spec, attrs, None)?;
        let Some((key, _, mut doc)) = attributes_document(array.store.as_ref())? else {
            return Ok(array);
        };
        let Some(attributes) = attributes_in(&mut doc, key) else {
            return Ok(array);
        };
        if attributes.get(JOB_ATTR) != Some(&attrs::job_marker(job)) {
            return Ok(array);
        }
        attributes.remove(JOB_ATTR);
        if let Ok(mut slot) = array.finished_docs.lock() {
            *slot = Some(vec![(key.to_string(), pretty(&doc)?)]);
        }
        Ok(array)
    }

    /// Removes the unfinished-job marker from the attributes of an array that
    /// [`open_target`](Self::open_target) marked: the array is complete. (Arrays it did not
    /// mark, such as those a region write fills, are left as they are.)
    pub fn finish_job(&self) -> Result<()> {
        let docs = self.finished_docs.lock().ok().and_then(|mut d| d.take());
        for (key, doc) in docs.into_iter().flatten() {
            self.store
                .set(&key, doc)
                .map_err(|e| e.with_store(&self.url))?;
        }
        Ok(())
    }
}

/// The attributes in the metadata document `doc` stored at `key` (`zarr.json`'s
/// `attributes`, made when absent, or the whole of `.zattrs`); None when not an object.
fn attributes_in<'a>(
    doc: &'a mut Value,
    key: &str,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    let attributes = match key {
        V3_KEY => doc
            .as_object_mut()?
            .entry("attributes")
            .or_insert_with(|| Value::Object(Default::default())),
        _ => doc,
    };
    attributes.as_object_mut()
}

/// True when the root of `store` holds a Zarr array or group.
fn node_exists(store: &dyn Store) -> Result<bool> {
    Ok(metadata::exists(store)? || store.size_of(V2_GROUP_KEY)?.is_some())
}

/// Removes the unfinished-job marker from the attributes of the array or group at the root of
/// `store` (`zarr.json`, or `.zattrs` for Zarr v2), if it has one.
pub(crate) fn remove_marker(store: &dyn Store) -> Result<()> {
    let Some((key, _, mut doc)) = attributes_document(store)? else {
        return Ok(());
    };
    if attributes_in(&mut doc, key)
        .and_then(|a| a.remove(JOB_ATTR))
        .is_some()
    {
        store
            .set(key, pretty(&doc)?)
            .map_err(|e| e.with_store(store.url()))?;
    }
    Ok(())
}

/// The document at the root of `store` that holds its attributes (`zarr.json`, else Zarr
/// v2's `.zattrs`): its key, bytes and parsed JSON; None when neither is stored.
fn attributes_document(store: &dyn Store) -> Result<Option<(&'static str, Vec<u8>, Value)>> {
    let url = store.url();
    for key in [V3_KEY, V2_ATTRS_KEY] {
        let Some(bytes) = store.get(key).map_err(|e| e.with_store(url))? else {
            continue;
        };
        let doc = serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}"))
                .with_chunk_key(key)
                .with_store(url)
        })?;
        return Ok(Some((key, bytes.to_vec(), doc)));
    }
    Ok(None)
}

/// `doc` as the engine writes metadata documents.
pub(super) fn pretty(doc: &Value) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(doc).map_err(|e| Error::internal(e.to_string()))
}

impl ZarrArray {
    /// Checks that this (existing) array has the shape (or, for a region write, holds the
    /// box `spec.region` starts, of `spec.shape`), dtype, chunks and shards `spec` asks for,
    /// so tasks planned for `spec` may write its chunks.
    pub fn check_matches(&self, spec: &ArraySpec) -> Result<()> {
        let info = self.info();
        let problem = if let Some(start) = &spec.region {
            window::check_box(start, &spec.shape, &self.shape()).err()
        } else if self.shape() != spec.shape {
            Some(format!(
                "its shape is {:?}, not {:?}",
                self.shape(),
                spec.shape
            ))
        } else {
            None
        };
        let problem = problem.or_else(|| {
            if self.dtype() != spec.dtype {
                Some(format!("its dtype is {}, not {}", self.dtype(), spec.dtype))
            } else if info.chunks != spec.chunks {
                Some(format!(
                    "its chunks are {:?}, not {:?}",
                    info.chunks, spec.chunks
                ))
            } else if info.shards != spec.shards {
                Some(format!(
                    "its shards are {:?}, not {:?}",
                    info.shards, spec.shards
                ))
            } else {
                None
            }
        });
        match problem {
            Some(p) => Err(Error::new(
                ErrorKind::Plan,
                format!("cannot write into the existing array: {p}"),
            )
            .with_store(self.url())),
            None => Ok(()),
        }
    }

    /// Creates (or replaces, when `spec.overwrite`) an array in `store` and writes its metadata.
    pub fn create(store: Arc<dyn Store>, spec: &ArraySpec) -> Result<Self> {
        Self::create_with(store, spec, &ArrayAttrs::default(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{Buffer, DType};
    use crate::store::memory::MemoryStore;
    use crate::zarr::Codec;
    use serde_json::json;

    fn spec(zarr_format: u8, overwrite: bool) -> ArraySpec {
        ArraySpec {
            shape: vec![4, 6],
            dtype: DType::F32,
            chunks: vec![2, 3],
            shards: None,
            codec: Codec::default(),
            zarr_format,
            fill: Some(f32::NAN.to_ne_bytes().to_vec()),
            overwrite,
            existing: false,
            region: None,
        }
    }

    fn attrs() -> ArrayAttrs {
        ArrayAttrs {
            attributes: json!({"units": "K"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            dimension_names: Some(vec![Some("time".into()), Some("lon".into())]),
            null_v2_fill: false,
        }
    }

    #[test]
    fn a_target_is_marked_until_finished_and_resumed_only_by_its_job() {
        for zarr_format in [2, 3] {
            let store = MemoryStore::named(&format!("target-marked-{zarr_format}"));
            let s = spec(zarr_format, false);
            check_target(store.as_ref(), false, "job-a").unwrap();
            let (arr, resumed) =
                ZarrArray::open_target(store.clone(), &s, &attrs(), "job-a", true).unwrap();
            assert!(!resumed);
            let chunk = Buffer::filled(DType::F32, 6, &1f32.to_ne_bytes());
            let key = arr.chunk_key(&[0, 0]);
            store
                .set(&key, arr.encode_chunk(&[0, 0], &chunk).unwrap().unwrap())
                .unwrap();
            let job = "job-a".to_string();
            let state = TargetState::of(store.as_ref()).unwrap();
            assert_eq!(state, TargetState::Unfinished { what: "array", job });
            // The opened array reads its attributes back, without the marker.
            let reopened = ZarrArray::open(store.clone()).unwrap();
            assert_eq!(reopened.attrs().dimension_names, attrs().dimension_names);
            assert_eq!(reopened.attrs().attributes.get("units"), Some(&json!("K")));
            assert!(!reopened.attrs().attributes.contains_key(JOB_ATTR));
            // Another job may not replace it; the same job resumes it, keeping its chunk.
            let err = check_target(store.as_ref(), false, "job-b").unwrap_err();
            assert!(err.message.contains("another job left unfinished"), "{err}");
            check_target(store.as_ref(), true, "job-b").unwrap();
            check_target(store.as_ref(), false, "job-a").unwrap();
            let (arr, resumed) =
                ZarrArray::open_target(store.clone(), &s, &attrs(), "job-a", true).unwrap();
            assert!(resumed);
            assert!(store.get(&key).unwrap().is_some());
            arr.finish_job().unwrap();
            let state = TargetState::of(store.as_ref()).unwrap();
            assert_eq!(state, TargetState::Present { what: "array" });
            let err = check_target(store.as_ref(), false, "job-a").unwrap_err();
            assert!(err.message.contains("already holds a Zarr array"), "{err}");
            // Started over without resuming: the job's own output, replaced.
            let store = MemoryStore::named(&format!("target-fresh-{zarr_format}"));
            ZarrArray::open_target(store.clone(), &s, &attrs(), "job-a", true).unwrap();
            store.set(&key, vec![1, 2, 3]).unwrap();
            let (_, resumed) =
                ZarrArray::open_target(store.clone(), &s, &attrs(), "job-a", false).unwrap();
            assert!(!resumed);
            assert!(store.get(&key).unwrap().is_none());
        }
    }

    #[test]
    fn a_null_v2_fill_value_stores_every_chunk() {
        let store = MemoryStore::named("target-null-fill");
        let mut s = spec(2, true);
        s.fill = Some(0f32.to_ne_bytes().to_vec());
        // An xarray variable without _FillValue: fill_value null in v2.
        let plain = ArrayAttrs {
            attributes: Default::default(),
            dimension_names: attrs().dimension_names,
            null_v2_fill: false,
        };
        let arr = ZarrArray::create_with(store.clone(), &s, &plain, None).unwrap();
        let doc: Value = serde_json::from_slice(&store.get(".zarray").unwrap().unwrap()).unwrap();
        assert_eq!(doc["fill_value"], Value::Null);
        let zeros = Buffer::zeros(DType::F32, 6);
        assert!(arr.encode_chunk(&[0, 0], &zeros).unwrap().is_some());
        let with_fill = ZarrArray::create(MemoryStore::named("target-zero-fill"), &s).unwrap();
        assert!(with_fill.encode_chunk(&[0, 0], &zeros).unwrap().is_none());
    }
}
