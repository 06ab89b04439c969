"""`RustExecutor.explain`: the engine runs a Cubed computation would make, with the stages the
run then uses, and the ops that run in Python with the reason; nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cubed
import cubed.array_api as xp
import numpy as np
import pytest
import zarr
from chunkfuse import RustExecutor
from chunkfuse.common.explanation import EngineStep, PythonStep

CHOICES = ("kind", "label", "strategy", "reads", "fused", "unit", "tasks", "parts", "bands")


def choices(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: s[k] for k in CHOICES} for s in stages]


@pytest.fixture
def spec(tmp_path: Path) -> Any:
    return cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="500MB")


def stored(tmp_path: Path, a: np.ndarray, chunks: tuple[int, ...]) -> str:
    url = str(tmp_path / "x.zarr")
    zarr.create_array(url, data=a, chunks=chunks)
    return url


def test_explain_gives_the_stages_a_native_computation_runs(tmp_path: Path, spec: Any) -> None:
    a = np.random.default_rng(0).random((8, 12, 10)).astype("float32")
    x = cubed.from_zarr(stored(tmp_path, a, (2, 12, 10)), spec=spec)
    anomaly = x - xp.mean(x, axis=0, keepdims=True)
    executor = RustExecutor(max_workers=2, max_mem="64MB")
    explained = executor.explain(anomaly)
    assert explained.python_steps == [], explained
    [step] = explained.engine_steps
    assert step.stages and step.explained is not None
    assert not any((tmp_path / "work").glob("**/*.zarr/zarr.json")), "explain wrote arrays"
    text = str(explained)
    assert "engine run of" in text and "fused subtract" in text, text

    got = anomaly.compute(executor=executor)
    np.testing.assert_allclose(got, a - a.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    assert choices(step.stages) == choices(executor.last_stats.stages)


def test_explain_names_the_ops_that_run_in_python_and_why(tmp_path: Path, spec: Any) -> None:
    a = np.arange(24.0).reshape(4, 6)
    x = cubed.from_zarr(stored(tmp_path, a, (2, 3)), spec=spec)
    y = xp.sum(cubed.map_blocks(lambda b: b * 3 + 1, x, dtype=x.dtype).rechunk((4, 2)), axis=1)
    executor = RustExecutor(max_workers=2)
    explained = executor.explain(y)
    [python] = explained.python_steps
    assert isinstance(python, PythonStep) and python.tasks == 4
    assert python.reason, python
    assert f"Python: {python.op} (4 task(s)): {python.reason}" in str(explained)
    # The steps are in the order they run: the user function before what reads its output.
    kinds = [type(s) for s in explained.steps]
    assert kinds.index(PythonStep) < len(kinds) - 1 and kinds[-1] is EngineStep, explained

    y.compute(executor=executor)
    assert executor.last_stats.python_ops == {python.op: python.reason}
