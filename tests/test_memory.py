"""Bounded memory: peak RSS of the chunkfuse child process stays under --max-mem plus a baseline.

The input (~200 MiB float32, zstd level 1, 2 MiB chunks) is several times ``--max-mem`` (48MB).
Peak RSS is ``ru_maxrss`` of exactly the chunkfuse process (``os.wait4`` in
scripts/rss_exec.py, a tiny launcher: measured straight from pytest, a child's ru_maxrss would
start at pytest's own RSS). The bound is

    peak_rss  <  max_mem (as the CLI reports it)  +  baseline  +  MARGIN

where baseline is the peak RSS of ``chunkfuse info`` on the same store (binary, allocator and
runtime start-up, thread stacks, metadata) and MARGIN (32 MiB) covers what the budget does not
count: allocator fragmentation and per-thread arenas, codec contexts, the IO layer's buffers.
Results are checked too, so a run cannot stay small by skipping work.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.codecs
from conftest import Cli, check_summary, open_zarr, power_spectrum_plan

RunPlan = Callable[..., dict[str, Any]]

MIB = 1024 * 1024
MARGIN = 32 * MIB
MAX_MEM = "48MB"
SHAPE = (50, 1024, 1024)  # 200 MiB of float32
CHUNKS = (1, 512, 1024)  # 2 MiB
SLAB = 5  # time steps generated / verified at a time


def slab_values(t0: int, t1: int) -> np.ndarray:
    rng = np.random.default_rng([7, t0])
    base = np.linspace(-3.0, 3.0, SHAPE[2], dtype=np.float32)[None, None, :]
    noise = rng.standard_normal((t1 - t0, SHAPE[1], SHAPE[2]), dtype=np.float32)
    return base + noise


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("memory") / "big.zarr"
    arr = zarr.create_array(
        store=str(path),
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="float32",
        compressors=[zarr.codecs.ZstdCodec(level=1)],
        zarr_format=3,
    )
    for t0 in range(0, SHAPE[0], SLAB):
        arr[t0 : t0 + SLAB] = slab_values(t0, t0 + SLAB)
    yield path


@pytest.fixture(scope="module")
def baseline_rss(cli: Cli, big_source: Path) -> int:
    """Peak RSS of `chunkfuse info` on the same store (best of 2)."""
    return min(cli("info", big_source, "--json", measure_rss=True).peak_rss for _ in range(2))


def bound(summary: dict[str, Any], baseline: int) -> int:
    max_mem = int(summary["max_mem"])
    assert 40 * 10**6 <= max_mem <= 48 * MIB, f"--max-mem {MAX_MEM} reported as {max_mem}"
    return max_mem + baseline + MARGIN


def report(label: str, peak: int, limit: int, baseline: int) -> str:
    return (
        f"{label}: peak RSS {peak / MIB:.1f} MiB, limit {limit / MIB:.1f} MiB "
        f"(max_mem + baseline {baseline / MIB:.1f} MiB + margin {MARGIN / MIB:.0f} MiB)"
    )


def test_sum_reduction_bounded(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path
) -> None:
    target = tmp_path / "sum.zarr"
    plan = {
        "name": "memory-sum",
        "arrays": [{"id": "x", "zarr": str(big_source)}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {"op": "multiply", "args": [{"input": 0}, {"const": 2}]},
            },
            {"id": "s", "op": "reduce", "input": "y", "func": "sum", "axes": [0]},
            {"id": "out", "op": "write", "input": "s", "target": str(target)},
        ],
    }
    result = cli("run", cli.write_plan(plan), "--max-mem", MAX_MEM, "--json", measure_rss=True)
    summary = result.json()
    check_summary(summary)
    limit = bound(summary, baseline_rss)
    print(report("sum", result.peak_rss, limit, baseline_rss))
    assert result.peak_rss < limit, report("sum", result.peak_rss, limit, baseline_rss)
    assert summary["decoded_bytes"] >= np.prod(SHAPE) * 4

    expected = np.zeros(SHAPE[1:], dtype=np.float64)
    magnitude = np.zeros(SHAPE[1:], dtype=np.float64)
    for t0 in range(0, SHAPE[0], SLAB):
        y = slab_values(t0, t0 + SLAB).astype(np.float64) * 2
        expected += y.sum(axis=0)
        magnitude += np.abs(y).sum(axis=0)
    out = np.asarray(open_zarr(target)[...])
    assert out.dtype == np.float32 and out.shape == SHAPE[1:]
    assert np.all(np.abs(out - expected) <= 1e-5 * magnitude + 1e-6)


def anomaly_sums_plan(source: Path, target: Path) -> dict[str, Any]:
    """(x - x.mean(axis=0)).sum(axis=(1, 2)): two stages that read x."""
    return {
        "name": "memory-anomaly",
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {"id": "m", "op": "reduce", "input": "x", "func": "mean", "axes": [0]},
            {
                "id": "a",
                "op": "elementwise",
                "inputs": ["x", "m"],
                "expr": {"op": "subtract", "args": [{"input": 0}, {"input": 1}]},
            },
            {"id": "s", "op": "reduce", "input": "a", "func": "sum", "axes": [1, 2]},
            {"id": "out", "op": "write", "input": "s", "target": str(target)},
        ],
    }


def test_chunks_kept_for_a_later_stage_stay_in_the_budget(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path
) -> None:
    """The anomaly's second stage reads x again: the first keeps the chunks it decodes for
    it, within a share of the budget. Under 48MB most are read and decoded twice and the
    peak stays under the bound; under 1GB every chunk is decoded once."""
    mean = np.zeros(SHAPE[1:], dtype=np.float64)
    for t0 in range(0, SHAPE[0], SLAB):
        mean += slab_values(t0, t0 + SLAB).astype(np.float64).sum(axis=0)
    mean /= SHAPE[0]
    expected = np.concatenate(
        [
            (slab_values(t0, t0 + SLAB).astype(np.float64) - mean).sum(axis=(1, 2))
            for t0 in range(0, SHAPE[0], SLAB)
        ]
    )
    x_bytes = int(np.prod(SHAPE)) * 4
    mean_bytes = int(np.prod(SHAPE[1:])) * 4
    decoded = {}
    for max_mem in (MAX_MEM, "1GB"):
        target = tmp_path / f"anomaly-{max_mem}.zarr"
        plan = cli.write_plan(anomaly_sums_plan(big_source, target))
        result = cli("run", plan, "--max-mem", max_mem, "--json", measure_rss=True)
        summary = result.json()
        check_summary(summary)
        if max_mem == MAX_MEM:
            limit = bound(summary, baseline_rss)
            print(report("anomaly", result.peak_rss, limit, baseline_rss))
            assert result.peak_rss < limit, report("anomaly", result.peak_rss, limit, baseline_rss)
        out = np.asarray(open_zarr(target)[...])
        np.testing.assert_allclose(out, expected, rtol=0, atol=0.05)
        decoded[max_mem] = summary["decoded_bytes"]
    assert decoded["1GB"] == x_bytes + mean_bytes, decoded
    assert x_bytes + mean_bytes < decoded[MAX_MEM] <= 2 * x_bytes + mean_bytes, decoded


# (50, 64, 64) and (10, 1024, 32) go through an intermediate array; (50, 512, 512) is
# encoded as streams, four 50 MiB chunks open at once (each input chunk decoded once).
@pytest.mark.parametrize("target_chunks", [(50, 64, 64), (10, 1024, 32), (50, 512, 512)])
def test_rechunk_bounded(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path, target_chunks: tuple[int, ...]
) -> None:
    target = tmp_path / "rechunked.zarr"
    result = cli(
        "rechunk",
        big_source,
        target,
        "--chunks",
        ",".join(map(str, target_chunks)),
        "--max-mem",
        MAX_MEM,
        "--codec",
        "zstd:1",
        "--json",
        measure_rss=True,
    )
    summary = result.json()
    check_summary(summary)
    limit = bound(summary, baseline_rss)
    print(report(f"rechunk {target_chunks}", result.peak_rss, limit, baseline_rss))
    streamed = any(s["strategy"] == "streams" for s in summary["stages"])
    assert streamed == (target_chunks == (50, 512, 512)), summary["stages"]
    assert result.peak_rss < limit, report("rechunk", result.peak_rss, limit, baseline_rss)

    out = open_zarr(target)
    assert out.shape == SHAPE and tuple(out.chunks) == target_chunks
    for t0 in range(0, SHAPE[0], SLAB):
        np.testing.assert_array_equal(out[t0 : t0 + SLAB], slab_values(t0, t0 + SLAB))


def test_a_rechunk_into_many_small_chunks_stays_in_the_budget(
    cli: Cli, baseline_rss: int, tmp_path: Path
) -> None:
    """16,380 output chunks of 800 bytes, through an intermediate array: the tasks' plans
    are made a window at a time as they run, so what they hold before they run does not
    grow with their number (made all at once, they took about 8 KiB each: 180 MiB peak
    here)."""
    source = tmp_path / "era5-like.zarr"
    values = np.random.default_rng(3).standard_normal((200, 181, 360), dtype=np.float32)
    zarr.create_array(str(source), data=values, chunks=(1, 181, 360), zarr_format=2)
    target = tmp_path / "series.zarr"
    args = ["rechunk", source, target, "--chunks", "200,2,2", "--codec", "zstd:1"]
    result = cli(*args, "--max-mem", MAX_MEM, "--threads", "2", "--json", measure_rss=True)
    summary = result.json()
    assert summary["stages"][-1]["tasks"] == 91 * 180, summary["stages"]
    limit = bound(summary, baseline_rss)
    print(report("rechunk into 16,380 chunks", result.peak_rss, limit, baseline_rss))
    assert result.peak_rss < limit, report("many chunks", result.peak_rss, limit, baseline_rss)
    np.testing.assert_array_equal(open_zarr(target)[:], values)


def test_rechunk_in_bands_bounded(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path
) -> None:
    """With room for a quarter of the input, not for it all: the input held in four bands
    in turn (each input chunk decoded through the rows a band needs: 1.5 decodes in all,
    rather than an intermediate array's write and read), RSS under the budget."""
    target = tmp_path / "rechunked.zarr"
    max_mem = 96 * 10**6
    args = ["rechunk", big_source, target, "--chunks", "50,64,64", "--codec", "zstd:1"]
    result = cli(*args, "--max-mem", str(max_mem), "--threads", "2", "--json", measure_rss=True)
    summary = result.json()
    check_summary(summary)
    stages = [(s["label"], s["strategy"], s["unit"], s["bands"]) for s in summary["stages"]]
    assert stages == [("write rechunked", "bands", [1, 1, 1], 4)], summary["stages"]
    assert summary["decoded_bytes"] == np.prod(SHAPE) * 4 * 3 // 2, summary
    limit = max_mem + baseline_rss + MARGIN
    print(report("rechunk in bands", result.peak_rss, limit, baseline_rss))
    assert result.peak_rss < limit, report("rechunk in bands", result.peak_rss, limit, baseline_rss)
    out = open_zarr(target)
    assert tuple(out.chunks) == (50, 64, 64)
    for t0 in range(0, SHAPE[0], SLAB):
        np.testing.assert_array_equal(out[t0 : t0 + SLAB], slab_values(t0, t0 + SLAB))


def test_rechunk_plan_op_bounded(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path
) -> None:
    """The `rechunk` op inside a plan, followed by an elementwise op, under the same budget."""
    target = tmp_path / "plan-rechunked.zarr"
    plan = {
        "arrays": [{"id": "x", "zarr": str(big_source)}],
        "ops": [
            {"id": "r", "op": "rechunk", "input": "x", "chunks": [-1, 32, 128]},
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["r"],
                "expr": {"op": "negative", "args": [{"input": 0}]},
            },
            {"id": "out", "op": "write", "input": "y", "target": str(target)},
        ],
    }
    result = cli("run", cli.write_plan(plan), "--max-mem", MAX_MEM, "--json", measure_rss=True)
    summary = result.json()
    limit = bound(summary, baseline_rss)
    print(report("plan rechunk", result.peak_rss, limit, baseline_rss))
    assert result.peak_rss < limit, report("plan rechunk", result.peak_rss, limit, baseline_rss)
    out = open_zarr(target)
    assert tuple(out.chunks) == (SHAPE[0], 32, 128)
    for t0 in range(0, SHAPE[0], SLAB):
        np.testing.assert_array_equal(out[t0 : t0 + SLAB], -slab_values(t0, t0 + SLAB))


