//! Exclusive locks on the local directories a job writes, held while it runs, so that a
//! second job (in another process, or another run in this one) writing the same target is
//! refused rather than interleaved with the first.
//!
//! The lock is `flock(2)` on the target directory itself (created when absent): the kernel
//! drops it when its holder exits, so a killed job leaves no stale lock, and nothing is
//! written into the target for it. Targets on object storage are not locked (they carry the
//! job marker only). Nor is a region write into an existing array: several writers fill
//! regions of one array at once by design (xarray's `region=`).

use std::fs::{File, TryLockError};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::plan::graph::Graph;
use crate::plan::node::NodeKind;
use crate::plan::Plan;

/// The locks of one job's targets, released when dropped.
#[derive(Debug, Default)]
pub(super) struct TargetLocks {
    /// The locked directories, open.
    _held: Vec<File>,
}

/// Locks the local targets of `plan` (its groups and its arrays) and the targets `more`
/// (see [`lock`]).
pub(super) fn lock_targets(plan: &Plan, graph: &Graph, more: &[String]) -> Result<TargetLocks> {
    let mut urls: Vec<&str> = plan.groups.iter().map(|g| g.target.as_str()).collect();
    urls.extend(more.iter().map(String::as_str));
    for node in &graph.nodes {
        if let NodeKind::Write { spec, .. } = &node.kind {
            if !(spec.existing && spec.region.is_some()) {
                urls.push(&spec.target);
            }
        }
    }
    lock(&urls)
}

/// Locks the local directories of `urls` (one inside another is covered by the outer one's
/// lock), creating those that do not exist. A directory another holder has locked is an
/// error naming its URL; directories made here are removed again (when still empty) on any
/// error.
fn lock(urls: &[&str]) -> Result<TargetLocks> {
    let mut dirs: Vec<(String, PathBuf)> = urls
        .iter()
        .filter_map(|u| local_dir(u).map(|d| (u.to_string(), d)))
        .collect();
    // A directory inside another locked one is covered by that lock (a group's arrays).
    dirs.sort_by(|a, b| a.1.cmp(&b.1));
    dirs.dedup_by(|later, earlier| later.1.starts_with(&earlier.1));
    let mut held = Vec::with_capacity(dirs.len());
    let mut made = Vec::new();
    let result = (|| {
        for (url, dir) in &dirs {
            if !dir.exists() {
                std::fs::create_dir_all(dir).map_err(|e| Error::store(url, e.to_string()))?;
                made.push(dir.clone());
            }
            let file = File::open(dir).map_err(|e| Error::store(url, e.to_string()))?;
            match file.try_lock() {
                Ok(()) => held.push(file),
                Err(TryLockError::WouldBlock) => {
                    return Err(Error::store(
                        url,
                        "another job is writing this target now (in another process, or \
                         another run in this one): wait for it to end, or write elsewhere",
                    ))
                }
                Err(TryLockError::Error(e)) => {
                    return Err(Error::store(url, format!("cannot lock the target: {e}")))
                }
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(TargetLocks { _held: held }),
        Err(e) => {
            drop(held);
            for dir in made.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
            Err(e)
        }
    }
}

/// The directory of a local target URL (a path or `file://` URL); None for object storage.
fn local_dir(url: &str) -> Option<PathBuf> {
    let path = url.strip_prefix("file://").unwrap_or(url);
    if path.contains("://") {
        return None;
    }
    let path = std::path::Path::new(path.trim_end_matches('/'));
    Some(if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_target_cannot_be_locked_again_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let group = dir.path().join("out.zarr");
        let array = group.join("a");
        let (group, array) = (group.display().to_string(), array.display().to_string());
        let first = lock(&[&group, &array]).unwrap();
        assert!(std::path::Path::new(&group).is_dir());
        // The array lies in the locked group: only the group's directory was made and locked.
        assert!(!std::path::Path::new(&array).exists());
        let err = lock(&[&array, &group]).unwrap_err().to_string();
        assert!(err.contains("another job is writing this target"), "{err}");
        assert!(err.contains("out.zarr"), "{err}");
        drop(first);
        drop(lock(&[&group]).unwrap());
        // Object storage is not locked.
        let _s3 = lock(&["s3://bucket/x.zarr"]).unwrap();
        let _again = lock(&["s3://bucket/x.zarr"]).unwrap();
    }

    #[test]
    fn a_refused_lock_removes_the_directories_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let held = dir.path().join("held.zarr").display().to_string();
        let fresh = dir.path().join("a-fresh.zarr").display().to_string();
        let _first = lock(&[&held]).unwrap();
        assert!(lock(&[&fresh, &held]).is_err());
        assert!(!std::path::Path::new(&fresh).exists());
    }
}
