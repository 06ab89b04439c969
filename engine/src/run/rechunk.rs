//! The plans of rechunk jobs (the CLI's `chunkfuse rechunk`): one array, or every array of a
//! group into a group of the same arrays, each target keeping its source's attributes,
//! dimension names and fill value.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorKind, Result};
use crate::plan::{ArrayDecl, GroupDecl, Op, OpDecl, Plan, WriteSpec};
use crate::store::open_store;
use crate::zarr::group::{member_arrays, read_group};
use crate::zarr::{AnyArray, Codec};

/// Sizes along the axes of a rechunk target (chunks or shards).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RechunkChunks {
    /// One size per axis; -1: the whole axis.
    Axes(Vec<i64>),
    /// Sizes by dimension name (-1: the whole axis); an axis not named keeps its chunks (for
    /// shards: is not sharded further).
    Dims(BTreeMap<String, i64>),
}

impl RechunkChunks {
    /// Parses the CLI form: `256,73,144` or `time=-1,latitude=10,longitude=20`.
    pub fn parse_cli(text: &str, flag: &str) -> Result<RechunkChunks> {
        let bad = |item: &str, why: &str| {
            Error::plan(
                flag,
                format!("\"{item}\" in \"{text}\": {why}; give sizes per axis (256,73,144) or by dimension name (time=-1,latitude=10), -1 for a whole axis"),
            )
        };
        let size = |item: &str, v: &str| -> Result<i64> {
            match v.trim().parse::<i64>() {
                Ok(n) if n > 0 || n == -1 => Ok(n),
                Ok(_) => Err(bad(item, "sizes are positive")),
                Err(_) => Err(bad(item, "not an integer")),
            }
        };
        let items: Vec<&str> = text.split(',').map(str::trim).collect();
        if items.iter().any(|i| i.contains('=')) {
            let mut dims = BTreeMap::new();
            for item in items {
                let (name, v) = item
                    .split_once('=')
                    .ok_or_else(|| bad(item, "mixes sizes by axis and by name"))?;
                if dims
                    .insert(name.trim().to_string(), size(item, v)?)
                    .is_some()
                {
                    return Err(bad(item, "names a dimension twice"));
                }
            }
            return Ok(RechunkChunks::Dims(dims));
        }
        items
            .iter()
            .map(|item| size(item, item))
            .collect::<Result<Vec<_>>>()
            .map(RechunkChunks::Axes)
    }
}

/// Options of a rechunk job.
#[derive(Debug, Clone)]
pub struct RechunkOptions {
    /// Target chunks.
    pub chunks: RechunkChunks,
    /// Target shards (Zarr v3), multiples of the chunks.
    pub shards: Option<RechunkChunks>,
    /// Target compressor.
    pub codec: Codec,
    /// 2 or 3.
    pub zarr_format: u8,
    /// Replace what is at the target; otherwise only an unfinished run of the same job is
    /// (resumed, or started over).
    pub overwrite: bool,
}