def test_long_one_dimensional_fft_bounded(cli: Cli, tmp_path: Path) -> None:
    """A long transform of a single lane holds one lane's work buffer, not a lane group's.

    (Each thread once allocated 16 lanes of work for any transform, 537 MB for this 16 MB
    input.)
    """
    n = 1 << 21
    source = tmp_path / "series.zarr"
    values = np.random.default_rng(5).standard_normal(n)
    arr = zarr.create_array(store=str(source), shape=(n,), chunks=(n // 4,), dtype="float64")
    arr[:] = values
    baseline = min(cli("info", source, "--json", measure_rss=True).peak_rss for _ in range(2))
    target = tmp_path / "spectrum.zarr"
    plan = {
        "name": "memory-fft-1d",
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {"id": "f", "op": "fft", "input": "x", "kind": "fft", "axis": 0},
            {
                "id": "a",
                "op": "elementwise",
                "inputs": ["f"],
                "expr": {"op": "abs", "args": [{"input": 0}]},
            },
            {"id": "out", "op": "write", "input": "a", "target": str(target)},
        ],
    }
    result = cli("run", cli.write_plan(plan), "--max-mem", "640MB", "--json", measure_rss=True)
    summary = result.json()
    check_summary(summary)
    limit = int(summary["max_mem"]) + baseline + MARGIN
    print(report("fft 1-d", result.peak_rss, limit, baseline))
    assert result.peak_rss < limit, report("fft 1-d", result.peak_rss, limit, baseline)
    out = np.asarray(open_zarr(target)[...])
    want = np.abs(np.fft.fft(values))
    assert np.allclose(out, want, rtol=1e-9, atol=1e-9 * want.max())


@pytest.mark.parametrize(("max_mem", "bands"), [("48MB", False), ("160MB", True)])
def test_power_spectrum_along_time_bounded(
    cli: Cli, big_source: Path, baseline_rss: int, tmp_path: Path, max_mem: str, bands: bool
) -> None:
    """|rfft along time|**2 of the 200 MiB source, whose chunks hold one time step each: at
    48 MB the bands would be too many and the input is spilled into a rechunked copy; at
    160 MB it is held in memory in a few bands, each decoded once. Both stay in the budget."""
    target = tmp_path / "power.zarr"
    plan = power_spectrum_plan(big_source, target, [-1, 64, 128])
    plan["name"] = "memory-power-spectrum"
    result = cli("run", cli.write_plan(plan), "--max-mem", max_mem, "--json", measure_rss=True)
    summary = result.json()
    check_summary(summary)
    stages = summary["stages"]
    banded = any(s["strategy"] == "bands" for s in stages)
    assert banded == bands, stages
    assert any(s["label"] == "write f input" for s in stages) == (not bands), stages
    limit = int(summary["max_mem"]) + baseline_rss + MARGIN
    label = f"power spectrum at {max_mem}"
    print(report(label, result.peak_rss, limit, baseline_rss))
    assert result.peak_rss < limit, report(label, result.peak_rss, limit, baseline_rss)
    out = open_zarr(target)
    for y0 in range(0, SHAPE[1], 256):
        values = np.concatenate(
            [slab_values(t, t + SLAB)[:, y0 : y0 + 256] for t in range(0, SHAPE[0], SLAB)]
        )
        want = np.abs(np.fft.rfft(values, axis=0)) ** 2
        np.testing.assert_allclose(out[:, y0 : y0 + 256], want, rtol=1e-4, atol=1e-3 * want.max())


# --- Small budgets on many threads (issue 34) -------------------------------------------------
#
# The guarantee the README states: peak RSS stays within --max-mem plus a fixed baseline, the
# binary's own start-up (what `chunkfuse info` peaks at, about 10 MiB) and at most
# SMALL_BUDGET_SLACK more, whatever --threads asks for. The plans in plans/ run at 32MB and
# 64MB on a small ERA5-like array with 16 threads asked (a many-core machine: each thread's
# allocator arena, codec contexts and stack are memory no task counts).

PLANS = Path(__file__).resolve().parents[1] / "plans"
MAKE_ERA5 = Path(__file__).resolve().parents[1] / "scripts" / "make_era5.py"
SMALL_BUDGET_SLACK = 16 * MIB
ERA5_SHAPE = (48, 361, 720)  # one 1 MB chunk per time step


@pytest.fixture(scope="module")
def small_era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("era5") / "era5.zarr"
    nt, nlat, nlon = ERA5_SHAPE
    subprocess.run(
        [sys.executable, MAKE_ERA5, path, "--time", str(nt), "--lat", str(nlat)]
        + ["--lon", str(nlon)],
        check=True,
        capture_output=True,
    )
    return path


def era5_expected(plan: str, x: np.ndarray) -> np.ndarray:
    """What each plan in plans/ computes, by numpy (float64)."""
    x64 = x.astype(np.float64)
    if plan == "sum":
        return ((x64 + 1) * 2).sum(axis=0)
    if plan == "anomaly":
        return x64 - x64.mean(axis=0, keepdims=True)
    if plan == "rechunk":
        return x
    if plan == "fft-lat":
        return np.abs(np.fft.rfft(x64, axis=1)).mean(axis=0)
    assert plan == "power-spectrum"
    return np.abs(np.fft.rfft(x64, axis=0)) ** 2


# Budgets a plan's tasks cannot fit on this array are refused; every other run stays in it.
REFUSED = {("anomaly", "32MB")}


@pytest.mark.parametrize("max_mem", ["32MB", "64MB"])
@pytest.mark.parametrize("plan", ["sum", "anomaly", "rechunk", "fft-lat", "power-spectrum"])
def test_plans_hold_small_budgets_on_many_threads(
    cli: Cli, small_era5: Path, tmp_path: Path, plan: str, max_mem: str
) -> None:
    baseline = min(cli("info", small_era5, "--json", measure_rss=True).peak_rss for _ in range(2))
    target = tmp_path / "out.zarr"
    args = ["run", PLANS / f"era5-{plan}.json", "--param", f"source={small_era5}"]
    args += ["--param", f"target={target}", "--max-mem", max_mem, "--threads", "16", "--json"]
    args += ["--work-dir", tmp_path / "work"]
    if (plan, max_mem) in REFUSED:
        result = cli(*args, expect_rc=None, timeout=120)
        assert result.returncode != 0, result.describe()
        # The task, the bytes it needs and the budget, and nothing written.
        assert re.search(r"needs [\d.]+ MiB but the budget for tasks is [\d.]+ MiB", result.stderr)
        assert not target.exists()
        return
    result = cli(*args, timeout=120, measure_rss=True)
    summary = result.json()
    check_summary(summary)
    assert summary["max_mem"] == int(max_mem.removesuffix("MB")) * 10**6
    limit = summary["max_mem"] + baseline + SMALL_BUDGET_SLACK
    label = (
        f"{plan} at {max_mem} on 16 threads: peak RSS {result.peak_rss / MIB:.1f} MiB, limit "
        f"{limit / MIB:.1f} MiB (max_mem + baseline {baseline / MIB:.1f} MiB + slack "
        f"{SMALL_BUDGET_SLACK / MIB:.0f} MiB)"
    )
    print(label)
    assert result.peak_rss < limit, label
    x = np.asarray(open_zarr(small_era5)[...])
    want = era5_expected(plan, x)
    out = np.asarray(open_zarr(target)[...])
    assert out.shape == want.shape
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("max_mem", ["12MB", "16MB", "20MB", "24MB"])
def test_a_reduction_never_waits_on_its_own_partial_results(
    cli: Cli, small_era5: Path, tmp_path: Path, max_mem: str
) -> None:
    """A reduction's groups hold their partial results until they are merged in order: a
    budget that fits one group but not the group with the results it waits for was accepted
    and then waited forever. Now it runs (in fewer groups) or is refused, naming the bytes."""
    target = tmp_path / "sum.zarr"
    args = ["run", PLANS / "era5-sum.json", "--param", f"source={small_era5}"]
    args += ["--param", f"target={target}", "--max-mem", max_mem, "--json"]
    result = cli(*args, expect_rc=None, timeout=60)
    if result.returncode != 0:
        assert "held by partial results of other tasks" in result.stderr, result.describe()
        assert not target.exists()
        return
    x = np.asarray(open_zarr(small_era5)[...]).astype(np.float64)
    want = ((x + 1) * 2).sum(axis=0)
    np.testing.assert_allclose(np.asarray(open_zarr(target)[...]), want, rtol=1e-5)


def test_a_budget_too_small_for_one_task_is_refused(
    cli: Cli, small_era5: Path, tmp_path: Path
) -> None:
    target = tmp_path / "sum.zarr"
    args = ["run", PLANS / "era5-sum.json", "--param", f"source={small_era5}"]
    result = cli(*args, "--param", f"target={target}", "--max-mem", "4MB", expect_rc=None)
    assert result.returncode != 0
    assert re.search(
        r"sum of y: output chunk \[0, 0\], group 0 needs [\d.]+ MiB but the budget for tasks "
        r"is [\d.]+ MiB \(of the memory budget 3.8 MiB\)",
        result.stderr,
    ), result.describe()
    assert not target.exists()


# --- Budgets are monotone (issue 34) ----------------------------------------------------------
#
# A budget that runs a plan runs it at every larger budget too, within the guarantee. A larger
# budget affords more threads (one per 8 MiB), so more of a reduction's groups in flight, whose
# partial results wait to be merged, and more of the budget set aside for the threads' own
# memory: neither may turn a run into a refusal. (Sums and means were refused at 17-19 MB and
# variances at 17-32 MB on the ERA5-like array below, though each ran at 16 MB.)

REDUCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.sum,
    "mean": np.mean,
    "var": np.var,
    "max": np.max,
}


