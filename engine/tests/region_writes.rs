//! Region writes: a plan's `write` with `existing: true` and `region` fills a box of an
//! existing array (Zarr v2, v3 and v3 sharded, the box on and off the chunk grid), merges the
//! chunks it covers in part and leaves every other chunk as it was.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use chunkfuse_engine::array::{Buffer, DType};
use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run::{run_plan, RunOptions};
use chunkfuse_engine::store::fs::FsStore;
use chunkfuse_engine::store::{Store, Value};
use chunkfuse_engine::zarr::{ArraySpec, Codec, ZarrArray};

/// The value at `pos` of the arrays the tests fill (distinct everywhere).
fn value(pos: &[u64], salt: f32) -> f32 {
    pos.iter().fold(salt, |acc, &p| acc * 1000.0 + p as f32)
}

fn store_at(path: &Path) -> Arc<dyn Store> {
    Arc::new(FsStore::new(path, 2).unwrap())
}

/// An array at `path` holding `value(pos, salt)` (every chunk written, or only those
/// `write_chunk` keeps).
fn make_array(
    path: &Path,
    spec: &ArraySpec,
    salt: f32,
    write_chunk: impl Fn(&[u64]) -> bool,
) -> ZarrArray {
    let store = store_at(path);
    let arr = ZarrArray::create(store.clone(), spec).unwrap();
    let grid = arr.grid().clone();
    for idx in grid.chunk_indices() {
        if !write_chunk(&idx) {
            continue;
        }
        let r = grid.chunk_region(&idx);
        let mut b = Buffer::zeros(DType::F32, r.len() as usize);
        let vals = b.as_slice_mut::<f32>().unwrap();
        for (k, pos) in positions(&r.start, &r.shape).into_iter().enumerate() {
            vals[k] = value(&pos, salt);
        }
        if let Some(bytes) = arr.encode_chunk(&idx, &b).unwrap() {
            store.set(&arr.chunk_key(&idx), bytes).unwrap();
        }
    }
    arr
}

/// Positions of a box in C order.
fn positions(start: &[u64], shape: &[u64]) -> Vec<Vec<u64>> {
    let n: u64 = shape.iter().product();
    (0..n)
        .map(|mut k| {
            let mut pos = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                pos[d] = start[d] + k % shape[d];
                k /= shape[d];
            }
            pos
        })
        .collect()
}

/// Every value of the array at `path`, by position.
fn read_all(path: &Path) -> BTreeMap<Vec<u64>, f32> {
    let store = store_at(path);
    let arr = ZarrArray::open(store.clone()).unwrap();
    let grid = arr.grid().clone();
    let mut out = BTreeMap::new();
    for idx in grid.chunk_indices() {
        let r = grid.chunk_region(&idx);
        let bytes = store.get(&arr.chunk_key(&idx)).unwrap();
        let b = arr.decode_chunk(&idx, bytes.map(Value::Owned)).unwrap();
        let vals = b.as_slice::<f32>().unwrap();
        for (k, pos) in positions(&r.start, &r.shape).into_iter().enumerate() {
            out.insert(pos, vals[k]);
        }
    }
    out
}

/// Inode and modification time of every stored chunk file under `path` (metadata aside).
fn chunk_files(path: &Path) -> BTreeMap<String, (u64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.strip_prefix(path).unwrap().display().to_string();
            if name.starts_with('.') || name == "zarr.json" {
                continue;
            }
            let m = e.metadata().unwrap();
            out.insert(name, (m.ino(), m.mtime(), m.mtime_nsec()));
        }
    }
    out
}

fn spec(shape: &[u64], chunks: &[u64], shards: Option<Vec<u64>>, zarr_format: u8) -> ArraySpec {
    ArraySpec {
        shape: shape.to_vec(),
        dtype: DType::F32,
        chunks: chunks.to_vec(),
        shards,
        codec: Codec::default(),
        zarr_format,
        fill: Some((-1.0f32).to_ne_bytes().to_vec()),
        overwrite: true,
        existing: false,
        region: None,
    }
}

