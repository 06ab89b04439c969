//! A job's stages run part by part, in separate calls, or batch by batch, in separate
//! attached jobs (as other processes would), write what one whole run writes; a range of
//! parts or tasks that is not the stage's is refused, and a finished job cannot be attached.

use std::path::Path;
use std::sync::Arc;

use chunkfuse_engine::array::{Buffer, DType};
use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run::{cut_batches, run_plan, Job, RunOptions};
use chunkfuse_engine::store::fs::FsStore;
use chunkfuse_engine::store::{Store, Value};
use chunkfuse_engine::zarr::{ArraySpec, Codec, ZarrArray};

fn store_at(path: &Path) -> Arc<dyn Store> {
    Arc::new(FsStore::new(path, 2).unwrap())
}

/// A (12, 6, 5) float32 array at `path` in (2, 3, 5) chunks, every value distinct.
fn make_source(path: &Path) {
    let spec = ArraySpec {
        shape: vec![12, 6, 5],
        dtype: DType::F32,
        chunks: vec![2, 3, 5],
        shards: None,
        codec: Codec::None,
        zarr_format: 3,
        fill: None,
        overwrite: true,
        existing: false,
        region: None,
    };
    let store = store_at(path);
    let arr = ZarrArray::create(store.clone(), &spec).unwrap();
    let grid = arr.grid().clone();
    for idx in grid.chunk_indices() {
        let r = grid.chunk_region(&idx);
        let mut b = Buffer::zeros(DType::F32, r.len() as usize);
        let first = (r.start[0] * 30 + r.start[1] * 5) as f32;
        for (k, v) in b.as_slice_mut::<f32>().unwrap().iter_mut().enumerate() {
            *v = (first + k as f32).sin() * 100.0;
        }
        if let Some(bytes) = arr.encode_chunk(&idx, &b).unwrap() {
            store.set(&arr.chunk_key(&idx), bytes).unwrap();
        }
    }
}

/// Every chunk of the array at `path`, decoded, in grid order.
fn chunks_of(path: &Path) -> Vec<Vec<f32>> {
    let store = store_at(path);
    let arr = ZarrArray::open(store.clone()).unwrap();
    let grid = arr.grid().clone();
    grid.chunk_indices()
        .iter()
        .map(|idx| {
            let bytes = store.get(&arr.chunk_key(idx)).unwrap();
            let b = arr.decode_chunk(idx, bytes.map(Value::Owned)).unwrap();
            b.as_slice::<f32>().unwrap().to_vec()
        })
        .collect()
}

/// x minus its mean over time (a reduction, then an elementwise stage), written to `target`.
fn anomaly_plan(source: &Path, target: &Path) -> Plan {
    let json = format!(
        r#"{{"name": "anomaly", "arrays": [{{"id": "x", "zarr": "{}"}}], "ops": [
            {{"id": "m", "op": "reduce", "input": "x", "func": "mean", "axes": [0], "keepdims": true}},
            {{"id": "a", "op": "elementwise", "inputs": ["x", "m"],
              "expr": {{"op": "subtract", "args": [{{"input": 0}}, {{"input": 1}}]}}}},
            {{"id": "out", "op": "write", "input": "a", "target": "{}", "chunks": [2, 3, 5]}}]}}"#,
        source.display(),
        target.display()
    );
    Plan::from_json(&json, &Default::default()).unwrap()
}

fn options(work: &Path) -> RunOptions {
    RunOptions {
        max_mem: Some(64 << 20),
        threads: 2,
        work_dir: Some(work.to_path_buf()),
        ..RunOptions::default()
    }
}

#[test]
fn stages_run_in_parts_write_what_a_whole_run_writes() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("x.zarr");
    make_source(&source);
    let whole = dir.path().join("whole.zarr");
    let once = run_plan(&anomaly_plan(&source, &whole), &options(dir.path())).unwrap();

    let parted = dir.path().join("parted.zarr");
    let mut job = Job::prepare(&anomaly_plan(&source, &parted), &options(dir.path())).unwrap();
    for at in 0..job.stage_count() {
        let parts = job.parts(at).unwrap();
        assert!(parts >= 2, "stage {at} has {parts} part(s)");
        // Two calls, the second first: parts are independent of one another.
        let half = parts / 2;
        let late = job.run_parts(at, half..parts).unwrap();
        let early = job.run_parts(at, 0..half).unwrap();
        assert_eq!(
            (early.parts, late.parts),
            (half as u64, (parts - half) as u64)
        );
        // Each call ran its own parts' tasks, no others.
        assert_eq!(
            early.tasks + late.tasks,
            once.stages[at].tasks,
            "stage {at}"
        );
    }
    let summary = job.finish().unwrap();
    assert_eq!(summary.stages.len(), 2 * once.stages.len());
    assert_eq!(chunks_of(&parted), chunks_of(&whole));
}

