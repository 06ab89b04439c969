"""Reductions run whole on the GPU: with `device="cuda"`, a reduction of one array's values
(through a fused elementwise program) reads the array onto the device (zstd chunks decoded
there by nvCOMP), folds it there and writes its output from the finished values. Its results
equal the CPU run's: minima and maxima bit for bit, sums and means within 1e-6 relative (the
device adds in float64 throughout; the CPU adds float32 values 16 at a time in float32
first). Reductions the device has no form of run on the CPU in the same run, saying why.

Arrays are written by the engine (no zarr-python), so this file runs on GPU machines that
lack it; without a GPU its tests skip (CHUNKFUSE_REQUIRE_GPU=1 makes them fail instead).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
from test_device import GPU_ERROR
from test_device_read import _array

needs_gpu = pytest.mark.skipif(
    GPU_ERROR is not None and not os.environ.get("CHUNKFUSE_REQUIRE_GPU"),
    reason=f"no usable GPU: {GPU_ERROR}",
)

EXACT = {"min", "max", "nanmin", "nanmax", "argmin", "argmax", "nanargmin", "nanargmax"}


def _reduce_plan(
    func: str, axes: list[int], keepdims: bool = False, ddof: float = 0.0
) -> dict[str, Any]:
    """`func((x + 1) * 2, axes)` written uncompressed."""
    affine = {
        "op": "multiply",
        "args": [{"op": "add", "args": [{"input": 0}, {"const": 1}]}, {"const": 2}],
    }
    return {
        "name": f"device-{func}",
        "arrays": [{"id": "x", "zarr": "${source}"}],
        "ops": [
            {"id": "y", "op": "elementwise", "inputs": ["x"], "expr": affine},
            {
                "id": "r",
                "op": "reduce",
                "input": "y",
                "func": func,
                "axes": axes,
                "keepdims": keepdims,
                "ddof": ddof,
            },
            {"id": "out", "op": "write", "input": "r", "target": "${target}"},
        ],
    }


def _both(
    tmp: Path, source: str, plan: dict[str, Any], tag: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The plan's output computed on the CPU and on the GPU, and the GPU run's summary."""
    out: dict[str, np.ndarray] = {}
    summary: dict[str, Any] = {}
    for device in ["cpu", "cuda"]:
        target = str(tmp / f"{tag}-{device}.zarr")
        summary = chunkfuse.run_plan(
            plan, {"source": source, "target": target}, device=device, threads=2
        )
        out[device] = chunkfuse.read(target)
    return out["cpu"], out["cuda"], summary


def _same(func: str, cpu: np.ndarray, gpu: np.ndarray, what: str) -> None:
    assert cpu.dtype == gpu.dtype and cpu.shape == gpu.shape, what
    if func in EXACT:
        np.testing.assert_array_equal(gpu, cpu, err_msg=what)
    else:
        np.testing.assert_allclose(gpu, cpu, rtol=1e-6, atol=1e-6, err_msg=what)


@pytest.fixture
def with_nans(tmp_path: Path) -> str:
    values = np.random.default_rng(1).normal(size=(9, 13, 17)).astype(np.float32)
    values[values > 1.8] = np.nan
    values[:, 0, 0] = np.nan  # a lane of NaNs only along axis 0
    return _array(tmp_path, values, (2, 4, 8))


@needs_gpu
@pytest.mark.parametrize(
    "func", ["sum", "nansum", "mean", "nanmean", "min", "max", "nanmin", "nanmax"]
)
def test_reductions_on_the_gpu_equal_the_cpu_s(tmp_path: Path, with_nans: str, func: str) -> None:
    for axes in [[0], [1, 2], [0, 2], [0, 1, 2]]:
        cpu, gpu, summary = _both(tmp_path, with_nans, _reduce_plan(func, axes), f"{axes}")
        _same(func, cpu, gpu, f"{func} over {axes}")
        reduce = [s for s in summary["stages"] if s["kind"] == "reduce"]
        assert [s["device"] for s in reduce] == ["gpu"], summary["stages"]
        assert summary["gpu_blocks"] >= 1, summary


