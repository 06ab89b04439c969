"""The Python package: `import chunkfuse` works, reports the engine's version, and runs plans
with progress reports."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from conftest import REPO


def test_import_and_version() -> None:
    chunkfuse = importlib.import_module("chunkfuse")
    engine = importlib.import_module("chunkfuse._engine")
    version = engine.version()
    assert isinstance(version, str) and version, version
    assert chunkfuse.__version__ == version


def test_version_matches_workspace() -> None:
    """The engine reports the workspace version from Cargo.toml."""
    engine = importlib.import_module("chunkfuse._engine")
    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())
    assert engine.version().startswith(cargo["workspace"]["package"]["version"])


def _copy_plan(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    src = tmp_path / "x.zarr"
    z = zarr.create_array(src, shape=(64, 64), chunks=(8, 8), dtype="f4")
    z[...] = np.arange(64 * 64, dtype="f4").reshape(64, 64)
    out = tmp_path / "y.zarr"
    plan = {
        "arrays": [{"id": "x", "zarr": str(src)}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {"op": "negative", "args": [{"input": 0}]},
            },
            {"id": "w", "op": "write", "input": "y", "target": str(out)},
        ],
    }
    return plan, out


def test_run_plan_reports_progress(tmp_path: Path) -> None:
    import chunkfuse

    plan, out = _copy_plan(tmp_path)
    calls: list[tuple[int, int]] = []
    summary = chunkfuse.run_plan(plan, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (summary["tasks"], summary["tasks"]) and summary["tasks"] > 0
    assert all(d <= t for d, t in calls)
    np.testing.assert_array_equal(
        zarr.open_array(out)[...], -zarr.open_array(tmp_path / "x.zarr")[...]
    )


class StopHere(Exception):
    pass


def test_an_exception_in_the_progress_callback_stops_the_run(tmp_path: Path) -> None:
    import chunkfuse

    plan, _ = _copy_plan(tmp_path)

    def stop(done: int, total: int) -> None:
        raise StopHere(f"{done}/{total}")

    # The run either finishes before the first report (then the final report raises) or is
    # cancelled: either way the callback's exception reaches the caller.
    with pytest.raises(StopHere):
        chunkfuse.run_plan(plan, progress=stop)
