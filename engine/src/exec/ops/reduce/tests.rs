use super::grouping::{fit_groups, group_sizes, GroupBytes};
use super::merge::{GroupResult, Merge};
use crate::array::DType;
use crate::kernels::cascade::PartialSums;
use crate::kernels::Accumulator;
use crate::plan::ReduceFunc;
use std::collections::BTreeMap;

/// Float32 partial sums holding `values`, one term each.
fn partial(values: &[f32]) -> GroupResult {
    let mut p = PartialSums::new(ReduceFunc::Sum, values.len());
    p.sums_mut().unwrap().copy_from_slice(values);
    p.added(1);
    GroupResult::Partial(p)
}

#[test]
fn partial_and_whole_group_results_merge_in_group_order() {
    let GroupResult::Partial(first) = partial(&[1e8, 0.5]) else {
        unreachable!()
    };
    let GroupResult::Partial(second) = partial(&[1.0, 0.25]) else {
        unreachable!()
    };
    let mut acc = Accumulator::from_partial(&first).unwrap();
    acc.add_partial(&second).unwrap();
    let mut m = Merge {
        groups: 3,
        next: 0,
        merged: None,
        waiting: BTreeMap::new(),
    };
    // Group 1 finishes first and waits for group 0.
    m.waiting.insert(1, (GroupResult::Acc(acc), None));
    m.merge_ready().unwrap();
    assert!(m.merged.is_none());
    m.waiting.insert(0, (partial(&[3.0, -1.0]), None));
    m.waiting.insert(2, (partial(&[1e-3, 2.0]), None));
    m.merge_ready().unwrap();
    assert_eq!(m.next, 3);
    let (merged, _) = m.merged.take().unwrap();
    let out = merged.finish(DType::F64, 1, 0.0).unwrap();
    // Each partial is widened to f64 before it is added, in group order.
    let first = 3.0f64 + (1e8f32 as f64 + 1.0) + 1e-3f32 as f64;
    assert_eq!(out.as_slice::<f64>().unwrap(), &[first, -1.0 + 0.75 + 2.0]);
}

#[test]
fn partial_sums_of_paired_groups_merge_together_whatever_the_order_they_finish_in() {
    let big = 2f32.powi(53);
    let mut m = Merge {
        groups: 5,
        next: 0,
        merged: None,
        waiting: BTreeMap::new(),
    };
    // Group 0 waits for group 1, its pair.
    m.waiting.insert(0, (partial(&[big, 1.0]), None));
    m.merge_ready().unwrap();
    assert_eq!((m.next, m.merged.is_none()), (0, true));
    m.waiting.insert(3, (partial(&[1.0, 1.0]), None));
    m.waiting.insert(1, (partial(&[1.0, 1.0]), None));
    m.merge_ready().unwrap();
    assert_eq!(m.next, 2);
    m.waiting.insert(4, (partial(&[0.5, 0.5]), None));
    m.waiting.insert(2, (partial(&[1.0, 1.0]), None));
    m.merge_ready().unwrap();
    assert_eq!(m.next, 5);
    let (merged, _) = m.merged.take().unwrap();
    let out = merged.finish(DType::F64, 1, 0.0).unwrap();
    // Pairs (0, 1) and (2, 3) are summed in f64 first: 2^53 + 1 rounds to 2^53, then
    // 1 + 1 adds exactly; added one by one, each 1 would round away. Group 4 has no pair.
    let b = big as f64;
    assert_eq!(out.as_slice::<f64>().unwrap(), &[b + 2.0 + 0.5, 4.5]);
}

#[test]
fn groups_cover_every_piece_in_order() {
    for (pieces, per_group, later, workers) in [
        (256, 15, 0, 2),
        (7, 3, 0, 4),
        (1, 1, 0, 1),
        (40, 8, 1000, 2),
        (10, 64, 0, 2),
    ] {
        let sizes = group_sizes(pieces, per_group, later, workers);
        assert_eq!(sizes.iter().sum::<usize>(), pieces);
        assert!(sizes.iter().all(|&s| (1..=per_group).contains(&s)));
    }
}

