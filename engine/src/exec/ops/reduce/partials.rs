//! A reduction run in batches on several processes: a batch that runs only some of an output
//! chunk's groups writes their merged state to shared storage instead of the chunk, and a
//! merge, once every batch is done, reads those states in group order, merges them and
//! writes the chunk. The batches are fixed by the caller, not by who runs them, so the result
//! does not depend on how many workers ran it or in what order.

use std::ops::Range;
use std::sync::Arc;

use super::ReduceParams;
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::kernels::Accumulator;
use crate::store::Store;
use crate::zarr::ZarrArray;

/// Which of a reduce stage's tasks to build (indices in the stage's task order), and where
/// those of output chunks the window cuts leave their state.
#[derive(Clone)]
pub struct Window {
    /// The tasks.
    pub tasks: Range<usize>,
    /// Where partial states go.
    pub sink: PartialSink,
}

/// Where partial states of a stage's output chunks go.
#[derive(Clone)]
pub struct PartialSink {
    /// The store (the job's shared work directory).
    pub store: Arc<dyn Store>,
    /// Key prefix of the stage.
    pub prefix: String,
}

impl PartialSink {
    /// The key of the state of groups `groups` of output chunk `idx`.
    pub fn key(&self, idx: &[u64], groups: &Range<usize>) -> String {
        let chunk: Vec<String> = idx.iter().map(u64::to_string).collect();
        format!(
            "{}/{}/{:06}-{:06}",
            self.prefix,
            chunk.join("."),
            groups.start,
            groups.end
        )
    }
}

/// The group ranges of one output chunk that the batches `batches` (task ranges of the
/// stage) cut it into, given that its groups are the stage's tasks `chunk_tasks`.
pub fn cuts(chunk_tasks: &Range<usize>, batches: &[Range<usize>]) -> Vec<Range<usize>> {
    batches
        .iter()
        .filter_map(|b| {
            let (s, e) = (b.start.max(chunk_tasks.start), b.end.min(chunk_tasks.end));
            (s < e).then(|| s - chunk_tasks.start..e - chunk_tasks.start)
        })
        .collect()
}

/// The groups of output chunk `idx` (the stage's tasks `chunk_tasks`) that `window` holds
/// (all without one), and where their merged state goes when that is not all of them (the
/// chunk is written otherwise); None when it holds none.
#[allow(clippy::type_complexity)]
pub fn held_groups(
    window: Option<&Window>,
    chunk_tasks: &Range<usize>,
    idx: &[u64],
) -> Option<(Range<usize>, Option<(Arc<dyn Store>, String)>)> {
    let Some(w) = window else {
        return Some((0..chunk_tasks.len(), None));
    };
    let held = cuts(chunk_tasks, std::slice::from_ref(&w.tasks)).pop()?;
    if held.len() == chunk_tasks.len() {
        return Some((held, None));
    }
    let key = w.sink.key(idx, &held);
    Some((held, Some((w.sink.store.clone(), key))))
}

/// An error naming the stage's tasks when `window` is not among `tasks` of them.
pub fn check_window(window: Option<&Window>, tasks: usize, label: &str) -> Result<()> {
    match window {
        Some(w) if w.tasks.start > w.tasks.end || w.tasks.end > tasks => Err(Error::new(
            ErrorKind::Value,
            format!(
                "{label} has tasks 0..{tasks}; {:?} is not among them",
                w.tasks
            ),
        )),
        _ => Ok(()),
    }
}

/// Reads the partial states of output chunk `idx` (its groups cut at `cuts`, in order),
/// merges them in that order and returns the chunk's encoded bytes (`None`: the fill value).
pub fn merge_chunk(
    out: &ZarrArray,
    params: &ReduceParams,
    count: u64,
    idx: &[u64],
    sink: &PartialSink,
    cuts: &[Range<usize>],
    encode_threads: usize,
) -> Result<Option<Vec<u8>>> {
    let mut merged: Option<Accumulator> = None;
    for groups in cuts {
        let key = sink.key(idx, groups);
        let bytes = sink.store.get(&key).chunk_ctx(&key)?.ok_or_else(|| {
            Error::new(
                ErrorKind::Store,
                format!(
                    "the partial state of groups {groups:?} of output chunk {idx:?} of {} is \
                     missing: the batch that computes it has not run",
                    out.name()
                ),
            )
            .with_store(sink.store.url())
        })?;
        let acc = Accumulator::from_bytes(params.func, &bytes)
            .chunk_ctx(&key)
            .map_err(|e| e.with_store(sink.store.url()))?;
        match merged.as_mut() {
            None => merged = Some(acc),
            Some(m) => m.merge(&acc)?,
        }
    }
    let acc = merged.ok_or_else(|| Error::internal("a merge of no partial states"))?;
    let values = acc.finish(out.dtype(), count, params.ddof)?;
    out.encode_chunk_on(idx, &values, encode_threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_the_batches_within_the_chunk() {
        let batches = [0..3, 3..5, 5..9];
        assert_eq!(cuts(&(2..7), &batches), vec![0..1, 1..3, 3..5]);
        assert_eq!(cuts(&(3..5), &batches), vec![0..2]);
        assert_eq!(cuts(&(9..10), &batches), Vec::<Range<usize>>::new());
    }
}
