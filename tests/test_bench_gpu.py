"""bench/gpu.py: its two arrays differ in compressibility as it says, and `--quick` runs end to
end on a machine with a CUDA GPU or refuses clearly without one."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench_gpu() -> Any:
    """bench/gpu.py as a module, loaded by path: putting bench/ on sys.path would shadow
    packages by its scripts' names (bench/distributed.py and dask's `distributed`)."""
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu = _bench_gpu()


def test_the_smooth_array_compresses_better_than_the_noisy_one(tmp_path: Path) -> None:
    shape = (4, 73, 144)
    ratios = {}
    for kind in ("smooth", "noisy"):
        url = gpu.make(tmp_path, shape, kind)
        values = chunkfuse.read(url)
        np.testing.assert_array_equal(values[2], gpu.field(2, 73, 144, kind))
        ratios[kind] = values.nbytes / gpu.stored_bytes(url)
        assert not (tmp_path / f"{kind}-raw.zarr").exists()
    assert ratios["smooth"] > 1.5 * ratios["noisy"] and ratios["noisy"] > 1.0, ratios


def test_quick_runs_on_a_gpu_and_refuses_clearly_without_one(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "gpu.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not torch.cuda.is_available():
        assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr, done.stderr
        assert not out.exists()
        return
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"smooth", "noisy"}
    assert all(r["device_stats"]["device_decoded"] > 0 for r in results.values()), results


def test_the_report_gives_each_stage_s_speed_ups_and_placement() -> None:
    """The report's arithmetic and layout, from made-up figures (no GPU needed)."""
    import argparse

    stats = {
        k: 0.1
        for k in [
            "wait_seconds",
            "device_seconds",
            "upload_seconds",
            "decode_seconds",
            "place_seconds",
            "seconds",
        ]
    }
    stats |= {"chunks": 4, "device_decoded": 4}
    stage = {
        "cpu_s": 0.3,
        "cuda_s": 0.1,
        "cpu_process_s": 0.5,
        "cuda_process_s": 1.0,
        "cpu_stages": [],
        "cuda_stages": [["sum of y", "gpu", None, 0.09], ["write", "cpu", "a copy", 0.01]],
    }
    result = {
        "decoded_gb": 1.0,
        "ratio": 4.0,
        "host_read_s": 0.2,
        "device_read_s": 0.1,
        "host_read_to_gpu_s": 0.3,
        "batches_cpu_s": 1.0,
        "batches_gpu_s": 0.5,
        "batches_cpu_grouped_s": 0.8,
        "batches_grouped_s": 0.4,
        "batch_samples": 64,
        "device_stats": stats,
        "nvcomp_gbs_by_frames": {1: 1.0},
        "stages": {"era5-sum": stage},
        "encode": {
            "chunks": 4,
            "decoded_bytes": 2_000_000_000,
            "level": 3,
            "threads": 16,
            "cpu_seconds": 0.5,
            "cpu_compressed_bytes": 500_000_000,
            "device": {
                "device": "cuda: a GPU",
                "upload_seconds": 0.2,
                "encode_seconds": 0.25,
                "compressed_bytes": 400_000_000,
                "frames_verified": 4,
                "frames_with_content_size": 4,
            },
        },
    }
    args = argparse.Namespace(time=4, lat=73, lon=144, repeat=1, batches=2, per_batch=32)
    text = gpu.report({"smooth": result}, "a machine", args)
    row = next(line for line in text.splitlines() if line.startswith("| smooth | era5-sum"))
    assert "| 0.300 s | 0.100 s | 3.00x | 0.500 s | 1.000 s | 0.50x |" in row, row
    assert "sum of y: gpu 0.090 s; write: cpu 0.010 s (a copy)" in row, row
    encode = next(line for line in text.splitlines() if "zstd encode" in line)
    assert "libzstd level 3 on 16 threads 4.0 GB/s (ratio 4.00)" in encode, encode
    assert "nvCOMP 8.0 GB/s (ratio 5.00; 2.00x libzstd's rate; upload 0.200 s" in encode, encode
    assert "4 of 4 frames decode back, 4 record their size." in encode, encode
    failed = gpu.encode_line("noisy", {"error": "no nvCOMP"})
    assert failed == "- noisy, zstd encode of every chunk: failed: no nvCOMP", failed


def test_the_loader_line_gives_rates_and_the_speed_up() -> None:
    line = gpu.loader_line("smooth", {"host_s": 2.0, "device_s": 0.5, "batches": 10})
    assert "host + .cuda() 5.0 batches/s" in line and "20.0 batches/s, 4.00x" in line, line
    skipped = gpu.loader_line("noisy", {"skipped": "no xarray"})
    assert skipped == "- noisy, window loader: not measured: no xarray", skipped
