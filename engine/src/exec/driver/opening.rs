//! The arrays a physical plan reads and writes, opened: sources as they are, targets and
//! intermediates created (or, to check a plan before anything is written, in-memory
//! stand-ins of them).

use std::sync::Arc;

use crate::error::{Result, ResultExt};
use crate::exec::held::Materials;
use crate::exec::ops::region::read::Arrays;
use crate::physical::material::{Material, MaterialOrigin};
use crate::store::open_store;
use crate::zarr::ZarrArray;

/// Opens every material: sources as they are, targets and intermediates created in their
/// stores, or, without a `work_root`, created in memory as stand-ins for planning checks.
/// `job` is the job's fingerprint (arrays created are marked as its unfinished output) and
/// whether to resume what an unfinished run of it left.
pub fn open_materials(
    materials: &[Material],
    io_threads: usize,
    work_root: Option<&std::path::Path>,
    job: Option<(&str, bool)>,
) -> Result<(Arrays, Vec<bool>)> {
    static STAND_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut arrays = Vec::with_capacity(materials.len());
    let mut resumed = vec![false; materials.len()];
    for (i, m) in materials.iter().enumerate() {
        let (store, spec) = match (&m.origin, work_root) {
            (MaterialOrigin::Source(a), _) => {
                arrays.push(a.clone());
                continue;
            }
            (MaterialOrigin::Target { spec, .. } | MaterialOrigin::Intermediate { spec }, None) => {
                let n = STAND_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let store = crate::store::memory::MemoryStore::named(&format!("stand-in-{n}"));
                (store, spec)
            }
            (MaterialOrigin::Target { url, spec, .. }, Some(_)) => {
                (open_store(url, io_threads)?, spec)
            }
            (MaterialOrigin::Intermediate { spec }, Some(root)) => {
                let dir = root.join(format!("{i}.zarr"));
                (open_store(&dir.display().to_string(), io_threads)?, spec)
            }
        };
        let attrs = match &m.origin {
            MaterialOrigin::Target { attrs, .. } => attrs.clone(),
            _ => Default::default(),
        };
        // Every target is marked while the job runs: what a killed run left is visibly
        // unfinished (and a rerun recognises its own unfinished output by the marker).
        let arr = match (job, work_root) {
            (Some((job, resume)), Some(_)) => {
                let (arr, again) = ZarrArray::open_target(store.clone(), spec, &attrs, job, resume)
                    .array_ctx(&m.name)?;
                resumed[i] = again;
                arr
            }
            _ => ZarrArray::create_with(store.clone(), spec, &attrs, None).array_ctx(&m.name)?,
        }
        .with_name(&m.name);
        let arr = read_as_material(arr, &m.origin);
        if work_root.is_none() {
            store.erase_prefix("")?;
        }
        arrays.push(Arc::new(arr));
    }
    Ok((Arc::new(Materials::new(arrays)), resumed))
}

/// Opens the materials of job `job` that another process prepared (see [`open_materials`]),
/// creating and erasing nothing: each target and intermediate must be the job's unfinished
/// output (an error naming it otherwise: the job finished, or something replaced it), so a
/// batch that runs late can never touch a finished result.
pub fn attach_materials(
    materials: &[Material],
    io_threads: usize,
    work_root: &std::path::Path,
    job: &str,
) -> Result<Arrays> {
    let mut arrays = Vec::with_capacity(materials.len());
    for (i, m) in materials.iter().enumerate() {
        let (store, spec, attrs) = match &m.origin {
            MaterialOrigin::Source(a) => {
                arrays.push(a.clone());
                continue;
            }
            MaterialOrigin::Target { url, spec, attrs } => {
                (open_store(url, io_threads)?, spec, attrs.clone())
            }
            MaterialOrigin::Intermediate { spec } => {
                let dir = work_root.join(format!("{i}.zarr"));
                let store = open_store(&dir.display().to_string(), io_threads)?;
                (store, spec, Default::default())
            }
        };
        let arr = if spec.existing {
            ZarrArray::attach_existing(store.clone(), spec, &attrs, job)
        } else {
            ZarrArray::attach_target(store.clone(), spec, &attrs, job)
        }
        .array_ctx(&m.name)?
        .with_name(&m.name);
        arrays.push(Arc::new(read_as_material(arr, &m.origin)));
    }
    Ok(Arc::new(Materials::new(arrays)))
}

/// How the engine reads `arr`, a material of `origin`: its sharded intermediates inner chunk
/// by inner chunk; a chunk missing from an intermediate is an error, never fill values (an
/// earlier stage wrote every chunk, so it was removed: the work directory, or, for a late
/// copy of a batch, the finished job's).
fn read_as_material(arr: ZarrArray, origin: &MaterialOrigin) -> ZarrArray {
    match origin {
        MaterialOrigin::Intermediate { spec } if spec.shards.is_some() => {
            arr.with_inner_reads().with_removal_guard()
        }
        MaterialOrigin::Intermediate { .. } => arr.with_removal_guard(),
        _ => arr,
    }
}
