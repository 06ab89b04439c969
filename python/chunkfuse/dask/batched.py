"""The engine's part of a Dask graph as batches any Dask scheduler runs: a graph rewrite.

At compute time (Dask's optimisation step, on the client) the native part of the graph
becomes one engine job, prepared here (its targets and scratch arrays created, marked as
unfinished), and each of its stages becomes tasks of the graph: one per batch (see
`chunkfuse.distributed`), the merges of split reductions, and a barrier before the next
stage. The keys the rest of the graph reads from the native part become tasks that read
their blocks back from the job's scratch arrays; the job is finished (targets completed,
scratch removed) once they have all been read. Dask schedules those tasks like any other:
on a distributed cluster, they spread over its workers (reductions included); on a local
scheduler, over its threads.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask._task_spec import DataNode, Task, TaskRef
from dask.core import flatten

from chunkfuse.distributed.batch import (
    BatchSpec,
    JobKey,
    merge_in_batches,
    merged_by_batches,
    run_batch,
)
from chunkfuse.distributed.coordinator import batch_budget
from chunkfuse.distributed.runtime import WorkerShape, default_threads
from chunkfuse.reading import ArrayReader, read

from .graph import as_task_graph
from .runner import engine_plan, select_native
from .scratch import FINISH_PREFIX, base_dir, batch_running, finished, opened
from .symbols import Blk, Store, Stored


@dataclass(frozen=True)
class BatchedOptions:
    """How the engine's part of a graph runs as batches."""

    #: Each batch's budget (bytes or text); by default three quarters of what the smallest
    #: worker offers one batch.
    max_mem: int | str | None = None
    #: Where jobs' scratch arrays, intermediates and partial states go: a directory every
    #: worker sees (default: Dask's `temporary-directory` setting, else the system temporary
    #: directory, which only a cluster on this machine shares).
    work_dir: str | None = None
    batches_per_worker: int = 4
    device: str = "cpu"


def _local_scheduler_running() -> bool:
    """Whether this graph is being materialised by one of Dask's local schedulers (threads,
    sync, processes), which build it inside `dask.local.get_async` or
    `dask.multiprocessing.get`, even when a distributed client is the default: a
    `compute(scheduler="threads")` call runs here whatever clients exist."""
    import dask.local
    import dask.multiprocessing

    local = {dask.local.get_async.__code__, dask.multiprocessing.get.__code__}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in local:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _materialising_scheduler() -> Any | None:
    """The dask.distributed scheduler in this process that is materialising a graph now
    (it does so for every graph a client submits, in a thread of its own), or None: when
    this process has no scheduler, or several are at it (then the default client decides)."""
    scheduler_module = sys.modules.get("distributed.scheduler")
    if scheduler_module is None:
        return None
    instances = getattr(scheduler_module.Scheduler, "_instances", ())
    busy = [s for s in list(instances) if getattr(s, "_active_graph_updates", 0)]
    return busy[0] if len(busy) == 1 else None


def _scheduler_shape(scheduler: Any) -> WorkerShape:
    """The shape of a scheduler's workers, read in its own process (a scheduler on another
    machine has no client to ask), once one has joined."""
    from chunkfuse.distributed import dask_runtime

    deadline = time.monotonic() + dask_runtime.WAIT_FOR_WORKERS_S
    while True:
        workers = [(w.nthreads, w.memory_limit) for w in list(scheduler.workers.values())]
        if workers:
            return dask_runtime.shape_of(workers)
        if time.monotonic() > deadline:
            raise dask_runtime.no_workers(scheduler.address)
        time.sleep(0.05)


def _shape() -> WorkerShape:
    """The workers batches will run on: this machine's threads when a local scheduler runs
    the graph, else the distributed scheduler's workers (read in the scheduler materialising
    the graph, or through the default client)."""
    if not _local_scheduler_running():
        scheduler = _materialising_scheduler()
        if scheduler is not None:
            return _scheduler_shape(scheduler)
        try:
            from distributed import default_client

            client = default_client()
        except (ImportError, ValueError):
            client = None
        if client is not None:
            from chunkfuse.distributed.dask_runtime import DaskRuntime

            return DaskRuntime(client).shape()
    import psutil

    threads = default_threads()
    return WorkerShape(1, threads, int(psutil.virtual_memory().total))


