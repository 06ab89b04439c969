"""Every examples/*.py runs, on small data, and finishes cleanly (each checks its own results).

A new example needs an entry in SMALL_ARGS (the arguments that make it small), so it is run
here before it is merged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.py"))

SMALL_ARGS: dict[str, list[str]] = {
    "cubed_quickstart": ["--size", "200"],
    "xarray_cubed": ["--time", "12", "--lat", "19", "--lon", "36"],
    "era5_fft": ["--time", "12", "--lat", "37", "--lon", "24"],
    "dask_quickstart": ["--time", "12", "--lat", "19", "--lon", "36"],
    "train_windows": ["--time", "16", "--lat", "19", "--lon", "36", "--steps", "30"],
}

#: Examples whose every task must run in the engine (they print "Python tasks N").
NATIVE_ONLY = {"cubed_quickstart", "xarray_cubed", "era5_fft", "dask_quickstart"}


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/ holds no example"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    assert path.stem in SMALL_ARGS, f"add the small-data arguments of {path.name} to SMALL_ARGS"
    done = subprocess.run(
        [sys.executable, str(path), *SMALL_ARGS[path.stem]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if path.stem in NATIVE_ONLY:
        assert "Python tasks 0" in done.stdout, done.stdout
