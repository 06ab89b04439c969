"""The window loader: anchors over named dimensions, each source's window at every anchor read
by the engine, batches in the order of `EpochOrder`, a bounded prefetch on background threads,
and a state that resumes mid-epoch with the same next batch."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from chunkfuse.loader.order import ONE_PROCESS, UNIFORM, Batches, EpochOrder, Shuffle, Split
from chunkfuse.loader.sources import Source, SourceError
from chunkfuse.reading import ChunkCache

#: Makes the empty array a batch's windows of one variable are read into, given its shape and
#: dtype (C-contiguous and writable; in pinned memory, say).
Allocate = Callable[[tuple[int, ...], np.dtype[Any]], npt.NDArray[Any]]
#: A filter of one anchor dimension's labels: a bool per label.
LabelFilter = Callable[[npt.NDArray[Any]], npt.ArrayLike]
#: A filter of anchors: given each anchor dimension's labels of a slice of anchors, a bool per
#: anchor (a land mask over latitude and longitude, say).
AnchorFilter = Callable[[dict[str, npt.NDArray[Any]]], npt.ArrayLike]
#: Anchors `keep=` is asked about at once.
KEEP_SLICE = 1 << 20
#: The decoded-chunk cache's budget unless told: a few dozen ERA5 fields.
DEFAULT_CACHE_BYTES = 256 << 20


def _numpy_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.empty(shape, dtype=dtype)


def _pinned() -> Allocate:
    """An allocator of page-locked host memory (PyTorch's), refused without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "pin_memory=True needs a CUDA device: torch.cuda.is_available() is False here"
        )

    def allocate(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        # The numpy view keeps the pinned tensor (its memory) alive.
        like = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        return torch.empty(shape, dtype=like, pin_memory=True).numpy()

    return allocate


@dataclass
class Batch:
    """One batch: per source, per variable, an array of the batch's windows (`(n, *window)`);
    per anchor dimension, each example's anchor label; and where it stands."""

    data: dict[str, dict[str, npt.NDArray[Any]]]
    anchors: dict[str, npt.NDArray[Any]]
    epoch: int
    step: int
    #: Each example's anchor index (into the epoch's anchors, in `anchor_labels` order).
    ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))


