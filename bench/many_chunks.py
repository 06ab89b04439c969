"""Dask graphs over many small chunks, and the fixed cost of one tiny `get`, under
chunkfuse.dask.get against Dask's threaded scheduler.

    python bench/many_chunks.py [--data DIR] [--time 730] [--repeat 5] [--threads N]

Makes (or reuses) an ERA5-like float32 (time, 73, 144) array, one chunk per step (zstd 3,
scripts/make_era5.py), opens it with da.from_zarr and times, in this process, best of
--repeat for each scheduler (their runs alternating): `da.roll` along longitude, a
`da.concatenate` of two longitude slices, `fftshift` along longitude (each computed whole and
as a mean over time), `fftshift` over all axes, xrft's spectrum along longitude
(`abs(fftshift(fft(x, axis=2), axes=2))`, a mean over time) and `x[5, :32, :32]` (the per-call
cost of a tiny graph, best of 10x --repeat). Every result is checked against the threaded
scheduler's. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _array(data: Path, steps: int) -> Path:
    """The ERA5-like array of `steps` one-step chunks under `data` (made if absent)."""
    path = data / f"era5-{steps}x73x144.zarr"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_era5.py"), str(path), "--time", str(steps)]
            + ["--lat", "73", "--lon", "144"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


def _quantized(data: Path, steps: int) -> Path:
    """The same field rounded to 0.5 K (compresses about three times better than the noisy
    one, as packed reanalysis fields do), under `data` (made if absent)."""
    import zarr

    path = data / f"era5-q-{steps}x73x144.zarr"
    if not path.exists():
        src = zarr.open_array(str(_array(data, steps)), mode="r")
        out = zarr.create_array(
            str(path),
            shape=src.shape,
            chunks=src.chunks,
            dtype=src.dtype,
            compressors=src.compressors,
        )
        for t in range(0, steps, 73):
            out[t : t + 73] = np.round(src[t : t + 73] * 2) / 2
    return path


def _ratio(path: Path) -> float:
    """Decoded bytes over stored chunk bytes."""
    import zarr

    a = zarr.open_array(str(path), mode="r")
    stored = sum(p.stat().st_size for p in (path / "c").rglob("*") if p.is_file())
    return a.nbytes / max(stored, 1)


def _cases(x: Any) -> dict[str, Any]:
    import dask.array as da

    return {
        "roll (whole)": da.roll(x, 72, axis=2),
        "roll, mean over time": da.roll(x, 72, axis=2).mean(axis=0),
        "concatenate of slices (whole)": da.concatenate([x[:, :, 72:], x[:, :, :72]], axis=2),
        "concatenate of slices, mean": da.concatenate([x[:, :, 72:], x[:, :, :72]], axis=2).mean(
            axis=0
        ),
        "fftshift (whole)": da.fft.fftshift(x, axes=2),
        "fftshift, mean over time": da.fft.fftshift(x, axes=2).mean(axis=0),
        "fftshift over all axes, mean": da.fft.fftshift(x).mean(axis=0),
        "xrft spectrum: abs(fftshift(fft(lon))), mean": abs(
            da.fft.fftshift(da.fft.fft(x, axis=2), axes=2)
        ).mean(axis=0),
        "tiny get: x[5, :32, :32]": x[5, :32, :32],
    }


def _best(
    runs: dict[str, Callable[[], Any]], repeat: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """Best seconds of each run over `repeat` rounds (every run once per round), and the
    last result of each."""
    best = dict.fromkeys(runs, float("inf"))
    results: dict[str, Any] = {}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def many_chunk_lines(data: Path, steps: int, threads: int, repeat: int) -> list[str]:
    """The report section."""
    import chunkfuse.dask
    import dask.array as da

    rows = []
    sets = {"noisy": _array(data, steps), "quantized": _quantized(data, steps)}
    for label, path in sets.items():
        x = da.from_zarr(str(path))
        for name, y in _cases(x).items():
            n = repeat * 10 if name.startswith("tiny") else repeat
            runs = {
                "chunkfuse": lambda y=y: y.compute(
                    scheduler=chunkfuse.dask.get, num_workers=threads
                ),
                "threads": lambda y=y: y.compute(scheduler="threads", num_workers=threads),
            }
            best, results = _best(runs, n)
            # FFT magnitudes reach 1e5 here: float32 rounding is relative.
            np.testing.assert_allclose(
                results["chunkfuse"], results["threads"], rtol=1e-5, atol=1e-2
            )
            ours, theirs = best["chunkfuse"], best["threads"]
            rows.append(
                f"| {label} | {name} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | "
                f"{ours / theirs:.2f} |"
            )
    ratios = ", ".join(f"{label} {_ratio(path):.1f}" for label, path in sets.items())
    return [
        "## Many small chunks: chunkfuse.dask.get vs Dask's threaded scheduler",
        "",
        f"float32 ({steps}, 73, 144), one chunk per step (zstd 3), `da.from_zarr`, two data "
        f"sets (compression ratio {ratios}: the ERA5-like field, and it rounded to 0.5 K); "
        f"{threads} threads; best of {repeat} (tiny get: of {repeat * 10}), in one process "
        "(`python bench/many_chunks.py`).",
        "",
        "| data | graph | chunkfuse.dask.get ms | dask threaded ms | ratio |",
        "|---|---|---:|---:|---:|",
        *rows,
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--time", type=int, default=730)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.data is None:
        with tempfile.TemporaryDirectory(prefix="chunkfuse-many-") as tmp:
            lines = many_chunk_lines(Path(tmp), args.time, args.threads, args.repeat)
    else:
        args.data.mkdir(parents=True, exist_ok=True)
        lines = many_chunk_lines(args.data, args.time, args.threads, args.repeat)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
