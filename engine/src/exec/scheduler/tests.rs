//! The scheduler's tests: batches, budgets, failures, Ctrl-C and what runs after a stage.

use super::*;
use crate::store::memory::MemoryStore;
use crate::store::ReadRequest;

/// A scheduler of two compute threads under `budget`, cancelled by `cancel`.
fn two_threads(budget: &Arc<Budget>, cancel: &Arc<AtomicBool>) -> Scheduler {
    Scheduler::new(
        2,
        budget.clone(),
        Arc::new(Progress::new(false)),
        cancel.clone(),
    )
    .unwrap()
}

struct Doubler {
    store: Arc<dyn crate::store::Store>,
    sum: u64,
    key: String,
}

impl Processor for Doubler {
    fn process(
        &mut self,
        _b: usize,
        data: Vec<Option<crate::store::Value>>,
        _c: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        self.sum += data.iter().flatten().map(|v| v[0] as u64).sum::<u64>();
        Ok(vec![])
    }
    fn finish(self: Box<Self>, _c: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(vec![WriteOp::whole(
            self.store.clone(),
            self.key.clone(),
            Some(vec![(self.sum * 2) as u8]),
        )])
    }
}

#[test]
fn tasks_read_process_and_write_in_batches() {
    let store = MemoryStore::named("scheduler-test");
    for i in 0..6u8 {
        store.set(&format!("in/{i}"), vec![i]).unwrap();
    }
    let budget = Budget::new(1000);
    let s = two_threads(&budget, &Arc::new(AtomicBool::new(false)));
    let tasks = (0..2)
        .map(|t| Task {
            label: format!("task {t}"),
            memory: 400,
            batches: (0..3)
                .map(|b| {
                    vec![ReadOp {
                        store: store.clone(),
                        req: ReadRequest::whole(format!("in/{}", t * 3 + b)),
                    }]
                })
                .collect(),
            outputs: Vec::new(),
            part: 0,
            processor: Box::new(Doubler {
                store: store.clone(),
                sum: 0,
                key: format!("out/{t}"),
            }),
        })
        .collect();
    s.run(tasks).unwrap();
    assert_eq!(store.get("out/0").unwrap(), Some(vec![6]));
    assert_eq!(store.get("out/1").unwrap(), Some(vec![24]));
    assert_eq!(budget.used(), 0);
}

/// A store whose reads of keys under `bad/` fail, and whose other reads are held and
/// never answered (a stalled server) or, unless `stall`, answered with `[1]`.
struct Scripted {
    stall: bool,
    held: Mutex<Vec<crate::store::ReadCallback>>,
}

impl Scripted {
    fn new(stall: bool) -> Arc<Scripted> {
        Arc::new(Scripted {
            stall,
            held: Mutex::new(Vec::new()),
        })
    }
}

impl crate::store::Store for Scripted {
    fn url(&self) -> &str {
        "scripted://"
    }
    fn read_batch(&self, reqs: Vec<ReadRequest>, done: crate::store::ReadCallback) {
        if reqs.iter().any(|r| r.key.starts_with("bad/")) {
            done(Err(Error::new(
                crate::error::ErrorKind::Store,
                "read refused",
            )));
        } else if self.stall {
            self.held.lock().unwrap().push(done);
        } else {
            done(Ok(reqs
                .iter()
                .map(|_| Some(crate::store::Value::Owned(vec![1])))
                .collect()));
        }
    }
    fn write_async(&self, _k: String, _v: Vec<u8>, done: crate::store::WriteCallback) {
        done(Ok(()))
    }
    fn erase(&self, _key: &str) -> Result<()> {
        Ok(())
    }
    fn erase_prefix(&self, _prefix: &str) -> Result<()> {
        Ok(())
    }
    fn list_prefix(&self, _prefix: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn size_of(&self, _key: &str) -> Result<Option<u64>> {
        Ok(None)
    }
    fn supports_partial_reads(&self) -> bool {
        true
    }
}

#[test]
fn cancel_ends_a_stage_whose_reads_never_answer() {
    let stalled = Scripted::new(true);
    let out = MemoryStore::named("scheduler-stalled");
    let budget = Budget::new(1000);
    let cancel = Arc::new(AtomicBool::new(false));
    let s = two_threads(&budget, &cancel);
    // More tasks than fit the budget at once: the dispatcher waits for memory too.
    let tasks = (0..8)
        .map(|t| Task {
            label: format!("task {t}"),
            memory: 300,
            batches: vec![vec![ReadOp {
                store: stalled.clone(),
                req: ReadRequest::whole(format!("in/{t}")),
            }]],
            outputs: Vec::new(),
            part: 0,
            processor: Box::new(Doubler {
                store: out.clone(),
                sum: 0,
                key: format!("out/{t}"),
            }),
        })
        .collect();
    let raiser = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            cancel.store(true, Ordering::SeqCst);
        })
    };
    let started = Instant::now();
    let e = s.run(tasks).unwrap_err();
    raiser.join().unwrap();
    assert_eq!(e.kind, crate::error::ErrorKind::Cancelled, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(budget.used(), 0);
    assert!(!stalled.held.lock().unwrap().is_empty());
    assert_eq!(out.list_prefix("out/").unwrap(), Vec::<String>::new());
    // Answers that come after the stage ended go nowhere.
    for done in stalled.held.lock().unwrap().drain(..) {
        done(Ok(vec![Some(crate::store::Value::Owned(vec![1]))]));
    }
    assert_eq!(out.list_prefix("out/").unwrap(), Vec::<String>::new());
}