class Anchors:
    """The valid anchors: every combination of the labels along `dims` (taken from the first
    source that has each dimension, every `stride` steps) at which every source's window
    lies inside its array."""

    def __init__(
        self,
        sources: Sequence[Source],
        dims: Sequence[str],
        stride: Mapping[str, int],
        where: Mapping[str, LabelFilter] | None = None,
        keep: AnchorFilter | None = None,
    ) -> None:
        self.dims = tuple(dims)
        where = dict(where or {})
        unknown = [d for d in where if d not in self.dims]
        if unknown:
            raise SourceError(
                f"where= names {unknown[0]!r}, which is not an anchor dimension ({self.dims})"
            )
        self.labels: list[npt.NDArray[Any]] = []
        # Per source, per anchor dimension it has: the index of each valid label.
        self.index: list[dict[str, npt.NDArray[np.int64]]] = [{} for _ in sources]
        for s in sources:
            for d in s.windows:
                if d not in self.dims:
                    raise SourceError(
                        f"source {s.name!r} has a window along {d!r}, which is not an anchor "
                        f"dimension ({self.dims})"
                    )
        for d in self.dims:
            having = [s for s in sources if d in s.sizes]
            if not having:
                raise SourceError(f"no source has the anchor dimension {d!r}")
            first = having[0]
            step = int(stride.get(d, 1))
            if step < 1:
                raise SourceError(f"anchor dimension {d!r}: stride must be at least 1, got {step}")
            if d not in first.coords:
                raise SourceError(
                    f"source {first.name!r}, dimension {d!r}: no coordinate to take anchor "
                    "labels from"
                )
            labels = first.coords[d][::step]
            ok = np.ones(labels.shape[0], dtype=bool)
            found = []
            for i, s in enumerate(sources):
                if d not in s.sizes:
                    continue
                idx = s.indices(d, labels)
                fits = s.fits(d, idx)
                if not fits.any():
                    raise SourceError(
                        f"source {s.name!r}, dimension {d!r}: no anchor label "
                        f"({labels[0]} .. {labels[-1]}) aligns with its coordinate with its "
                        "window inside the array"
                    )
                ok &= fits
                found.append((i, idx))
            if not ok.any():
                raise SourceError(
                    f"anchor dimension {d!r}: no label where every source's window fits "
                    f"({[sources[i].name for i, _ in found]})"
                )
            if d in where:
                chosen = np.asarray(where[d](labels), dtype=bool)
                if chosen.shape != labels.shape:
                    raise SourceError(
                        f"where[{d!r}] returned shape {chosen.shape} for {labels.shape[0]} labels"
                    )
                ok &= chosen
                if not ok.any():
                    raise SourceError(f"anchor dimension {d!r}: where[{d!r}] leaves no anchor")
            self.labels.append(labels[ok])
            for i, idx in found:
                self.index[i][d] = idx[ok]
        self.shape = tuple(int(lab.shape[0]) for lab in self.labels)
        # Where every source's window holds few enough missing values (None: not asked).
        valid = self._complete(sources)
        # The anchors `keep` chose, as ids into the grid of label combinations (None: all).
        self.kept: npt.NDArray[np.int64] | None = None
        if keep is not None:
            self.kept = self._keep(keep, valid)
        elif valid is not None:
            self.kept = np.flatnonzero(valid.reshape(-1)).astype(np.int64)
        self.count = int(np.prod(self.shape)) if self.kept is None else int(self.kept.shape[0])

    def _complete(self, sources: Sequence[Source]) -> npt.NDArray[np.bool_] | None:
        """Over the grid of anchors: whether each source with `max_missing` has at most that
        share of missing values in its window there (None when no source asks)."""
        valid: npt.NDArray[np.bool_] | None = None
        for i, s in enumerate(sources):
            if s.max_missing is None:
                continue
            starts, where = [], []
            for d in s.dims:
                if d in self.index[i]:
                    first = self.index[i][d]
                    first = s.starts(d, first) if d in s.windows else np.zeros_like(first)
                    unique, inverse = np.unique(first, return_inverse=True)
                    starts.append(unique)
                    where.append(inverse)
                else:  # read whole: one window along it
                    starts.append(np.zeros(1, dtype=np.int64))
                    where.append(np.zeros(1, dtype=np.int64))
            ok = s.missing_share(starts) <= s.max_missing
            if not ok.any():
                raise SourceError(
                    f"source {s.name!r}: every anchor's window holds more than "
                    f"{s.max_missing:.0%} missing values (max_missing)"
                )
            # Over the source's dimensions, at each anchor label; then in anchor order, with
            # the anchor dimensions it lacks broadcast.
            mine = ok[np.ix_(*where)]
            keep_axes = [k for k, d in enumerate(s.dims) if d in self.index[i]]
            mine = mine.reshape([mine.shape[k] for k in keep_axes])
            order = [d for d in s.dims if d in self.index[i]]
            mine = np.moveaxis(mine, range(len(order)), [self.dims.index(d) for d in order])
            for k, d in enumerate(self.dims):
                if d not in order:
                    mine = np.expand_dims(mine, k)
            mine = np.broadcast_to(mine, self.shape)
            valid = mine.copy() if valid is None else valid & mine
        if valid is not None and not valid.any():
            raise SourceError(
                "no anchor left where every source's window holds few enough missing values"
            )
        return valid

    def _keep(
        self, keep: AnchorFilter, valid: npt.NDArray[np.bool_] | None
    ) -> npt.NDArray[np.int64]:
        """The grid ids `keep` chooses among the `valid` ones, asked over slices of the
        grid."""
        total = int(np.prod(self.shape))
        flat = None if valid is None else valid.reshape(-1)
        chosen = []
        for start in range(0, total, KEEP_SLICE):
            ids = np.arange(start, min(start + KEEP_SLICE, total), dtype=np.int64)
            if flat is not None:
                ids = ids[flat[ids]]
                if ids.size == 0:
                    continue
            labels = self.labels_of(ids)
            mask = np.asarray(keep(labels), dtype=bool)
            if mask.shape != ids.shape:
                raise SourceError(
                    f"keep= returned shape {mask.shape} for {ids.shape[0]} anchors: it must "
                    "return one bool per anchor"
                )
            chosen.append(ids[mask])
        kept = np.concatenate(chosen)
        if kept.size == 0:
            raise SourceError("keep= leaves no anchor")
        return kept

    def labels_of(self, grid_ids: npt.NDArray[np.int64]) -> dict[str, npt.NDArray[Any]]:
        """Each anchor dimension's label of each grid id."""
        where = np.unravel_index(grid_ids, self.shape)
        return {d: self.labels[k][where[k]] for k, d in enumerate(self.dims)}

    def at(self, ids: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        """The label position along each anchor dimension of each anchor id."""
        grid = ids if self.kept is None else self.kept[ids]
        return [np.asarray(p, dtype=np.int64) for p in np.unravel_index(grid, self.shape)]


class WindowLoader:
    """Batches of windows from `sources` around anchors over `dims`.

    The batch at (epoch, step) is a pure function of the sources, `seed`, `shuffle`, the
    batch size and `split` (see `chunkfuse.loader.order`): identical across machines, worker
    counts and restarts. Iterating yields the rest of the current epoch from the state, then
    moves to the next epoch. `prefetch` batches are read ahead on background threads (each
    read runs in the engine with the GIL released, on `threads` threads, 0: all cores).
    `where` restricts an anchor dimension's labels (`{"time": lambda t: t < cutoff}`); `keep`
    restricts anchors by all their labels at once (a land mask); both run once, before the
    first batch. Decoded chunks are kept across batches in a cache of `cache_bytes` (0:
    none), shared by every source, so batches whose windows share chunks (a chunk-aware
    `shuffle`) decode each once while it stays there. Each variable's windows of a batch are
    read straight into one array that `allocate` makes (default `numpy.empty`);
    `pin_memory=True` makes them in page-locked memory through PyTorch, for fast copies to
    a GPU (it needs CUDA).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        dims: Sequence[str],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: Shuffle | None = UNIFORM,
        stride: Mapping[str, int] | None = None,
        where: Mapping[str, LabelFilter] | None = None,
        keep: AnchorFilter | None = None,
        split: Split = ONE_PROCESS,
        prefetch: int = 2,
        threads: int = 0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        allocate: Allocate | None = None,
        pin_memory: bool = False,
    ) -> None:
        if not sources:
            raise SourceError("no sources given")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise SourceError(f"source names must differ, got {names}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be at least 0, got {prefetch}")
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be at least 0, got {cache_bytes}")
        self.sources = list(sources)
        self.anchors = Anchors(self.sources, dims, stride or {}, where, keep)
        self.order = EpochOrder(self.anchors.count, seed, shuffle)
        self.batches = Batches(self.order, batch_size, split)
        self.seed = seed
        self.prefetch = prefetch
        self.threads = threads
        if pin_memory and allocate is not None:
            raise ValueError("give allocate= or pin_memory=True, not both")
        self.allocate: Allocate = _pinned() if pin_memory else (allocate or _numpy_empty)
        #: Decoded chunks kept across batches (None: no cache).
        self.cache = ChunkCache(cache_bytes) if cache_bytes else None
        self.epoch = 0
        self.step = 0  # the next batch of the epoch, counted over the rank's batches
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The batches this worker yields in a whole epoch."""
        return len(self.batches.steps())

    def batch(self, epoch: int, step: int) -> Batch:
        """The rank's batch `step` of epoch `epoch`, read now."""
        ids = self.batches.anchors(epoch, step)
        where = self.anchors.at(ids)
        data: dict[str, dict[str, npt.NDArray[Any]]] = {}
        for i, s in enumerate(self.sources):
            starts = np.zeros((ids.shape[0], len(s.dims)), dtype=np.int64)
            for axis, d in enumerate(s.dims):
                if d in self.anchors.index[i]:
                    k = self.anchors.dims.index(d)
                    idx = self.anchors.index[i][d][where[k]]
                    starts[:, axis] = s.starts(d, idx) if d in s.windows else 0
            out = {v: self._allocate((ids.shape[0], *s.shape), s.dtypes[v]) for v in s.variables}
            s.read(starts, out, self.threads, self.cache)
            data[s.name] = out
        labels = {d: self.anchors.labels[k][where[k]] for k, d in enumerate(self.anchors.dims)}
        return Batch(data, labels, epoch, step, ids)

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        out = self.allocate(shape, dtype)
        if (
            not isinstance(out, np.ndarray)
            or out.shape != shape
            or out.dtype != dtype
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(
                f"allocate{shape, dtype} must return a writable C-contiguous numpy array of "
                f"that shape and dtype, got {type(out).__name__} "
                f"{getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}"
            )
        return out

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self.epoch, self.step
        if start >= self.batches.per_rank():
            epoch, start = epoch + 1, 0
        steps = self.batches.steps(start)
        threads = max(1, self.prefetch)
        with ThreadPoolExecutor(threads, thread_name_prefix="chunkfuse-loader") as pool:
            ahead: deque[Future[Batch]] = deque()
            try:
                for step in steps:
                    ahead.append(pool.submit(self.batch, epoch, step))
                    if len(ahead) > self.prefetch:
                        yield self._deliver(ahead.popleft())
                while ahead:
                    yield self._deliver(ahead.popleft())
            finally:
                for f in ahead:
                    f.cancel()
        self._advance(epoch + 1, 0)

    def _deliver(self, future: Future[Batch]) -> Batch:
        b = future.result()
        # Where the stream of every worker's batches resumes after this one.
        self._advance(b.epoch, b.step + 1)
        return b

    def _advance(self, epoch: int, step: int) -> None:
        with self._lock:
            self.epoch, self.step = epoch, step

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: the next batch is (epoch, step), counted over the rank's
        batches. With the same sources and options, `load_state_dict` of it resumes with that
        batch, whatever the number of workers; with several workers, the state of the stream
        is that of the batch the consumer took last (`Batch.epoch`, `Batch.step` + 1)."""
        with self._lock:
            split = self.batches.split
            return {
                "seed": self.seed,
                "epoch": self.epoch,
                "step": self.step,
                "anchors": self.anchors.count,
                "batch_size": self.batches.size,
                "rank": split.rank,
                "world": split.world,
                "worker": split.worker,
                "workers": split.workers,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from `state_dict()`'s record; refused when it was made with other anchors,
        seed or batch size, which would give other batches."""
        for key, have in (
            ("seed", self.seed),
            ("anchors", self.anchors.count),
            ("batch_size", self.batches.size),
        ):
            if state.get(key) != have:
                raise ValueError(
                    f"the state was saved with {key} {state.get(key)!r}, this loader has {have!r}"
                )
        self._advance(int(state["epoch"]), int(state["step"]))

    #: grain's names for the same record.
    get_state = state_dict
    set_state = load_state_dict
