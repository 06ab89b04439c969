"""`chunkfuse.dask.explain(x)`: how ``x.compute(scheduler=chunkfuse.dask.get)`` would run,
without running it: the engine run (its stages and strategies) and the tasks that run in Python,
with the reason, grouped by the name of their keys."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Hashable
from typing import Any

import dask
from dask._task_spec import DataNode
from dask.core import flatten
from dask.utils import key_split

from chunkfuse.common.explanation import EngineStep, Explanation, PythonStep
from chunkfuse.engine_calls import explain_plan
from chunkfuse.sizes import budget_bytes

from .direct import direct_reads
from .graph import as_task_graph
from .runner import engine_plan, select_native


class _Captured(Exception):
    """Stops `dask.compute` once it has handed its graph to the scheduler."""

    def __init__(self, graph: Any, keys: Any) -> None:
        super().__init__("captured")
        self.graph, self.keys = graph, keys


def _capture(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    raise _Captured(dsk, keys)


def explain(
    *collections: Any,
    max_mem: int | str | None = None,
    num_workers: int | None = None,
    device: str = "cpu",
) -> Explanation:
    """The steps ``dask.compute(*collections, scheduler=chunkfuse.dask.get, max_mem=...,
    num_workers=...)`` would run: the engine run, with its stages (what fused into each, the
    strategy, tasks and parts, the bytes the largest task reserves against the budget), then
    the tasks run in Python, grouped by key name, each group with why it is not native.
    `print()` it, or read its `steps`. Sources are opened; nothing is computed or written."""
    try:
        dask.compute(*collections, scheduler=_capture)
    except _Captured as c:
        graph, keys = as_task_graph(c.graph), c.keys
    else:
        return Explanation()
    wanted = set(flatten(keys)) if isinstance(keys, list) else {keys}
    selection = select_native(graph, wanted)
    covered = set() if selection is None else selection.covered
    out = Explanation()
    if selection is not None:
        out.steps.append(_engine_step(selection, covered, max_mem, num_workers, device))
    reasons = {} if selection is None else selection.interp.reasons
    mixed = {} if selection is None else selection.interp.mixed
    groups: Counter[str] = Counter()
    why: dict[str, str] = {}
    for key, node in graph.items():
        if key in covered or isinstance(node, DataNode):
            continue
        name = _name(key)
        groups[name] += 1
        reason = reasons.get(key, "the graph holds no array the engine reads")
        if key in mixed:
            reason += " (the engine computes the task's first steps)"
        why.setdefault(name, reason)
    out.steps.extend(PythonStep(name, why[name], n) for name, n in groups.items())
    return out


def _engine_step(
    selection: Any,
    covered: set[Hashable],
    max_mem: int | str | None,
    num_workers: int | None,
    device: str,
) -> EngineStep:
    interp, todo = selection.interp, selection.todo
    names = sorted({_name(k) for k in covered})
    names += sorted({f"first steps of {_name(k)}" for k in interp.mixed})
    if not interp.mixed and direct_reads(todo, interp.b) is not None:
        return EngineStep(names, {}, None, "blocks of stored arrays, read directly: no plan")
    with tempfile.TemporaryDirectory(prefix="chunkfuse-explain-") as tmp:
        planned = engine_plan(interp, todo, tmp)
        budget = budget_bytes(max_mem, "max_mem")
        explained = explain_plan(
            planned.plan, max_mem=budget, threads=num_workers or 0, device=device
        )
    return EngineStep(names, planned.plan, explained)


def _name(key: Hashable) -> str:
    """The name of a key without its token: ``mean_chunk`` for ``("mean_chunk-ab12...", 0)``."""
    return str(key_split(key))
