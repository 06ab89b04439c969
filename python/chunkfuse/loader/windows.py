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

import chunkfuse._engine as _engine
from chunkfuse.loader.device import on_gpu
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


def _pooled_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """An array over memory from the engine's buffer pool, handed back to the pool when the
    last array over it is gone: the next batch is read into memory already mapped, rather
    than fresh pages the engine's copying threads would fault in one by one."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    # The stub cannot say PooledBuffer exports the buffer protocol before Python 3.12.
    buffer: Any = _engine.PooledBuffer(nbytes)
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


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
    """One batch: per source, per variable, an array of the batch's windows (`(n, *window)`:
    a numpy array, or a torch CUDA tensor from a loader with `device="cuda"`); per anchor
    dimension, each example's anchor label; and where it stands."""

    data: dict[str, dict[str, Any]]
    anchors: dict[str, npt.NDArray[Any]]
    epoch: int
    step: int
    #: Each example's anchor index (into the epoch's anchors, in `anchor_labels` order).
    ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))


def _valid_labels(
    sources: Sequence[Source], d: str, labels: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.bool_], list[tuple[int, npt.NDArray[np.int64]]]]:
    """Which `labels` of anchor dimension `d` every source having it aligns with, its window
    inside its array; and each such source's index of every label."""
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
    return ok, found


@dataclass(frozen=True)
class _Jitter:
    """How anchors move along one dimension: up to `steps` label positions either way (of
    the first source's coordinate), to the nearest label valid for every source."""

    steps: int
    #: The coordinate position of each anchor label (the strided grid).
    grid: npt.NDArray[np.int64]
    #: The positions an anchor may move to, ascending, their labels and each source's index.
    valid: npt.NDArray[np.int64]
    labels: npt.NDArray[Any]
    index: dict[int, npt.NDArray[np.int64]]

    def move(
        self,
        where: npt.NDArray[np.int64],
        ids: npt.NDArray[np.int64],
        seed: int,
        epoch: int,
        axis: int,
    ) -> npt.NDArray[np.int64]:
        """Indices into `valid` of anchors at label positions `where` (into `grid`) moved
        by their offsets for (seed, epoch, id, axis)."""
        offsets = _mix(seed, epoch, ids, axis) % np.uint64(2 * self.steps + 1)
        target = self.grid[where] + offsets.astype(np.int64) - self.steps
        right = np.searchsorted(self.valid, target).clip(0, self.valid.shape[0] - 1)
        left = (right - 1).clip(0)
        nearer = np.abs(self.valid[left] - target) <= np.abs(self.valid[right] - target)
        return np.where(nearer, left, right)


