//! Which materials of a job run in batches an earlier, unfinished run had partly written: the
//! process that prepares the job finds them and records them in the job's work directory,
//! where every process that attaches to run a batch reads them, so a rerun's batches skip the
//! tasks whose output chunks are written (and a first run's batches list nothing).

use std::path::Path;

use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::store::open_store;

/// The key of the record in the work directory.
const KEY: &str = "resumed.json";

/// Records `resumed` (per material: partly written by an earlier run) in `work_root`,
/// replacing what an earlier prepare recorded.
pub(super) fn record(work_root: &Path, resumed: &[bool], io_threads: usize) -> Result<()> {
    let url = work_root.display().to_string();
    let store = open_store(&url, io_threads)?;
    let doc = serde_json::json!({ "resumed": resumed });
    store
        .set(KEY, doc.to_string().into_bytes())
        .chunk_ctx(KEY)
        .map_err(|e| e.with_store(&url))
}

/// What [`record`] recorded in `work_root` for the job's `materials` materials; none resumed
/// when there is no record (a work directory the attaching process does not see: its batches
/// then write every chunk again, the same bytes); an error naming the file when it is not
/// such a record.
pub(super) fn read(work_root: &Path, materials: usize, io_threads: usize) -> Result<Vec<bool>> {
    let url = work_root.display().to_string();
    let store = open_store(&url, io_threads)?;
    let bad = |why: String| {
        Error::new(ErrorKind::Value, why)
            .with_chunk_key(KEY)
            .with_store(&url)
    };
    let Some(bytes) = store.get(KEY).chunk_ctx(KEY)? else {
        return Ok(vec![false; materials]);
    };
    #[derive(serde::Deserialize)]
    struct Doc {
        resumed: Vec<bool>,
    }
    let doc: Doc = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("not a record of resumed materials: {e}")))?;
    if doc.resumed.len() != materials {
        return Err(bad(format!(
            "records {} materials, the job has {materials}: another job's record",
            doc.resumed.len()
        )));
    }
    Ok(doc.resumed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_none_means_nothing_resumed_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("job");
        assert_eq!(read(&root, 2, 1).unwrap(), vec![false, false]);
        record(&root, &[true, false], 1).unwrap();
        assert_eq!(read(&root, 2, 1).unwrap(), vec![true, false]);
        let e = read(&root, 3, 1).unwrap_err();
        assert!(e.to_string().contains("another job"), "{e}");
        std::fs::write(root.join(KEY), b"{").unwrap();
        let e = read(&root, 2, 1).unwrap_err();
        assert!(e.to_string().contains("resumed.json"), "{e}");
    }
}
