"""Graphs run with Dask's scheduler state, so that Dask's local callbacks see every task
(``dask.diagnostics.ProgressBar``, ``Profiler``, ``ResourceProfiler``, ``CacheProfiler`` and
callbacks of one's own), the engine's tasks included.

The state covers the whole graph, as ``dask.local`` keeps it. The keys the engine covers get
their ``pretask`` callbacks when the engine run starts and their ``posttask`` callbacks when
it ends, in dependency order, each finishing in Dask's state then (with its value where the
engine gave one: a root's block, a store's None; the other keys' values were never made, and
stand as None). The Python tasks then run on worker threads, as ``dask.local`` runs them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from dask.callbacks import local_callbacks, unpack_callbacks
from dask.local import finish_task, start_state_from_dask
from dask.order import order
from dask.typing import Key

from chunkfuse.common.symbols import NotNative

from .graph import topological
from .lean import run_workers
from .runner import NativePart, run_native
from .stats import GetStats


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a graph's native part (see ``get``)."""

    max_mem: int | None
    threads: int
    device: str
    #: Where the engine's scratch goes (see ``scratch.base_dir``).
    work_dir: str | None = None


def counted_native_part(
    graph: Mapping[Hashable, Any],
    wanted: set[Hashable],
    stats: GetStats,
    engine: EngineOptions,
    on_start: Callable[[set[Hashable]], None] | None = None,
) -> NativePart | None:
    """The engine's run of `graph`'s native part (None when nothing is native), counted in
    `stats`."""
    try:
        part = run_native(
            graph,
            wanted,
            max_mem=engine.max_mem,
            threads=engine.threads,
            device=engine.device,
            work_dir=engine.work_dir,
            on_start=on_start,
        )
    except NotNative:
        return None
    if part is not None:
        stats.native_tasks = len(part.covered)
        stats.gpu_blocks += part.gpu_blocks
        stats.stages.extend(part.stages)
        stats.engine_runs += 1
    return part


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


def run_watched(
    graph: Mapping[Hashable, Any],
    wanted: set[Hashable],
    cache: dict[Hashable, Any] | None,
    callbacks: Any,
    workers: int,
    stats: GetStats,
    engine: EngineOptions | None,
) -> dict[Hashable, Any]:
    """Computes `wanted` of the task-spec `graph` with Dask's state and local callbacks
    (`callbacks` and those active); the engine first runs what it recognises, unless
    `engine` is None. Returns the cache of values."""
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
            keyorder = _priorities(graph)
            state = start_state_from_dask(graph, cache=cache, sortkey=keyorder, keys=wanted)
            for _, start_state, _, _, _ in cbs:
                if start_state:
                    start_state(graph, state)
            dsk = graph
            if engine is not None:
                dsk = _run_engine(
                    graph, state, wanted, keyorder, (pretask, posttask), stats, engine
                )
            if state["waiting"] and not state["ready"]:
                raise ValueError("Found no accessible jobs in dask")
            run = _Run(dsk, state, wanted, keyorder, (pretask, posttask), stats)
            run_workers(run.work, min(workers, max(1, len(graph))), lambda: run.error)
            succeeded = True
        finally:
            for _, _, _, _, finish in started:
                if finish:
                    finish(graph, state, not succeeded)
    return state["cache"]


def _priorities(graph: Mapping[Hashable, Any]) -> Callable[[Hashable], int | None]:
    """Dask's priority of each task of `graph` (`dask.order.order`), the sort key of Dask's
    scheduler state. The keys of a task-spec graph are Dask keys (`dask.typing.Key`), which
    this package types as Hashable."""
    ranks: dict[Any, int] = order(cast("Mapping[Key, Any]", graph))
    return ranks.get


def _run_engine(
    graph: Mapping[Hashable, Any],
    state: dict[str, Any],
    wanted: set[Hashable],
    sortkey: Callable[[Hashable], Any],
    callbacks: tuple[list[Any], list[Any]],
    stats: GetStats,
    engine: EngineOptions,
) -> Mapping[Hashable, Any]:
    """Runs the graph's native part in the engine, as tasks of Dask's `state`; returns the
    graph the Python tasks run from (fused tasks whose native steps the engine computed are
    rebuilt with their values)."""
    pretask, posttask = callbacks
    s = state
    in_order: list[Hashable] = []

    def starting(covered: set[Hashable]) -> None:
        in_order.extend(k for k in topological(graph) if k in covered and k in s["dependencies"])
        for k in in_order:
            for f in pretask:
                f(k, graph, s)

    part = counted_native_part(graph, wanted, stats, engine, on_start=starting)
    if part is None:
        return graph
    covered = part.covered
    s["ready"] = [k for k in s["ready"] if k not in covered]
    for k in in_order:
        # A Python task whose value the engine did not need (it read the same values
        # symbolically) is no dependency of `k` any more.
        for d in [d for d in s["dependencies"][k] if d not in covered and d not in s["cache"]]:
            s["dependencies"][k].discard(d)
            s["dependents"][d].discard(k)
            s["waiting_data"][d].discard(k)
            waiting = s["waiting"].get(k)
            if waiting is not None:
                waiting.discard(d)
                if not waiting:
                    del s["waiting"][k]
    for k in in_order:
        value = part.values.get(k)
        s["waiting"].pop(k, None)
        s["running"].add(k)
        s["cache"][k] = value
        finish_task(graph, k, s, wanted, sortkey)
        for f in posttask:
            f(k, value, graph, s, 0)
    s["ready"] = [k for k in s["ready"] if k not in covered]
    return {**graph, **part.tasks} if part.tasks else graph