fn run(plan: serde_json::Value) -> chunkfuse_engine::error::Result<()> {
    let plan = Plan::from_json(&plan.to_string(), &BTreeMap::new())?;
    run_plan(
        &plan,
        &RunOptions {
            threads: 2,
            max_mem: Some(64 << 20),
            ..Default::default()
        },
    )
    .map(|_| ())
}

/// The plan writing `src` (plus 0.5 when `compute`) into the box of `target` at `region`.
fn region_plan(src: &Path, target: &Path, region: &[u64], compute: bool) -> serde_json::Value {
    let mut ops = vec![];
    let input = if compute {
        ops.push(
            serde_json::json!({"id": "y", "op": "elementwise", "inputs": ["x"],
            "expr": {"op": "add", "args": [{"input": 0}, {"const": 0.5}]}}),
        );
        "y"
    } else {
        "x"
    };
    ops.push(serde_json::json!({"id": "w", "op": "write", "input": input,
        "target": target.display().to_string(), "existing": true, "region": region}));
    serde_json::json!({"name": "region", "arrays": [{"id": "x", "zarr": src.display().to_string()}],
        "ops": ops})
}

/// Writes a source of `box_shape` into the box at `region` of a target made by `target_spec`
/// (only the chunks `written` keeps stored), and checks every value and that no chunk file
/// outside the box's chunks changed.
fn check_region_write(
    target_spec: ArraySpec,
    written: impl Fn(&[u64]) -> bool,
    region: &[u64],
    box_shape: &[u64],
    compute: bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
    let src_chunks: Vec<u64> = box_shape.iter().map(|&n| n.div_ceil(2).max(1)).collect();
    make_array(&src, &spec(box_shape, &src_chunks, None, 3), 7.0, |_| true);
    let target = make_array(&tgt, &target_spec, 3.0, &written);
    let before = read_all(&tgt);
    let files = chunk_files(&tgt);
    run(region_plan(&src, &tgt, region, compute)).unwrap();
    let after = read_all(&tgt);
    assert_eq!(after.len(), before.len());
    let end: Vec<u64> = region.iter().zip(box_shape).map(|(s, n)| s + n).collect();
    for (pos, v) in &after {
        let inside = pos
            .iter()
            .zip(region)
            .zip(&end)
            .all(|((p, s), e)| p >= s && p < e);
        let want = if inside {
            let rel: Vec<u64> = pos.iter().zip(region).map(|(p, s)| p - s).collect();
            value(&rel, 7.0) + if compute { 0.5 } else { 0.0 }
        } else {
            before[pos]
        };
        assert_eq!(*v, want, "at {pos:?} (inside the box: {inside})");
    }
    // Chunk files of target chunks the box does not reach are the very same files.
    let grid = target.grid().clone();
    let after_files = chunk_files(&tgt);
    for idx in grid.chunk_indices() {
        let r = grid.chunk_region(&idx);
        let touched = (0..r.rank()).all(|d| r.start[d] < end[d] && r.end(d) > region[d]);
        let key = target.chunk_key(&idx);
        if !touched {
            assert_eq!(
                files.get(&key),
                after_files.get(&key),
                "chunk {key} was touched"
            );
        } else {
            assert!(
                after_files.contains_key(&key),
                "chunk {key} was not written"
            );
        }
    }
    // The target is not marked as a job's unfinished output, and a rerun of the same job
    // (resumable by default) is not refused and writes the same values.
    let meta = ["zarr.json", ".zattrs"]
        .iter()
        .filter_map(|k| std::fs::read_to_string(tgt.join(k)).ok())
        .collect::<String>();
    assert!(!meta.contains("chunkfuse"), "{meta}");
    run(region_plan(&src, &tgt, region, compute)).unwrap();
    assert_eq!(read_all(&tgt), after);
}

#[test]
fn region_write_aligned_into_v2() {
    check_region_write(
        spec(&[40, 6], &[10, 3], None, 2),
        |_| true,
        &[10, 3],
        &[20, 3],
        false,
    );
}

