"""Run Dask graphs with chunkfuse: ``x.compute(scheduler=chunkfuse.dask.get)``.

``get`` follows Dask's get-function contract (``dask.get(dsk, keys)``): it takes the expression
or graph that ``compute`` passes and culls it to ``keys``. Array tasks it recognises run in the
engine (``runner.py``, over the symbols ``interpreter.py`` gives them); the others run their
Python callables in a memory-friendly order, freeing every intermediate as soon as its last
dependent has run: by a lean runner (``lean.py``) when nothing watches, or with Dask's
scheduler state over the whole graph, the engine's tasks included, so that Dask's local
callbacks (``dask.diagnostics.ProgressBar``, ``Profiler``, ...) fire (``watched.py``).
``explain(x)`` shows what the engine would run and which tasks run in Python, and why.

``with chunkfuse.dask.enabled(): x.compute()`` keeps Dask's own scheduler (a
``distributed.Client``'s cluster, or the local ones) and runs the graph's native part there
as engine batches (``setting.py``, ``batched.py``).
"""

from __future__ import annotations

from .explain import explain
from .scheduler import GetStats, get, last_stats
from .setting import disable, enable, enabled

__all__ = ["GetStats", "disable", "enable", "enabled", "explain", "get", "last_stats"]
