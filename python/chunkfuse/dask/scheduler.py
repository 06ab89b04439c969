"""The get function: Dask's graph, culled and ordered, run by worker threads that pull tasks."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dask._task_spec import DataNode
from dask.callbacks import Callback, local_callbacks, unpack_callbacks
from dask.core import flatten
from dask.local import finish_task, start_state_from_dask
from dask.order import order

import chunkfuse
from chunkfuse import iomode
from chunkfuse.cubed.symbols import NotNative

from .graph import as_task_graph, check_keys
from .lean import is_lean, run_lean, run_workers
from .native import has_zarr_arrays, run_native


@dataclass
class GetStats:
    """What one ``get`` call ran: tasks in all, and the keys of any that failed."""

    tasks: int = 0
    python_tasks: int = 0
    native_tasks: int = 0
    engine_runs: int = 0
    #: Blocks whose fused elementwise program ran on a GPU (``device="cuda"`` or ``"auto"``).
    gpu_blocks: int = 0
    failed: list[Hashable] = field(default_factory=list)


_last = threading.local()


def last_stats() -> GetStats | None:
    """Statistics of this thread's most recent ``get`` call."""
    return getattr(_last, "stats", None)


def _nested(keys: Any, cache: Mapping[Hashable, Any]) -> Any:
    """``keys``' values, lists turned into tuples (Dask's ``nested_get``)."""
    if isinstance(keys, list):
        return tuple(_nested(k, cache) for k in keys)
    return cache[keys]


class _Run:
    """Shared state of one ``get`` call: Dask's scheduler state dict, guarded by one lock."""

    def __init__(
        self,
        dsk: Mapping[Hashable, Any],
        state: dict[str, Any],
        wanted: set[Any],
        keyorder: Callable[[Hashable], Any],
        callbacks: tuple[list[Any], list[Any]],
        stats: GetStats,
    ) -> None:
        self.dsk = dsk
        self.state = state
        self.wanted = wanted
        self.keyorder = keyorder
        self.pretask, self.posttask = callbacks
        self.stats = stats
        self.cond = threading.Condition()
        self.error: tuple[Hashable, BaseException] | None = None

    def done(self) -> bool:
        s = self.state
        return not (s["waiting"] or s["ready"] or s["running"])

    def work(self, worker_id: int) -> None:
        """Runs ready tasks until the graph is done or a task failed."""
        s = self.state
        cond = self.cond
        while True:
            with cond:
                while not s["ready"] and not self.done() and self.error is None:
                    cond.wait()
                if self.error is not None or not s["ready"]:
                    cond.notify_all()
                    return
                key = s["ready"].pop()
                s["running"].add(key)
                for f in self.pretask:
                    f(key, self.dsk, s)
                node = self.dsk[key]
                data = {dep: s["cache"][dep] for dep in s["dependencies"][key]}
            try:
                result = node(data)
            except BaseException as e:  # noqa: BLE001 - re-raised unchanged by get()
                with cond:
                    if self.error is None:
                        self.error = (key, e)
                    self.stats.failed.append(key)
                    cond.notify_all()
                return
            with cond:
                s["cache"][key] = result
                before = len(s["ready"])
                finish_task(self.dsk, key, s, self.wanted, self.keyorder)
                self.stats.tasks += 1
                self.stats.python_tasks += 1
                for f in self.posttask:
                    f(key, result, self.dsk, s, worker_id)
                if len(s["ready"]) > before + 1 or self.done():
                    cond.notify_all()


def _run_native_part(
    graph: dict[Hashable, Any],
    wanted: set[Hashable],
    stats: GetStats,
    max_mem: int | None,
    threads: int,
    device: str,
) -> dict[Hashable, Any]:
    """Runs what the engine can of `graph`; returns the rest, with the engine's results as
    data nodes."""
    try:
        part = run_native(graph, wanted, max_mem=max_mem, threads=threads, device=device)
    except NotNative:
        return graph
    if part is None:
        return graph
    stats.native_tasks = len(part.covered)
    stats.gpu_blocks += part.gpu_blocks
    stats.engine_runs += 1
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
    max_mem: int | None = None,
    native: bool = True,
    io: str | None = None,
    device: str = "cpu",
    **kwargs: Any,
) -> Any:
    """Computes ``keys`` of the Dask graph ``dsk`` (an expression, a HighLevelGraph or a
    dict); returns their values in the nesting of ``keys`` (lists become tuples).

    Array tasks the engine knows (zarr reads, elementwise functions, reductions, zarr stores)
    run in one engine plan on ``num_workers`` threads within ``max_mem`` bytes (the engine's
    default budget when None); ``native=False`` runs every task in Python. Python tasks run on
    ``num_workers`` threads (default: all cores). An exception raised by a task reaches the
    caller unchanged, with a note naming the task's key. ``io`` sets how local files are
    read (see ``chunkfuse.set_io``). ``device`` is where the engine runs fused elementwise
    programs: ``"cpu"``, ``"cuda"`` (an NVIDIA GPU; an error naming why when none can be used)
    or ``"auto"`` (see ``chunkfuse.device_info``).
    """
    iomode.apply(io)
    chunkfuse.device_info(device)
    raw = dsk if isinstance(dsk, Mapping) else dsk.__dask_graph__()
    check_keys(raw, keys, cache)
    wanted = set(flatten(keys)) if isinstance(keys, list) else {keys}
    stats = GetStats()
    _last.stats = stats
    workers = max(1, num_workers or os.cpu_count() or 1)
    graph: Mapping[Hashable, Any] = raw
    if native and has_zarr_arrays(raw):
        graph = _run_native_part(
            as_task_graph(raw), wanted, stats, max_mem, num_workers or 0, device
        )
    if callbacks is None and not Callback.active and is_lean(graph):
        # Nothing watches the run: the lean runner, without Dask's per-task bookkeeping.
        results = dict(cache or {})
        ran = run_lean(graph, list(dict.fromkeys(flatten([keys]))), results, workers)
        stats.tasks = stats.python_tasks = ran
        return _nested(keys, results)
    graph = as_task_graph(graph)
    with local_callbacks(callbacks) as cbs:
        _, _, pretask, posttask, _ = unpack_callbacks(cbs)
        started: list[Any] = []
        state: dict[str, Any] = {}
        succeeded = False
        try:
            for cb in cbs:
                if cb[0]:
                    cb[0](graph)
                started.append(cb)
            keyorder = order(graph)
            state = start_state_from_dask(graph, cache=cache, sortkey=keyorder.get, keys=wanted)
            for _, start_state, _, _, _ in cbs:
                if start_state:
                    start_state(graph, state)
            if state["waiting"] and not state["ready"]:
                raise ValueError("Found no accessible jobs in dask")
            run = _Run(graph, state, wanted, keyorder.get, (pretask, posttask), stats)
            run_workers(run.work, min(workers, max(1, len(graph))), lambda: run.error)
            succeeded = True
        finally:
            for _, _, _, _, finish in started:
                if finish:
                    finish(graph, state, not succeeded)
    return _nested(keys, state["cache"])
