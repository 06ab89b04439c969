"""Lithops as a runtime (Cubed's serverless path): batches are calls of a Lithops
`FunctionExecutor` map, rerun by Lithops' retrying executor when a call fails, their
results yielded as they complete."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from chunkfuse.distributed.batch import BatchFailed
from chunkfuse.distributed.runtime import WorkerShape

Item = TypeVar("Item")
Out = TypeVar("Out")

#: Lithops gives a function's memory (`runtime_memory`) in MiB.
_MIB = 1 << 20


class LithopsRuntime:
    """Runs batches as the calls of a `lithops.FunctionExecutor`'s maps.

    `executor`: a `FunctionExecutor` (or a `RetryingFunctionExecutor` around one) the caller
    owns; without one, the runtime creates one from `config` (a Lithops config dict, e.g.
    `{"lithops": {"backend": "localhost", "storage": "localhost"}}`; None: Lithops' own
    config file) and closes it in `close()`. On the localhost backend the calls run in this
    interpreter (`sys.executable`) unless the config names another. `retries`: Lithops reruns
    a call that raised or whose worker died this many times. `workers` and `memory_limit`
    (bytes per worker) replace what the executor's config says. `batch_threads`: the engine's
    compute threads per batch.

    Lithops ships no modules with the calls (`include_modules=None`): chunkfuse must be
    installed where they run (the localhost workers run this machine's interpreter; a cloud
    backend needs a runtime image with chunkfuse in it), as its engine is a native module.
    A batch that failed for good ends the map; the calls still running finish, or end when
    the executor is closed.
    """

    name = "lithops"

    def __init__(
        self,
        executor: Any = None,
        *,
        config: Mapping[str, Any] | None = None,
        retries: int = 2,
        workers: int | None = None,
        memory_limit: int | None = None,
        batch_threads: int = 1,
    ) -> None:
        from lithops import FunctionExecutor  # type: ignore[import-untyped]
        from lithops.retries import RetryingFunctionExecutor  # type: ignore[import-untyped]

        if retries < 0:
            raise ValueError(f"LithopsRuntime: retries must be at least 0, got {retries}")
        if workers is not None and workers < 1:
            raise ValueError(f"LithopsRuntime: workers must be at least 1, got {workers}")
        if memory_limit is not None and memory_limit < 1:
            raise ValueError(f"LithopsRuntime: memory_limit must be positive, got {memory_limit}")
        if batch_threads < 1:
            raise ValueError(
                f"LithopsRuntime: batch_threads must be at least 1, got {batch_threads}"
            )
        if executor is not None and config is not None:
            raise ValueError("LithopsRuntime: give an executor or a config, not both")
        self._owned = executor is None
        if executor is None:
            executor = FunctionExecutor(
                config=_with_interpreter(config), log_level=_log_level(config)
            )
        if isinstance(executor, RetryingFunctionExecutor):
            self._retrying = executor
            self.executor = executor.executor
        else:
            self.executor = executor
            self._retrying = RetryingFunctionExecutor(executor)
        self.retries = retries
        self.workers = workers
        self.memory_limit = memory_limit
        self.batch_threads = batch_threads

    def shape(self) -> WorkerShape:
        """Workers: the localhost backend's worker processes, or a cloud backend's function
        concurrency (`max_workers`) with `worker_processes` calls in each function; memory:
        the backend's `runtime_memory` (MiB in the config), when it has one."""
        config = self.executor.config
        backend = str(config["lithops"]["backend"])
        section = config.get(backend) or {}
        processes = max(int(section.get("worker_processes") or 1), 1)
        if config["lithops"].get("mode") == "localhost":
            workers, threads = processes, 1
        else:
            workers, threads = max(int(section.get("max_workers") or 1), 1), processes
        memory = section.get("runtime_memory")
        limit = int(float(memory) * _MIB) if memory else None
        return WorkerShape(
            workers=self.workers if self.workers is not None else workers,
            threads=threads,
            memory_limit=self.memory_limit if self.memory_limit is not None else limit,
            batch_threads=self.batch_threads,
        )

    def map(self, fn: Callable[[Item], Out], items: Sequence[Item], *, label: str) -> Iterator[Out]:
        """Maps `fn` over `items` as one Lithops job; yields results as calls finish. A call
        that failed after its retries raises its `BatchFailed`, or any other error (its
        worker killed or timed out) as a `BatchFailed` naming the item; the other calls are
        not retried after that, and those still running finish or end with the executor."""
        from lithops.wait import ANY_COMPLETED  # type: ignore[import-untyped]

        if not items:
            return
        # Each item travels as a 1-tuple, so Lithops binds it whole to fn's one parameter
        # (a bare tuple or dict would be spread over parameters).
        futures = self._retrying.map(
            fn,
            [(item,) for item in items],
            retries=self.retries,
            include_modules=None,
        )
        which = {id(f): items[i] for i, f in enumerate(futures)}
        pending = list(futures)
        try:
            while pending:
                done, pending = self._retrying.wait(
                    pending,
                    throw_except=False,
                    return_when=ANY_COMPLETED,
                    show_progressbar=False,
                )
                for future in done:
                    if future.error:
                        raise _failure(future, which[id(future)], label)
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Stops the executor this runtime created (its workers and monitor); an executor
        the caller gave is left to the caller."""
        if self._owned:
            self.executor.__exit__(None, None, None)

    def __enter__(self) -> LithopsRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_interpreter(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The config, with the localhost backend running this interpreter unless it names
    another (Lithops' default is `python` on the PATH, which may lack chunkfuse)."""
    if config is None:
        return None
    out = copy.deepcopy(dict(config))
    if (out.get("lithops") or {}).get("backend") == "localhost":
        local = out.get("localhost") or {}
        local.setdefault("runtime", sys.executable)
        out["localhost"] = local
    return out


def _log_level(config: Mapping[str, Any] | None) -> bool | None:
    """Lithops logs as its config file says when no config is given, at the config's level
    when it names one, else not at all (its default is INFO on stdout)."""
    if config is None or "log_level" in (config.get("lithops") or {}):
        return False
    return None


def _failure(future: Any, item: Any, label: str) -> BaseException:
    """The `BatchFailed` a call raised in its worker, rebuilt by Lithops; any other error
    (another the function raised, or its worker's: killed, timed out) becomes a
    `BatchFailed` naming the item, caused by it."""
    hook = sys.excepthook
    try:
        future.status(throw_except=True)
    except Exception as e:
        error: BaseException = e
    else:
        error = RuntimeError("the call was reported failed without an error")
    finally:
        # Lithops installs a hook that prints the worker's traceback; the caller decides.
        sys.excepthook = hook
    if isinstance(error, BatchFailed):
        return error
    describe = getattr(item, "describe", None)
    what = describe() if callable(describe) else f"{label}: {item!r}"
    failed = BatchFailed(f"{what}: lithops: {type(error).__name__}: {error}")
    failed.__cause__ = error
    return failed
