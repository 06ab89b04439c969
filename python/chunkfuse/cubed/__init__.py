"""chunkfuse as a Cubed executor: `arr.compute(executor=RustExecutor())`.

The executor is imported on first use, so the IR builder and symbols in this package (which
the Dask scheduler shares) load without Cubed installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExecutionStats", "RustExecutor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from chunkfuse.cubed import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'chunkfuse.cubed' has no attribute {name!r}")
