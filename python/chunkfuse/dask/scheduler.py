"""The get function: Dask's graph, culled and ordered, run by worker threads that pull tasks."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from typing import Any

from dask._task_spec import DataNode
from dask.callbacks import Callback
from dask.core import flatten

import chunkfuse.iomode as iomode
from chunkfuse.engine_calls import device_info
from chunkfuse.sizes import budget_bytes

from .graph import as_task_graph, check_keys
from .lean import is_lean, run_lean
from .runner import has_zarr_arrays
from .stats import GetStats, last_stats, new_stats
from .watched import EngineOptions, counted_native_part, run_watched

__all__ = ["GetStats", "get", "last_stats"]


def _nested(keys: Any, cache: Mapping[Hashable, Any]) -> Any:
    """``keys``' values, lists turned into tuples (Dask's ``nested_get``)."""
    if isinstance(keys, list):
        return tuple(_nested(k, cache) for k in keys)
    return cache[keys]


def _run_native_part(
    graph: dict[Hashable, Any],
    wanted: set[Hashable],
    stats: GetStats,
    engine: EngineOptions,
) -> dict[Hashable, Any]:
    """Runs what the engine can of `graph`; returns the rest, with the engine's results as
    data nodes."""
    part = counted_native_part(graph, wanted, stats, engine)
    if part is None:
        return graph
    rest = {k: v for k, v in graph.items() if k not in part.covered}
    rest.update(part.tasks)
    rest.update({k: DataNode(k, v) for k, v in part.values.items()})
    return rest


def get(
    dsk: Any,
    keys: Any,
    cache: dict[Hashable, Any] | None = None,
    num_workers: int | None = None,
    callbacks: Any = None,
    *,
    max_mem: int | str | None = None,
    native: bool = True,
    io: str | None = None,
    device: str = "cpu",
    work_dir: str | None = None,
    **kwargs: Any,
) -> Any:
    """Computes ``keys`` of the Dask graph ``dsk`` (an expression, a HighLevelGraph or a
    dict); returns their values in the nesting of ``keys`` (lists become tuples).

    Array tasks the engine knows (zarr reads, elementwise functions, reductions, zarr stores)
    run in one engine plan on ``num_workers`` threads within ``max_mem`` (bytes, or text such
    as ``"1GB"``; the engine's default budget when None; one task too large for it raises
    MemoryError); ``native=False`` runs every task in Python. Python tasks run on
    ``num_workers`` threads (default: all cores). An exception raised by a task reaches the
    caller unchanged, with a note naming the task's key (the engine's, naming its run).
    Dask's local callbacks (``dask.diagnostics``) see every task: each one the engine covers
    starts when the engine run starts and ends when it ends. ``io`` sets how local files are
    read (see ``chunkfuse.set_io``). ``device`` is where the engine runs fused elementwise
    programs: ``"cpu"``, ``"cuda"`` (an NVIDIA GPU; an error naming why when none can be used)
    or ``"auto"`` (see ``chunkfuse.device_info``). The engine's scratch (the values Python
    reads back, intermediates) goes in a directory of its own, removed when the run ends,
    in ``work_dir`` (default: Dask's ``temporary-directory`` setting, else the system
    temporary directory).
    """
    iomode.apply(io)
    device_info(device)
    raw = dsk if isinstance(dsk, Mapping) else dsk.__dask_graph__()
    check_keys(raw, keys, cache)
    wanted = set(flatten(keys)) if isinstance(keys, list) else {keys}
    stats = new_stats()
    workers = max(1, num_workers or os.cpu_count() or 1)
    engine = EngineOptions(budget_bytes(max_mem, "max_mem"), num_workers or 0, device, work_dir)
    use_engine = native and has_zarr_arrays(raw)
    if callbacks is not None or Callback.active:
        # Callbacks watch the run: Dask's state over the whole graph, the engine's tasks in it.
        values = run_watched(
            as_task_graph(raw),
            wanted,
            cache,
            callbacks,
            workers,
            stats,
            engine if use_engine else None,
        )
        return _nested(keys, values)
    graph: Mapping[Hashable, Any] = raw
    if use_engine:
        graph = _run_native_part(as_task_graph(raw), wanted, stats, engine)
    if is_lean(graph):
        # Nothing watches the run: the lean runner, without Dask's per-task bookkeeping.
        results = dict(cache or {})
        run_lean(graph, list(dict.fromkeys(flatten([keys]))), results, workers, stats)
        return _nested(keys, results)
    values = run_watched(as_task_graph(graph), wanted, cache, None, workers, stats, None)
    return _nested(keys, values)
