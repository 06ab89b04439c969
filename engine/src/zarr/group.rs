//! Zarr groups: reading a source group (its attributes, its arrays, whether its metadata is
//! consolidated), and writing a job's target group: created with the source's attributes and
//! marked unfinished while the job runs, then unmarked and, when asked, consolidated (the
//! member arrays' metadata gathered into the group's, as zarr-python's
//! `consolidate_metadata` does, so xarray opens it with one read).

use serde_json::{json, Map, Value};

use super::attrs::{self, JOB_ATTR};
use super::target::{remove_marker, TargetState};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{ReadRequest, Store};

const V3_KEY: &str = "zarr.json";
const V2_GROUP_KEY: &str = ".zgroup";
const V2_ATTRS_KEY: &str = ".zattrs";
const V2_CONSOLIDATED_KEY: &str = ".zmetadata";

/// A group's own metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupMeta {
    /// 2 or 3.
    pub zarr_format: u8,
    /// Attributes (without a job marker).
    pub attributes: Map<String, Value>,
    /// Whether the group has consolidated metadata.
    pub consolidated: bool,
}

fn json_of(bytes: &[u8], key: &str, url: &str) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::new(ErrorKind::Corrupt, format!("invalid JSON: {e}"))
            .with_chunk_key(key)
            .with_store(url)
    })
}

fn to_json(v: &Value) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v).map_err(|e| Error::internal(e.to_string()))
}

/// The group at the root of `store`, or `None` when there is none (an array, or nothing).
pub fn read_group(store: &dyn Store) -> Result<Option<GroupMeta>> {
    let url = store.url().to_string();
    let mut docs = store
        .get_many(vec![
            ReadRequest::whole(V3_KEY),
            ReadRequest::whole(V2_GROUP_KEY),
            ReadRequest::whole(V2_ATTRS_KEY),
        ])?
        .into_iter();
    let (v3, v2, v2_attrs) = (
        docs.next().flatten(),
        docs.next().flatten(),
        docs.next().flatten(),
    );
    let (zarr_format, mut attributes, consolidated) = match (v3, v2) {
        (Some(doc), _) => {
            let doc = json_of(&doc, V3_KEY, &url)?;
            if doc.get("node_type").and_then(Value::as_str) != Some("group") {
                return Ok(None);
            }
            let attributes = doc.get("attributes").and_then(Value::as_object).cloned();
            let consolidated = doc
                .get("consolidated_metadata")
                .is_some_and(|c| !c.is_null());
            (3, attributes.unwrap_or_default(), consolidated)
        }
        (None, Some(_)) => {
            let attributes = match v2_attrs {
                Some(a) => json_of(&a, V2_ATTRS_KEY, &url)?
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                None => Map::new(),
            };
            let consolidated = store.size_of(V2_CONSOLIDATED_KEY)?.is_some();
            (2, attributes, consolidated)
        }
        (None, None) => return Ok(None),
    };
    attributes.remove(JOB_ATTR);
    Ok(Some(GroupMeta {
        zarr_format,
        attributes,
        consolidated,
    }))
}

/// The nodes directly in a group: its arrays and the groups nested in it, each by name,
/// sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// The arrays directly in the group.
    pub arrays: Vec<String>,
    /// The groups directly in it (an array deeper down names the group holding it).
    pub groups: Vec<String>,
}

/// The names of the arrays directly in the group at the root of `store`, sorted. A group
/// nested in it is refused (naming it): rechunking nested groups is not supported.
pub fn member_arrays(store: &dyn Store) -> Result<Vec<String>> {
    let members = members(store)?;
    if let Some(group) = members.groups.first() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("the group holds a nested group \"{group}\"; only flat groups (arrays directly in the group, as xarray writes datasets) are supported"),
        )
        .with_store(store.url()));
    }
    Ok(members.arrays)
}

/// What the group at the root of `store` holds: from its consolidated metadata when it has
/// some, else by listing the store.
pub fn members(store: &dyn Store) -> Result<Members> {
    let url = store.url().to_string();
    // Every metadata key below the root: "<path>/zarr.json", "<path>/.zarray", ...
    let keys: Vec<String> = match consolidated_keys(store)? {
        Some(keys) => keys,
        None => store
            .list_prefix("")?
            .into_iter()
            .filter(|k| {
                k.ends_with("/zarr.json") || k.ends_with("/.zarray") || k.ends_with("/.zgroup")
            })
            .collect(),
    };
    let mut members = Members::default();
    for key in keys {
        let Some((path, leaf)) = key.rsplit_once('/') else {
            continue;
        };
        let is_group = match leaf {
            ".zgroup" => true,
            ".zarray" => false,
            "zarr.json" => {
                let doc = match store.get(&key)? {
                    Some(b) => json_of(&b, &key, &url)?,
                    None => continue,
                };
                doc.get("node_type").and_then(Value::as_str) == Some("group")
            }
            _ => continue,
        };
        match path.split_once('/') {
            Some((group, _)) => members.groups.push(group.to_string()),
            None if is_group => members.groups.push(path.to_string()),
            None => members.arrays.push(path.to_string()),
        }
    }
    for names in [&mut members.arrays, &mut members.groups] {
        names.sort();
        names.dedup();
    }
    Ok(members)
}

