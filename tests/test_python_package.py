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


SLOW_RUN = """
import signal, sys, numpy as np, zarr, chunkfuse
# Python only turns SIGINT into KeyboardInterrupt when its parent left SIGINT at the default:
# a test run started in the background of a non-interactive shell inherits it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
src, out = sys.argv[1], sys.argv[2]
z = zarr.create_array(src, shape=(4096, 4096), chunks=(256, 256), dtype="f8", compressors=None)
z[...] = np.random.default_rng(0).random((4096, 4096))
plan = {"arrays": [{"id": "x", "zarr": src}], "ops": [
    {"id": "y", "op": "elementwise", "inputs": ["x"],
     "expr": {"op": "exp", "args": [{"op": "sin", "args": [{"input": 0}]}]}},
    {"id": "w", "op": "write", "input": "y", "target": out, "chunks": [64, 64],
     "codec": {"name": "gzip", "level": 9}}]}
print("started", flush=True)
for _ in range(100):
    chunkfuse.run_plan(plan, threads=1)
"""


def test_ctrl_c_cancels_a_run_promptly(tmp_path: Path) -> None:
    """SIGINT while the engine runs raises KeyboardInterrupt in Python within a second or so."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_RUN, str(tmp_path / "x.zarr"), str(tmp_path / "y.zarr")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10, "the run did not stop promptly"
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    # No half-written chunk is left behind.
    assert not [p for p in (tmp_path / "y.zarr").rglob("*") if ".partial" in p.name]


def test_write_into_an_existing_array_keeps_its_metadata(tmp_path: Path) -> None:
    """`"existing": true` writes chunks with the array's own codecs and keeps its attributes."""
    import chunkfuse

    plan, _ = _copy_plan(tmp_path)
    out = tmp_path / "made-elsewhere.zarr"
    made = zarr.create_array(
        out,
        shape=(64, 64),
        chunks=(16, 32),
        dtype="f4",
        compressors=[zarr.codecs.GzipCodec(level=1)],
        attributes={"units": "K"},
    )
    plan["ops"][1] = {"id": "w", "op": "write", "input": "y", "target": str(out), "existing": True}
    chunkfuse.run_plan(plan)
    got = zarr.open_array(out, mode="r")
    assert got.attrs["units"] == "K" and got.chunks == made.chunks
    assert "gzip" in str(got.metadata.codecs).lower()
    np.testing.assert_array_equal(got[...], -zarr.open_array(tmp_path / "x.zarr")[...])

    # Format fields cannot be given with "existing": the plan error names the field.
    plan["ops"][1]["codec"] = {"name": "zstd"}
    with pytest.raises(ValueError, match=r"ops\[1\]\.codec"):
        chunkfuse.run_plan(plan)


def test_help_lists_every_public_name() -> None:
    """help(chunkfuse) shows every name of __all__, the lazily imported ones included."""
    import pydoc

    import chunkfuse

    text = pydoc.render_doc(chunkfuse, renderer=pydoc.plaintext)
    documented = text.split("\nCLASSES\n", 1)[-1]  # past the module docstring
    assert "class RustExecutor" in documented
    assert "\n    rechunk(source" in documented
    for name in chunkfuse.__all__:
        if not name.startswith("__"):
            assert name in documented, name
    assert "RustExecutor" in dir(chunkfuse) and "rechunk" in dir(chunkfuse)
    missing = [n for n in chunkfuse.__all__ if not hasattr(chunkfuse, n)]
    assert not missing