const MIB: u64 = 1 << 20;

/// An ERA5-like sum over time: 48 one-step pieces of 1 MiB into an accumulator of 3 MiB.
const ERA5_SUM: GroupBytes = GroupBytes {
    one_piece: 8 * MIB,
    per_piece: MIB,
    acc: 3 * MIB,
};

#[test]
fn the_preferred_groups_stay_where_they_fit_beside_two_partial_results() {
    let preferred = group_sizes(48, 48, 0, 2);
    assert_eq!(preferred, vec![24, 12, 6, 3, 2, 1]);
    let (sizes, fold) = fit_groups(preferred.clone(), 3, ERA5_SUM, 16 * MIB);
    assert_eq!((sizes, fold), (preferred.clone(), 3));
    // Room for two partial results beside a task folding one piece, not three pieces.
    let (sizes, fold) = fit_groups(preferred.clone(), 3, ERA5_SUM, 15 * MIB);
    assert_eq!((sizes, fold), (preferred, 2));
}

#[test]
fn a_budget_that_holds_fewer_partial_results_gets_fewer_groups() {
    let preferred = group_sizes(48, 48, 0, 2);
    // One partial result beside a task: two groups, halves of the pieces.
    let (sizes, fold) = fit_groups(preferred.clone(), 1, ERA5_SUM, 13 * MIB);
    assert_eq!((sizes, fold), (vec![24, 24], 1));
    // None: one group.
    let (sizes, fold) = fit_groups(preferred.clone(), 4, ERA5_SUM, 10 * MIB);
    assert_eq!((sizes, fold), (vec![48], 3));
    // Not even one task: one group folding one piece at a time, what the check refuses.
    let (sizes, fold) = fit_groups(preferred, 4, ERA5_SUM, 4 * MIB);
    assert_eq!((sizes, fold), (vec![48], 1));
    // Odd counts split as evenly as they go, first groups larger.
    let (sizes, _) = fit_groups(group_sizes(7, 2, 0, 1), 1, ERA5_SUM, 12 * MIB);
    assert_eq!(sizes, vec![4, 3]);
}

#[test]
fn every_budget_that_holds_one_task_fits_every_task_of_its_layout() {
    let shapes = [
        GroupBytes {
            one_piece: 8 * MIB,
            per_piece: MIB,
            acc: 3 * MIB,
        },
        GroupBytes {
            one_piece: 11 * MIB,
            per_piece: MIB,
            acc: 6 * MIB,
        },
        GroupBytes {
            one_piece: 5 * MIB,
            per_piece: 2 * MIB,
            acc: 0,
        },
    ];
    for bytes in shapes {
        for (pieces, per_group, later, workers) in [(48, 48, 0, 2), (200, 64, 0, 16), (5, 1, 9, 3)]
        {
            for budget in (1..64).map(|m| m * MIB / 2) {
                for fold in [1, 3, 8] {
                    let preferred = group_sizes(pieces, per_group, later, workers);
                    let (sizes, f) = fit_groups(preferred.clone(), fold, bytes, budget);
                    assert_eq!(sizes.iter().sum::<usize>(), pieces);
                    assert!(sizes.iter().all(|&s| s > 0) && (1..=fold).contains(&f));
                    assert!(sizes.len() <= preferred.len());
                    let need = bytes.memory(f) + bytes.held(sizes.len());
                    if bytes.memory(1) <= budget {
                        assert!(need <= budget, "{bytes:?} at {budget}: {sizes:?}, {f}");
                    } else {
                        assert_eq!((sizes.len(), need), (1, bytes.memory(1)));
                    }
                }
            }
        }
    }
}

#[test]
fn groups_shrink_only_at_the_end_of_the_stage() {
    // Far from the end: full groups.
    assert_eq!(group_sizes(40, 8, 1000, 2), vec![8; 5]);
    // The stage's last pieces: full groups, then halves of what is left.
    let sizes = group_sizes(256, 15, 0, 2);
    assert_eq!(&sizes[..16], &[15; 16]);
    assert_eq!(&sizes[16..], &[8, 4, 2, 1, 1]);
}