def reduce_plan(func: str, source: Path, target: Path) -> dict[str, Any]:
    """func((x + 1) * 2, axis=0)."""
    return {
        "name": f"budget-sweep-{func}",
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {
                    "op": "multiply",
                    "args": [{"op": "add", "args": [{"input": 0}, {"const": 1}]}, {"const": 2}],
                },
            },
            {"id": "r", "op": "reduce", "input": "y", "func": func, "axes": [0]},
            {"id": "out", "op": "write", "input": "r", "target": str(target)},
        ],
    }


def sweep_budgets(
    cli: Cli,
    source: Path,
    plan_of: Callable[[Path], dict[str, Any]],
    want: np.ndarray,
    budgets_mb: range,
    tmp_path: Path,
) -> list[int]:
    """Runs the plan `plan_of(target)` makes at each budget (MB) on 16 threads asked; checks
    every refusal names a need larger than the budget for tasks, every run's values (`want`,
    numpy's) and peak RSS (the guarantee), and that no budget above the smallest admitted one
    is refused. Returns the budgets admitted."""
    baseline = min(cli("info", source, "--json", measure_rss=True).peak_rss for _ in range(2))
    admitted, refused = [], []
    for mb in budgets_mb:
        target = tmp_path / f"out-{mb}.zarr"
        plan = cli.write_plan(plan_of(target))
        args = ["run", plan, "--max-mem", f"{mb}MB", "--threads", "16", "--json"]
        args += ["--work-dir", tmp_path / "work"]
        result = cli(*args, expect_rc=None, timeout=60, measure_rss=True)
        if result.returncode != 0:
            found = re.search(
                r"needs ([\d.]+) MiB.* but the budget for tasks is ([\d.]+) MiB", result.stderr
            )
            assert found, result.describe()
            # (Both rounded to 0.1 MiB.)
            assert float(found[1]) >= float(found[2]), result.describe()
            assert not target.exists()
            refused.append(mb)
            continue
        summary = result.json()
        limit = summary["max_mem"] + baseline + SMALL_BUDGET_SLACK
        label = (
            f"{summary['plan']} at {mb}MB ({summary['threads']} threads): peak RSS "
            f"{result.peak_rss / MIB:.1f} MiB, limit {limit / MIB:.1f} MiB"
        )
        assert result.peak_rss < limit, label
        out = np.asarray(open_zarr(target)[...])
        assert out.shape == want.shape, label
        np.testing.assert_allclose(
            out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()), err_msg=label
        )
        admitted.append(mb)
    assert admitted, f"every budget refused ({list(budgets_mb)} MB)"
    after = [mb for mb in refused if mb > min(admitted)]
    assert not after, f"admitted at {min(admitted)}MB, refused at {after} MB"
    return admitted


