//! How an output chunk's pieces are grouped into tasks and how many each task folds
//! together, within the memory budget.

/// Decoded bytes folded per partial accumulator: enough work per task to amortise the
/// partial, few enough partials to merge cheaply.
pub(super) const GROUP_BYTES: u64 = 64 << 20;

/// At most this many pieces are folded together.
const FOLD_MAX: usize = 8;

/// Pieces folded together per accumulator pass. Each piece goes straight into the
/// accumulator, while it is still in cache from its decode, when every worker's accumulator
/// and piece fit the last-level cache together: then the accumulator stays there too. Else
/// several pieces are folded slab by slab, so each slab of the accumulator crosses memory
/// once per group rather than once per piece. (ERA5 sum on a 32 MiB-L3 EPYC: one piece at a
/// time is about 6% faster than eight.)
pub(super) fn fold_count(acc_bytes: u64, piece_bytes: u64, share: u64, workers: usize) -> usize {
    let working_set = (acc_bytes + piece_bytes).saturating_mul(workers.max(1) as u64);
    match crate::exec::cpu_cache::last_level_cache_bytes() {
        Some(cache) if working_set <= cache => 1,
        _ => ((share / piece_bytes.max(1)) as usize).clamp(1, FOLD_MAX),
    }
}

/// Sizes of the groups `pieces` pieces are folded in, in order: `per_group` each, except
/// that near the end of the stage (`later` pieces of other output chunks still follow) groups
/// shrink to a share of what is left, so the last tasks are short and no worker idles long
/// while another finishes a full group.
pub(super) fn group_sizes(
    pieces: usize,
    per_group: usize,
    later: usize,
    workers: usize,
) -> Vec<usize> {
    let per_group = per_group.max(1);
    let share = workers.max(1);
    let mut sizes = Vec::new();
    let mut left = pieces;
    while left > 0 {
        let size = per_group.min((left + later).div_ceil(share)).clamp(1, left);
        sizes.push(size);
        left -= size;
    }
    sizes
}

/// What the tasks of one output chunk's reduction reserve, and what they may wait beside.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupBytes {
    /// A task that folds one piece at a time: its accumulator, two pieces read ahead, the
    /// piece being folded and the output.
    pub(super) one_piece: u64,
    /// What each further piece folded together adds.
    pub(super) per_piece: u64,
    /// One group's partial result, held from its end until it is merged.
    pub(super) acc: u64,
}

impl GroupBytes {
    /// A task that folds `fold` pieces together.
    pub(super) fn memory(&self, fold: usize) -> u64 {
        self.one_piece + (fold.max(1) as u64 - 1) * self.per_piece
    }

    /// The most that the other groups' partial results hold while a task of a reduction in
    /// `groups` groups waits to start (see [`ReduceProcessor::held_by_others`]).
    pub(super) fn held(&self, groups: usize) -> u64 {
        groups.saturating_sub(1).min(2) as u64 * self.acc
    }
}

/// The sizes of the groups one output chunk's pieces are folded in and how many pieces each
/// task folds together, so that every task fits `budget` together with the partial results
/// it may wait beside: `preferred` and `fold` when they do; else fewer pieces folded
/// together and, when even one at a time does not fit beside two partial results, fewer
/// groups (two hold one partial result while the second waits, one holds none). One group
/// folding one piece at a time is the least any budget can run, the same whatever the budget
/// or the number of workers; when even that does not fit, it is what the budget check
/// refuses, with the bytes it needs.
pub(super) fn fit_groups(
    preferred: Vec<usize>,
    fold: usize,
    bytes: GroupBytes,
    budget: u64,
) -> (Vec<usize>, usize) {
    let fits = |fold: usize, groups: usize| bytes.memory(fold) + bytes.held(groups) <= budget;
    if fits(fold, preferred.len()) {
        return (preferred, fold);
    }
    let pieces: usize = preferred.iter().sum();
    let most = (1..=preferred.len().min(3))
        .rev()
        .find(|&n| fits(1, n))
        .unwrap_or(1);
    let sizes = match most {
        // Three groups or more hold at most two partial results: any number fits.
        3 => preferred,
        n if n >= preferred.len() => preferred,
        n => (0..n)
            .map(|i| pieces / n + usize::from(i < pieces % n))
            .collect(),
    };
    let fold = (1..=fold.max(1))
        .rev()
        .find(|&f| fits(f, sizes.len()))
        .unwrap_or(1);
    (sizes, fold)
}
