//! Typing of what touches stores: writes (new targets, or into existing arrays and regions
//! of them, with the chunks each writes) and the URLs that name sources and targets.

use std::ops::Range;

use crate::array::ChunkGrid;
use crate::error::{Error, Result};
use crate::plan::node::{Node, NodeId, NodeKind};
use crate::plan::{CopiedMetadata, WriteSpec};
use crate::store::open_store;
use crate::zarr::{ArraySpec, ZarrArray};
use crate::{plan_bail, plan_ensure};

/// A store URL or path in one form (no `file://`, no trailing `/`; a local path absolute and
/// canonical: a path that does not exist yet is its nearest existing ancestor's canonical
/// path joined with the rest), to compare sources and targets.
pub(crate) fn normalise_url(url: &str) -> String {
    use std::path::{Component, Path, PathBuf};
    let p = url.strip_prefix("file://").unwrap_or(url);
    let p = p.trim_end_matches('/');
    if p.contains("://") {
        return p.to_string();
    }
    let components: Vec<Component> = Path::new(p).components().collect();
    // The longest existing prefix, canonical; the rest applied to it as written (`..` going
    // up), as the store will when it creates them.
    for keep in (0..=components.len()).rev() {
        let prefix: PathBuf = components[..keep].iter().collect();
        let prefix = if prefix.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            prefix
        };
        let Ok(mut path) = std::fs::canonicalize(&prefix) else {
            continue;
        };
        for c in &components[keep..] {
            match c {
                Component::ParentDir => {
                    path.pop();
                }
                Component::Normal(name) => path.push(name),
                _ => {}
            }
        }
        return path.display().to_string();
    }
    p.to_string()
}

/// Whether the stores at the normalised URLs `a` and `b` (see [`normalise_url`]) share
/// keys: the same, or one inside the other.
pub(crate) fn overlap(a: &str, b: &str) -> bool {
    let inside =
        |x: &str, y: &str| x.len() > y.len() && x.starts_with(y) && x[y.len()..].starts_with('/');
    a == b || inside(a, b) || inside(b, a)
}

/// A write node, with the target chunks it writes (their index ranges along each axis) when
/// it writes into an existing array.
pub(crate) fn write(
    nodes: &[Node],
    id: String,
    field: String,
    input: NodeId,
    spec: &WriteSpec,
    like: Option<NodeId>,
) -> Result<(Node, Option<ChunkRanges>)> {
    let src = &nodes[input];
    let rank = src.shape.len();
    let existing_spec;
    let mut existing = None;
    let spec = if spec.existing {
        let (s, target) = existing_target(src, &field, spec)?;
        existing_spec = s;
        existing = Some(target);
        &existing_spec
    } else {
        spec
    };
    let chunks: Vec<u64> = match &spec.chunks {
        Some(c) => {
            plan_ensure!(
                c.len() == rank,
                format!("{field}.chunks"),
                "chunks {c:?} have {} entries but \"{}\" has rank {rank}",
                c.len(),
                src.id
            );
            c.iter()
                .zip(&src.shape)
                .map(|(&c, &n)| if c == 0 { n.max(1) } else { c })
                .collect()
        }
        None => src.grid.chunk_shape().iter().map(|&c| c.max(1)).collect(),
    };
    let storage = match &spec.shards {
        Some(s) => {
            plan_ensure!(
                s.len() == rank,
                format!("{field}.shards"),
                "shards {s:?} have {} entries but \"{}\" has rank {rank}",
                s.len(),
                src.id
            );
            let s: Vec<u64> = s
                .iter()
                .zip(&src.shape)
                .map(|(&c, &n)| if c == 0 { n.max(1) } else { c })
                .collect();
            for (d, (sh, c)) in s.iter().zip(&chunks).enumerate() {
                plan_ensure!(
                    sh % c == 0,
                    format!("{field}.shards[{d}]"),
                    "shard size {sh} of \"{}\" is not a multiple of the chunk size {c}",
                    src.id
                );
            }
            s
        }
        None => chunks.clone(),
    };
    // Whether the target may be replaced (overwrite, or this job's unfinished output) is
    // checked when the job's fingerprint is known, before anything is written.
    let mut spec = spec.clone();
    if let Some(like) = like {
        let (fill, attrs) = metadata_of(&nodes[like], src, &field)?;
        spec.copied = Box::new(CopiedMetadata {
            fill: Some(fill),
            attrs,
        });
    }
    spec.chunks = Some(chunks);
    if spec.shards.is_some() {
        spec.shards = Some(storage.clone());
    }
    // A region write's tasks fill the window of its box (target chunks cut to the box).
    let (grid, touched) = match existing {
        Some(ExistingTarget { window, touched }) => (window, Some(touched)),
        None => (None, None),
    };
    let grid = match grid {
        Some(g) => g,
        None => ChunkGrid::regular(&src.shape, &storage)
            .map_err(|e| e.with_field(format!("{field}.chunks")))?,
    };
    let node = Node {
        id,
        field: field.clone(),
        shape: src.shape.clone(),
        dtype: src.dtype,
        grid,
        kind: NodeKind::Write { input, spec },
    };
    Ok((node, touched))
}