#[test]
fn parts_out_of_range_are_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("x.zarr");
    make_source(&source);
    let target = dir.path().join("out.zarr");
    let mut job = Job::prepare(&anomaly_plan(&source, &target), &options(dir.path())).unwrap();
    let last = job.stage_count() - 1;
    let parts = job.parts(last).unwrap();
    let err = job.run_parts(last, 0..parts + 1).unwrap_err().to_string();
    assert!(err.contains(&format!("has parts 0..{parts}")), "{err}");
    let err = job
        .run_parts(job.stage_count(), 0..1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no stage"), "{err}");
    assert!(std::fs::read_dir(&target)
        .unwrap()
        .all(|e| e.unwrap().file_name() != "c"));
}

fn batched(work: &Path) -> RunOptions {
    RunOptions {
        batched: true,
        ..options(work)
    }
}

/// Values of two runs agree to float32 rounding (batches merge partial states in another
/// association than one process's groups).
fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

/// A prepared batched anomaly job over a fresh source, the target it writes and the chunks
/// a whole run of the same plan writes.
struct BatchedJob {
    _dir: tempfile::TempDir,
    plan: Plan,
    opts: RunOptions,
    job: Job,
    target: std::path::PathBuf,
    whole: Vec<Vec<f32>>,
}

fn batched_job() -> BatchedJob {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("x.zarr");
    make_source(&source);
    let whole = dir.path().join("whole.zarr");
    run_plan(&anomaly_plan(&source, &whole), &options(dir.path())).unwrap();
    let target = dir.path().join("batched.zarr");
    let plan = anomaly_plan(&source, &target);
    let opts = batched(dir.path());
    let job = Job::prepare(&plan, &opts).unwrap();
    BatchedJob {
        whole: chunks_of(&whole),
        _dir: dir,
        plan,
        opts,
        job,
        target,
    }
}

#[test]
fn stages_run_in_batches_by_attached_jobs_write_what_a_whole_run_writes() {
    let BatchedJob {
        _dir,
        plan,
        opts,
        job,
        target,
        whole,
    } = batched_job();
    let mut merged = 0;
    for at in 0..job.stage_count() {
        let layout = job.task_layout(at).unwrap();
        // One batch per task: the reduction's output chunks are split and merged.
        let cut = cut_batches(&layout, layout.len(), 0);
        assert_eq!(cut.batches.len(), layout.len());
        // Last batch first, each in a job of its own, the first one twice (a retry).
        for b in cut.batches.iter().rev().chain(cut.batches.first()) {
            let mut worker = Job::attach(&plan, &opts).unwrap();
            let record = worker.run_batch(at, b.clone()).unwrap();
            assert_eq!(record.tasks, b.len() as u64);
        }
        for &part in &cut.merges {
            let mut worker = Job::attach(&plan, &opts).unwrap();
            worker.run_merge(at, part, &cut.batches).unwrap();
            merged += 1;
        }
    }
    assert!(merged > 0, "no output chunk was split");
    // Any process may finish the job once its batches have run: here an attached one.
    drop(job);
    Job::attach(&plan, &opts).unwrap().finish().unwrap();
    assert_close(&chunks_of(&target), &whole);
    // The job is finished: a late batch attaches to nothing and writes nothing.
    let err = Job::attach(&plan, &opts).err().unwrap().to_string();
    assert!(err.contains("is not the unfinished output of job"), "{err}");
}

