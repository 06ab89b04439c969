"""The order a training loader visits its anchors in: for each epoch, a permutation of the
anchor indices that is a pure function of (seed, epoch), computed position by position in O(1)
memory (a keyed Feistel network over the next power of four, walked until it lands inside the
range, as grain's index shuffle does), optionally chunk-aware (blocks of anchors that share
chunks stay together, shuffled among a bounded buffer of blocks), then split into batches
across ranks and data-loader workers so that every anchor is visited exactly once per epoch.

Everything here is index arithmetic on small numpy arrays (a batch's positions); the Feistel
network and the windows are run and read by the engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import chunkfuse._engine as _engine

#: Rounds of the Feistel network: 6 mixes well for domains up to 2^64 with the round
#: function below (grain uses 4).
ROUNDS = 6

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix_int(x: int) -> int:
    """`_mix` of one word, in Python integers."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _key(*words: int) -> int:
    """A 64-bit key from integers (the seed, the epoch, a round, a purpose)."""
    acc = 0
    for w in words:
        acc = _mix_int((acc + (w & _MASK64) + _GOLDEN) & _MASK64)
    return acc


class Permutation:
    """A bijection of `range(size)` keyed by `key`: `perm(i)` for arrays of positions."""

    def __init__(self, size: int, key: int) -> None:
        if size < 1:
            raise ValueError(f"a permutation needs at least one element, got size {size}")
        self.size = size
        #: The round keys; the engine runs the network (`chunkfuse_engine::permute`).
        self._keys = [_key(key, r) for r in range(ROUNDS)]

    def _walk(self, values: npt.ArrayLike, inverse: bool) -> npt.NDArray[np.int64]:
        p = np.ascontiguousarray(values, dtype=np.int64)
        out = np.empty_like(p)
        _engine.feistel_permute(self.size, self._keys, p.reshape(-1), out.reshape(-1), inverse)
        return out

    def __call__(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The element at each of `positions` (ints in `range(size)`)."""
        return self._walk(positions, False)

    def inverse(self, elements: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The position of each of `elements`: `perm.inverse(perm(p)) == p`."""
        return self._walk(elements, True)


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's anchors are shuffled.

    `block`: anchors per block, in the order the caller lists anchors (list them so that
    anchors sharing chunks are neighbours); a block's anchors are visited within one buffer.
    `buffer`: blocks shuffled together. `block=1` is a uniform shuffle of all anchors; larger
    blocks and smaller buffers read fewer distinct chunks per batch at the cost of randomness.
    """

    block: int = 1
    buffer: int = 1

    def __post_init__(self) -> None:
        if self.block < 1 or self.buffer < 1:
            raise ValueError(
                f"shuffle block and buffer must be at least 1, got block={self.block}, "
                f"buffer={self.buffer}"
            )


#: A uniform shuffle of all anchors.
UNIFORM = Shuffle()


class EpochOrder:
    """The anchor visited at each position of each epoch: a pure function of (seed, epoch,
    position), the same on every machine, worker count and restart."""

    def __init__(self, count: int, seed: int, shuffle: Shuffle | None = UNIFORM) -> None:
        if count < 1:
            raise ValueError(f"no anchors to order (count {count})")
        if not 0 <= seed <= _MASK64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
        self.count = count
        self.seed = seed
        self.shuffle = shuffle

    def __call__(self, epoch: int, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The anchor indices at `positions` (ints in `range(count)`) of epoch `epoch`."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.count):
            raise IndexError(f"positions must lie in range({self.count})")
        if self.shuffle is None:
            return p.copy()
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        block, buffer = self.shuffle.block, self.shuffle.buffer
        if block == 1:
            return Permutation(self.count, _key(self.seed, epoch, 0))(p)
        return self._blocked(epoch, p, block, buffer)

    def _blocked(
        self, epoch: int, p: npt.NDArray[np.int64], block: int, buffer: int
    ) -> npt.NDArray[np.int64]:
        n = self.count
        blocks = -(-n // block)
        last = n - (blocks - 1) * block  # the last block's anchors (block, or fewer)
        order = Permutation(blocks, _key(self.seed, epoch, 1))
        # The short last block sits at permuted block position `short_at`; positions are
        # laid out as the permuted blocks' anchors, one after another.
        short_at = int(order.inverse([blocks - 1])[0])
        window_items = buffer * block
        out = np.empty_like(p)
        # Window w holds permuted block positions [w*buffer, (w+1)*buffer).
        short_window = short_at // buffer
        windows = _window_of(p, window_items, short_window, block - last)
        for w in np.unique(windows):
            sel = windows == w
            first_block = int(w) * buffer
            nb = min(buffer, blocks - first_block)
            sizes = np.full(nb, block, dtype=np.int64)
            if short_window == w:
                sizes[short_at - first_block] = last
            total = int(sizes.sum())
            local = p[sel] - (int(w) * window_items - (block - last if short_window < w else 0))
            mixed = Permutation(total, _key(self.seed, epoch, 2, int(w)))(local)
            ends = np.cumsum(sizes)
            which = np.searchsorted(ends, mixed, side="right")
            offset = mixed - (ends[which] - sizes[which])
            original_block = order(first_block + which)
            out[sel] = original_block * block + offset
        return out


def _window_of(
    p: npt.NDArray[np.int64], window_items: int, short_window: int, missing: int
) -> npt.NDArray[np.int64]:
    """The buffer window of each position, when the window `short_window` holds `missing`
    fewer anchors than the others."""
    w = p // window_items
    after = p >= (short_window + 1) * window_items - missing
    shifted = (p + missing) // window_items
    return np.where(after, shifted, w)


@dataclass(frozen=True)
class Split:
    """Where one consumer of an epoch stands: rank `rank` of `world` (processes of a
    distributed training run), worker `worker` of `workers` (DataLoader worker processes of
    that rank)."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world and 0 <= self.worker < self.workers):
            raise ValueError(
                f"rank {self.rank} of {self.world} and worker {self.worker} of {self.workers}: "
                "each index must lie in [0, its count)"
            )


class Batches:
    """An epoch's positions cut into batches: rank r takes the r-th of `world` contiguous
    shares of the epoch (so chunk-aware blocks stay on one rank), cuts it into batches of
    `size` (the last may be smaller), and its worker k takes batches k, k + workers, ...:
    DataLoader, taking one batch from each worker in turn, yields them in the order one
    process would. Every anchor of an epoch is in exactly one batch of one rank."""

    def __init__(self, order: EpochOrder, size: int, split: Split | None = None) -> None:
        split = split if split is not None else Split()
        if size < 1:
            raise ValueError(f"batch size must be at least 1, got {size}")
        if split.world > order.count:
            raise ValueError(f"{order.count} anchors cannot be shared by {split.world} ranks")
        self.order = order
        self.size = size
        self.split = split
        n, world, rank = order.count, split.world, split.rank
        self.first = rank * n // world
        self.stop = (rank + 1) * n // world

    def per_rank(self) -> int:
        """Batches this rank has in an epoch."""
        return -(-(self.stop - self.first) // self.size)

    def steps(self, start: int = 0) -> range:
        """The rank's batch numbers from `start` on that this worker produces, in order:
        workers take turns from `start` (a run resumed mid-epoch keeps DataLoader's order).
        A range, not a list: an epoch may have billions of batches."""
        return range(start + self.split.worker, self.per_rank(), self.split.workers)

    def anchors(self, epoch: int, step: int) -> npt.NDArray[np.int64]:
        """The anchor indices of the rank's batch `step` of epoch `epoch`."""
        if not 0 <= step < self.per_rank():
            raise IndexError(f"batch {step} of an epoch of {self.per_rank()} batches")
        start = self.first + step * self.size
        stop = min(start + self.size, self.stop)
        return self.order(epoch, np.arange(start, stop))


#: One process reading the whole epoch.
ONE_PROCESS = Split()
