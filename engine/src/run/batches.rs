//! Cutting a stage's tasks into batches for other processes to run: contiguous ranges of
//! about equal work, cut between parts when the stage has enough of them (then no output
//! chunk is split), else between tasks (then the reductions' output chunks the cuts split
//! are merged afterwards from their partial states).

use std::ops::Range;

use serde::Serialize;

/// How a stage runs in batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchCut {
    /// Ranges of the stage's tasks, in order, covering them all.
    pub batches: Vec<Range<usize>>,
    /// The parts (output chunks of a reduction) the batches split: each is merged from its
    /// partial states once every batch has run.
    pub merges: Vec<usize>,
}

/// Cuts tasks `layout` (each its part and its work, in stage order; parts contiguous) into
/// about `want` batches of about equal work. A stage with fewer parts than that (a
/// reduction into few output chunks) is cut into `spread` batches instead when `spread` is
/// smaller (one per batch running at once): every further batch is one more partial state
/// to merge, and a batch per worker thread already keeps them all busy.
pub fn cut_batches(layout: &[(usize, usize)], want: usize, spread: usize) -> BatchCut {
    let n = layout.len();
    if n == 0 {
        return BatchCut {
            batches: Vec::new(),
            merges: Vec::new(),
        };
    }
    let part_starts: Vec<usize> = (1..n).filter(|&i| layout[i].0 != layout[i - 1].0).collect();
    let want = want.clamp(1, n);
    let want = match part_starts.len() + 1 < want && spread > 0 {
        true => want.min(spread),
        false => want,
    };
    // Cut between parts when there are enough of them, else anywhere.
    let allowed: Vec<usize> = match part_starts.len() + 1 >= want {
        true => part_starts,
        false => (1..n).collect(),
    };
    let mut done = Vec::with_capacity(n + 1);
    done.push(0u64);
    for &(_, w) in layout {
        done.push(done.last().copied().unwrap_or(0) + w.max(1) as u64);
    }
    let total = done[n];
    let mut cuts = vec![0];
    for k in 1..want as u64 {
        let goal = (total * k + want as u64 / 2) / want as u64;
        let last = cuts.last().copied().unwrap_or(0);
        let best = allowed
            .iter()
            .copied()
            .filter(|&c| c > last)
            .min_by_key(|&c| done[c].abs_diff(goal));
        if let Some(c) = best {
            cuts.push(c);
        }
    }
    cuts.push(n);
    cuts.dedup();
    let batches: Vec<Range<usize>> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
    let mut merges: Vec<usize> = batches[1..]
        .iter()
        .filter(|b| layout[b.start].0 == layout[b.start - 1].0)
        .map(|b| layout[b.start].0)
        .collect();
    merges.dedup();
    BatchCut { batches, merges }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_parts_are_cut_between_parts() {
        let layout: Vec<(usize, usize)> = (0..10).map(|p| (p, 4)).collect();
        let cut = cut_batches(&layout, 3, 0);
        assert_eq!(cut.batches, vec![0..3, 3..7, 7..10]);
        assert!(cut.merges.is_empty());
    }

    #[test]
    fn a_reduction_of_one_chunk_is_cut_between_tasks_and_merged() {
        let layout = vec![(0, 16); 8];
        let cut = cut_batches(&layout, 4, 0);
        assert_eq!(cut.batches, vec![0..2, 2..4, 4..6, 6..8]);
        assert_eq!(cut.merges, vec![0]);
        // One batch per batch running at once: two partial states to merge, not four.
        let cut = cut_batches(&layout, 4, 2);
        assert_eq!(cut.batches, vec![0..4, 4..8]);
        // Enough parts: cut between them as wanted, whatever the spread.
        let parts: Vec<(usize, usize)> = (0..8).map(|p| (p, 1)).collect();
        assert_eq!(cut_batches(&parts, 4, 2).batches.len(), 4);
        // More batches wanted than there are tasks: one per task, each its own part.
        assert_eq!(cut_batches(&parts, 100, 2).batches.len(), 8);
    }

    #[test]
    fn batches_cover_every_task_once_whatever_is_wanted() {
        let layout = vec![(0, 3), (0, 1), (1, 7), (2, 2), (2, 2), (2, 9)];
        for want in 0..10 {
            let cut = cut_batches(&layout, want, want % 3);
            let covered: Vec<usize> = cut.batches.iter().flat_map(|b| b.clone()).collect();
            assert_eq!(covered, (0..6).collect::<Vec<_>>(), "want {want}");
            assert!(cut.batches.iter().all(|b| !b.is_empty()));
            for &p in &cut.merges {
                assert!(cut
                    .batches
                    .iter()
                    .any(|b| b.start > 0 && layout[b.start].0 == p && layout[b.start - 1].0 == p));
            }
        }
    }
}
