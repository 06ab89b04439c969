//! Merging the results of an output chunk's groups, in group order, so that results do not
//! depend on timing.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::Result;
use crate::exec::memory::Reservation;
use crate::kernels::cascade::PartialSums;
use crate::kernels::Accumulator;

/// What one group of pieces hands to the merge.
pub(super) enum GroupResult {
    /// Its accumulator.
    Acc(Accumulator),
    /// Its float32 partial sums, when every value it added fits them: the merge adds them
    /// to the merged f64 sums, so the group never makes an f64 accumulator of its own (one
    /// less 8-byte-per-element buffer to fault in, fill and merge per group).
    Partial(PartialSums),
}

pub(super) struct Merge {
    pub(super) groups: usize,
    pub(super) next: usize,
    pub(super) merged: Option<(Accumulator, Option<Reservation>)>,
    pub(super) waiting: BTreeMap<usize, (GroupResult, Option<Reservation>)>,
}

impl Merge {
    /// Merges the waiting results that come next in group order. Float32 partial sums of
    /// groups 2k and 2k + 1 are added to the merged sums together, in one pass over them
    /// (the pairs are fixed, so results still do not depend on timing): partial sums of an
    /// even group wait for the next group's.
    pub(super) fn merge_ready(&mut self) -> Result<()> {
        while let Some((result, held)) = self.waiting.remove(&self.next) {
            let pairs = self.next.is_multiple_of(2) && self.next + 1 < self.groups;
            let second = match (&result, pairs) {
                (GroupResult::Partial(_), true) => match self.waiting.remove(&(self.next + 1)) {
                    Some((GroupResult::Partial(p), its_held)) => Some((p, its_held)),
                    Some(other) => {
                        self.waiting.insert(self.next + 1, other);
                        None
                    }
                    None => {
                        self.waiting.insert(self.next, (result, held));
                        return Ok(());
                    }
                },
                _ => None,
            };
            let merged_groups = 1 + usize::from(second.is_some());
            match (self.merged.as_mut(), result) {
                (None, GroupResult::Acc(acc)) => self.merged = Some((acc, held)),
                (None, GroupResult::Partial(partial)) => {
                    let acc = Accumulator::from_partials(&partial, second.as_ref().map(|s| &s.0))?;
                    self.merged = Some((acc, held));
                }
                (Some((merged, _)), GroupResult::Acc(acc)) => merged.merge(&acc)?,
                (Some((merged, _)), GroupResult::Partial(partial)) => {
                    merged.add_partials(&partial, second.as_ref().map(|s| &s.0))?
                }
            }
            // The second group's partial sums and reservation go only now.
            drop(second);
            self.next += merged_groups;
        }
        Ok(())
    }
}

/// Partial results of one output chunk, merged in group order.
pub(super) struct OutputChunk {
    pub(super) idx: Vec<u64>,
    /// Threads to encode the chunk on: all workers when it is the stage's only output chunk
    /// (nothing else runs while it is encoded), else one.
    pub(super) encode_threads: usize,
    pub(super) merge: Mutex<Merge>,
    pub(super) count: u64,
    /// Where the merged state of the groups goes, and its key, when the task list holds only
    /// some of the chunk's groups (see [`super::partials`]); the chunk is written otherwise.
    pub(super) sink: Option<(std::sync::Arc<dyn crate::store::Store>, String)>,
}