/// Target chunks: index ranges along each axis.
pub(crate) type ChunkRanges = Vec<Range<usize>>;

/// What a write into an existing array learns of its target.
struct ExistingTarget {
    /// The grid of a region write's window (see `zarr::window`).
    window: Option<ChunkGrid>,
    /// The target chunks written.
    touched: ChunkRanges,
}

/// The fill value and attributes that a write of `src` takes from the plan array `like` (its
/// `metadata_from`), which must have `src`'s rank and dtype.
fn metadata_of(like: &Node, src: &Node, field: &str) -> Result<(Vec<u8>, crate::zarr::ArrayAttrs)> {
    let path = format!("{field}.metadata_from");
    let NodeKind::Source(arr) = &like.kind else {
        plan_bail!(
            path,
            "\"{}\" is an op; metadata_from names an array of \"arrays\"",
            like.id
        );
    };
    plan_ensure!(
        like.shape.len() == src.shape.len() && like.dtype == src.dtype,
        path,
        "\"{}\" ({} of rank {}) cannot give its fill value and dimension names to \"{}\" ({} of rank {}): they need the same dtype and rank",
        like.id,
        like.dtype,
        like.shape.len(),
        src.id,
        src.dtype,
        src.shape.len()
    );
    Ok((arr.fill_bytes().to_vec(), arr.attrs().clone()))
}

/// The write spec for writing into the array already at `spec.target` (into the box at
/// `spec.region` when given): its chunks, shards and format, after checking that it can hold
/// `src`.
fn existing_target(
    src: &Node,
    field: &str,
    spec: &WriteSpec,
) -> Result<(WriteSpec, ExistingTarget)> {
    let store = open_store(&spec.target, 1).map_err(|e| e.with_field(format!("{field}.target")))?;
    let arr = ZarrArray::open(store).map_err(|e| e.with_field(format!("{field}.target")))?;
    let info = arr.info();
    if let Some(start) = &spec.region {
        crate::zarr::window::check_box(start, &src.shape, &arr.shape()).map_err(|m| {
            Error::plan(
                format!("{field}.region"),
                format!("the box \"{}\" fills does not fit the target: {m}", src.id),
            )
        })?;
    }
    let want = ArraySpec {
        shape: src.shape.clone(),
        dtype: src.dtype,
        chunks: info.chunks.clone(),
        shards: info.shards.clone(),
        codec: spec.codec.clone(),
        zarr_format: info.zarr_format,
        fill: None,
        overwrite: false,
        existing: true,
        region: spec.region.clone(),
    };
    arr.check_matches(&want)
        .map_err(|e| e.with_field(format!("{field}.target")))?;
    let zeros = vec![0; src.shape.len()];
    let start = spec.region.as_deref().unwrap_or(&zeros);
    let touched = crate::zarr::window::touched_chunks(arr.grid(), start, &src.shape);
    let window = match &spec.region {
        Some(start) => Some(
            crate::zarr::window::box_grid(arr.grid(), start, &src.shape)
                .map_err(|e| e.with_field(format!("{field}.region")))?,
        ),
        None => None,
    };
    let mut out = spec.clone();
    out.chunks = Some(info.chunks.clone());
    out.shards = info.shards.clone();
    out.zarr_format = info.zarr_format;
    Ok((out, ExistingTarget { window, touched }))
}

/// The first target chunk (index ranges along each axis) that both `a` and `b` write, if any.
pub(crate) fn shared_chunk(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<usize>> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let lo = x.start.max(y.start);
            (lo < x.end.min(y.end)).then_some(lo)
        })
        .collect()
}
