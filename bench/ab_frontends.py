"""Two builds of the Python package side by side: Cubed's RustExecutor and chunkfuse.dask.get on
the same workloads, each build in its own interpreter, their runs alternating, so that a
refactor of the front ends (or of the engine under them) can show it costs nothing.

    python bench/ab_frontends.py --base-python OLDVENV/bin/python [--new-python PY]
        [--data DIR] [--time 64] [--repeat 5] [--threads N]

OLDVENV is a virtual environment with the baseline build installed (`pip install` of its
wheel); `--new-python` defaults to this interpreter. Each run is one process that imports
everything, opens the ERA5-like array (scripts/make_era5.py; made if absent) and times only
the work (`time.perf_counter`). Prints a Markdown table: each build's best seconds, and the
median and range of the pairs' ratios (new over base).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Workloads: name -> Python code that sets `seconds` (SRC, DST and THREADS are given).
DASK = """
import time, dask.array as da, numpy as np, chunkfuse.dask
x = da.from_zarr(SRC)
t = time.perf_counter()
{expr}.compute(scheduler=chunkfuse.dask.get, num_workers=THREADS)
seconds = time.perf_counter() - t
"""
OVERHEAD = """
import time, operator, chunkfuse.dask
n = 20_000
dsk = {("inc", i): (operator.add, i, 1) for i in range(n)}
dsk["total"] = (sum, [("inc", i) for i in range(n)])
t = time.perf_counter()
chunkfuse.dask.get(dsk, "total", num_workers=THREADS)
seconds = time.perf_counter() - t
"""
CUBED = """
import time, cubed, cubed.array_api as xp
from chunkfuse import RustExecutor
spec = cubed.Spec(work_dir=WORK, allowed_mem="1GB")
x = cubed.from_zarr(SRC, spec=spec)
t = time.perf_counter()
cubed.to_zarr({expr}, DST, executor=RustExecutor(max_workers=THREADS))
seconds = time.perf_counter() - t
"""
WORKLOADS = {
    "dask: x.mean(axis=0)": DASK.format(expr="x.mean(axis=0)"),
    "dask: x.std(axis=0)": DASK.format(expr="x.std(axis=0)"),
    "dask: (x - x.mean(axis=0)).sum(axis=(1, 2))": DASK.format(
        expr="(x - x.mean(axis=0)).sum(axis=(1, 2))"
    ),
    "dask: 20,000 trivial tasks": OVERHEAD,
    "cubed: xp.sum((x + 1) * 2, axis=0)": CUBED.format(expr="xp.sum((x + 1) * 2, axis=0)"),
    "cubed: x - xp.mean(x, axis=0)": CUBED.format(expr="x - xp.mean(x, axis=0, keepdims=True)"),
}


def _source(data: Path, steps: int) -> Path:
    path = data / f"era5-{steps}x721x1440.zarr"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_era5.py"), str(path), "--time", str(steps)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


def _run(python: str, code: str, source: Path, threads: int) -> float:
    with tempfile.TemporaryDirectory(prefix="chunkfuse-abf-") as work:
        prelude = (
            f"SRC = {str(source)!r}; DST = {work + '/out.zarr'!r}; WORK = {work!r}; "
            f"THREADS = {threads}\n"
        )
        script = prelude + code + "\nimport json; print(json.dumps({'seconds': seconds}))\n"
        out = subprocess.run(
            [python, "-c", script], check=True, capture_output=True, text=True, cwd=work
        )
    seconds: float = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-python", required=True)
    parser.add_argument("--new-python", default=sys.executable)
    parser.add_argument("--data", type=Path, default=ROOT / "bench/data")
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    source = _source(args.data, args.time)
    rows = []
    for name, code in WORKLOADS.items():
        base: list[float] = []
        new: list[float] = []
        for _ in range(args.repeat):
            base.append(_run(args.base_python, code, source, args.threads))
            new.append(_run(args.new_python, code, source, args.threads))
        ratios = [n / b for n, b in zip(new, base, strict=True)]
        rows.append((name, min(base), min(new), ratios))
        print(f"{name}: {statistics.median(ratios):.3f}", file=sys.stderr)
    print(
        f"Data: {source.name} (float32, one chunk per step, zstd 3); {args.threads} threads; "
        f"{args.repeat} rounds, the builds alternating.\n"
    )
    print("| workload | base best s | new best s | new/base median (range) |")
    print("|---|---:|---:|---:|")
    for name, b, n, ratios in rows:
        med = statistics.median(ratios)
        print(f"| {name} | {b:.3f} | {n:.3f} | {med:.3f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
