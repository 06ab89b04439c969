"""`RustExecutor`: Cubed's executor interface over the chunkfuse engine."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import networkx as nx
from cubed.runtime.types import Callback, DagExecutor
from cubed.runtime.utils import handle_operation_end_callbacks, handle_operation_start_callbacks
from cubed.spec import Spec
from cubed.storage.zarr import LazyZarrArray

import chunkfuse.iomode as iomode
from chunkfuse.common.explanation import Explanation
from chunkfuse.cubed.budget import (
    Budget,
    batch_budget_of,
    engine_budget,
    engine_call,
    worker_count,
)
from chunkfuse.cubed.events import TaskProgress
from chunkfuse.cubed.explain import explain_arrays
from chunkfuse.cubed.python_ops import create_array, create_arrays, run_python_op
from chunkfuse.cubed.translate import CREATE_ARRAYS, Translation, op_outputs, translate
from chunkfuse.distributed.coordinator import run_distributed
from chunkfuse.distributed.runtime import Runtime, describe
from chunkfuse.engine_calls import device_info, run_plan

log = logging.getLogger("chunkfuse.cubed")


@dataclass
class ExecutionStats:
    """What the last `execute_dag` did: which ops ran natively, which in Python, and why."""

    native_ops: list[str] = field(default_factory=list)
    python_ops: dict[str, str] = field(default_factory=dict)
    native_tasks: int = 0
    python_tasks: int = 0
    #: Python tasks whose reads and writes the engine did (only the function ran in Python).
    engine_io_tasks: int = 0
    engine_runs: int = 0
    #: Where the engine ran fused elementwise programs ("cpu", or "cuda: NAME (compute_XY)").
    device: str = "cpu"
    #: Blocks of output whose fused elementwise program ran on the GPU.
    gpu_blocks: int = 0
    arrays_written: int = 0
    max_mem: int = 0
    #: The stages of the engine's runs, in order, as their summaries record them (with a
    #: `runtime`: each stage's label, tasks, batches, merges and seconds).
    stages: list[dict[str, Any]] = field(default_factory=list)
    #: Where the engine's runs ran: "local", or the runtime's name ("dask", "lithops").
    runtime: str = "local"
    #: Batches the runtime ran (merges of split reductions included), and the peak RSS each
    #: worker process reported, by (host, pid).
    batches: int = 0
    worker_peak_rss: dict[tuple[str, int], int] = field(default_factory=dict)


class RustExecutor(DagExecutor):
    """Runs Cubed plans on the chunkfuse engine.

    Options (here or as `compute(...)` keywords): `max_workers` (compute threads; default all
    cores), `max_mem` (the engine's memory budget: bytes, or text such as `"1GB"` or
    `"512MiB"` as Cubed's `allowed_mem` is written; a task too large for it raises
    MemoryError naming the task, the bytes it needs and the budget), `device` (where fused
    elementwise programs run: `"cpu"`, the default; `"cuda"`, an NVIDIA GPU, an error naming
    why when none can be used; `"auto"`, the GPU when present; reductions, FFTs and codecs run
    on the CPU),
    `io` (how local files are read: `"auto"`, `"uring"` or `"pread"`; see `chunkfuse.set_io`),
    `runtime` (run the engine's work as batches on a cluster: a `chunkfuse.distributed`
    runtime such as `DaskRuntime(client)` or `LithopsRuntime(...)`; each batch's budget is
    `max_mem` or else Cubed's `allowed_mem − reserved_mem`, refused before anything runs when
    the workers cannot hold it; the spec's `work_dir` must be storage every worker sees, see
    docs/distributed.md). Any other option is a TypeError naming it, except the options of
    Cubed's local executors (`retries`, `use_backups`, `batch_size`,
    `compute_arrays_in_parallel`), which are taken and ignored.

    Without `max_mem` the budget follows Cubed's memory model: `max_workers` times the largest
    `projected_mem − reserved_mem` of the plan's ops (what Cubed's own executors let run at
    once), at least 256 MB, and never more than `max_workers × (allowed_mem − reserved_mem)`;
    if a task needs more than that, the run is planned again with the whole allowance, and
    beyond it Cubed's own tasks run (each within `allowed_mem`). Peak RSS stays within the
    budget plus a fixed baseline (see the README's memory paragraph).
    """

    #: The options it takes (see the class doc).
    OPTIONS = ("device", "io", "max_mem", "max_workers", "runtime")
    #: Options of Cubed's local executors, taken so that code written for them runs, and
    #: ignored: the engine retries storage itself and runs a plan's arrays together.
    CUBED_OPTIONS = ("batch_size", "compute_arrays_in_parallel", "retries", "use_backups")

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(self.OPTIONS) - set(self.CUBED_OPTIONS))
        if unknown:
            raise TypeError(
                f"RustExecutor: unknown option(s) {', '.join(map(repr, unknown))}: it takes "
                f"{', '.join(self.OPTIONS)} (and ignores Cubed's {', '.join(self.CUBED_OPTIONS)})"
            )
        super().__init__(**kwargs)
        self.last_stats = ExecutionStats()

    @property
    def name(self) -> str:
        return "rust"

    def explain(self, *arrays: Any, **kwargs: Any) -> Explanation:
        """How `cubed.compute(*arrays, executor=self, **kwargs)` would run, without running
        it: its steps in order, each an engine run (the Cubed ops it covers and its stages:
        what fused into each, the strategy, tasks and parts, the bytes the largest task
        reserves against the budget) or an op run in Python, with the reason. `print()` it, or
        read its `steps`. The arrays' sources are opened; nothing is written."""
        return explain_arrays(arrays, {**self.kwargs, **kwargs})

    def execute_dag(
        self,
        dag: nx.MultiDiGraph,
        callbacks: Sequence[Callback] | None = None,
        spec: Spec | None = None,
        compute_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        options = {**self.kwargs, **kwargs}
        iomode.apply(options.get("io"))
        device = str(options.get("device", "cpu"))
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"RustExecutor: unknown device {device!r}: expected cpu, cuda or auto")
        # Before anything runs: a GPU asked for and missing is an error naming why.
        device_info(device)
        workers = worker_count(options)
        runtime = options.get("runtime")
        max_mem = (
            engine_budget(spec, workers, options.get("max_mem"), dag)
            if runtime is None
            else batch_budget_of(spec, options.get("max_mem"), runtime)
        )
        stats = ExecutionStats(max_mem=max_mem.budget)
        if runtime is not None:
            stats.runtime = describe(runtime)
        self.last_stats = stats
        work_dir = getattr(spec, "work_dir", None) if spec is not None else None
        stage_dir = tempfile.mkdtemp(prefix="chunkfuse-", dir=_local_dir(work_dir))
        try:
            t = translate(dag, stage_dir, _requested_arrays())
            run = _Run(t, dag, callbacks, workers, max_mem, stats, stage_dir, device)
            run.runtime = runtime
            run.execute()
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)


