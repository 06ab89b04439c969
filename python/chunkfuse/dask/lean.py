"""The Python tasks of a graph, run with as little per-task work as possible.

Dask's local schedulers convert every legacy task to the task-spec form, order the graph
with ``dask.order`` and keep set-based state for callbacks: tens of microseconds per task,
which is what a graph of many small tasks pays. Without callbacks to feed, this runner does
less: legacy tuples run as they are (``(func, *args)`` with keys replaced by their values,
lists walked, anything else literal), task-spec nodes are called with their dependencies, the
order is a depth-first post-order from the requested keys (each input's subtree finishes
before the next is started, so intermediates are freed early), and each value is dropped when
its last dependent has run.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from dask._task_spec import DataNode, GraphNode

from .stats import GetStats


def _is_task(x: Any) -> bool:
    return type(x) is tuple and bool(x) and callable(x[0])


def _legacy_deps(node: Any, graph: Mapping[Hashable, Any], out: list[Hashable]) -> None:
    """Appends the keys `node` (a legacy task, list or literal) refers to."""
    stack = [node]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is tuple and x and callable(x[0]):
            stack.extend(x[1:])
        elif t is list:
            stack.extend(x)
        elif isinstance(x, GraphNode):
            out.extend(x.dependencies)
        else:
            try:
                if x in graph:
                    out.append(x)
            except TypeError:  # unhashable: a literal
                pass


def _run_legacy(x: Any, cache: Mapping[Hashable, Any]) -> Any:
    """The value of a legacy task, list, key or literal."""
    t = type(x)
    if t is tuple and x and callable(x[0]):
        return x[0](*[_run_legacy(a, cache) for a in x[1:]])
    if t is list:
        return [_run_legacy(a, cache) for a in x]
    if isinstance(x, GraphNode):
        return x({d: cache[d] for d in x.dependencies})
    try:
        return cache[x] if x in cache else x
    except TypeError:  # unhashable: a literal
        return x


def is_lean(graph: Mapping[Hashable, Any]) -> bool:
    """True when every node is one this runner takes: task-spec nodes and legacy tuples,
    lists and literals (dicts and other containers go through Dask's conversion)."""
    for v in graph.values():
        if isinstance(v, GraphNode) or _is_task(v):
            continue
        if type(v) in (dict, set, frozenset):
            return False
    return True


class LeanRun:
    """One run: dependencies, a depth-first priority per task, and worker threads."""

    def __init__(
        self, graph: Mapping[Hashable, Any], wanted: list[Hashable], cache: dict[Hashable, Any]
    ) -> None:
        self.graph = graph
        self.cache = cache
        self.wanted = set(wanted)
        deps: dict[Hashable, list[Hashable]] = {}
        priority: dict[Hashable, int] = {}
        # Depth-first post-order from the requested keys; culls what they do not need.
        stack: list[tuple[Hashable, bool]] = [(k, False) for k in reversed(wanted)]
        while stack:
            key, expanded = stack.pop()
            if expanded:
                priority[key] = len(priority)
                continue
            if key in deps or key in cache:
                continue
            node = graph[key]
            found: list[Hashable] = []
            if isinstance(node, GraphNode):
                found.extend(node.dependencies)
            else:
                _legacy_deps(node, graph, found)
            mine = list(dict.fromkeys(d for d in found if d != key))
            deps[key] = mine
            stack.append((key, True))
            stack.extend((d, False) for d in reversed(mine) if d not in deps and d not in cache)
        self.deps = deps
        self.priority = priority
        self.dependents: dict[Hashable, list[Hashable]] = {k: [] for k in deps}
        self.refs: dict[Hashable, int] = {}
        self.waiting: dict[Hashable, int] = {}
        for k, ds in deps.items():
            n = 0
            for d in ds:
                self.refs[d] = self.refs.get(d, 0) + 1
                if d in deps:
                    self.dependents[d].append(k)
                    n += 1
            self.waiting[k] = n
        self.ready = [(priority[k], k) for k, n in self.waiting.items() if n == 0]
        heapq.heapify(self.ready)
        self.left = len(deps)
        self.cond = threading.Condition()
        self.error: tuple[Hashable, BaseException] | None = None
        self.ran = 0
        self.workers = 1

    def work(self) -> None:
        """Takes ready tasks in batches (a share of what is ready, so threads do not queue on
        the lock for every small task), runs them, and records them in one locked step."""
        cond, cache, ready = self.cond, self.cache, self.ready
        while True:
            with cond:
                while not ready and self.left and self.error is None:
                    cond.wait()
                if self.error is not None or not self.left:
                    cond.notify_all()
                    return
                take = max(1, min(BATCH, len(ready) // self.workers))
                batch = [heapq.heappop(ready)[1] for _ in range(min(take, len(ready)))]
            done: list[tuple[Hashable, Any, bool]] = []
            failed: tuple[Hashable, BaseException] | None = None
            for key in batch:
                node = self.graph[key]
                try:
                    if isinstance(node, DataNode):
                        value = node.value
                    elif isinstance(node, GraphNode):
                        value = node({d: cache[d] for d in self.deps[key]})
                    else:
                        value = _run_legacy(node, cache)
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller
                    failed = (key, e)
                    break
                done.append((key, value, isinstance(node, DataNode)))
                # Later tasks of the batch may need this value: publish it now.
                cache[key] = value
            with cond:
                woke = 0
                for key, _value, is_data in done:
                    self.ran += not is_data
                    self.left -= 1
                    for d in self.dependents[key]:
                        self.waiting[d] -= 1
                        if self.waiting[d] == 0:
                            heapq.heappush(ready, (self.priority[d], d))
                            woke += 1
                    for d in self.deps[key]:
                        self.refs[d] -= 1
                        if self.refs[d] == 0 and d not in self.wanted:
                            cache.pop(d, None)
                if failed is not None and self.error is None:
                    self.error = failed
                if woke or failed is not None or not self.left:
                    cond.notify_all()
                if failed is not None:
                    return


#: Most tasks a worker takes at once.
BATCH = 64


def run_lean(
    graph: Mapping[Hashable, Any],
    wanted: list[Hashable],
    cache: dict[Hashable, Any],
    workers: int,
    stats: GetStats,
) -> None:
    """Computes `wanted` into `cache` on `workers` threads, counting the tasks that ran in
    `stats`. Raises the first task exception (with a note naming its key)."""
    run = LeanRun(graph, wanted, cache)
    run.workers = workers
    try:
        run_workers(
            lambda _worker: run.work(), min(workers, max(1, len(run.deps))), lambda: run.error
        )
    finally:
        stats.tasks += run.ran
        stats.python_tasks += run.ran
        if run.error is not None:
            stats.failed.append(run.error[0])


def run_workers(
    work: Callable[[int], None],
    workers: int,
    error: Callable[[], tuple[Hashable, BaseException] | None],
) -> None:
    """Runs `work(i)` on `workers` threads (this one included) until all return, then raises
    the task exception `error()` reports, with a note naming its key."""
    threads = [
        threading.Thread(target=work, args=(i,), daemon=True, name=f"chunkfuse-dask-{i}")
        for i in range(1, workers)
    ]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    failed = error()
    if failed is not None:
        key, exc = failed
        exc.add_note(f"chunkfuse.dask: raised by the task with key {key!r}")
        raise exc