/// The plan of a rechunk job: the array at `source` rechunked into `target`; or, when
/// `source` is a group, every array in it (chunks given by dimension name) into the array
/// of the same name in group `target`, which takes the source group's attributes (and
/// consolidated metadata when the source has some). Every target takes its source's fill
/// value, attributes and dimension names.
pub fn rechunk_plan(source: &str, target: &str, r: &RechunkOptions) -> Result<Plan> {
    if r.shards.is_some() && r.zarr_format != 3 {
        return Err(Error::plan(
            "--shards",
            format!(
                "shards need Zarr v3, but the target is Zarr v{}: drop --shards or \
                 --zarr-format",
                r.zarr_format
            ),
        ));
    }
    let store = open_store(source, 4).map_err(|e| e.with_field("source"))?;
    if read_group(store.as_ref())?.is_none() {
        let chunks = match &r.chunks {
            RechunkChunks::Axes(c) => c.clone(),
            dims => {
                let arr = Layout::open(source).map_err(|e| e.with_field("source"))?;
                by_name(&arr, dims, &arr.chunks, "--chunks")?.unwrap_or(arr.chunks)
            }
        };
        let shards = match &r.shards {
            None => None,
            Some(RechunkChunks::Axes(s)) => Some(s.clone()),
            Some(dims) => by_name(&Layout::open(source)?, dims, &chunks, "--shards")?,
        };
        let mut plan = Plan {
            name: "rechunk".into(),
            arrays: Vec::new(),
            ops: Vec::new(),
            groups: Vec::new(),
        };
        let ids = ["source", "rechunked", "target"].map(String::from);
        push_array(&mut plan, ids, source, target, chunks, shards, r)?;
        plan.ops[0].field = "--chunks".into();
        return Ok(plan);
    }
    let RechunkChunks::Dims(wanted) = &r.chunks else {
        return Err(Error::plan(
            "--chunks",
            format!("\"{source}\" is a group, whose arrays have their own axes: give chunks by dimension name (time=-1,latitude=10,...)"),
        ));
    };
    if matches!(r.shards, Some(RechunkChunks::Axes(_))) {
        return Err(Error::plan(
            "--shards",
            "the source is a group: give shards by dimension name (time=-1,...)",
        ));
    }
    let mut plan = Plan {
        name: "rechunk".into(),
        arrays: Vec::new(),
        ops: Vec::new(),
        groups: vec![GroupDecl {
            target: target.into(),
            metadata_from: Some(source.into()),
            zarr_format: r.zarr_format,
            consolidated: None,
            overwrite: r.overwrite,
            field: "target".into(),
        }],
    };
    let mut seen: Vec<String> = Vec::new();
    let join = |root: &str, name: &str| format!("{}/{name}", root.trim_end_matches('/'));
    for name in member_arrays(store.as_ref())? {
        let url = join(source, &name);
        let arr = Layout::open(&url).map_err(|e| e.with_array(&name))?;
        let dims = arr.dims.clone();
        seen.extend(dims.iter().flatten().cloned());
        let own = |d: &RechunkChunks| match d {
            RechunkChunks::Dims(m) => RechunkChunks::Dims(
                m.iter()
                    .filter(|(k, _)| dims.iter().any(|n| n.as_deref() == Some(k.as_str())))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            ),
            axes => axes.clone(),
        };
        let chunks = by_name(&arr, &own(&r.chunks), &arr.chunks, "--chunks")?
            .unwrap_or_else(|| arr.chunks.clone());
        let shards = match &r.shards {
            None => None,
            Some(s) => by_name(&arr, &own(s), &chunks, "--shards")?,
        };
        let ids = [
            name.clone(),
            format!("{name} (rechunked)"),
            format!("{name} (target)"),
        ];
        push_array(
            &mut plan,
            ids,
            &url,
            &join(target, &name),
            chunks,
            shards,
            r,
        )?;
    }
    let unknown: Vec<&String> = wanted.keys().filter(|k| !seen.contains(k)).collect();
    if let Some(name) = unknown.first() {
        seen.sort();
        seen.dedup();
        return Err(Error::plan(
            "--chunks",
            format!(
                "no array of the group has a dimension \"{name}\"; its dimensions are {}",
                seen.join(", ")
            ),
        ));
    }
    if plan.ops.is_empty() {
        return Err(Error::new(ErrorKind::Plan, "the group holds no arrays").with_store(source));
    }
    Ok(plan)
}

/// The chunk shape `sizes` gives the array at `url` (per axis or by dimension name, an axis
/// not named keeping its chunks, -1 the whole axis); `flag` names the option in errors.
pub fn array_chunks(url: &str, sizes: &RechunkChunks, flag: &str) -> Result<Vec<u64>> {
    let arr = Layout::open(url)?;
    let wanted = by_name(&arr, sizes, &arr.chunks, flag)?.unwrap_or_else(|| arr.chunks.clone());
    crate::plan::chunk_sizes(&wanted, &arr.shape).ok_or_else(|| {
        Error::plan(
            flag,
            format!(
                "{} sizes for an array of rank {} (shape {:?})",
                wanted.len(),
                arr.shape.len(),
                arr.shape
            ),
        )
        .with_store(url)
    })
}

/// What a rechunk plan takes from a source array: its URL, shape, dimension names and
/// chunks.
struct Layout {
    url: String,
    shape: Vec<u64>,
    /// One name (or none) per axis; empty when the array names none.
    dims: Vec<Option<String>>,
    /// The source's chunks, as target sizes.
    chunks: Vec<i64>,
}

impl Layout {
    /// The layout of the array at `url`: one the engine computes on, or one of strings
    /// (which the job copies; see `string_copies`).
    fn open(url: &str) -> Result<Layout> {
        let (shape, dims, chunks) = match AnyArray::open(open_store(url, 4)?)? {
            AnyArray::Strings(s) => (
                s.shape().to_vec(),
                s.attrs().dimension_names.clone(),
                s.chunks().to_vec(),
            ),
            AnyArray::Typed(arr) => (
                arr.shape(),
                arr.attrs().dimension_names.clone(),
                arr.info().chunks.clone(),
            ),
        };
        Ok(Layout {
            url: url.to_string(),
            shape,
            dims: dims.unwrap_or_default(),
            chunks: chunks.iter().map(|&c| c as i64).collect(),
        })
    }
}