#[test]
fn region_write_unaligned_into_v3_merges_partial_chunks() {
    check_region_write(
        spec(&[40, 6], &[10, 3], None, 3),
        |_| true,
        &[15, 1],
        &[20, 4],
        true,
    );
}

#[test]
fn region_write_appends_past_a_partial_chunk() {
    // 735 steps written in chunks of 10, the array grown to 740: the box is the second half
    // of the last chunk, whose first half is kept.
    check_region_write(
        spec(&[740, 4], &[10, 4], None, 3),
        |idx| idx[0] < 74,
        &[735, 0],
        &[5, 4],
        false,
    );
}

#[test]
fn region_write_into_missing_chunks_keeps_the_fill_value() {
    check_region_write(
        spec(&[40, 6], &[10, 3], None, 2),
        |idx| idx[0] != 1,
        &[12, 0],
        &[5, 6],
        true,
    );
}

#[test]
fn region_write_into_v3_shards_rewrites_partial_shards_whole() {
    check_region_write(
        spec(&[40, 6], &[5, 3], Some(vec![10, 6]), 3),
        |_| true,
        &[7, 2],
        &[20, 3],
        false,
    );
    check_region_write(
        spec(&[40, 6], &[5, 3], Some(vec![10, 6]), 3),
        |_| true,
        &[10, 0],
        &[20, 6],
        true,
    );
}

fn plan_error(plan: serde_json::Value) -> String {
    match run(plan) {
        Ok(()) => panic!("the plan ran"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn region_write_validation_names_the_field_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
    make_array(&src, &spec(&[5, 4], &[5, 4], None, 3), 7.0, |_| true);
    make_array(&tgt, &spec(&[12, 4], &[10, 4], None, 3), 3.0, |_| true);
    let before = read_all(&tgt);
    // Past the target's end.
    let e = plan_error(region_plan(&src, &tgt, &[10, 0], false));
    assert!(e.contains("ops[0].region"), "{e}");
    assert!(e.contains("[5, 4]") && e.contains("[12, 4]"), "{e}");
    // Another rank.
    let e = plan_error(region_plan(&src, &tgt, &[1], false));
    assert!(e.contains("ops[0].region"), "{e}");
    // Another dtype.
    let i16_src = dir.path().join("i16.zarr");
    let mut s = spec(&[5, 4], &[5, 4], None, 3);
    s.dtype = DType::I16;
    s.fill = None;
    ZarrArray::create(store_at(&i16_src), &s).unwrap();
    let e = plan_error(region_plan(&i16_src, &tgt, &[0, 0], false));
    assert!(e.contains("dtype"), "{e}");
    // A region without "existing".
    let mut p = region_plan(&src, &tgt, &[0, 0], false);
    p["ops"][0]["existing"] = serde_json::json!(false);
    let e = plan_error(p);
    assert!(e.contains("ops[0].region") && e.contains("existing"), "{e}");
    // Negative starts.
    let mut p = region_plan(&src, &tgt, &[0, 0], false);
    p["ops"][0]["region"] = serde_json::json!([-1, 0]);
    let e = plan_error(p);
    assert!(e.contains("ops[0].region[0]"), "{e}");
    assert_eq!(read_all(&tgt), before, "a refused plan wrote something");
}

#[test]
fn region_writes_sharing_a_target_chunk_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
    make_array(&src, &spec(&[5, 4], &[5, 4], None, 3), 7.0, |_| true);
    make_array(&tgt, &spec(&[30, 4], &[10, 4], None, 3), 3.0, |_| true);
    let before = read_all(&tgt);
    let two = |second: u64| {
        let t = tgt.display().to_string();
        let write = |id: &str, start: u64| {
            serde_json::json!({"id": id, "op": "write", "input": "x", "target": t,
                "existing": true, "region": [start, 0]})
        };
        serde_json::json!({"name": "two",
            "arrays": [{"id": "x", "zarr": src.display().to_string()}],
            "ops": [write("a", 0), write("b", second)]})
    };
    // Rows 0..5 and 5..10 both lie in chunk 0.
    let e = plan_error(two(5));
    assert!(e.contains("ops[1].region") && e.contains("\"a\""), "{e}");
    assert!(e.contains("one writer"), "{e}");
    assert_eq!(read_all(&tgt), before);
    // Rows 0..5 and 12..17: chunks 0 and 1, one writer each.
    run(two(12)).unwrap();
    let after = read_all(&tgt);
    assert_eq!(after[&vec![3, 2]], value(&[3, 2], 7.0));
    assert_eq!(after[&vec![14, 1]], value(&[2, 1], 7.0));
    assert_eq!(after[&vec![7, 1]], before[&vec![7, 1]]);
    assert_eq!(after[&vec![11, 1]], before[&vec![11, 1]]);
}

#[test]
fn region_write_is_not_read_by_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
    make_array(&src, &spec(&[5, 4], &[5, 4], None, 3), 7.0, |_| true);
    make_array(&tgt, &spec(&[30, 4], &[10, 4], None, 3), 3.0, |_| true);
    let mut p = region_plan(&src, &tgt, &[3, 0], false);
    p["ops"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"id": "again", "op": "write",
        "input": "w", "target": dir.path().join("o.zarr").display().to_string()}));
    let e = plan_error(p);
    assert!(e.contains("ops[1].input") && e.contains("region"), "{e}");
}

