"""Every plans/*.json runs on a small ERA5-like array and matches its numpy reference.

A plan is identified by its file name (without .json). Each needs an entry in REFERENCES: the
numpy computation, how to compare, and which parameters to pass. A new plan without an entry
fails here, so it gets a reference before it gets merged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, open_zarr, read_zarr

RunPlan = Callable[..., dict[str, Any]]

PLANS_DIR = REPO / "plans"
PLANS = sorted(PLANS_DIR.glob("*.json"))

# small, with irregular last chunks for (256, 73, 144) targets: 91 = 73 + 18, 180 = 144 + 36
ERA5_TIME, ERA5_LAT, ERA5_LON = 8, 91, 180


def sum_tolerance(y: np.ndarray, axis: int) -> np.ndarray:
    n = y.shape[axis]
    rel = max(1e-5, 4 * (n + 1) * float(np.finfo(y.dtype).eps))
    return rel * np.abs(y.astype(np.float64)).sum(axis=axis)


def era5_sum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    y = (x + 1) * 2  # Python scalars: stays float32, as in numpy 2
    return y.sum(axis=0), sum_tolerance(y, 0)


def era5_anomaly(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    mean = x.mean(axis=0)
    tol = sum_tolerance(x, 0) / x.shape[0] + 2 * float(np.finfo(x.dtype).eps) * np.abs(x)
    return x - mean, tol


def relative(expected: np.ndarray, rtol: float) -> np.ndarray:
    """An absolute tolerance of `rtol` times the largest magnitude (FFTs mix every value of a
    lane into every output)."""
    return np.full(expected.shape, rtol * float(np.abs(expected).max()))


def era5_fft_lat(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    expected = np.abs(np.fft.rfft(x, axis=1)).mean(axis=0)
    return expected, relative(expected, 2e-5)


def era5_power_spectrum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    expected = np.abs(np.fft.rfft(x, axis=0)) ** 2
    return expected, relative(expected, 2e-5)


def identity(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    return x, None


@dataclass(frozen=True)
class Reference:
    """numpy reference of a plan: ``compute(x) -> (expected, absolute tolerance or None)``."""

    compute: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]
    params: tuple[str, ...] = ("source", "target")


REFERENCES: dict[str, Reference] = {
    "era5-sum": Reference(era5_sum),
    "era5-anomaly": Reference(era5_anomaly),
    "era5-rechunk": Reference(identity),
    "era5-fft-lat": Reference(era5_fft_lat),
    "era5-power-spectrum": Reference(era5_power_spectrum),
}


@pytest.fixture(scope="module")
def era5_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("era5") / "era5.zarr"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_era5.py"),
            str(out),
            "--time",
            str(ERA5_TIME),
            "--lat",
            str(ERA5_LAT),
            "--lon",
            str(ERA5_LON),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["shape"] == [ERA5_TIME, ERA5_LAT, ERA5_LON]
    return out


def test_plans_exist() -> None:
    assert PLANS, f"no plans found in {PLANS_DIR}"


def test_every_plan_has_a_reference() -> None:
    missing = [p.stem for p in PLANS if p.stem not in REFERENCES]
    assert not missing, f"plans without a numpy reference in {__file__}: {missing}"


def requested_chunks(plan: dict[str, Any]) -> list[int] | None:
    """Chunks the output should have: the write op's, else the last rechunk op's."""
    chunks = None
    for op in plan.get("ops", []):
        if op.get("op") == "rechunk":
            chunks = op.get("chunks")
        if op.get("op") == "write" and op.get("chunks"):
            chunks = op["chunks"]
    return chunks


@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_plan_matches_numpy(
    run_plan: RunPlan, era5_small: Path, tmp_path: Path, plan_path: Path
) -> None:
    name = plan_path.stem
    if name not in REFERENCES:
        pytest.fail(f"plan {name} has no numpy reference: add one to REFERENCES in {__file__}")
    ref = REFERENCES[name]
    plan = json.loads(plan_path.read_text())
    declared = set(plan.get("params", {}))
    unknown = declared - set(ref.params)
    assert not unknown, f"plan {name} declares parameters the test does not supply: {unknown}"

    target = tmp_path / "out.zarr"
    values = {"source": str(era5_small), "target": str(target)}
    summary = run_plan(plan_path, {k: values[k] for k in ref.params})
    assert summary["tasks"] > 0

    x = read_zarr(era5_small)
    expected, atol = ref.compute(x)
    result = read_zarr(target)
    assert result.shape == expected.shape, f"shape {result.shape} != numpy {expected.shape}"
    assert result.dtype == expected.dtype, f"dtype {result.dtype} != numpy {expected.dtype}"
    if atol is None:
        np.testing.assert_array_equal(result, expected)
    else:
        diff = np.abs(result.astype(np.float64) - expected.astype(np.float64))
        bad = ~(diff <= atol)
        assert not bad.any(), (
            f"{bad.sum()} of {bad.size} values outside tolerance; worst "
            f"{(diff - atol)[bad].max()} over (max diff {diff.max()})"
        )

    out = open_zarr(target)
    check_layout("chunks", tuple(out.chunks), requested_chunks(plan), out.shape)
    writes = [op for op in plan.get("ops", []) if op.get("op") == "write"]
    if writes and writes[-1].get("shards"):
        assert out.shards is not None, "plan asked for shards, output is not sharded"
        check_layout("shards", tuple(out.shards), writes[-1]["shards"], out.shape)


def check_layout(
    what: str, got: tuple[int, ...], want: list[int] | None, shape: tuple[int, ...]
) -> None:
    """Output chunk (or shard) shape is what the plan asked for; -1 means the whole axis, and a
    request larger than the axis may be clipped to it."""
    if want is None:
        return
    assert len(got) == len(want), f"{what} {got}, plan asked for {want}"
    for axis, (g, w, extent) in enumerate(zip(got, want, shape, strict=True)):
        full = extent if w == -1 else w
        assert g in (full, min(full, extent)), (
            f"{what} axis {axis}: {g}, plan asked for {w} (extent {extent})"
        )