/// The metadata keys a group's consolidated metadata lists (v3: `<name>/zarr.json` for each
/// node in it), or `None` without consolidated metadata.
fn consolidated_keys(store: &dyn Store) -> Result<Option<Vec<String>>> {
    let url = store.url().to_string();
    if let Some(doc) = store.get(V2_CONSOLIDATED_KEY)? {
        let doc = json_of(&doc, V2_CONSOLIDATED_KEY, &url)?;
        let keys = doc
            .get("metadata")
            .and_then(Value::as_object)
            .map(|m| m.keys().filter(|k| k.contains('/')).cloned().collect());
        return Ok(keys);
    }
    if let Some(doc) = store.get(V3_KEY)? {
        let doc = json_of(&doc, V3_KEY, &url)?;
        let nodes = doc
            .get("consolidated_metadata")
            .and_then(|c| c.get("metadata"))
            .and_then(Value::as_object);
        return Ok(nodes.map(|m| {
            m.iter()
                .map(|(name, node)| {
                    let leaf = match node.get("node_type").and_then(Value::as_str) {
                        Some("group") => ".zgroup",
                        _ => ".zarray",
                    };
                    format!("{name}/{leaf}")
                })
                .collect()
        }));
    }
    Ok(None)
}

/// The documents of a group with `attributes` (and the job marker's value `marker`), each
/// with its key.
fn group_documents(
    zarr_format: u8,
    attributes: &Map<String, Value>,
    marker: Option<&Value>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut attributes = attributes.clone();
    if let Some(m) = marker {
        attributes.insert(JOB_ATTR.to_string(), m.clone());
    }
    Ok(match zarr_format {
        2 => vec![
            (
                V2_GROUP_KEY.to_string(),
                to_json(&json!({"zarr_format": 2}))?,
            ),
            (
                V2_ATTRS_KEY.to_string(),
                to_json(&Value::Object(attributes))?,
            ),
        ],
        3 => vec![(
            V3_KEY.to_string(),
            to_json(&json!({"zarr_format": 3, "node_type": "group", "attributes": attributes}))?,
        )],
        v => {
            return Err(Error::new(
                ErrorKind::Plan,
                format!("zarr_format must be 2 or 3, got {v}"),
            ))
        }
    })
}

/// Creates the target group of job `job` at the root of `store`, with `attributes`, marked
/// as the job's unfinished output; with `resume`, keeps the group (and the arrays in it) that
/// an unfinished run of the same job left with the same attributes. Anything else at the
/// root is erased first: the caller has checked that it may be (see
/// [`check_target`](super::target::check_target)). Returns whether it resumed.
pub fn open_target_group(
    store: &dyn Store,
    zarr_format: u8,
    attributes: &Map<String, Value>,
    job: &str,
    resume: bool,
) -> Result<bool> {
    let url = store.url().to_string();
    let docs = group_documents(zarr_format, attributes, Some(&attrs::job_marker(job)))?;
    let state = TargetState::of(store)?;
    if resume && matches!(&state, TargetState::Unfinished { job: j, what: "group" } if j == job) {
        let mut same = true;
        for (key, doc) in &docs {
            same &= store.get(key).map_err(|e| e.with_store(&url))?.as_deref() == Some(doc);
        }
        if same {
            return Ok(true);
        }
    }
    if state != TargetState::Absent {
        store.erase_prefix("")?;
    }
    for (key, doc) in docs {
        store.set(&key, doc).map_err(|e| e.with_store(&url))?;
    }
    Ok(false)
}

