"""Dask's inputs as a dict of task-spec nodes."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from dask._task_spec import convert_legacy_graph
from dask.core import flatten


def as_task_graph(dsk: Any) -> dict[Hashable, Any]:
    """The graph of an expression, HighLevelGraph or legacy dict, as task-spec nodes
    (``Task``, ``DataNode``, ``Alias``), the form ``compute`` would run."""
    if not isinstance(dsk, Mapping):
        dsk = dsk.__dask_graph__()
    return convert_legacy_graph(dsk)


def check_keys(
    graph: Mapping[Hashable, Any], keys: Any, cache: Mapping[Hashable, Any] | None
) -> None:
    """Raises ``KeyError`` naming the first of ``keys`` (nested lists allowed) that is neither
    in the graph nor in ``cache``."""
    for key in flatten(keys) if isinstance(keys, list) else [keys]:
        if key not in graph and not (cache and key in cache):
            raise KeyError(key)