/// Takes a while over each batch and writes one value per batch.
struct SlowWriter {
    store: Arc<dyn crate::store::Store>,
}

impl Processor for SlowWriter {
    fn process(
        &mut self,
        b: usize,
        _data: Vec<Option<crate::store::Value>>,
        _c: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        std::thread::sleep(Duration::from_millis(200));
        Ok(vec![WriteOp::whole(
            self.store.clone(),
            format!("out/{b}"),
            Some(vec![1]),
        )])
    }
    fn finish(self: Box<Self>, _c: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(vec![])
    }
}

#[test]
fn a_task_that_fails_while_a_batch_runs_writes_nothing_after_the_stage_ends() {
    // Batch 0 is computing when batch 1's read fails: the task ends and the stage
    // returns the error. The batch's write used to be issued after that, outliving
    // the stage (a process exiting on the error cut it short, leaving a temporary).
    let out = MemoryStore::named("scheduler-failed-mid-batch");
    let reads: Arc<dyn crate::store::Store> = Scripted::new(false);
    let s = two_threads(&Budget::new(1000), &Arc::new(AtomicBool::new(false)));
    let task = Task {
        label: "task".into(),
        memory: 100,
        batches: ["in/0", "bad/1"]
            .iter()
            .map(|k| {
                vec![ReadOp {
                    store: reads.clone(),
                    req: ReadRequest::whole(k.to_string()),
                }]
            })
            .collect(),
        outputs: Vec::new(),
        part: 0,
        processor: Box::new(SlowWriter { store: out.clone() }),
    };
    let e = s.run(vec![task]).unwrap_err();
    assert!(e.to_string().contains("read refused"), "{e}");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(out.list_prefix("out/").unwrap(), Vec::<String>::new());
}

/// Computes for longer than a cancelled stage's grace for writes, then says it is done.
struct LongCompute {
    done: Arc<AtomicBool>,
}

impl Processor for LongCompute {
    fn process(
        &mut self,
        _b: usize,
        _data: Vec<Option<crate::store::Value>>,
        _c: &mut TaskContext,
    ) -> Result<Vec<WriteOp>> {
        std::thread::sleep(WRITE_GRACE * 2);
        self.done.store(true, Ordering::SeqCst);
        Ok(vec![])
    }
    fn finish(self: Box<Self>, _c: &mut TaskContext) -> Result<Vec<WriteOp>> {
        Ok(vec![])
    }
}

#[test]
fn a_cancelled_stage_returns_only_once_no_batch_computes() {
    // A Python function computing a chunk when Ctrl-C comes: the call that ran the stage
    // returned after the grace for writes while the function still ran, and the
    // interpreter, finalizing on the KeyboardInterrupt, aborted when it returned.
    let cancel = Arc::new(AtomicBool::new(false));
    let s = two_threads(&Budget::new(1000), &cancel);
    let reads: Arc<dyn crate::store::Store> = Scripted::new(false);
    let done = Arc::new(AtomicBool::new(false));
    let task = Task {
        label: "task".into(),
        memory: 100,
        batches: vec![vec![ReadOp {
            store: reads,
            req: ReadRequest::whole("in/0".to_string()),
        }]],
        outputs: Vec::new(),
        part: 0,
        processor: Box::new(LongCompute { done: done.clone() }),
    };
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        cancel.store(true, Ordering::SeqCst);
    });
    let e = s.run(vec![task]).unwrap_err();
    raiser.join().unwrap();
    assert_eq!(e.kind, crate::error::ErrorKind::Cancelled, "{e}");
    assert!(done.load(Ordering::SeqCst), "the stage returned mid-batch");
}