def sweep_reduction(
    cli: Cli, source: Path, func: str, budgets_mb: range, tmp_path: Path
) -> list[int]:
    """`sweep_budgets` of func((x + 1) * 2, axis=0) over `source`."""
    x = np.asarray(open_zarr(source)[...]).astype(np.float64)
    want = REDUCTIONS[func]((x + 1) * 2, axis=0)
    return sweep_budgets(
        cli, source, lambda t: reduce_plan(func, source, t), want, budgets_mb, tmp_path
    )


@pytest.mark.parametrize("func", list(REDUCTIONS))
def test_a_larger_budget_never_refuses_a_reduction(
    cli: Cli, small_era5: Path, tmp_path: Path, func: str
) -> None:
    """Budgets from below the smallest task to four threads' worth, MB by MB."""
    admitted = sweep_reduction(cli, small_era5, func, range(8, 34), tmp_path)
    assert max(admitted) == 33


@pytest.fixture(scope="module")
def thread_step_array(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """(8, 600, 700) float32 in one chunk per time step: its sum's task needs about 12.8 MiB,
    which a 16MB budget holds on one thread and a 17MB one does not on two (the second
    thread's 2 MiB are set aside)."""
    path = tmp_path_factory.mktemp("thread-step") / "x.zarr"
    values = np.random.default_rng(11).standard_normal((8, 600, 700), dtype=np.float32)
    arr = zarr.create_array(store=str(path), shape=values.shape, chunks=(1, 600, 700), dtype="f4")
    arr[:] = values
    return path


def test_a_budget_that_affords_another_thread_runs_what_it_ran_without(
    cli: Cli, thread_step_array: Path, tmp_path: Path
) -> None:
    """Where a task fits the budget only without another thread's overhead set aside, the
    run takes fewer threads rather than being refused."""
    admitted = sweep_reduction(cli, thread_step_array, "sum", range(12, 23), tmp_path)
    assert 17 in admitted


@pytest.fixture(scope="module")
def era5_72(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """72 ERA5-like time steps of 1 MB: more than one 64 MiB group of a reduction over time
    on one thread, so the groups' partial results wait to be merged."""
    path = tmp_path_factory.mktemp("era5-72") / "era5.zarr"
    args = ["--time", "72", "--lat", "361", "--lon", "720"]
    subprocess.run([sys.executable, MAKE_ERA5, path, *args], check=True, capture_output=True)
    return path


def test_chunks_kept_for_a_later_stage_leave_room_for_partial_results(
    cli: Cli, era5_72: Path, tmp_path: Path
) -> None:
    """x - x.mean(axis=0): the mean's stage keeps x's chunks for the subtraction within the
    room its tasks leave, the partial results of its groups included. (Counting the tasks
    alone, the kept chunks took the bytes the last group waited for, and 14-16 MB runs hung.)"""
    plan = json.loads((PLANS / "era5-anomaly.json").read_text())
    plan["ops"][-1] = {"id": "out", "op": "write", "input": "a", "target": "${target}"}
    x = np.asarray(open_zarr(era5_72)[...]).astype(np.float64)
    want = x - x.mean(axis=0, keepdims=True)

    def plan_of(target: Path) -> dict[str, Any]:
        text = json.dumps(plan).replace("${source}", str(era5_72))
        return json.loads(text.replace("${target}", str(target)))

    sweep_budgets(cli, era5_72, plan_of, want, range(12, 19), tmp_path)


# --- Budgets from Python: text as Cubed writes it, and refusals --------------------------------


@pytest.fixture(scope="module")
def small_array(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """(8, 512, 512) float32 in 1 MiB chunks."""
    path = tmp_path_factory.mktemp("budgets") / "x.zarr"
    values = np.random.default_rng(3).standard_normal((8, 512, 512), dtype=np.float32)
    arr = zarr.create_array(store=str(path), shape=values.shape, chunks=(1, 512, 512), dtype="f4")
    arr[:] = values
    return path, values


def sum_plan(source: Path, target: Path) -> dict[str, Any]:
    return {
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {"id": "s", "op": "reduce", "input": "x", "func": "sum", "axes": [0]},
            {"id": "out", "op": "write", "input": "s", "target": str(target)},
        ],
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64MB", 64 * 10**6), ("512MiB", 512 * MIB), ("2 GB", 2 * 10**9), (64 * MIB, 64 * MIB)],
)
def test_run_plan_takes_budgets_as_text(
    small_array: tuple[Path, np.ndarray], tmp_path: Path, text: str | int, expected: int
) -> None:
    import chunkfuse

    source, values = small_array
    summary = chunkfuse.run_plan(sum_plan(source, tmp_path / "s.zarr"), max_mem=text)
    assert summary["max_mem"] == expected
    out = np.asarray(open_zarr(tmp_path / "s.zarr")[...])
    np.testing.assert_allclose(out, values.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_bad_budget_text_is_an_error_naming_the_argument(
    small_array: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    import chunkfuse
    import chunkfuse.dask
    import dask.array as da
    from chunkfuse.cubed import RustExecutor

    source, _ = small_array
    with pytest.raises(ValueError, match=r"max_mem: .*invalid size \"lots\""):
        chunkfuse.run_plan(sum_plan(source, tmp_path / "s.zarr"), max_mem="lots")
    with pytest.raises(ValueError, match=r"max_mem: .*invalid size unit \"parsecs\""):
        da.from_zarr(str(source)).sum().compute(scheduler=chunkfuse.dask.get, max_mem="2 parsecs")
    with pytest.raises(TypeError, match=r"max_mem must be a number of bytes or text"):
        chunkfuse.run_plan(sum_plan(source, tmp_path / "s.zarr"), max_mem=1.5)  # type: ignore[arg-type]
    import cubed

    x = cubed.from_zarr(str(source), spec=cubed.Spec(allowed_mem="500MB"))
    with pytest.raises(ValueError, match=r"RustExecutor: max_mem: .*invalid size \"much\""):
        cubed.array_api.sum(x).compute(executor=RustExecutor(max_mem="much"))
    assert not (tmp_path / "s.zarr").exists()


def test_dask_get_takes_budgets_as_text(small_array: tuple[Path, np.ndarray]) -> None:
    import chunkfuse.dask
    import dask.array as da

    source, values = small_array
    total = da.from_zarr(str(source)).sum(axis=0)
    out = total.compute(scheduler=chunkfuse.dask.get, max_mem="256MiB")
    assert chunkfuse.dask.last_stats().native_tasks > 0
    np.testing.assert_allclose(out, values.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_rust_executor_takes_budgets_as_text(
    small_array: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    import cubed
    import cubed.array_api as xp
    from chunkfuse.cubed import RustExecutor

    source, values = small_array
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="500MB")
    executor = RustExecutor(max_mem="1GB")
    out = xp.sum(cubed.from_zarr(str(source), spec=spec), axis=0).compute(executor=executor)
    assert executor.last_stats.max_mem == 10**9
    assert executor.last_stats.native_ops and not executor.last_stats.python_ops
    np.testing.assert_allclose(out, values.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_rust_executor_refuses_an_explicit_budget_too_small_for_a_task(
    small_array: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    """An explicit max_mem smaller than one task is refused, naming the task and the bytes it
    needs: it used to run the ops in Python instead, past the budget asked for."""
    import cubed
    import cubed.array_api as xp
    from chunkfuse.cubed import RustExecutor

    source, _ = small_array
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="500MB")
    executor = RustExecutor(max_mem="2MB")
    x = cubed.from_zarr(str(source), spec=spec)
    with pytest.raises(MemoryError, match=r"needs [\d.]+ MiB but the budget for tasks is"):
        xp.negative(x).compute(executor=executor)
    assert not executor.last_stats.python_ops
