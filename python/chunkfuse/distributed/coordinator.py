"""The process that owns a distributed run: prepares the job, cuts each stage into batches,
has the runtime run them (a barrier between stages, then the merges of split reductions),
and finishes the job."""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chunkfuse.distributed.batch import (
    BatchSpec,
    JobKey,
    merge_in_batches,
    merged_by_batches,
    run_batch,
)
from chunkfuse.distributed.runtime import Runtime, WorkerShape, describe
from chunkfuse.sizes import budget_bytes

#: The budget of a batch when neither the caller nor the runtime says how much memory a
#: worker has.
DEFAULT_BATCH_MEMORY = 1 << 30

#: How long the run waits, before finishing the job, for copies of batches that outlived
#: their round (a runtime's `settle`). Past it the job finishes anyway: a copy that then
#: reads a removed intermediate fails instead of writing (the engine's removal guard).
SETTLE_S = 60.0


@dataclass
class DistributedRun:
    """What a distributed run did."""

    #: The job's summary from the coordinator (targets, name, budget).
    summary: dict[str, Any]
    #: Each batch's summary (`run_batch`'s), in completion order.
    batches: list[dict[str, Any]] = field(default_factory=list)
    #: Per stage: `stage`, `label`, `tasks`, `batches`, `merges`, `seconds`.
    stages: list[dict[str, Any]] = field(default_factory=list)
    #: The budget each batch ran under, and the threads it computed on.
    max_mem: int = 0
    threads: int = 1
    seconds: float = 0.0

    def peak_rss(self) -> dict[tuple[str, int], int]:
        """The peak RSS each worker process reported, by (host, pid)."""
        peaks: dict[tuple[str, int], int] = {}
        for b in self.batches:
            k = (str(b["host"]), int(b["pid"]))
            peaks[k] = max(peaks.get(k, 0), int(b["peak_rss"]))
        return peaks


class ClusterTooSmall(MemoryError):
    """A batch's budget is more than a runtime's workers offer one batch."""


def batch_budget(max_mem: int | str | None, shape: WorkerShape, who: str) -> int:
    """The budget of one batch: `max_mem`, or what the smallest worker offers a batch. A
    budget larger than that is refused before anything runs (`who` names the runtime)."""
    offered = shape.batch_memory()
    if max_mem is None:
        return int(offered * 0.75) if offered is not None else DEFAULT_BATCH_MEMORY
    budget = budget_bytes(max_mem, "max_mem")
    assert budget is not None
    if offered is not None and budget > offered:
        raise ClusterTooSmall(
            f"{who}: a batch's budget of {budget} bytes does not fit its workers: "
            f"the smallest has a memory limit of {shape.memory_limit} bytes for "
            f"{shape.threads} thread(s), of which batches may use "
            f"{int(shape.memory_fraction * 100)}% ({offered} bytes each); lower max_mem or "
            "give the workers more memory"
        )
    return budget


def settle_stragglers(runtime: Runtime) -> None:
    """Waits for the copies of batches a runtime left running (`settle`, where it has one):
    finishing the job removes the intermediates they may still read."""
    settle = getattr(runtime, "settle", None)
    if settle is not None and not settle(SETTLE_S):
        warnings.warn(
            f"{describe(runtime)}: copies of batches were still running {SETTLE_S:g} s after "
            "their rounds ended; the job finishes, and a copy that reads its removed work "
            "directory fails without writing",
            RuntimeWarning,
            stacklevel=3,
        )


def run_distributed(
    plan: str | Mapping[str, Any],
    params: Mapping[str, str] | None = None,
    *,
    runtime: Runtime,
    work_dir: str,
    max_mem: int | str | None = None,
    threads: int | None = None,
    device: str = "cpu",
    batches_per_worker: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> DistributedRun:
    """Runs a plan's stages as batches on `runtime`; returns what it did.

    `work_dir` is where the job's intermediates and partial states go: a directory every
    worker sees. `max_mem` is each batch's budget (by default three quarters of what the
    smallest worker offers one batch; more than it offers is refused before anything runs).
    `threads` is each batch's compute threads (default: the runtime's). Each stage is cut
    into about `batches_per_worker` batches per worker thread. `progress(done, total)` is
    called as batches finish, in tasks. A batch that fails for good raises its
    `BatchFailed`; the job is left unfinished, and a rerun keeps what it wrote.
    """
    started = time.perf_counter()
    text = plan if isinstance(plan, str) else json.dumps(plan)
    shape = runtime.shape()
    budget = batch_budget(max_mem, shape, describe(runtime))
    compute_threads = threads if threads is not None else shape.batch_threads
    key = JobKey(
        plan=text,
        params=tuple(sorted((params or {}).items())),
        max_mem=budget,
        threads=compute_threads,
        work_dir=work_dir,
        device=device,
        spread=shape.workers * shape.threads,
        run=uuid.uuid4().hex,
    )
    job = key.prepare()
    run = DistributedRun(summary={}, max_mem=budget, threads=compute_threads)
    done, total = 0, 0
    name = str(json.loads(text).get("name", "plan"))
    want = max(1, shape.workers * shape.threads * batches_per_worker)
    for stage in range(job.stage_count()):
        stage_started = time.perf_counter()
        cut = json.loads(job.cut(stage, want))
        total += int(cut["tasks"])
        batches = [tuple(b) for b in cut["batches"]]
        # With the stage's cut, the batch that finds a split chunk's states all written
        # merges it; the merge round has the chunks none did.
        given = tuple(batches) if cut["merges"] and merge_in_batches() else ()
        specs = [
            BatchSpec(key, name, stage, i, len(batches), s, e, cut["label"], None, given)
            for i, (s, e) in enumerate(batches)
        ]
        results = []
        label = f"chunkfuse-{name}-stage{stage}"
        for result in runtime.map(run_batch, specs, label=label):
            results.append(result)
            done += int(result["tasks"])
            if progress is not None:
                progress(done, total)
        merged = merged_by_batches(results)
        merges = [
            BatchSpec(
                key, name, stage, i, len(cut["merges"]), 0, 0, cut["label"], part, tuple(batches)
            )
            for i, part in enumerate(cut["merges"])
            if part not in merged
        ]
        results.extend(runtime.map(run_batch, merges, label=f"{label}-merge"))
        run.batches.extend(results)
        run.stages.append(
            {
                "stage": stage,
                "label": cut["label"],
                "tasks": cut["tasks"],
                # Tasks whose output chunks an earlier (killed or failed) run had written.
                "tasks_done_before": sum(r.get("tasks_done_before", 0) for r in results),
                "resumed": any(r.get("tasks_done_before", 0) for r in results),
                "batches": len(specs),
                "merges": len(cut["merges"]),
                "merged_by_batches": len(merged),
                "seconds": time.perf_counter() - stage_started,
            }
        )
    settle_stragglers(runtime)
    run.summary = json.loads(job.finish())
    run.seconds = time.perf_counter() - started
    return run