def rewrite(graph_in: Any, keys: Any, options: BatchedOptions) -> Any:
    """`graph_in` (Dask's optimised graph for `keys`) with its native part as batch tasks;
    unchanged when nothing in it is native."""
    graph = as_task_graph(graph_in)
    wanted = set(flatten(keys)) if isinstance(keys, list) else {keys}
    selection = select_native(graph, wanted, mixed=False)
    if selection is None or not selection.todo:
        return graph_in
    shape = _shape()
    scratch = tempfile.mkdtemp(prefix="chunkfuse-dask-", dir=base_dir(options.work_dir))
    token = uuid.uuid4().hex[:10]
    opened(token, scratch)
    planned = engine_plan(selection.interp, selection.todo, scratch)
    text = json.dumps(planned.plan)
    key = JobKey(
        plan=text,
        params=(),
        max_mem=batch_budget(options.max_mem, shape, "chunkfuse.dask"),
        threads=shape.batch_threads,
        # The job's work directory inside its scratch: one removal ends both.
        work_dir=scratch,
        device=options.device,
        spread=shape.workers * shape.threads,
        run=uuid.uuid4().hex,
    )
    job = key.prepare()
    out: dict[Hashable, Any] = {k: v for k, v in graph.items() if k not in selection.covered}
    barrier: str | None = None
    want = max(1, shape.workers * shape.threads * options.batches_per_worker)
    for stage in range(job.stage_count()):
        cut = json.loads(job.cut(stage, want))
        batches = [tuple(b) for b in cut["batches"]]
        names = []
        given = tuple(batches) if cut["merges"] and merge_in_batches() else ()
        for i, (s, e) in enumerate(batches):
            spec = BatchSpec(key, "dask", stage, i, len(batches), s, e, cut["label"], None, given)
            name = f"chunkfuse-batch-{token}-{stage}-{i}"
            out[name] = Task(name, _run_after, token, spec, *_refs(barrier))
            names.append(name)
        merges = []
        for i, part in enumerate(cut["merges"]):
            spec = BatchSpec(
                key, "dask", stage, i, len(cut["merges"]), 0, 0, cut["label"], part, tuple(batches)
            )
            name = f"chunkfuse-merge-{token}-{stage}-{i}"
            out[name] = Task(name, _run_after, token, spec, *(TaskRef(n) for n in names))
            merges.append(name)
        barrier = f"chunkfuse-stage-{token}-{stage}"
        out[barrier] = Task(barrier, _barrier, *(TaskRef(n) for n in names + merges))
    del job
    readers: dict[Hashable, str] = {}
    for k, sym in planned.roots.items():
        if isinstance(sym, Blk):
            url = planned.scratch[sym.full.root][1]
            name = f"chunkfuse-read-{token}-{len(readers)}"
            out[name] = Task(name, _read_block, url, sym.region, *_refs(barrier))
            readers[k] = name
    finish = f"{FINISH_PREFIX}{token}"
    out[finish] = Task(
        finish,
        _finish,
        key,
        token,
        scratch,
        *_refs(barrier),
        *(TaskRef(r) for r in readers.values()),
    )
    for k, sym in planned.roots.items():
        if k in readers:
            out[k] = Task(k, _after, TaskRef(readers[k]), TaskRef(finish))
        elif isinstance(sym, Stored):
            out[k] = Task(k, _after, DataNode(None, sym.template), TaskRef(finish))
        elif isinstance(sym, Store):
            out[k] = Task(k, _after, None, TaskRef(finish))
    return out


def _refs(key: str | None) -> tuple[TaskRef, ...]:
    return () if key is None else (TaskRef(key),)


def _run_after(token: str, spec: BatchSpec, *before: Any) -> dict[str, Any]:
    """Runs a batch of the graph `token` once what it waits for has run; a merge that one of
    the batches before it did already (see `BatchSpec`) is not run again."""
    if spec.merge is not None and spec.merge in merged_by_batches(before):
        return {"stage": spec.stage, "merge": spec.merge, "tasks": 0, "merged": []}
    with batch_running(token):
        return run_batch(spec)


def _barrier(*summaries: Any) -> int:
    """A stage's end: every batch of it has run. Its value is the tasks they ran."""
    return sum(int(s.get("tasks", 0)) for s in summaries if isinstance(s, Mapping))


def _read_block(url: str, region: tuple[tuple[int, int], ...], _stage: Any) -> np.ndarray:
    """A block of the job's scratch array at `url`, read by the engine on this task's thread
    (the scheduler runs other tasks on the others)."""
    box = tuple(slice(a, b) for a, b in region)
    return np.asarray(read(ArrayReader(url), box, threads=1))


def _finish(key: JobKey, token: str, scratch: str, *_read: Any) -> None:
    """Completes the job's targets and removes its scratch (its work directory within)."""
    key.attach().finish()
    shutil.rmtree(scratch, ignore_errors=True)
    finished(token)


def _after(value: Any, _finished: Any) -> Any:
    """`value`, once the job is finished."""
    return value