#[test]
fn region_write_of_a_reduction_merges_its_edges() {
    // The sum over axis 0 of a (6, 9) source, written into row 7 of a (10, 12) target from
    // column 2 (chunks of 4 × 5: parts of three chunks along the row).
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
    make_array(&src, &spec(&[6, 9], &[2, 4], None, 3), 7.0, |_| true);
    make_array(&tgt, &spec(&[10, 12], &[4, 5], None, 2), 3.0, |_| true);
    let before = read_all(&tgt);
    let t = tgt.display().to_string();
    run(serde_json::json!({"name": "sum",
    "arrays": [{"id": "x", "zarr": src.display().to_string()}],
    "ops": [
        {"id": "s", "op": "reduce", "input": "x", "func": "sum", "axes": [0],
            "keepdims": true},
        {"id": "w", "op": "write", "input": "s", "target": t, "existing": true,
            "region": [7, 2]}
    ]}))
    .unwrap();
    let after = read_all(&tgt);
    for (pos, v) in &after {
        let want = if pos[0] == 7 && (2..11).contains(&pos[1]) {
            (0..6).map(|r| value(&[r, pos[1] - 2], 7.0)).sum::<f32>()
        } else {
            before[pos]
        };
        assert!(
            (v - want).abs() <= want.abs() * 1e-6,
            "at {pos:?}: {v} != {want}"
        );
    }
}

#[test]
fn existing_write_into_v3_shards_without_a_region() {
    // Shards of compressed and of raw inner chunks (the latter written by the engine's own
    // shard encoder).
    for codec in [Codec::default(), Codec::None] {
        let dir = tempfile::tempdir().unwrap();
        let (src, tgt) = (dir.path().join("src.zarr"), dir.path().join("tgt.zarr"));
        make_array(&src, &spec(&[20, 6], &[3, 6], None, 3), 7.0, |_| true);
        let mut target = spec(&[20, 6], &[5, 3], Some(vec![10, 6]), 3);
        target.codec = codec.clone();
        make_array(&tgt, &target, 3.0, |_| true);
        let mut p = region_plan(&src, &tgt, &[0, 0], true);
        p["ops"][1].as_object_mut().unwrap().remove("region");
        run(p).unwrap();
        for (pos, v) in read_all(&tgt) {
            assert_eq!(v, value(&pos, 7.0) + 0.5, "{codec:?} at {pos:?}");
        }
        // And a region of it, off the shard grid.
        check_region_write(target, |_| true, &[3, 1], &[9, 4], true);
    }
}
