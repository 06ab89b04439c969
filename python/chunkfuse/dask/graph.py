"""Dask's inputs as a dict of task-spec nodes."""

from __future__ import annotations

import graphlib
from collections.abc import Hashable, Mapping
from typing import Any

from dask._task_spec import Alias, DataNode, Task, convert_legacy_graph
from dask.core import flatten


def as_task_graph(dsk: Any) -> dict[Hashable, Any]:
    """The graph of an expression, HighLevelGraph or legacy dict, as task-spec nodes
    (``Task``, ``DataNode``, ``Alias``), the form ``compute`` would run, with Dask's
    identity wrappers taken off (see `unwrapped`)."""
    if not isinstance(dsk, Mapping):
        dsk = dsk.__dask_graph__()
    graph = convert_legacy_graph(dsk)
    identity = _identity()
    if identity is None:
        return graph
    for key, node in graph.items():
        if type(node) is Task and node.func is identity:
            graph[key] = unwrapped(node)
    return graph


def _identity() -> Any:
    """The function of Dask's `ProhibitReuse` wrappers (None in a Dask without them)."""
    from dask import _expr

    return getattr(getattr(_expr, "ProhibitReuse", None), "_identity", None)


def unwrapped(node: Task) -> Any:
    """The node `_identity(node')` stands for: `node'` under the outer key.

    A collection handed to ``dask.delayed`` (xarray's ``to_zarr(compute=False)`` of one
    variable: its delayed closing of the store takes the stores' array) goes through Dask's
    ``ProhibitReuse``, which renames every key of its graph and wraps each node, the stored
    arrays' data nodes included, in a task calling an identity function on it."""
    if len(node.args) != 1 or node.kwargs:
        return node
    (inner,) = node.args
    if isinstance(inner, DataNode):
        return DataNode(node.key, inner.value)
    if isinstance(inner, Alias):
        return Alias(node.key, inner.target)
    if isinstance(inner, Task):
        return inner.substitute({}, key=node.key)
    return node


def check_keys(
    graph: Mapping[Hashable, Any], keys: Any, cache: Mapping[Hashable, Any] | None
) -> None:
    """Raises ``KeyError`` naming the first of ``keys`` (nested lists allowed) that is neither
    in the graph nor in ``cache``."""
    for key in flatten(keys) if isinstance(keys, list) else [keys]:
        if key not in graph and not (cache and key in cache):
            raise KeyError(key)


def topological(graph: Mapping[Hashable, Any]) -> list[Hashable]:
    """The keys of a task-spec graph, each after its dependencies (those in the graph).
    Raises graphlib.CycleError naming the keys of a cycle."""
    sorter = graphlib.TopologicalSorter(
        {key: [d for d in node.dependencies if d in graph] for key, node in graph.items()}
    )
    return list(sorter.static_order())