def _local_dir(work_dir: Any) -> str | None:
    if isinstance(work_dir, str) and "://" not in work_dir:
        if os.path.exists(work_dir) and not os.path.isdir(work_dir):
            raise NotADirectoryError(f"the Spec's work_dir {work_dir!r} is a file, not a directory")
        os.makedirs(work_dir, exist_ok=True)
        return work_dir
    return None


def _requested_arrays() -> set[str] | None:
    """Names of the arrays `compute()` returns, from Cubed's `FinalizedPlan.execute` frame.

    Cubed does not pass them to executors; without them every op output counts as requested
    (correct, but partial reductions then run in Python).
    """
    from cubed.core.plan import FinalizedPlan

    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, FinalizedPlan):
            return set(owner.array_names)
        frame = frame.f_back
    return None


class _Run:
    """One execution: ops in topological order, native ones batched into engine runs."""

    def __init__(
        self,
        t: Translation,
        dag: nx.MultiDiGraph,
        callbacks: Sequence[Callback] | None,
        workers: int,
        max_mem: Budget,
        stats: ExecutionStats,
        work_dir: str,
        device: str = "cpu",
    ) -> None:
        self.t = t
        self.device = device
        self.dag = dag
        self.callbacks = list(callbacks or [])
        self.workers = workers
        self.max_mem = max_mem
        self.stats = stats
        self.work_dir = work_dir
        self.pending: list[tuple[str, dict[str, Any]]] = []
        self.later = t.arrays_created_later(dag)
        #: Runs the engine's work as batches on a cluster when set.
        self.runtime: Runtime | None = None

    def execute(self) -> None:
        for name, node in self.t.ops:
            if name == CREATE_ARRAYS:
                self._create_arrays(name, node)
            elif self.t.native.get(name):
                self.pending.append((name, node))
            else:
                self._flush()
                self.stats.python_ops[name] = self.t.reasons.get(name, "")
                self._python(name, node)
        self._flush()

    def _create_arrays(self, name: str, node: dict[str, Any]) -> None:
        """Cubed's create-arrays op, less the arrays that are made later or never needed
        (`Translation.arrays_created_later`): creating them in zarr-python costs a few
        milliseconds each, and the engine would replace them anyway."""
        later = {id(self.dag.nodes[a].get("target")) for a in self.later}
        handle_operation_start_callbacks(self.callbacks, name)
        create_arrays(
            name,
            list(node["pipeline"].mappable),
            self.callbacks,
            skip=lambda lazy: id(lazy) in later,
        )
        handle_operation_end_callbacks(self.callbacks, name)

    def _python(self, name: str, node: dict[str, Any]) -> None:
        handle_operation_start_callbacks(self.callbacks, name)
        n, engine_io = run_python_op(
            name, node, self.callbacks, self.workers, self.max_mem, self.work_dir
        )
        self.stats.python_tasks += n
        if engine_io:
            self.stats.engine_io_tasks += n
        handle_operation_end_callbacks(self.callbacks, name)

    def _flush(self) -> None:
        if not self.pending:
            return
        ops, self.pending = self.pending, []
        writes = [w for name, _ in ops for w in self.t.writes.get(name, [])]
        for name, _ in ops:
            handle_operation_start_callbacks(self.callbacks, name)
        progress = TaskProgress(
            [(name, node["primitive_op"].num_tasks) for name, node in ops], self.callbacks
        )
        if writes:
            plan = self.t.builder.plan(
                "cubed", [(w.symbol, w.url, w.chunks, w.codec, w.shards) for w in writes]
            )
            log.debug("engine plan: %s", plan)
            try:
                summary = engine_call(
                    self.max_mem,
                    lambda budget: self._engine_run(
                        plan, budget, progress if self.callbacks else None
                    ),
                )
            except MemoryError as e:
                if self.max_mem.explicit:
                    # The user's max_mem is a promise: refused, not exceeded in Python.
                    raise
                # The engine checks every task before it writes anything: run the ops as Cubed
                # planned them (each task within allowed_mem), one after the other.
                self._run_in_python(ops, f"the engine's tasks do not fit the budget: {e}")
                return
            self.stats.engine_runs += 1
            self.stats.arrays_written += len(writes)
            self.stats.device = summary["device"]
            self.stats.gpu_blocks += summary["gpu_blocks"]
            self.stats.stages.extend(summary["stages"])
        progress.finish()
        for name, node in ops:
            self.stats.native_ops.append(name)
            self.stats.native_tasks += node["primitive_op"].num_tasks
            handle_operation_end_callbacks(self.callbacks, name)

    def _engine_run(
        self, plan: str | Mapping[str, Any], budget: int, progress: TaskProgress | None
    ) -> dict[str, Any]:
        """Runs an engine plan here, or as batches on the runtime; returns its summary."""
        if self.runtime is None:
            return run_plan(
                plan,
                max_mem=budget,
                threads=self.workers,
                work_dir=self.work_dir,
                progress=progress,
                # Cubed reruns whole computations itself; its arrays carry no markers.
                resume=False,
                device=self.device,
            )
        run = run_distributed(
            plan,
            runtime=self.runtime,
            work_dir=self.work_dir,
            max_mem=budget,
            device=self.device,
            progress=progress,
        )
        self.stats.batches += len(run.batches)
        for worker, peak in run.peak_rss().items():
            self.stats.worker_peak_rss[worker] = max(
                self.stats.worker_peak_rss.get(worker, 0), peak
            )
        return {**run.summary, "stages": run.stages}

    def _run_in_python(self, ops: list[tuple[str, dict[str, Any]]], reason: str) -> None:
        log.info("running %d ops in Python: %s", len(ops), reason)
        for name, _ in ops:
            for a in op_outputs(self.dag, name):
                target = self.dag.nodes[a].get("target")
                if a in self.later and isinstance(target, LazyZarrArray):
                    create_array(target)
        for name, node in ops:
            n, engine_io = run_python_op(
                name, node, self.callbacks, self.workers, self.max_mem, self.work_dir
            )
            self.stats.python_ops[name] = reason
            self.stats.python_tasks += n
            if engine_io:
                self.stats.engine_io_tasks += n
            handle_operation_end_callbacks(self.callbacks, name)
