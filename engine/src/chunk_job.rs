//! Entry point for chunk-function jobs: every chunk of an existing Zarr array computed by a
//! caller-supplied function from chunks of other stored arrays (the Python fallback for user
//! code: the engine reads, decodes, encodes and writes; only the function is Python).

use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::exec::driver::{Engine, RunOptions, RunSummary, Snapshot, StageKind, StageRecord};
use crate::exec::held::Materials;
use crate::exec::ops::chunk_fn::{self, ChunkFunction, ChunkTask};
use crate::store::open_store;
use crate::zarr::ZarrArray;

/// What to compute: the arrays read, the (existing) array written, one task per output chunk.
pub struct ChunkJob {
    /// A name for progress and errors.
    pub name: String,
    /// Store URLs of the input arrays, referred to by position in `tasks`.
    pub inputs: Vec<String>,
    /// Store URL of the array written; it must exist (its metadata is kept).
    pub target: String,
    /// The output chunks to compute.
    pub tasks: Vec<ChunkTask>,
    /// Computes an output chunk from its input chunks.
    pub function: Arc<dyn ChunkFunction>,
}

/// Opens the array at `url` for a chunk job, read chunk by chunk: a sharded input by its
/// inner chunks (the chunks its readers see), which needs a shard index the engine reads
/// itself. The target, written whole chunk by whole chunk, must not be sharded.
fn open_for_job(
    url: &str,
    name: String,
    io_threads: usize,
    target: bool,
) -> Result<Arc<ZarrArray>> {
    let store = open_store(url, io_threads)?;
    let arr = ZarrArray::open(store)
        .array_ctx(&name)?
        .with_name(&name)
        .with_inner_reads();
    let refused = match (arr.info().shards.is_some(), target) {
        (false, _) => None,
        (true, true) => Some("chunk functions cannot write sharded arrays yet"),
        (true, false) if arr.shard_layout().is_none() => Some(
            "chunk functions read sharded arrays only with the standard shard index (bytes, \
             optionally crc32c) and no codecs outside the sharding codec",
        ),
        (true, false) => None,
    };
    match refused {
        Some(msg) => Err(Error::new(ErrorKind::Unsupported, msg)
            .with_array(&name)
            .with_store(url)),
        None => Ok(Arc::new(arr)),
    }
}

/// Runs `job` under the budget and threads of `opts`.
pub fn run_chunk_job(job: ChunkJob, opts: &RunOptions) -> Result<RunSummary> {
    let started = Instant::now();
    let inputs: Vec<Arc<ZarrArray>> = job
        .inputs
        .iter()
        .enumerate()
        .map(|(i, url)| {
            open_for_job(
                url,
                format!("{} input {i}", job.name),
                opts.io_threads,
                false,
            )
        })
        .collect::<Result<_>>()?;
    let out = open_for_job(&job.target, job.name.clone(), opts.io_threads, true)?;
    let engine = Engine::new(opts)?;
    let before = Snapshot::of(&engine.progress);
    let mut record = StageRecord::new(0, StageKind::ChunkFunction, "chunk function", out.name());
    let tasks = chunk_fn::tasks(
        job.tasks,
        Arc::new(Materials::new(inputs)),
        out,
        job.function,
    )?;
    engine.check_fits(&tasks)?;
    record.tasks = tasks.len() as u64;
    record.parts = record.tasks;
    record.task_budget = engine.task_budget;
    record.largest_task_bytes = tasks.iter().map(|t| t.memory).max().unwrap_or(0);
    engine.progress.add_tasks(tasks.len() as u64);
    engine.scheduler.run(tasks)?;
    engine.progress.finish();
    before.close(&engine.progress, &mut record);
    Ok(engine.summary(job.name, started, vec![record], vec![job.target]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::{Buffer, DType};
    use crate::store::fs::FsStore;
    use crate::store::Store;
    use crate::zarr::{ArraySpec, Codec};

    fn create(dir: &std::path::Path, shape: Vec<u64>, chunks: Vec<u64>) -> Arc<ZarrArray> {
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir, 2).unwrap());
        let spec = ArraySpec {
            shape,
            dtype: DType::F64,
            chunks,
            shards: None,
            codec: Codec::default(),
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        Arc::new(ZarrArray::create(store, &spec).unwrap())
    }

    /// Output chunk = sum of the input chunks it names, plus its task number.
    struct AddInputs;

    impl ChunkFunction for AddInputs {
        fn call(&self, task: usize, inputs: Vec<Buffer>) -> Result<Buffer> {
            let mut out = inputs[0].as_slice::<f64>().unwrap().to_vec();
            for b in &inputs[1..] {
                for (o, v) in out.iter_mut().zip(b.as_slice::<f64>().unwrap()) {
                    *o += v;
                }
            }
            for o in &mut out {
                *o += task as f64;
            }
            let bytes = out.iter().flat_map(|v| v.to_ne_bytes()).collect();
            Buffer::from_bytes(DType::F64, bytes)
        }
    }

    #[test]
    fn chunk_functions_read_compute_and_write_every_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let input = create(&dir.path().join("x"), vec![4, 3], vec![2, 3]);
        for (i, idx) in [vec![0, 0], vec![1, 0]].iter().enumerate() {
            let region = input.grid().chunk_region(idx);
            let vals: Vec<u8> = (0..region.len())
                .flat_map(|k| (k as f64 + 10.0 * i as f64).to_ne_bytes())
                .collect();
            let buf = Buffer::from_bytes(DType::F64, vals).unwrap();
            let bytes = input.encode_chunk(idx, &buf).unwrap().unwrap();
            input.store().set(&input.chunk_key(idx), bytes).unwrap();
        }
        let out = create(&dir.path().join("y"), vec![2, 3], vec![2, 3]);
        let job = ChunkJob {
            name: "test".into(),
            inputs: vec![input.url().to_string()],
            target: out.url().to_string(),
            tasks: vec![ChunkTask {
                out: vec![0, 0],
                reads: vec![(0, vec![0, 0]), (0, vec![1, 0])],
            }],
            function: Arc::new(AddInputs),
        };
        let summary = run_chunk_job(job, &RunOptions::default()).unwrap();
        assert_eq!(summary.tasks, 1);
        let bytes = out.store().get(&out.chunk_key(&[0, 0])).unwrap();
        let got = out
            .decode_chunk(&[0, 0], bytes.map(crate::store::Value::Owned))
            .unwrap();
        let want: Vec<f64> = (0..6).map(|k| 2.0 * k as f64 + 10.0).collect();
        assert_eq!(got.as_slice::<f64>().unwrap(), &want[..]);

        // A read outside the input's grid is a plan error naming the task.
        let job = ChunkJob {
            name: "test".into(),
            inputs: vec![input.url().to_string()],
            target: out.url().to_string(),
            tasks: vec![ChunkTask {
                out: vec![0, 0],
                reads: vec![(0, vec![5, 0])],
            }],
            function: Arc::new(AddInputs),
        };
        let err = run_chunk_job(job, &RunOptions::default()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Plan, "{err}");
        assert!(err.to_string().contains("tasks[0].reads[0]"), "{err}");
    }
}
