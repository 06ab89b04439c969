"""The FFT section of bench/run.py: chunkfuse's FFT plans against dask.array.fft.

  fft-lat         plans/era5-fft-lat.json: mean over time of |rfft along latitude| (length 721 =
                  7 x 103, slow in every FFT library)  vs  Dask's ``abs(rfft(x, axis=1)).mean(0)``
  power-spectrum  plans/era5-power-spectrum.json: |rfft along time|^2, written in chunks
                  (T // 2 + 1, 73, 144)  vs  Dask rechunking time whole first (``--max-mem`` binds
                  chunkfuse; Dask has no such bound, its peak RSS is reported)

Both tools' outputs are compared (relative to the largest value: an FFT mixes every value of a
lane into every output).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "bench" / "peers.py"
PLANS = {"fft-lat": "era5-fft-lat.json", "power-spectrum": "era5-power-spectrum.json"}


def check(outputs: dict[str, Path]) -> dict[str, str]:
    """Each tool's output against chunkfuse's, within 1e-5 of the largest magnitude."""
    import zarr

    status: dict[str, str] = {}
    reference = None
    for tool, path in outputs.items():
        if not path.exists():
            status[tool] = "no output"
            continue
        value = np.asarray(zarr.open_array(str(path), mode="r")[...], dtype=np.float64)
        if reference is None:
            reference = value
        scale = float(np.abs(reference).max()) or 1.0
        ok = value.shape == reference.shape and float(np.abs(value - reference).max()) <= (
            1e-5 * scale
        )
        status[tool] = "ok" if ok else "MISMATCH"
    return status


def measure_fft(
    measure_rounds: Callable[..., Any],
    binary: Path,
    source: Path,
    work: Path,
    nbytes: int,
    threads: str,
    max_mem: str,
    repeat: int,
    target_chunks: tuple[int, ...],
    with_dask: bool,
) -> tuple[list[Any], dict[tuple[str, str], str]]:
    """Rows and output checks of the FFT workloads."""
    rows: list[Any] = []
    checks: dict[tuple[str, str], str] = {}
    for op, plan in PLANS.items():
        print(f"{op}:", file=sys.stderr)
        outputs: dict[str, Path] = {}
        jobs: list[tuple[str, str, list[str], int, Path | None]] = []
        dst = work / f"{op}-chunkfuse.zarr"
        argv = [
            str(binary),
            "run",
            str(REPO / "plans" / plan),
            "--param",
            f"source={source}",
            "--param",
            f"target={dst}",
            "--max-mem",
            max_mem,
            "--threads",
            threads,
            "--json",
        ]
        jobs.append((op, "chunkfuse", argv, nbytes, dst))
        outputs["chunkfuse"] = dst
        if with_dask:
            dst = work / f"{op}-dask.zarr"
            argv = [
                sys.executable,
                str(PEERS),
                "dask",
                op,
                str(source),
                str(dst),
                "--threads",
                threads,
                "--chunks",
                ",".join(map(str, target_chunks)),
                "--max-mem",
                max_mem,
            ]
            jobs.append((op, "dask", argv, nbytes, dst))
            outputs["dask"] = dst
        # In rounds (chunkfuse, Dask, chunkfuse, ...): both see the same host speed.
        rows += measure_rounds(jobs, repeat)
        for tool, status in check(outputs).items():
            checks[(op, tool)] = status
    return rows, checks
