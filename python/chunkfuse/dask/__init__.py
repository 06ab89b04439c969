"""Run Dask graphs with chunkfuse: ``x.compute(scheduler=chunkfuse.dask.get)``.

``get`` follows Dask's get-function contract (``dask.get(dsk, keys)``): it takes the expression
or graph that ``compute`` passes, culls it to ``keys``, runs it in a memory-friendly order
(``dask.order``, most recently readied first) and frees every intermediate as soon as its last
dependent has run. Dask's local callbacks fire, so ``dask.diagnostics.ProgressBar`` works.
"""

from __future__ import annotations

from .scheduler import GetStats, get, last_stats

__all__ = ["GetStats", "get", "last_stats"]
