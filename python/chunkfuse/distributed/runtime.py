"""The small interface a runtime implements: the shape of its workers, and a map of a
function over items on them, results yielded as they complete."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

Item = TypeVar("Item")
Out = TypeVar("Out")


@dataclass(frozen=True)
class WorkerShape:
    """What the smallest worker of a runtime offers one batch."""

    #: Workers (processes or functions) that run batches at once.
    workers: int
    #: Batches one worker runs at once (its threads).
    threads: int
    #: Bytes one worker may use (None: the runtime does not say).
    memory_limit: int | None
    #: The share of `memory_limit` the engine's budgets may take: Dask pauses a worker whose
    #: memory reaches 80% of its limit, and the engine's memory is unmanaged memory to it.
    memory_fraction: float = 0.8
    #: Compute threads each batch runs on (the engine's threads inside a batch).
    batch_threads: int = 1

    def batch_memory(self) -> int | None:
        """The most one batch's budget may be, or None when the runtime does not say."""
        if self.memory_limit is None:
            return None
        return int(self.memory_limit * self.memory_fraction) // max(self.threads, 1)


class Runtime(Protocol):
    """Runs batches. `map` yields each item's result as it completes and raises the error of
    an item that failed for good (after the runtime's retries)."""

    name: str

    def shape(self) -> WorkerShape:
        """The shape of the workers batches run on."""
        ...

    def map(self, fn: Callable[[Item], Out], items: Sequence[Item], *, label: str) -> Iterator[Out]:
        """Runs `fn` on every item on the workers; yields the results as they complete."""
        ...


class LocalRuntime:
    """Threads of this process, for tests and for trying a distributed plan on one machine."""

    name = "local"

    def __init__(self, workers: int = 2, threads: int = 1, memory_limit: int | None = None) -> None:
        if workers < 1 or threads < 1:
            raise ValueError(
                f"LocalRuntime: workers and threads must be at least 1, got {workers}, {threads}"
            )
        self._shape = WorkerShape(workers, threads, memory_limit)

    def shape(self) -> WorkerShape:
        return self._shape

    def map(self, fn: Callable[[Item], Out], items: Sequence[Item], *, label: str) -> Iterator[Out]:
        with ThreadPoolExecutor(self._shape.workers * self._shape.threads) as pool:
            futures = [pool.submit(fn, item) for item in items]
            try:
                for f in as_completed(futures):
                    yield f.result()
            finally:
                for f in futures:
                    f.cancel()


def default_threads() -> int:
    """Compute threads of this process: its CPU affinity."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe(runtime: Any) -> str:
    """A runtime's name, for messages."""
    return str(getattr(runtime, "name", type(runtime).__name__))
