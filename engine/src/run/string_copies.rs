//! Rechunks of arrays of strings, which the engine does not compute on: taken out of a plan
//! before it is typed, and run by the job once its targets are made (see
//! [`crate::zarr::strings`]). A `write` of a source array of strings, or of a `rechunk` of
//! one, is such a copy when nothing else reads them; any other use of a string array stays
//! the engine's error naming it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use crate::error::{Error, ErrorKind, Result};
use crate::exec::Progress;
use crate::plan::{chunk_sizes, GroupDecl, Op, Plan};
use crate::store::open_store;
use crate::zarr::attrs::job_marker;
use crate::zarr::strings::{StringArray, StringTarget};
use crate::zarr::target::check_target;

/// One array of strings rechunked into its target.
pub(super) struct StringCopy {
    array: StringArray,
    target: String,
    spec: StringTarget,
    overwrite: bool,
    /// The write op's JSON path.
    field: String,
}

/// Splits `plan` into the plan the engine types and runs, and the rechunks of arrays of
/// strings it holds (see the module docs).
pub(super) fn split(plan: &Plan, io_threads: usize) -> Result<(Plan, Vec<StringCopy>)> {
    let mut uses: HashMap<&str, usize> = HashMap::new();
    let mut described: HashSet<&str> = HashSet::new();
    for op in &plan.ops {
        for input in op.op.inputs() {
            *uses.entry(input).or_default() += 1;
        }
        if let Op::Write { spec, .. } = &op.op {
            described.extend(spec.metadata_from.as_deref());
        }
    }
    let used_once = |id: &str| uses.get(id) == Some(&1);
    let mut copies = Vec::new();
    let mut taken: HashSet<String> = HashSet::new();
    for op in &plan.ops {
        let Op::Write { input, spec } = &op.op else {
            continue;
        };
        if spec.existing || spec.region.is_some() || !used_once(input) {
            continue;
        }
        let via = plan.ops.iter().find(|o| &o.id == input);
        let (source, chunks) = match via.map(|o| &o.op) {
            Some(Op::Rechunk { input, chunks }) => (input.as_str(), Some(chunks)),
            Some(_) => continue,
            None => (input.as_str(), None),
        };
        let Some(decl) = plan.arrays.iter().find(|a| a.id == source) else {
            continue;
        };
        // metadata_from naming its own source is the rechunk's; another write's would need
        // the array typed.
        let own = spec.metadata_from.as_deref() == Some(source);
        if !used_once(source) || (described.contains(source) && !own) {
            continue;
        }
        // An array the engine types (or cannot open) is left to the typed plan's checks.
        let Ok(store) = open_store(&decl.url, io_threads) else {
            continue;
        };
        let Ok(Some(array)) = StringArray::open(store) else {
            continue;
        };
        let mut target_chunks = match chunks {
            None => array.chunks().to_vec(),
            Some(c) => match chunk_sizes(c, array.shape()) {
                Some(c) => c,
                None => continue,
            },
        };
        if let Some(c) = &spec.chunks {
            target_chunks = c.clone();
        }
        copies.push(StringCopy {
            array,
            target: spec.target.clone(),
            spec: StringTarget {
                chunks: target_chunks,
                codec: spec.codec.clone(),
                zarr_format: spec.zarr_format,
                keep_attrs: own,
            },
            overwrite: spec.overwrite,
            field: op.field.clone(),
        });
        taken.insert(op.id.clone());
        taken.insert(source.to_string());
        if via.is_some() {
            taken.insert(input.clone());
        }
    }
    let rest = Plan {
        name: plan.name.clone(),
        arrays: plan
            .arrays
            .iter()
            .filter(|a| !taken.contains(&a.id))
            .cloned()
            .collect(),
        ops: plan
            .ops
            .iter()
            .filter(|o| !taken.contains(&o.id))
            .cloned()
            .collect(),
        groups: plan.groups.clone(),
    };
    Ok((rest, copies))
}

