"""dask.distributed as a runtime: batches are `client.map` tasks on the cluster's workers,
with Dask's retries and backup copies of stragglers."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from chunkfuse.distributed.runtime import WorkerShape

Item = TypeVar("Item")
Out = TypeVar("Out")


#: How long `shape()` waits for a first worker to join a cluster that has none.
WAIT_FOR_WORKERS_S = 10.0


class LostCluster(RuntimeError):
    """The client lost its scheduler (or was closed) while batches ran."""


def no_workers(address: str) -> RuntimeError:
    """The error for a cluster at `address` that has no workers after the wait."""
    return RuntimeError(
        f"dask: the cluster at {address} has no workers (waited {WAIT_FOR_WORKERS_S:g} s); "
        "start or scale workers (cluster.scale(n)) before computing, or compute with a local "
        "scheduler"
    )


def shape_of(workers: Sequence[tuple[int, int | None]], batch_threads: int = 1) -> WorkerShape:
    """The shape batches are sized for, from each worker's (threads, memory limit or None):
    the fewest threads, and the memory of the worker that offers the least per thread."""
    if not workers:
        raise ValueError("no workers to size batches for")
    threads = min(max(int(n), 1) for n, _ in workers)
    _, limit = min(workers, key=lambda w: (w[1] or 1 << 62) / max(int(w[0]), 1))
    return WorkerShape(
        workers=len(workers),
        threads=threads,
        memory_limit=int(limit) if limit else None,
        batch_threads=batch_threads,
    )


class DaskRuntime:
    """Runs batches on a `distributed.Client`'s workers.

    `retries`: Dask reruns a batch whose worker died or that raised, this many times.
    `backups`: once half of a round's batches are done, a batch running longer than three
    times the median of those done gets a copy on another worker; the first to finish wins
    (batches are idempotent). The copy that lost keeps running (Dask cannot stop a running
    task); `settle` waits for such copies. `batch_threads`: the engine's compute threads per
    batch (default 1: each Dask thread runs one single-threaded batch, so the engine uses as
    many threads as the worker has).
    """

    name = "dask"

    def __init__(
        self,
        client: Any,
        *,
        retries: int = 2,
        backups: bool = True,
        batch_threads: int = 1,
    ) -> None:
        self.client = client
        self.retries = retries
        self.backups = backups
        self.batch_threads = batch_threads
        # Copies of batches still running when their round ended (the losers of backups).
        self._stragglers: list[Any] = []

    def shape(self) -> WorkerShape:
        try:
            workers = self._workers()
        except Exception as e:
            raise LostCluster(f"dask: cannot reach the scheduler: {e}") from e
        if not workers:
            workers = self._wait_for_workers()
        return shape_of(
            [(int(w.get("nthreads", 1)), w.get("memory_limit")) for w in workers.values()],
            self.batch_threads,
        )

    def _workers(self) -> dict[str, Any]:
        try:
            return dict(self.client.scheduler_info(n_workers=-1)["workers"])
        except TypeError:  # older distributed: no n_workers argument
            return dict(self.client.scheduler_info()["workers"])

    def _wait_for_workers(self) -> dict[str, Any]:
        """The cluster's workers once one has joined (a cluster that is starting), or a
        clear error after `WAIT_FOR_WORKERS_S` seconds."""
        try:
            self.client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
            return self._workers()
        except TimeoutError:
            pass
        except Exception as e:
            raise LostCluster(f"dask: cannot reach the scheduler: {e}") from e
        raise no_workers(self.client.scheduler.address)

    def map(self, fn: Callable[[Item], Out], items: Sequence[Item], *, label: str) -> Iterator[Out]:
        from distributed import as_completed

        if not items:
            return
        run = uuid.uuid4().hex[:8]
        keys = [f"{label}-{i}-{run}" for i in range(len(items))]
        try:
            futures = self.client.map(fn, list(items), key=keys, pure=False, retries=self.retries)
        except Exception as e:
            raise LostCluster(f"dask: cannot submit {label}: {e}") from e
        submitted = list(futures)
        index = {f.key: i for i, f in enumerate(futures)}
        started = {i: time.monotonic() for i in range(len(items))}
        durations: list[float] = []
        finished: set[int] = set()
        backed_up: set[int] = set()
        pending = as_completed(futures, with_results=False)
        try:
            while len(finished) < len(items):
                future = self._next(pending)
                if future is None:
                    copies = self._back_up(
                        fn, items, keys, started, durations, finished, backed_up, pending, index
                    )
                    submitted.extend(copies)
                    continue
                i = index[future.key]
                if i in finished:
                    continue
                result = self._result(future, label)
                finished.add(i)
                durations.append(time.monotonic() - started[i])
                yield result
        finally:
            left = [f for f in submitted if f.status == "pending"]
            if len(finished) == len(items):
                # Every batch has a result: the copies left are duplicates that may be
                # running; the job must not finish under them (see `settle`).
                self._stragglers.extend(left)
            else:
                for f in left:
                    f.cancel()

    def settle(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the copies of batches still running after their
        round ended (see the class doc); True when none is left."""
        from distributed import wait

        left, self._stragglers = self._stragglers, []
        if not left:
            return True
        try:
            wait(left, timeout=timeout)
        except TimeoutError:
            self._stragglers = [f for f in left if f.status == "pending"]
            return False
        except Exception:  # a lost client: nothing of ours runs on it any more
            return True
        return True

    def _next(self, pending: Any) -> Any:
        """The next finished future, or None after a second without one."""
        try:
            return next(pending) if not self.backups else self._wait(pending)
        except StopIteration:
            raise LostCluster("dask: every batch future ended without a result") from None

    @staticmethod
    def _wait(pending: Any) -> Any:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if pending.has_ready():
                return next(pending)
            if pending.is_empty():
                raise StopIteration
            time.sleep(0.002)
        return None

    def _result(self, future: Any, label: str) -> Any:
        if future.status == "error":
            raise future.exception()
        if future.status == "cancelled":
            raise LostCluster(
                f"dask: a batch of {label} was cancelled: the client lost its scheduler or was "
                "closed"
            )
        try:
            return future.result()
        except Exception as e:
            if self.client.status not in ("running", "connecting"):
                raise LostCluster(
                    f"dask: the client is {self.client.status} while {label} ran"
                ) from e
            raise

    def _back_up(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        keys: list[str],
        started: dict[int, float],
        durations: list[float],
        finished: set[int],
        backed_up: set[int],
        pending: Any,
        index: dict[str, int],
    ) -> list[Any]:
        """Submits a copy of each straggler (see the class doc); returns the copies."""
        copies: list[Any] = []
        if not self.backups or len(items) < 4 or len(finished) * 2 < len(items) or not durations:
            return copies
        limit = 3 * statistics.median(durations)
        now = time.monotonic()
        for i in range(len(items)):
            if i in finished or i in backed_up or now - started[i] <= limit:
                continue
            copy = self.client.submit(
                fn, items[i], key=f"{keys[i]}-backup", pure=False, retries=self.retries
            )
            index[copy.key] = i
            pending.add(copy)
            backed_up.add(i)
            copies.append(copy)
        return copies
