"""Two builds of the `chunkfuse` CLI side by side: every plan in plans/ on two data sets of
different compressibility, the two binaries' runs alternating, so that a refactor can show it
costs nothing.

    python bench/ab_binaries.py --base /tmp/old/chunkfuse [--new target/release/chunkfuse]
        [--data DIR] [--time 64] [--repeat 5] [--max-mem 1GB] [--threads N]

Makes (or reuses) an ERA5-like float32 (time, 721, 1440) array, one chunk per step (zstd 3,
scripts/make_era5.py), and the same field rounded to 0.5 K (about three times more
compressible). Each round runs each plan with the base binary, then the new one (whole
processes, `run PLAN --json`); a pair's ratio is the new run's seconds (its own `seconds`,
opening the arrays included) over the base run's. Prints a Markdown table: each binary's best
seconds, the median of the pairs' ratios and their range, and the new run's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _noisy(data: Path, steps: int) -> Path:
    path = data / f"era5-{steps}x721x1440.zarr"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_era5.py"), str(path), "--time", str(steps)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


def _quantized(data: Path, steps: int) -> Path:
    import zarr

    path = data / f"era5-q-{steps}x721x1440.zarr"
    if not path.exists():
        src = zarr.open_array(str(_noisy(data, steps)), mode="r")
        out = zarr.create_array(
            str(path), shape=src.shape, chunks=src.chunks, dtype=src.dtype,
            compressors=src.compressors,
        )  # fmt: skip
        for t in range(0, steps, 8):
            out[t : t + 8] = np.round(src[t : t + 8] * 2) / 2
    return path


def _ratio(path: Path) -> float:
    stored = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    import zarr

    a = zarr.open_array(str(path), mode="r")
    return a.nbytes / stored


def _run(binary: Path, plan: Path, source: Path, target: Path, args: list[str]) -> dict[str, Any]:
    """One whole-process run: its summary."""
    out = subprocess.run(
        [str(binary), "run", str(plan), "--param", f"source={source}"]
        + ["--param", f"target={target}", "--json", "--fresh", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    summary: dict[str, Any] = json.loads(out.stdout)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline binary")
    parser.add_argument("--new", type=Path, default=ROOT / "target/release/chunkfuse")
    parser.add_argument("--data", type=Path, default=ROOT / "bench/data")
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--max-mem", default="1GB")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    sets = {"noisy": _noisy(args.data, args.time), "quantized": _quantized(args.data, args.time)}
    # The runs' outputs and work directories are this run's and go with it.
    with tempfile.TemporaryDirectory(prefix="chunkfuse-ab-") as work:
        rows = _compare(args, sets, Path(work))
    ratios_text = ", ".join(f"{k} {_ratio(p):.2f}" for k, p in sets.items())
    print(
        f"Data: (time, lat, lon) = ({args.time}, 721, 1440) float32, one chunk per step, zstd 3; "
        f"compression ratios {ratios_text}. --max-mem {args.max_mem}, --threads {args.threads}, "
        f"{args.repeat} rounds.\n"
    )
    print("| data | plan | base best s | new best s | new/base median (range) | new peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for set_name, plan, b, n, ratios, rss in rows:
        med = statistics.median(ratios)
        print(
            f"| {set_name} | {plan} | {b:.3f} | {n:.3f} | {med:.3f} "
            f"({min(ratios):.2f}–{max(ratios):.2f}) | {rss / 2**20:.0f} |"
        )
    return 0


def _compare(
    args: argparse.Namespace, sets: dict[str, Path], work: Path
) -> list[tuple[str, str, float, float, list[float], int]]:
    """Each plan run by both binaries on each data set, outputs under `work`: per (set,
    plan), the best seconds of each, the new/base ratios and the new binary's peak RSS."""
    run_args = ["--max-mem", args.max_mem, "--threads", str(args.threads), "--work-dir", str(work)]
    plans = sorted((ROOT / "plans").glob("*.json"))
    rows = []
    for set_name, source in sets.items():
        for plan in plans:
            base: list[float] = []
            new: list[float] = []
            rss = 0
            for r in range(args.repeat):
                b = _run(args.base, plan, source, work / f"{plan.stem}-{r}-base.zarr", run_args)
                n = _run(args.new, plan, source, work / f"{plan.stem}-{r}-new.zarr", run_args)
                base.append(b["seconds"])
                new.append(n["seconds"])
                rss = max(rss, int(n["peak_rss"]))
            ratios = [n / b for n, b in zip(new, base, strict=True)]
            rows.append((set_name, plan.stem, min(base), min(new), ratios, rss))
            print(f"{set_name} {plan.stem}: {statistics.median(ratios):.3f}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(main())