def _mix(seed: int, epoch: int, ids: npt.NDArray[np.int64], axis: int) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of (seed, epoch, id, axis) per id (splitmix64's finalizer)."""
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x ^= np.uint64((seed * 0xBF58476D1CE4E5B9 + epoch * 0x94D049BB133111EB + axis) % 2**64)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


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
        jitter: Mapping[str, int] | None = None,
    ) -> None:
        self.dims = tuple(dims)
        where = dict(where or {})
        jitter = dict(jitter or {})
        for d, j in jitter.items():
            if d not in self.dims:
                raise SourceError(
                    f"jitter= names {d!r}, which is not an anchor dimension ({self.dims})"
                )
            if int(j) < 0:
                raise SourceError(f"anchor dimension {d!r}: jitter must be at least 0, got {j}")
        #: Per jittered anchor dimension: the valid labels an anchor may move to.
        self.jittered: dict[str, _Jitter] = {}
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
            for s in having[1:]:
                if (d in s.positional) != (d in first.positional):
                    labelled, bare = (s, first) if d in first.positional else (first, s)
                    raise SourceError(
                        f"anchor dimension {d!r}: source {labelled.name!r} labels it by its "
                        f"coordinate, source {bare.name!r} has no coordinate for it (its "
                        "positions): the two cannot be aligned"
                    )
            full = first.coords[d]
            ok, found = _valid_labels(sources, d, full)
            if d in where:
                chosen = np.asarray(where[d](full), dtype=bool)
                if chosen.shape != full.shape:
                    raise SourceError(
                        f"where[{d!r}] returned shape {chosen.shape} for {full.shape[0]} labels"
                    )
                ok &= chosen
                if not ok.any():
                    raise SourceError(f"anchor dimension {d!r}: where[{d!r}] leaves no anchor")
            positions = np.arange(0, full.shape[0], step)
            positions = positions[ok[positions]]
            if positions.size == 0:
                raise SourceError(
                    f"anchor dimension {d!r}: no label every {step} steps where every "
                    "source's window fits"
                )
            self.labels.append(full[positions])
            for i, idx in found:
                self.index[i][d] = idx[positions]
            if jitter.get(d, 0):
                reachable = np.flatnonzero(ok)
                self.jittered[d] = _Jitter(
                    int(jitter[d]),
                    positions,
                    reachable,
                    full[reachable],
                    {i: idx[reachable] for i, idx in found},
                )
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

    def locate(
        self, ids: npt.NDArray[np.int64], epoch: int, seed: int
    ) -> tuple[dict[str, npt.NDArray[Any]], list[dict[str, npt.NDArray[np.int64]]]]:
        """Each anchor's label along each anchor dimension, and each source's index of it,
        after this epoch's jitter (a pure function of seed, epoch and anchor id)."""
        where = self.at(ids)
        labels: dict[str, npt.NDArray[Any]] = {}
        index: list[dict[str, npt.NDArray[np.int64]]] = [{} for _ in self.index]
        for k, d in enumerate(self.dims):
            jit = self.jittered.get(d)
            if jit is None:
                labels[d] = self.labels[k][where[k]]
                for i, per_dim in enumerate(self.index):
                    if d in per_dim:
                        index[i][d] = per_dim[d][where[k]]
                continue
            moved = jit.move(where[k], ids, seed, epoch, k)
            labels[d] = jit.labels[moved]
            for i, idx in jit.index.items():
                index[i][d] = idx[moved]
        return labels, index

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
    first batch. `jitter={"latitude": 4}` moves each anchor by up to 4 label positions either
    way along that dimension, anew each epoch (a pure function of seed, epoch and anchor),
    to the nearest label where every source's window fits (`where` holds there too; the
    missing-value filter and `keep` judge the anchor before it moves). Decoded chunks are
    kept across batches in a cache of `cache_bytes` (0:
    none), shared by every source, so batches whose windows share chunks (a chunk-aware
    `shuffle`) decode each once while it stays there. Each variable's windows of a batch are
    read straight into one array that `allocate` makes (default: memory from the engine's
    buffer pool, handed back when the batch is dropped);
    `pin_memory=True` makes them in page-locked memory through PyTorch, for fast copies to
    a GPU (it needs CUDA).

    `device="cuda"` reads `group` batches at a time onto the GPU (one device read per
    source, nvCOMP decoding zstd there) into torch CUDA tensors, the host loader's batches
    in its order; without a usable GPU or PyTorch with CUDA it fails when made, and
    `device="auto"` then reads on the host (docs/loader.md).
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
        jitter: Mapping[str, int] | None = None,
        split: Split = ONE_PROCESS,
        prefetch: int = 2,
        threads: int = 0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        allocate: Allocate | None = None,
        pin_memory: bool = False,
        device: str = "cpu",
        group: int = 5,
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
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be an int of at least 1, got {group!r}")
        #: Whether batches are read onto the GPU (torch CUDA tensors).
        self.on_gpu = on_gpu(device)
        if self.on_gpu and (pin_memory or allocate is not None):
            raise ValueError(
                "pin_memory= and allocate= make host batches; a loader with device='cuda' "
                "reads onto the GPU"
            )
        self.group = group
        self.sources = list(sources)
        self.anchors = Anchors(self.sources, dims, stride or {}, where, keep, jitter)
        self.order = EpochOrder(self.anchors.count, seed, shuffle)
        self.batches = Batches(self.order, batch_size, split)
        self.seed = seed
        self.prefetch = prefetch
        self.threads = threads
        if pin_memory and allocate is not None:
            raise ValueError("give allocate= or pin_memory=True, not both")
        self.allocate: Allocate = _pinned() if pin_memory else (allocate or _pooled_empty)
        #: Decoded chunks kept across batches (None: no cache).
        self.cache = ChunkCache(cache_bytes) if cache_bytes else None
        self.epoch = 0
        self.step = 0  # the next batch of the epoch, counted over the rank's batches
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The batches this worker yields in a whole epoch."""
        return len(self.batches.steps())

    def _locate(
        self, epoch: int, step: int
    ) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[Any]], list[npt.NDArray[np.int64]]]:
        """Batch `step` of `epoch`: its anchor ids, their labels, and each source's window
        starts (an (n, ndim) array)."""
        ids = self.batches.anchors(epoch, step)
        labels, index = self.anchors.locate(ids, epoch, self.seed)
        corners = []
        for i, s in enumerate(self.sources):
            starts = np.zeros((ids.shape[0], len(s.dims)), dtype=np.int64)
            for axis, d in enumerate(s.dims):
                if d in index[i]:
                    idx = index[i][d]
                    starts[:, axis] = s.starts(d, idx) if d in s.windows else 0
            corners.append(starts)
        return ids, labels, corners

    def batch(self, epoch: int, step: int) -> Batch:
        """The rank's batch `step` of epoch `epoch`, read now."""
        if self.on_gpu:
            return self._device_batches(epoch, [step])[0]
        ids, labels, corners = self._locate(epoch, step)
        data: dict[str, dict[str, Any]] = {}
        for s, starts in zip(self.sources, corners, strict=True):
            out = {v: self._allocate((ids.shape[0], *s.shape), s.dtypes[v]) for v in s.variables}
            s.read(starts, out, self.threads, self.cache)
            data[s.name] = out
        return Batch(data, labels, epoch, step, ids)

    def _device_batches(self, epoch: int, steps: Sequence[int]) -> list[Batch]:
        """Batches `steps` of `epoch` read onto the GPU: each source's windows of all of them
        in one device read, split into each batch's views."""
        located = [self._locate(epoch, step) for step in steps]
        bounds = np.cumsum([0, *(ids.shape[0] for ids, _, _ in located)])
        reads = [
            s.read_device(np.concatenate([c[k] for _, _, c in located]), self.threads)
            for k, s in enumerate(self.sources)
        ]
        return [
            Batch(
                {
                    s.name: {v: t[bounds[j] : bounds[j + 1]] for v, t in read.items()}
                    for s, read in zip(self.sources, reads, strict=True)
                },
                labels,
                epoch,
                step,
                ids,
            )
            for j, (step, (ids, labels, _)) in enumerate(zip(steps, located, strict=True))
        ]

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
        if self.on_gpu:
            yield from self._device_iter(epoch, steps)
            return
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

    def _device_iter(self, epoch: int, steps: Sequence[int]) -> Iterator[Batch]:
        """The batches `steps` of `epoch` read onto the GPU `group` at a time, whole groups
        read ahead on a background thread to cover `prefetch` batches."""
        # Lazily: an epoch may have billions of batches.
        groups = (steps[i : i + self.group] for i in range(0, len(steps), self.group))
        ahead_groups = -(-self.prefetch // self.group)
        with ThreadPoolExecutor(1, thread_name_prefix="chunkfuse-loader") as pool:
            ahead: deque[Future[list[Batch]]] = deque()
            try:
                for g in groups:
                    ahead.append(pool.submit(self._device_batches, epoch, g))
                    if len(ahead) > ahead_groups:
                        for b in ahead.popleft().result():
                            yield self._delivered(b)
                while ahead:
                    for b in ahead.popleft().result():
                        yield self._delivered(b)
            finally:
                for f in ahead:
                    f.cancel()
        self._advance(epoch + 1, 0)

    def _delivered(self, b: Batch) -> Batch:
        # Where the stream of every worker's batches resumes after this one.
        self._advance(b.epoch, b.step + 1)
        return b

    def _deliver(self, future: Future[Batch]) -> Batch:
        return self._delivered(future.result())

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
