"""The loader's anchor order: each epoch a permutation of the anchors that depends on (seed,
epoch, position) alone, chunk-aware blocks kept within their buffer, batches across ranks and
DataLoader workers covering every anchor exactly once, in the order one process would give."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr
from chunkfuse.loader import (
    Batches,
    EpochOrder,
    Permutation,
    Shuffle,
    Source,
    Split,
    WindowLoader,
)
from hypothesis import given, settings
from hypothesis import strategies as st

SEEDS = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5000), seed=SEEDS)
def test_a_permutation_is_a_bijection_with_an_inverse(size: int, seed: int) -> None:
    perm = Permutation(size, seed)
    got = perm(np.arange(size))
    assert np.array_equal(np.sort(got), np.arange(size))
    assert np.array_equal(perm.inverse(got), np.arange(size))


def _reference(size: int, key: int, position: int) -> int:
    """The loader's permutation written out in Python integers, one position at a time: a
    6-round balanced Feistel network over the smallest even bit count (at least 2) holding
    `size - 1`, with SplitMix64's finaliser of (right half xor round key) as the round
    function, the round keys chained from `key` as `_key` does, cycle-walked into range."""
    m64 = (1 << 64) - 1

    def mix(x: int) -> int:
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & m64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & m64
        return x ^ (x >> 31)

    keys = []
    for r in range(6):
        acc = 0
        for w in (key, r):
            acc = mix((acc + (w & m64) + 0x9E3779B97F4A7C15) & m64)
        keys.append(acc)
    if size == 1:
        return 0
    bits = max(2, (size - 1).bit_length())
    half = (bits + bits % 2) // 2
    low = (1 << half) - 1
    x = position
    while True:
        left, right = x >> half, x & low
        for k in keys:
            left, right = right, left ^ (mix(right ^ k) & low)
        x = (left << half) | right
        if x < size:
            return x


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 2**50), seed=SEEDS, data=st.data())
def test_the_permutation_is_the_documented_feistel_network(
    size: int, seed: int, data: st.DataObject
) -> None:
    positions = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=20))
    got = Permutation(size, seed)(positions)
    assert got.tolist() == [_reference(size, seed, p) for p in positions]
    with pytest.raises(IndexError, match=f"range\\({size}\\)"):
        Permutation(size, seed)([size])


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 3000),
    seed=SEEDS,
    epoch=st.integers(0, 1000),
    block=st.integers(1, 64),
    buffer=st.integers(1, 8),
)
def test_every_epoch_visits_every_anchor_once_and_blocks_stay_in_their_buffer(
    count: int, seed: int, epoch: int, block: int, buffer: int
) -> None:
    order = EpochOrder(count, seed, Shuffle(block, buffer))
    got = order(epoch, np.arange(count))
    assert np.array_equal(np.sort(got), np.arange(count))
    # Positions answered one by one, or in any order, are the same function.
    picks = np.random.default_rng(seed % 1000).permutation(count)[:50]
    assert np.array_equal(order(epoch, picks), got[picks])
    # A block's anchors are visited within a span of `buffer` blocks' positions.
    where = np.empty(count, dtype=np.int64)
    where[got] = np.arange(count)
    for b in range(0, count, block):
        span = where[b : b + block]
        assert span.max() - span.min() < buffer * block, (b, span)


def test_orders_depend_on_seed_and_epoch_and_mix_well() -> None:
    n = 10_000
    a = EpochOrder(n, 7)(0, np.arange(n))
    assert np.array_equal(a, EpochOrder(n, 7)(0, np.arange(n)))
    for other in (EpochOrder(n, 7)(1, np.arange(n)), EpochOrder(n, 8)(0, np.arange(n))):
        assert np.mean(a == other) < 0.01
    # Not the identity, nor a shift: few fixed points, positions spread over the range.
    assert np.mean(a == np.arange(n)) < 0.01
    assert abs(np.corrcoef(a, np.arange(n))[0, 1]) < 0.05
    # Each tenth of the positions draws from every tenth of the anchors about evenly.
    counts = np.histogram2d(np.arange(n) // 1000, a // 1000, bins=10)[0]
    assert counts.min() > 60 and counts.max() < 140, counts


def test_no_shuffle_is_the_anchors_in_order() -> None:
    assert np.array_equal(EpochOrder(9, 1, None)(5, np.arange(9)), np.arange(9))


@settings(max_examples=100, deadline=None)
@given(
    count=st.integers(1, 2000),
    size=st.integers(1, 100),
    world=st.integers(1, 5),
    workers=st.integers(1, 4),
    block=st.integers(1, 16),
)
def test_ranks_and_workers_cover_each_anchor_once_in_one_process_order(
    count: int, size: int, world: int, workers: int, block: int
) -> None:
    if world > count:
        return
    order = EpochOrder(count, 3, Shuffle(block, 2))
    seen = []
    for rank in range(world):
        alone = Batches(order, size, Split(rank, world))
        single = [alone.anchors(2, s) for s in alone.steps()]
        # Workers take turns, as DataLoader collects them: the same batches, in order.
        per_worker = [Batches(order, size, Split(rank, world, k, workers)) for k in range(workers)]
        streams = [[b.anchors(2, s) for s in b.steps()] for b in per_worker]
        merged = [streams[i % workers][i // workers] for i in range(alone.per_rank())]
        assert all(np.array_equal(x, y) for x, y in zip(single, merged, strict=True))
        seen.extend(single)
    flat = np.concatenate(seen) if seen else np.array([], dtype=np.int64)
    assert np.array_equal(np.sort(flat), np.arange(count))


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no anchors"):
        EpochOrder(0, 1)
    with pytest.raises(ValueError, match="seed"):
        EpochOrder(5, -1)
    with pytest.raises(ValueError, match="block and buffer"):
        Shuffle(0, 1)
    with pytest.raises(IndexError, match="range"):
        EpochOrder(5, 1)(0, [5])
    with pytest.raises(ValueError, match="rank 2 of 2"):
        Split(2, 2)
    with pytest.raises(ValueError, match="cannot be shared by 4 ranks"):
        Batches(EpochOrder(3, 1), 2, Split(0, 4))
    with pytest.raises(IndexError, match="batch 3 of an epoch of 3"):
        Batches(EpochOrder(5, 1), 2).anchors(0, 3)


def test_an_epoch_of_millions_of_batches_starts_without_listing_them(tmp_path: Path) -> None:
    """A 4000 x 4000 array (nothing written) in windows of 4 x 4, two to a batch: eight
    million batches an epoch. The first batch comes without memory for one entry per batch
    (listing the batch numbers took about 290 MiB here, and grows with the epoch)."""
    path = tmp_path / "big.zarr"
    zarr.create_array(str(path), shape=(4000, 4000), chunks=(1000, 1000), dtype="f4")
    window = {"dim_0": 4, "dim_1": 4}
    loader = WindowLoader([Source("x", path, None, window)], list(window), batch_size=2)
    assert len(loader) > 7 * 10**6
    tracemalloc.start()
    try:
        batch = next(iter(loader))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batch.data["x"]["big"].shape == (2, 4, 4)
    assert peak < 16 * 2**20, peak