/// Completes a job's target group at the root of `store`: consolidates the metadata of its
/// arrays `members` when `consolidated`, then removes the unfinished-job marker.
pub fn finish_group(store: &dyn Store, members: &[String], consolidated: bool) -> Result<()> {
    if !consolidated {
        return remove_marker(store);
    }
    let url = store.url().to_string();
    let read = |key: &str| -> Result<Option<Value>> {
        match store.get(key).map_err(|e| e.with_store(&url))? {
            Some(b) => json_of(&b, key, &url).map(Some),
            None => Ok(None),
        }
    };
    if let Some(mut group) = read(V3_KEY)? {
        let mut nodes = Map::new();
        for name in members {
            if let Some(doc) = read(&format!("{name}/{V3_KEY}"))? {
                nodes.insert(name.clone(), doc);
            }
        }
        if let Some(map) = group.as_object_mut() {
            if let Some(a) = map.get_mut("attributes").and_then(Value::as_object_mut) {
                a.remove(JOB_ATTR);
            }
            map.insert(
                "consolidated_metadata".to_string(),
                json!({"kind": "inline", "must_understand": false, "metadata": nodes}),
            );
        }
        return store
            .set(V3_KEY, to_json(&group)?)
            .map_err(|e| e.with_store(&url));
    }
    // Zarr v2: the group's attributes unmarked first, as the consolidated copy holds them.
    remove_marker(store)?;
    let mut metadata = Map::new();
    for key in [V2_GROUP_KEY, V2_ATTRS_KEY] {
        if let Some(doc) = read(key)? {
            metadata.insert(key.to_string(), doc);
        }
    }
    for name in members {
        for leaf in [".zarray", V2_ATTRS_KEY] {
            let key = format!("{name}/{leaf}");
            if let Some(doc) = read(&key)? {
                metadata.insert(key, doc);
            }
        }
    }
    let doc = json!({"zarr_consolidated_format": 1, "metadata": metadata});
    store
        .set(V2_CONSOLIDATED_KEY, to_json(&doc)?)
        .map_err(|e| e.with_store(&url))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::DType;
    use crate::zarr::{ArrayAttrs, ArraySpec, Codec, ZarrArray};

    #[test]
    fn a_target_group_is_marked_then_consolidated() {
        for zarr_format in [2u8, 3] {
            // Groups are directories (in-memory stores have no paths inside them).
            let dir = tempfile::tempdir().unwrap();
            let url = dir.path().join("g.zarr").display().to_string();
            let store = crate::store::open_store(&url, 1).unwrap();
            let attrs: Map<String, Value> = json!({"title": "era5"})
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert!(!open_target_group(store.as_ref(), zarr_format, &attrs, "j", true).unwrap());
            let meta = read_group(store.as_ref()).unwrap().unwrap();
            assert_eq!(
                meta.attributes, attrs,
                "the marker is not an attribute of the data"
            );
            assert_eq!(meta.zarr_format, zarr_format);
            let state = TargetState::of(store.as_ref()).unwrap();
            assert_eq!(
                state,
                TargetState::Unfinished {
                    what: "group",
                    job: "j".into()
                }
            );
            // The same job resumes it; its arrays stay.
            let member = crate::store::open_store(&format!("{url}/t2m"), 1).unwrap();
            let spec = ArraySpec {
                shape: vec![4],
                dtype: DType::F64,
                chunks: vec![2],
                shards: None,
                codec: Codec::None,
                zarr_format,
                fill: None,
                overwrite: true,
                existing: false,
                region: None,
            };
            let names = ArrayAttrs {
                attributes: Map::new(),
                dimension_names: Some(vec![Some("time".into())]),
                null_v2_fill: false,
            };
            ZarrArray::create_with(member, &spec, &names, None).unwrap();
            assert!(open_target_group(store.as_ref(), zarr_format, &attrs, "j", true).unwrap());
            assert_eq!(
                member_arrays(store.as_ref()).unwrap(),
                vec!["t2m".to_string()]
            );
            finish_group(store.as_ref(), &["t2m".to_string()], true).unwrap();
            let meta = read_group(store.as_ref()).unwrap().unwrap();
            assert!(meta.consolidated);
            let state = TargetState::of(store.as_ref()).unwrap();
            assert_eq!(state, TargetState::Present { what: "group" });
            let consolidated = if zarr_format == 3 {
                let doc: Value =
                    serde_json::from_slice(&store.get("zarr.json").unwrap().unwrap()).unwrap();
                assert_eq!(doc["attributes"], json!({"title": "era5"}));
                doc["consolidated_metadata"]["metadata"]["t2m"]["dimension_names"].clone()
            } else {
                let doc: Value =
                    serde_json::from_slice(&store.get(".zmetadata").unwrap().unwrap()).unwrap();
                assert_eq!(doc["metadata"][".zattrs"], json!({"title": "era5"}));
                doc["metadata"]["t2m/.zattrs"]["_ARRAY_DIMENSIONS"].clone()
            };
            assert_eq!(consolidated, json!(["time"]));
            // Listed from the consolidated metadata too; another job's run starts over.
            assert_eq!(
                member_arrays(store.as_ref()).unwrap(),
                vec!["t2m".to_string()]
            );
            assert!(!open_target_group(store.as_ref(), zarr_format, &attrs, "k", true).unwrap());
            assert_eq!(member_arrays(store.as_ref()).unwrap(), Vec::<String>::new());
        }
    }
}
