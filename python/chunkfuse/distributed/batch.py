"""The unit of remote work: one batch of one stage's tasks, run by `run_batch` in whatever
process the runtime picks. A batch is a pure function of its `BatchSpec`; running it twice
writes the same chunks (retries and backup tasks are safe)."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import chunkfuse._engine as _engine

#: Whether the batches of a reduction stage merge the output chunks whose partial states
#: they complete (`Job.run_batch(..., cut=)`), saving the merge round. (It was off for a
#: while: a killed-worker run once wrote an anomaly whose mean was read as missing. The
#: cause was not this but a backup copy of a batch that outlived its job and read the
#: removed work directory as fill values; the runtime now settles such copies before the
#: job finishes, and the engine fails a batch that reads a removed intermediate.)
MERGE_IN_BATCHES = True


def merge_in_batches() -> bool:
    """`MERGE_IN_BATCHES`, read when a stage is cut."""
    return MERGE_IN_BATCHES


class BatchFailed(RuntimeError):
    """A batch failed: the message names the job, stage, batch and tasks, then the engine's
    error (with its array, chunk key and store). Where the engine raised ValueError,
    MemoryError or OSError, the batch's error is one too (`BatchValueError`, ...), so code
    that catches those catches it as it would without batches."""


class BatchValueError(BatchFailed, ValueError):
    """A batch failed on a value the engine refuses (an all-NaN slice of `nanargmax`, ...)."""


class BatchMemoryError(BatchFailed, MemoryError):
    """A batch failed because a task cannot fit its memory budget."""


class BatchOSError(BatchFailed, OSError):
    """A batch failed on storage (a missing store, a write refused, ...)."""


def batch_failure(message: str, cause: BaseException) -> BatchFailed:
    """The `BatchFailed` for a batch that failed with `cause`, of the kind `cause` is."""
    kinds: tuple[tuple[type[BaseException], type[BatchFailed]], ...] = (
        (ValueError, BatchValueError),
        (MemoryError, BatchMemoryError),
        (OSError, BatchOSError),
    )
    for base, kind in kinds:
        if isinstance(cause, base):
            return kind(message)
    return BatchFailed(message)


@dataclass(frozen=True)
class JobKey:
    """What identifies a job to the processes that run its batches: the plan and the options
    that shape its physical plan (the budget and threads), where its work directory is, and
    which run of it this is (`run`: a worker attaches afresh to each run, whose preparation
    may have found more already written)."""

    plan: str
    params: tuple[tuple[str, str], ...]
    max_mem: int
    threads: int
    work_dir: str
    device: str = "cpu"
    #: Batches that run at once: a reduction's output chunk is spread over that many groups.
    spread: int = 0
    #: The run (a token the coordinator draws per run; not passed to the engine).
    run: str = ""

    def _args(self) -> tuple[Any, ...]:
        return (
            self.plan,
            dict(self.params),
            self.max_mem,
            self.threads,
            self.work_dir,
            self.device,
            self.spread,
        )

    def attach(self) -> Any:
        """The job, opened in this process to run batches (see `_engine.Job.attach`)."""
        return _engine.Job.attach(*self._args())

    def prepare(self) -> Any:
        """The job, prepared: targets and work directory created (`_engine.Job.prepare`)."""
        return _engine.Job.prepare(*self._args())


@dataclass(frozen=True)
class BatchSpec:
    """One batch: tasks `start..end` of stage `stage` of the job `job` (`merge` set: the
    merge of reduction output chunk `merge` from the partial states the stage's `cut` left).
    A batch given its stage's `cut` merges, after its tasks, the output chunks it split whose
    partial states are all written; its summary's `merged` lists them."""

    job: JobKey
    name: str
    stage: int
    index: int
    count: int
    start: int
    end: int
    label: str = ""
    merge: int | None = None
    cut: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        what = (
            f"merge of output chunk {self.merge}"
            if self.merge is not None
            else f"batch {self.index} of {self.count} (tasks {self.start}..{self.end})"
        )
        return f"job {self.name}: stage {self.stage} ({self.label}), {what}"


# Jobs this process attached and is not using, per job, most recently used last: a worker
# attaches once per job (and once more per batch it runs at the same time), not once per
# batch. Only the process that attached a job uses it: a forked child attaches its own.
_IDLE: OrderedDict[JobKey, list[Any]] = OrderedDict()
_IDLE_PID = os.getpid()
_LOCK = threading.Lock()
_KEEP_JOBS = 4


@contextmanager
def _attached(key: JobKey) -> Iterator[Any]:
    global _IDLE_PID
    job = None
    with _LOCK:
        if _IDLE_PID != os.getpid():
            _IDLE.clear()
            _IDLE_PID = os.getpid()
        idle = _IDLE.get(key)
        if idle:
            job = idle.pop()
    if job is None:
        job = key.attach()
    yield job
    with _LOCK:
        _IDLE.setdefault(key, []).append(job)
        _IDLE.move_to_end(key)
        while len(_IDLE) > _KEEP_JOBS:
            _IDLE.popitem(last=False)


def forget_jobs() -> None:
    """Drops the jobs this process attached (their work is done)."""
    with _LOCK:
        _IDLE.clear()


def peak_rss_bytes() -> int:
    """This process's peak resident set so far, in bytes: `VmHWM`, the high-water mark of its
    own memory. (`ru_maxrss` is not: it keeps the size of the process it was forked from, even
    across `exec`, so a spawned Dask worker of a large client reports the client's size.) Where
    /proc is missing, `ru_maxrss` (KiB on Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def merged_by_batches(summaries: Iterable[Any]) -> set[int]:
    """The output chunks (parts) the batches whose `summaries` these are merged themselves:
    the merge round skips them."""
    return {int(p) for s in summaries if isinstance(s, Mapping) for p in s.get("merged", ())}


def run_batch(spec: BatchSpec) -> dict[str, Any]:
    """Runs one batch in this process; returns its summary: the stage record's counts,
    `merged` (see `BatchSpec`), `seconds`, `peak_rss` (this process's peak so far, bytes),
    `pid` and `host`. A failure
    raises `BatchFailed` naming the job, stage, batch and tasks, with the engine's error."""
    started = time.perf_counter()
    try:
        with _attached(spec.job) as job:
            if spec.merge is None:
                record = job.run_batch(spec.stage, spec.start, spec.end, list(spec.cut) or None)
            else:
                record = job.run_merge(spec.stage, spec.merge, list(spec.cut))
    except KeyboardInterrupt:
        raise
    except Exception as e:
        raise batch_failure(f"{spec.describe()}: {type(e).__name__}: {e}", e) from e
    out: dict[str, Any] = json.loads(record)
    return {
        "stage": spec.stage,
        "batch": spec.index,
        "merge": spec.merge,
        "tasks": out.get("tasks", 0),
        "tasks_done_before": out.get("tasks_done_before", 0),
        "bytes_read": out.get("bytes_read", 0),
        "decoded_bytes": out.get("decoded_bytes", 0),
        "bytes_written": out.get("bytes_written", 0),
        "largest_task_bytes": out.get("largest_task_bytes", 0),
        "merged": list(out.get("merged", [])),
        "seconds": time.perf_counter() - started,
        "peak_rss": peak_rss_bytes(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
