"""The one setting that turns chunkfuse on for Dask's own `compute()`, on any scheduler
(a `distributed.Client`'s cluster or Dask's local schedulers): Dask's optimisation hooks for
arrays and delayed objects (`array_optimize`, `delayed_optimize`) rewrite each graph's native
part into engine batches (see `batched`). The options are `enabled()`'s arguments; they travel
with each graph's optimiser, to the scheduler when dask.distributed materialises it there."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

import dask
import dask.array.optimization
from dask.callbacks import Callback
from dask.delayed import optimize as optimize_delayed

from chunkfuse import _engine
from chunkfuse.sizes import budget_bytes

from .batched import BatchedOptions, rewrite
from .scratch import abandon


@dataclass(frozen=True)
class EngineOptimizer:
    """Dask's own optimisation for one kind of collection (`array` or `delayed`: `to_zarr`
    and `da.store` return delayed objects), then the graph's native part as engine batches.

    Dask captures the optimiser when a collection is computed, on the client, and may run
    it elsewhere: dask.distributed materialises graphs on the scheduler. The options travel
    inside this object (it pickles by value), so a scheduler in another process, which has
    none of the client's Dask config, rewrites with the user's settings."""

    kind: Literal["array", "delayed"]
    options: BatchedOptions

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        if self.kind == "array":
            optimized = dask.array.optimization.optimize(dsk, keys, **kwargs)
        else:
            # `dask.delayed` is the function: the package shadows its own module.
            optimized = optimize_delayed(dsk, keys, **kwargs)
        return rewrite(optimized, keys, self.options)


def _settings(
    max_mem: int | str | None, work_dir: str | None, batches_per_worker: int, device: str
) -> dict[str, Any]:
    if batches_per_worker < 1:
        raise ValueError(f"batches_per_worker must be at least 1, got {batches_per_worker}")
    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"unknown device {device!r}: expected cpu, cuda or auto")
    budget_bytes(max_mem, "max_mem")  # a bad budget is named now, not at the first compute
    options = BatchedOptions(max_mem, work_dir, batches_per_worker, device)
    return {
        "array_optimize": EngineOptimizer("array", options),
        "delayed_optimize": EngineOptimizer("delayed", options),
        # Rechunks as Dask's tasks, which the engine recognises (a P2P shuffle it does not).
        "array.rechunk.method": "tasks",
    }


class _AfterAFailedCompute(Callback):
    """When a compute Dask's local schedulers run in this process fails, its graphs' scratch
    goes (see `scratch`); when Ctrl-C ended it, the engine batches their pool threads still
    run stop too: those calls see no signal of their own, and would otherwise finish their
    whole batch after the KeyboardInterrupt reached the user."""

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        if not errored:
            return
        # Dask calls this from the `finally` of its scheduling loop: the exception that ends
        # the loop is the one being handled.
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            _engine.interrupt_calls()
        abandon(dsk)


#: Registered while `enable()` is in force.
_after_a_failure = _AfterAFailedCompute()
#: The settings each `enable()` made, last last: `disable()` undoes them in turn.
_enabled: list[Any] = []


@contextmanager
def enabled(
    *,
    max_mem: int | str | None = None,
    work_dir: str | None = None,
    batches_per_worker: int = 4,
    device: str = "cpu",
) -> Iterator[None]:
    """Within the block, Dask's `compute()`, `dask.compute(...)`, `persist()` and `to_zarr`
    run the parts of their graphs chunkfuse recognises as engine batches on whatever
    scheduler runs the graph (spread over a cluster's workers), the rest as Dask's tasks.

    `max_mem`: each batch's budget (default: three quarters of what the smallest worker
    offers one batch, a Dask worker's 80% pause threshold counted; more is refused before
    anything runs). `work_dir`: where scratch arrays, intermediates and partial states go,
    storage every worker sees (default: Dask's `temporary-directory` setting, else the system
    temporary directory). Each stage is cut
    into about `batches_per_worker` batches per worker thread. Rechunks made within the block
    use Dask's task method (which the engine runs) rather than a P2P shuffle. Ctrl-C within
    the block stops the batches Dask's local pools still run in this process too."""
    with (
        dask.config.set(_settings(max_mem, work_dir, batches_per_worker, device)),
        _AfterAFailedCompute(),
    ):
        try:
            yield
        except KeyboardInterrupt:
            # Dask's pool threads run on after the main thread's interrupt; their engine
            # calls see no signal of their own.
            _engine.interrupt_calls()
            raise


def enable(
    *,
    max_mem: int | str | None = None,
    work_dir: str | None = None,
    batches_per_worker: int = 4,
    device: str = "cpu",
) -> None:
    """`enabled(...)` for the rest of the process (until `disable()`), Ctrl-C included: when
    it ends a compute, the engine batches Dask's local pools still run in this process stop."""
    _enabled.append(dask.config.set(_settings(max_mem, work_dir, batches_per_worker, device)))
    _after_a_failure.register()  # a set's member: once however often enable() is called


def disable() -> None:
    """Undoes `enable()`: Dask's settings are as they were before it (Dask optimises and runs
    graphs its own way again)."""
    # Each setting put back as `enable()` found it: a key Dask did not hold is taken out, not
    # set to None (an `array_optimize` of None turns Dask's own array optimisation off).
    while _enabled:
        _enabled.pop().__exit__(None, None, None)
    with suppress(KeyError):  # not enabled
        _after_a_failure.unregister()