@needs_gpu
@pytest.mark.parametrize("func", ["var", "std", "nanvar", "nanstd"])
def test_variances_on_the_gpu_equal_the_cpu_s(tmp_path: Path, with_nans: str, func: str) -> None:
    for axes, ddof in [([0], 0.0), ([1, 2], 1.0), ([0, 2], 0.0), ([0, 1, 2], 1.0)]:
        plan = _reduce_plan(func, axes, ddof=ddof)
        cpu, gpu, summary = _both(tmp_path, with_nans, plan, f"{axes}")
        _same(func, cpu, gpu, f"{func} over {axes}, ddof {ddof}")
        reduce = [s for s in summary["stages"] if s["kind"] == "reduce"]
        assert [s["device"] for s in reduce] == ["gpu"], summary["stages"]


@needs_gpu
@pytest.mark.parametrize("func", ["argmin", "argmax", "nanargmin", "nanargmax"])
def test_arg_reductions_on_the_gpu_equal_the_cpu_s(tmp_path: Path, func: str) -> None:
    values = np.random.default_rng(3).integers(0, 4, size=(9, 13, 17)).astype(np.float32)
    values[values == 3] = np.nan  # ties and NaNs in most lanes
    source = _array(tmp_path, values, (2, 4, 8))
    for axes in [[0], [1], [2], [0, 1, 2]]:
        cpu, gpu, summary = _both(tmp_path, source, _reduce_plan(func, axes), f"{axes}")
        _same(func, cpu, gpu, f"{func} over {axes}")
        reduce = [s for s in summary["stages"] if s["kind"] == "reduce"]
        assert [s["device"] for s in reduce] == ["gpu"], summary["stages"]


@needs_gpu
def test_nanargmax_of_a_lane_of_nans_only_fails_on_the_gpu_as_on_the_cpu(
    tmp_path: Path, with_nans: str
) -> None:
    for device in ["cpu", "cuda"]:
        target = tmp_path / f"nanargmax-{device}.zarr"
        with pytest.raises(ValueError, match="nanargmax: all-NaN slice encountered"):
            chunkfuse.run_plan(
                _reduce_plan("nanargmax", [0]),
                {"source": with_nans, "target": str(target)},
                device=device,
            )


@needs_gpu
def test_float64_keepdims_and_arrays_the_cpu_decodes(tmp_path: Path) -> None:
    values = np.random.default_rng(2).normal(size=(6, 10, 12))
    for codec, shards in [("zstd", None), ("none", None), ("zstd", (6, 10, 12)), ("gzip", None)]:
        source = _array(tmp_path, values, (3, 5, 4), codec, shards)
        plan = _reduce_plan("mean", [0, 2], keepdims=True)
        cpu, gpu, summary = _both(tmp_path, source, plan, f"{codec}-{shards}")
        assert gpu.shape == (1, 10, 1) and gpu.dtype == np.float64
        _same("mean", cpu, gpu, f"{codec}, shards {shards}")
        np.testing.assert_allclose(gpu, ((values + 1) * 2).mean(axis=(0, 2), keepdims=True))


@needs_gpu
def test_a_reduction_without_a_device_form_runs_on_the_cpu_in_a_gpu_run(
    tmp_path: Path, with_nans: str
) -> None:
    values = chunkfuse.read(with_nans)
    cpu, gpu, summary = _both(tmp_path, with_nans, _reduce_plan("prod", [1]), "prod")
    np.testing.assert_array_equal(gpu, cpu)
    np.testing.assert_allclose(gpu, np.prod((values + 1) * 2, axis=1), rtol=1e-5)
    reduce = [s for s in summary["stages"] if s["kind"] == "reduce"]
    assert [(s["device"], s["device_note"]) for s in reduce] == [
        ("cpu", "the reduction runs on the CPU: prod has no device form yet")
    ], summary["stages"]
