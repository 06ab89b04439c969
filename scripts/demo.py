"""`make demo`: make a small ERA5-like dataset, run the plans on it, show what was computed.

    python scripts/demo.py [--time 32] [--dir .demo] [--max-mem 1GB]

Every figure printed comes from the engine's own run summary (`chunkfuse ... --json`); the
result of each plan is checked against numpy on the same data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import zarr

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("CHUNKFUSE_BIN", ROOT / "target" / "release" / "chunkfuse"))


def chunkfuse(*args: str) -> dict[str, Any]:
    """Run the CLI with --json and return its summary."""
    out = subprocess.run([str(BIN), *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def report(title: str, s: dict[str, Any]) -> None:
    secs = s["seconds"]
    print(f"{title}")
    for stage in s["stages"]:
        print(
            f"    stage {stage['index']}: {stage['label']} ({stage['kind']}, {stage['strategy']}, "
            f"{stage['tasks']} tasks, {stage['seconds']:.2f} s)"
        )
    print(
        f"    {secs:.2f} s, {s['tasks']} tasks on {s['threads']} threads, "
        f"decoded {s['decoded_bytes'] / 1e9:.2f} GB ({s['decoded_bytes'] / 1e9 / secs:.2f} GB/s), "
        f"wrote {s['bytes_written'] / 1e6:.0f} MB, "
        f"peak RSS {s['peak_rss'] / 2**20:.0f} MiB of a {s['max_mem'] / 2**20:.0f} MiB budget"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=32)
    parser.add_argument("--dir", type=Path, default=ROOT / ".demo")
    parser.add_argument("--max-mem", default="1GB")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    src = args.dir / f"era5_t{args.time}.zarr"
    if not (src / "zarr.json").exists():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "make_era5.py"),
                str(src),
                "--time",
                str(args.time),
            ],
            check=True,
        )
    info = json.loads(
        subprocess.run(
            [str(BIN), "info", str(src), "--json"], check=True, capture_output=True, text=True
        ).stdout
    )
    print(
        f"input {src}: {info['shape']} {info['dtype']}, chunks {info['chunks']}, "
        f"{', '.join(info['codecs'])}, {info['nbytes'] / 1e6:.0f} MB decoded, "
        f"compression {info['compression_ratio']:.2f}x\n"
    )
    x = zarr.open_array(str(src))[:]
    mm = ["--max-mem", args.max_mem]

    s = chunkfuse(
        "run",
        str(ROOT / "plans/era5-sum.json"),
        "--param",
        f"source={src}",
        "--param",
        f"target={args.dir / 'sum.zarr'}",
        *mm,
    )
    report("plans/era5-sum.json: sum((x + 1) * 2, axis=0)", s)
    got = zarr.open_array(str(args.dir / "sum.zarr"))[:]
    ref = ((x.astype(np.float64) + 1) * 2).sum(axis=0)
    print(
        "    max relative error vs numpy (float64): "
        f"{np.max(np.abs(got - ref) / np.abs(ref)):.1e}\n"
    )

    s = chunkfuse(
        "run",
        str(ROOT / "plans/era5-anomaly.json"),
        "--param",
        f"source={src}",
        "--param",
        f"target={args.dir / 'anomaly.zarr'}",
        *mm,
    )
    report("plans/era5-anomaly.json: x - mean(x, axis=0), sharded Zarr v3", s)
    got_a = zarr.open_array(str(args.dir / "anomaly.zarr"))
    err = np.max(np.abs(got_a[:] - (x - x.mean(axis=0, dtype=np.float64)).astype(np.float32)))
    print(
        f"    shards {got_a.shards}, inner chunks {got_a.chunks}; "
        f"max abs error vs numpy {err:.1e}\n"
    )

    s = chunkfuse(
        "rechunk",
        str(src),
        str(args.dir / "rechunked.zarr"),
        "--chunks",
        f"{args.time},73,144",
        "--overwrite",  # the previous demo's output
        *mm,
    )
    report(f"chunkfuse rechunk to ({args.time}, 73, 144), zstd level 3", s)
    same = bool(np.array_equal(zarr.open_array(str(args.dir / "rechunked.zarr"))[:], x))
    print(f"    identical to the source: {same}\n")

    for plan, title, reference in [
        (
            "era5-fft-lat",
            "mean over time of |rfft along latitude| (721 = 7 x 103)",
            lambda: np.abs(np.fft.rfft(x, axis=1)).mean(axis=0),
        ),
        (
            "era5-power-spectrum",
            "power spectrum along time, |rfft(x, axis=0)|^2",
            lambda: np.abs(np.fft.rfft(x, axis=0)) ** 2,
        ),
    ]:
        out = args.dir / f"{plan}.zarr"
        s = chunkfuse(
            "run",
            str(ROOT / f"plans/{plan}.json"),
            "--param",
            f"source={src}",
            "--param",
            f"target={out}",
            *mm,
        )
        report(f"plans/{plan}.json: {title}", s)
        want = reference()
        err = float(np.abs(zarr.open_array(str(out))[:] - want).max() / np.abs(want).max())
        print(f"    max error vs numpy.fft, relative to the peak: {err:.1e}\n")
        same = same and err < 1e-5

    print("examples/era5_fft.py (xarray + Cubed + RustExecutor):")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "era5_fft.py")], check=False)
    return 0 if same and done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