/// Per-axis sizes from sizes by dimension name (an axis not named takes its size in
/// `unnamed`), or the sizes given per axis; `None` when no axis is named. A name the array
/// lacks is an error naming its dimensions.
fn by_name(
    arr: &Layout,
    sizes: &RechunkChunks,
    unnamed: &[i64],
    flag: &str,
) -> Result<Option<Vec<i64>>> {
    let dims = match sizes {
        RechunkChunks::Axes(a) => return Ok(Some(a.clone())),
        RechunkChunks::Dims(d) => d,
    };
    if dims.is_empty() {
        return Ok(None);
    }
    let names = &arr.dims;
    for name in dims.keys() {
        if !names.iter().any(|n| n.as_deref() == Some(name.as_str())) {
            let have: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
            return Err(Error::plan(
                flag,
                format!(
                    "the array has no dimension \"{name}\" (its dimensions: {})",
                    if have.is_empty() {
                        "none named".to_string()
                    } else {
                        have.join(", ")
                    }
                ),
            )
            .with_store(&arr.url));
        }
    }
    Ok(Some(
        names
            .iter()
            .zip(unnamed)
            .map(|(n, &c)| n.as_ref().and_then(|n| dims.get(n)).copied().unwrap_or(c))
            .collect(),
    ))
}

/// Adds to `plan` the source `ids[0]` at `source`, its rechunk `ids[1]` to `chunks` and its
/// write `ids[2]` to `target` (with `shards`, -1 meaning the whole axis), taking the
/// source's metadata.
fn push_array(
    plan: &mut Plan,
    ids: [String; 3],
    source: &str,
    target: &str,
    chunks: Vec<i64>,
    shards: Option<Vec<i64>>,
    r: &RechunkOptions,
) -> Result<()> {
    if let Some(bad) = shards.iter().flatten().find(|&&s| s == 0 || s < -1) {
        return Err(Error::plan(
            "--shards",
            format!("shard sizes must be positive (or -1 for the whole axis), got {bad}"),
        ));
    }
    let [src, rechunked, written] = ids;
    plan.arrays.push(ArrayDecl {
        id: src.clone(),
        url: source.into(),
        shape: None,
        dtype: None,
        field: "source".into(),
    });
    plan.ops.push(OpDecl {
        id: rechunked.clone(),
        op: Op::Rechunk {
            input: src.clone(),
            chunks,
        },
        field: format!("--chunks ({src})"),
    });
    plan.ops.push(OpDecl {
        id: written,
        op: Op::Write {
            input: rechunked,
            spec: WriteSpec {
                target: target.into(),
                chunks: None,
                // -1 (the whole axis) is 0 to the write op.
                shards: shards.map(|s| s.into_iter().map(|v| v.max(0) as u64).collect()),
                codec: r.codec.clone(),
                zarr_format: r.zarr_format,
                overwrite: r.overwrite,
                existing: false,
                region: None,
                metadata_from: Some(src),
                copied: Default::default(),
            },
        },
        field: "target".into(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_sizes_per_axis_or_by_dimension_name() {
        assert_eq!(
            RechunkChunks::parse_cli("-1,13, 36", "--chunks").unwrap(),
            RechunkChunks::Axes(vec![-1, 13, 36])
        );
        let dims = RechunkChunks::parse_cli("time=-1,latitude=10", "--chunks").unwrap();
        let want: BTreeMap<String, i64> = [("time".to_string(), -1), ("latitude".to_string(), 10)]
            .into_iter()
            .collect();
        assert_eq!(dims, RechunkChunks::Dims(want));
        for (bad, why) in [
            ("time=-1,10", "mixes sizes by axis and by name"),
            ("1,x", "\"x\" in \"1,x\": not an integer"),
            ("time=1,time=2", "names a dimension twice"),
            ("-7,3", "\"-7\" in \"-7,3\": sizes are positive"),
            ("time=0", "sizes are positive"),
        ] {
            let e = RechunkChunks::parse_cli(bad, "--chunks").unwrap_err();
            assert_eq!(e.context.field.as_deref(), Some("--chunks"));
            assert!(e.message.contains(why), "{bad}: {}", e.message);
        }
    }
}
