//! A job's targets before anything is written (each must be absent, the job's own unfinished
//! output, or allowed to be replaced), and the Zarr groups it writes: made before the arrays
//! in them, completed after.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::plan::graph::Graph;
use crate::plan::node::NodeKind;
use crate::plan::{GroupDecl, Plan};
use crate::store::{open_store, Store};
use crate::zarr::group::{self, read_group};
use crate::zarr::target::check_target;

/// A group a job writes, with what it takes from its source group.
pub(super) struct JobGroup {
    /// The declaration.
    decl: GroupDecl,
    /// The target store.
    store: Arc<dyn Store>,
    /// The group's attributes.
    attributes: Map<String, Value>,
    /// Whether to consolidate its metadata when the job completes.
    consolidated: bool,
}

/// `url` without trailing slashes.
fn trimmed(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// The name of the array at `url` in the group at `group`, when it is directly in it.
fn member_name<'a>(group: &str, url: &'a str) -> Option<&'a str> {
    let rest = trimmed(url)
        .strip_prefix(trimmed(group))?
        .strip_prefix('/')?;
    (!rest.is_empty() && !rest.contains('/')).then_some(rest)
}

/// Reads the source groups of `plan`'s groups and checks every target of job `job` (see
/// [`check_target`]); an array in one of the plan's groups is checked with its group.
/// Returns the groups to write.
pub(super) fn check_targets(
    plan: &Plan,
    graph: &Graph,
    job: &str,
    io_threads: usize,
) -> Result<Vec<JobGroup>> {
    let mut groups = Vec::with_capacity(plan.groups.len());
    for decl in &plan.groups {
        let field = |key: &str| format!("{}.{key}", decl.field);
        let source = match &decl.metadata_from {
            None => None,
            Some(url) => {
                let store = open_store(url, io_threads)
                    .map_err(|e| e.with_field(field("metadata_from")))?;
                let meta = read_group(store.as_ref())?.ok_or_else(|| {
                    Error::plan(
                        field("metadata_from"),
                        format!("no Zarr group at \"{url}\""),
                    )
                })?;
                Some(meta)
            }
        };
        let store =
            open_store(&decl.target, io_threads).map_err(|e| e.with_field(field("target")))?;
        // The error names the target's store (a field path would name the plan's, not the
        // user's, spelling of it).
        check_target(store.as_ref(), decl.overwrite, job)?;
        groups.push(JobGroup {
            consolidated: decl
                .consolidated
                .unwrap_or_else(|| source.as_ref().is_some_and(|s| s.consolidated)),
            attributes: source.map(|s| s.attributes).unwrap_or_default(),
            decl: decl.clone(),
            store,
        });
    }
    for node in &graph.nodes {
        let NodeKind::Write { spec, .. } = &node.kind else {
            continue;
        };
        let in_group = plan
            .groups
            .iter()
            .any(|g| member_name(&g.target, &spec.target).is_some());
        // A target that may be replaced needs no look.
        if spec.existing || spec.overwrite || in_group {
            continue;
        }
        let store = open_store(&spec.target, 1)
            .map_err(|e| e.with_field(format!("{}.target", node.field)))?;
        check_target(store.as_ref(), spec.overwrite, job)?;
    }
    Ok(groups)
}

/// Creates the groups (or, with `resume`, keeps those an unfinished run of job `job` left),
/// marked as the job's unfinished output.
pub(super) fn open(groups: &[JobGroup], job: &str, resume: bool) -> Result<()> {
    for g in groups {
        group::open_target_group(
            g.store.as_ref(),
            g.decl.zarr_format,
            &g.attributes,
            job,
            resume,
        )
        .map_err(|e| e.with_field(format!("{}.target", g.decl.field)))?;
    }
    Ok(())
}

/// Completes the groups once the arrays written (`outputs`, their URLs) are: consolidated
/// metadata of the arrays in each (when asked), the marker removed.
pub(super) fn finish(groups: &[JobGroup], outputs: &[String]) -> Result<()> {
    for g in groups {
        let members: Vec<String> = outputs
            .iter()
            .filter_map(|url| member_name(&g.decl.target, url).map(str::to_string))
            .collect();
        group::finish_group(g.store.as_ref(), &members, g.consolidated)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::member_name;

    #[test]
    fn members_are_arrays_directly_in_the_group() {
        assert_eq!(member_name("/d/g.zarr", "/d/g.zarr/t2m"), Some("t2m"));
        assert_eq!(member_name("/d/g.zarr/", "/d/g.zarr/t2m/"), Some("t2m"));
        assert_eq!(member_name("/d/g.zarr", "/d/g.zarr/a/b"), None);
        assert_eq!(member_name("/d/g.zarr", "/d/g.zarr2/t2m"), None);
        assert_eq!(member_name("/d/g.zarr", "/d/g.zarr"), None);
    }
}
