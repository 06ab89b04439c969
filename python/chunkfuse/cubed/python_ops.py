"""Runs the ops chunkfuse cannot translate: their function runs in Python.

Where it can (`engine_ops`), the engine reads, decodes, encodes and writes the chunks and only
the op's function runs under the GIL. Otherwise the task function is Cubed's `apply_blockwise`
(zarr-python IO) on a thread pool. Either way an exception from the user's function reaches the
caller as the same type, with a note naming the op and the output chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from cubed.runtime.types import Callback

import chunkfuse.cubed.engine_ops as engine_ops
from chunkfuse.cubed.events import report_tasks


def run_python_op(
    name: str,
    node: dict[str, Any],
    callbacks: Sequence[Callback] | None,
    max_workers: int,
    max_mem: Any,
    work_dir: str | None = None,
) -> tuple[int, bool]:
    """Run every task of one op; fire a TaskEndEvent per task.

    Returns the task count and whether the engine did the op's IO (see `engine_ops`).
    """
    pipeline = node["pipeline"]
    items = list(pipeline.mappable)
    if not items:
        return 0, False
    prepared = engine_ops.prepare(node)
    if prepared is not None:
        try:
            n = engine_ops.run(name, node, prepared, callbacks, max_workers, max_mem, work_dir)
            return n, True
        except MemoryError:
            if getattr(max_mem, "explicit", False):
                raise  # the user's max_mem is refused, not exceeded
            # Checked before any chunk is written: Cubed's tasks fit allowed_mem.

    return _run_cubed_tasks(name, node, items, callbacks, max_workers), False


def _run_cubed_tasks(
    name: str,
    node: dict[str, Any],
    items: list[Any],
    callbacks: Sequence[Callback] | None,
    max_workers: int,
) -> int:
    """Cubed's own task function (zarr-python IO) on a thread pool."""
    pipeline = node["pipeline"]

    def task(item: Any, created: float) -> tuple[Any, float, float, float]:
        start = time.time()
        try:
            result = pipeline.function(item, config=pipeline.config)
        except BaseException as e:
            e.add_note(f"chunkfuse: in Cubed op {name!r}, output chunk {list(item)}")
            raise
        return result, created, start, time.time()

    workers = max(1, min(max_workers, len(items)))
    if workers == 1:
        for item in items:
            _report(name, callbacks, *task(item, time.time()))
        return len(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chunkfuse-py") as pool:
        futures: list[Future[tuple[Any, float, float, float]]] = [
            pool.submit(task, item, time.time()) for item in items
        ]
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_EXCEPTION)
                for f in done:
                    _report(name, callbacks, *f.result())
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    return len(items)


def _report(
    name: str,
    callbacks: Sequence[Callback] | None,
    result: Any,
    created: float,
    start: float,
    end: float,
) -> None:
    report_tasks(callbacks, name, 1, created, start, end, result)


def create_arrays(
    name: str,
    arrays: list[Any],
    callbacks: Sequence[Callback] | None,
    skip: Callable[[Any], bool],
) -> None:
    """Cubed's create-arrays op, tolerant of arrays an earlier compute of the plan created.

    Arrays for which `skip` is true are left for later (the engine creates what it writes);
    their tasks are still reported, so the op's TaskEndEvents add up to its num_tasks.
    (Cubed's own `create(mode="a")` refuses an existing structured intermediate, so computing
    such a plan twice fails with its own executors.)
    """
    for lazy in arrays:
        created = start = time.time()
        if not skip(lazy):
            create_array(lazy)
        _report(name, callbacks, None, created, start, time.time())


def create_array(lazy: Any) -> None:
    """Create one of Cubed's lazy Zarr arrays; one that exists already is kept."""
    from zarr.errors import ContainsArrayError, ContainsGroupError

    try:
        lazy.create(mode="a")
    except (ContainsArrayError, ContainsGroupError):
        pass  # already there: written again by the op that produces it