#[test]
fn batches_out_of_range_and_merges_without_states_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("x.zarr");
    make_source(&source);
    let target = dir.path().join("out.zarr");
    let plan = anomaly_plan(&source, &target);
    let opts = batched(dir.path());
    let job = Job::prepare(&plan, &opts).unwrap();
    let tasks = job.task_layout(0).unwrap().len();
    let mut worker = Job::attach(&plan, &opts).unwrap();
    let err = worker.run_batch(0, 0..tasks + 1).unwrap_err().to_string();
    assert!(err.contains(&format!("has tasks 0..{tasks}")), "{err}");
    let halves = [0..1, 1..tasks];
    let err = worker.run_merge(0, 0, &halves).unwrap_err().to_string();
    assert!(err.contains("partial state of groups 0..1"), "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn the_batch_that_completes_a_split_chunk_merges_it() {
    let BatchedJob {
        _dir,
        plan,
        opts,
        job,
        target,
        whole,
    } = batched_job();
    let mut merged_by_batches = 0;
    for at in 0..job.stage_count() {
        let layout = job.task_layout(at).unwrap();
        let cut = cut_batches(&layout, layout.len(), 0);
        let mut merged = Vec::new();
        for (i, b) in cut.batches.iter().enumerate() {
            let mut worker = Job::attach(&plan, &opts).unwrap();
            let (record, parts) = worker
                .run_batch_merging(at, b.clone(), &cut.batches)
                .unwrap();
            assert_eq!(record.tasks, b.len() as u64);
            // In order, a split chunk's last batch finds every state and merges it; the
            // batches before it find one missing.
            for &part in &parts {
                let (first, last) = (
                    layout.iter().position(|t| t.0 == part).unwrap(),
                    layout.iter().rposition(|t| t.0 == part).unwrap(),
                );
                assert!(
                    b.contains(&last) && !b.contains(&first),
                    "batch {i}: {parts:?}"
                );
            }
            merged.extend(parts);
        }
        merged.sort_unstable();
        assert_eq!(merged, cut.merges, "stage {at}");
        merged_by_batches += merged.len();
        // A range that is not one of the batches is refused before it runs.
        if let Some(b) = cut.batches.first() {
            let mut worker = Job::attach(&plan, &opts).unwrap();
            let wider = b.start..b.end + 1;
            let err = worker
                .run_batch_merging(at, wider, &cut.batches)
                .unwrap_err()
                .to_string();
            assert!(err.contains("not one of the batches"), "{err}");
        }
    }
    assert!(merged_by_batches > 0, "no output chunk was split");
    drop(job);
    Job::attach(&plan, &opts).unwrap().finish().unwrap();
    assert_close(&chunks_of(&target), &whole);
}

#[test]
fn finishing_a_batched_job_removes_writes_a_killed_process_abandoned() {
    let BatchedJob {
        _dir,
        plan,
        opts,
        job,
        target,
        whole,
    } = batched_job();
    for at in 0..job.stage_count() {
        let layout = job.task_layout(at).unwrap();
        let cut = cut_batches(&layout, 2, 0);
        let mut worker = Job::attach(&plan, &opts).unwrap();
        for b in &cut.batches {
            worker
                .run_batch_merging(at, b.clone(), &cut.batches)
                .unwrap();
        }
        for &part in &cut.merges {
            worker.run_merge(at, part, &cut.batches).unwrap();
        }
    }
    // What a worker killed while writing a chunk leaves: its temporary, never renamed.
    let abandoned = target.join("c").join(".partial-4000000-0");
    std::fs::create_dir_all(abandoned.parent().unwrap()).unwrap();
    std::fs::write(&abandoned, b"half a chunk").unwrap();
    job.finish().unwrap();
    assert!(!abandoned.exists(), "the abandoned write is still there");
    assert_close(&chunks_of(&target), &whole);
}

#[test]
fn a_batch_that_outlives_its_job_fails_and_changes_nothing() {
    let BatchedJob {
        _dir,
        plan,
        opts,
        job,
        target,
        whole,
    } = batched_job();
    let mut cuts = Vec::new();
    for at in 0..job.stage_count() {
        let layout = job.task_layout(at).unwrap();
        let cut = cut_batches(&layout, 2, 0);
        let mut worker = Job::attach(&plan, &opts).unwrap();
        for b in &cut.batches {
            worker.run_batch(at, b.clone()).unwrap();
        }
        for &part in &cut.merges {
            worker.run_merge(at, part, &cut.batches).unwrap();
        }
        cuts.push(cut);
    }
    // A copy of a batch of the last stage (a backup's loser) attached while the job ran ...
    let mut late = Job::attach(&plan, &opts).unwrap();
    job.finish().unwrap();
    let done = chunks_of(&target);
    assert_close(&done, &whole);
    // ... runs after the job finished and removed the intermediate it reads (the mean): it
    // fails, naming it, rather than read it as the fill value and write x - 0.
    let last = cuts.len() - 1;
    for b in &cuts[last].batches {
        let err = late.run_batch(last, b.clone()).unwrap_err().to_string();
        assert!(err.contains("was removed while the job read it"), "{err}");
        assert!(err.contains("intermediate"), "{err}");
    }
    assert_eq!(chunks_of(&target), done, "a late batch changed the target");
}