/// What identifies the copies, for the job's fingerprint.
pub(super) fn describe(copies: &[StringCopy]) -> String {
    copies
        .iter()
        .map(|c| {
            format!(
                "strings {} {:?} {} {:?}\n",
                c.array.url(),
                c.array.shape(),
                c.target,
                c.spec
            )
        })
        .collect()
}

/// The copies' target URLs.
pub(super) fn target_urls(copies: &[StringCopy]) -> Vec<String> {
    copies.iter().map(|c| c.target.clone()).collect()
}

/// Whether `url` lies inside the group at `group`.
fn in_group(group: &str, url: &str) -> bool {
    url.trim_end_matches('/')
        .strip_prefix(group.trim_end_matches('/'))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Checks the targets of `copies` that are in none of `groups` (a group's check covers its
/// arrays) as the job's other targets are: absent, the unfinished output of job `job`, or
/// allowed to be replaced. Also checks their metadata can be made, so that a bad option
/// fails before anything is written.
pub(super) fn check_targets(
    copies: &[StringCopy],
    groups: &[GroupDecl],
    job: &str,
    io_threads: usize,
) -> Result<()> {
    for c in copies {
        c.array
            .target_documents(&c.spec, None)
            .map_err(|e| e.with_field(&c.field))?;
        if groups.iter().any(|g| in_group(&g.target, &c.target)) || c.overwrite {
            continue;
        }
        let store = open_store(&c.target, io_threads)
            .map_err(|e| e.with_field(format!("{}.target", c.field)))?;
        check_target(store.as_ref(), c.overwrite, job)?;
    }
    Ok(())
}

/// Rechunks every array of `copies` into its target, marked as job `job`'s unfinished output
/// until its last chunk is written; counts each target chunk as a task in `progress`.
pub(super) fn run(
    copies: &[StringCopy],
    job: &str,
    io_threads: usize,
    progress: &Progress,
) -> Result<()> {
    let marker = job_marker(job);
    for c in copies {
        let store = open_store(&c.target, io_threads)
            .map_err(|e| e.with_field(format!("{}.target", c.field)))?;
        let copied = c
            .array
            .rechunk_into(&store, &c.spec, &marker)
            .map_err(|e| match e.kind {
                ErrorKind::Cancelled => e,
                _ => with_array(e, c),
            })?;
        progress.add_tasks(copied.chunks);
        progress
            .tasks_done
            .fetch_add(copied.chunks, Ordering::Relaxed);
        progress
            .bytes_read
            .fetch_add(copied.read, Ordering::Relaxed);
        progress
            .bytes_written
            .fetch_add(copied.written, Ordering::Relaxed);
    }
    Ok(())
}

/// `e` naming the source array of `c` when it names none.
fn with_array(e: Error, c: &StringCopy) -> Error {
    if e.context.array.is_some() {
        return e;
    }
    let name = c
        .array
        .url()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    e.with_array(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Zarr v3 array of strings at `dir`, one chunk of `chunk` strings, holding
    /// `values` (vlen-utf8 bytes written by hand, after the codec's specification).
    fn strings_at(dir: &std::path::Path, values: &[&str], chunk: u64) {
        std::fs::create_dir_all(dir.join("c")).unwrap();
        let doc = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": [values.len()],
            "data_type": "string",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": "-", "codecs": [{"name": "vlen-utf8", "configuration": {}}],
            "attributes": {"units": "none"}, "dimension_names": ["x"],
        });
        std::fs::write(dir.join("zarr.json"), doc.to_string()).unwrap();
        for (i, part) in values.chunks(chunk as usize).enumerate() {
            let mut part: Vec<&str> = part.to_vec();
            part.resize(chunk as usize, "-");
            std::fs::write(dir.join("c").join(i.to_string()), vlen_utf8(&part)).unwrap();
        }
    }

    /// The vlen-utf8 encoding of `values`: their count, then each one's length and bytes
    /// (u32 little-endian).
    fn vlen_utf8(values: &[&str]) -> Vec<u8> {
        let mut out = (values.len() as u32).to_le_bytes().to_vec();
        for v in values {
            out.extend((v.len() as u32).to_le_bytes());
            out.extend(v.as_bytes());
        }
        out
    }

    fn plan(ops: &str, src: &std::path::Path, dst: &std::path::Path) -> Plan {
        let text = format!(
            r#"{{"name": "p", "arrays": [{{"id": "labels", "zarr": "{}"}}], "ops": {ops}}}"#,
            src.display()
        )
        .replace("DST", &dst.display().to_string());
        Plan::from_json(&text, &Default::default()).unwrap()
    }

    #[test]
    fn a_rechunk_of_strings_is_copied_value_by_value_with_fill_padding() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src.zarr"), dir.path().join("dst.zarr"));
        strings_at(&src, &["a", "ß", "", "日本", "last"], 2);
        // The middle chunk is not stored: it reads as the fill value.
        std::fs::remove_file(src.join("c").join("1")).unwrap();
        let ops = r#"[{"id": "r", "op": "rechunk", "input": "labels", "chunks": [3]},
            {"id": "w", "op": "write", "input": "r", "target": "DST", "codec": {"name": "none"},
             "metadata_from": "labels"}]"#;
        let (rest, copies) = split(&plan(ops, &src, &dst), 1).unwrap();
        assert!(rest.ops.is_empty() && rest.arrays.is_empty());
        assert_eq!(copies.len(), 1);
        let progress = Progress::new(false);
        run(&copies, "job", 1, &progress).unwrap();
        assert_eq!(progress.tasks_done.load(Ordering::Relaxed), 2);
        let chunk = |i: &str| std::fs::read(dst.join("c").join(i)).unwrap();
        assert_eq!(chunk("0"), vlen_utf8(&["a", "ß", "-"]));
        assert_eq!(chunk("1"), vlen_utf8(&["-", "last", "-"]));
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dst.join("zarr.json")).unwrap()).unwrap();
        assert_eq!(
            doc["chunk_grid"]["configuration"]["chunk_shape"],
            serde_json::json!([3])
        );
        assert_eq!(doc["attributes"], serde_json::json!({"units": "none"}));
        assert_eq!(doc["dimension_names"], serde_json::json!(["x"]));
        assert_eq!(doc["fill_value"], "-");
        // Without metadata_from, as for the engine's other writes: no attributes or names.
        let ops = r#"[{"id": "w", "op": "write", "input": "labels", "target": "DST",
             "zarr_format": 2}]"#;
        let (_, copies) = split(&plan(ops, &src, &dst), 1).unwrap();
        run(&copies, "job", 1, &progress).unwrap();
        let zattrs = std::fs::read_to_string(dst.join(".zattrs")).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&zattrs).unwrap(),
            serde_json::json!({})
        );
        let zarray: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dst.join(".zarray")).unwrap()).unwrap();
        assert_eq!(zarray["chunks"], serde_json::json!([2]));
        assert_eq!(zarray["fill_value"], "-");
    }

    #[test]
    fn strings_computed_on_stay_in_the_typed_plan() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src.zarr"), dir.path().join("dst.zarr"));
        strings_at(&src, &["a", "b"], 2);
        let ops = r#"[{"id": "c", "op": "concat", "inputs": ["labels", "labels"], "axis": 0},
            {"id": "w", "op": "write", "input": "c", "target": "DST"}]"#;
        let (rest, copies) = split(&plan(ops, &src, &dst), 1).unwrap();
        assert!(copies.is_empty());
        assert_eq!(rest.ops.len(), 2);
        let e = crate::plan::graph::Graph::build(&rest, 1).unwrap_err();
        assert!(e.to_string().contains("string"), "{e}");
    }

    #[test]
    fn groups_hold_their_member_urls() {
        assert!(in_group("/d/g.zarr", "/d/g.zarr/name"));
        assert!(in_group("/d/g.zarr/", "/d/g.zarr/name/"));
        assert!(!in_group("/d/g.zarr", "/d/g.zarr2/name"));
        assert!(!in_group("/d/g.zarr", "/d/g.zarr"));
    }
}
