"""`chunkfuse.dask.explain`: the engine run a Dask computation would make, with the stages the
run then uses, and the tasks that run in Python, grouped by name, with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chunkfuse.dask
import dask.array as da
import numpy as np
import zarr
from chunkfuse.common.explanation import PythonStep

CHOICES = ("kind", "label", "strategy", "reads", "fused", "unit", "tasks", "parts", "bands")


def choices(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: s[k] for k in CHOICES} for s in stages]


def source(tmp_path: Path) -> tuple[np.ndarray, Any]:
    a = np.random.default_rng(1).random((8, 12, 10)).astype("float32")
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 12, 10))
    return a, da.from_zarr(str(tmp_path / "x.zarr"))


def test_explain_gives_the_stages_the_engine_runs(tmp_path: Path) -> None:
    a, x = source(tmp_path)
    y = (x - x.mean(axis=0)).sum(axis=(1, 2))
    explained = chunkfuse.dask.explain(y, max_mem="64MB", num_workers=2)
    assert explained.python_steps == [], explained
    [step] = explained.engine_steps
    assert [s["kind"] for s in step.stages] == ["reduce", "reduce"], step.stages
    assert "mean_chunk" in step.ops and "fused subtract" in str(explained), explained

    got = y.compute(scheduler=chunkfuse.dask.get, max_mem="64MB", num_workers=2)
    np.testing.assert_allclose(got, (a - a.mean(0)).sum(axis=(1, 2)), rtol=1e-4, atol=1e-3)
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0
    assert choices(step.stages) == choices(stats.stages)


def test_explain_names_the_tasks_that_run_in_python_and_why(tmp_path: Path) -> None:
    a, x = source(tmp_path)
    z = x.map_blocks(lambda b: np.sort(b, axis=1)).mean(axis=0)
    explained = chunkfuse.dask.explain(z)
    python = {s.op: s for s in explained.python_steps}
    names = {"mean_chunk", "mean_agg-aggregate", "finalize-hlgfinalizecompute"}
    assert set(python) == names, explained
    assert python["mean_chunk"].tasks == 4
    assert "'<lambda>' has no native form" in python["mean_chunk"].reason
    assert "task that runs in Python" in python["mean_agg-aggregate"].reason
    assert isinstance(explained.steps[-1], PythonStep)
    text = str(explained)
    assert "Python: mean_chunk (4 task(s)): '<lambda>' has no native form" in text, text

    got = z.compute(scheduler=chunkfuse.dask.get)
    np.testing.assert_allclose(got, np.sort(a, axis=1).mean(0), rtol=1e-6)
    stats = chunkfuse.dask.last_stats()
    assert stats is not None, stats
    assert stats.python_tasks == sum(s.tasks for s in explained.python_steps) == 6, stats


def test_explain_of_a_graph_with_no_stored_array_is_all_python() -> None:
    x = da.ones((4, 4), chunks=2)
    explained = chunkfuse.dask.explain(x.sum())
    assert explained.engine_steps == [] and explained.python_steps, explained
