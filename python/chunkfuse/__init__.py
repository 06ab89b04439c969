"""chunkfuse: a Rust executor for chunked-array plans over Zarr.

The engine lives in the native module ``chunkfuse._engine``; this package translates and
calls it. ``run_plan`` executes a JSON plan (see docs/plan-ir.md) with the GIL released, and
``explain_plan`` shows how it would run;
``rechunk`` copies a Zarr array into new chunks with bounded memory; ``chunkfuse.fft`` has
numpy's FFTs for Cubed arrays; ``RustExecutor`` runs Cubed computations on the engine.
"""

from __future__ import annotations

from typing import Any

from chunkfuse import _engine
from chunkfuse.engine_calls import device_info, engine_version, explain_plan, run_plan
from chunkfuse.iomode import io_mode, set_io, set_io_timeouts
from chunkfuse.reading import ArrayReader, ChunkCache, DeviceArray, read, read_windows

__all__ = [
    "ArrayReader",
    "ChunkCache",
    "DeviceArray",
    "RustExecutor",
    "__version__",
    "device_info",
    "engine_version",
    "explain_plan",
    "io_mode",
    "read",
    "read_windows",
    "rechunk",
    "run_plan",
    "set_io",
    "set_io_timeouts",
]

__version__: str = _engine.version()


#: Names made on first use (they import Cubed and zarr-python only when asked for).
_LAZY = ("RustExecutor", "rechunk")


def __dir__() -> list[str]:
    # help(chunkfuse) and tab completion list the lazy names too.
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    # RustExecutor needs cubed and rechunk needs zarr-python; import them only when asked for.
    if name == "RustExecutor":
        from chunkfuse.cubed import RustExecutor

        return RustExecutor
    if name == "rechunk":
        from chunkfuse.rechunking import rechunk

        return rechunk
    raise AttributeError(f"module 'chunkfuse' has no attribute {name!r}")
