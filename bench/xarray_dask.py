"""xarray on Dask: chunkfuse.dask.get against Dask's threaded scheduler, same code, same data.

    python bench/xarray_dask.py [--source ARRAY] [--data DIR] [--threads N] [--repeat R]

The ERA5-like array (float32 (time, lat, lon), one time step per chunk, zstd level 3) is
written once as an xarray dataset (variable ``t2m``) beside it, then opened with
``xr.open_zarr`` as users do: xarray's lazy backend arrays, its NaN-skipping reductions
(``nanmean``, ``nanvar``; its sums through ``isnan``/``where``), and ``x - x.mean("time")``
broadcast with a new axis. A second copy is packed as ERA5 is distributed (int16 with
``scale_factor``, ``add_offset`` and ``_FillValue``), which xarray decodes lazily. Each workload
is computed with ``.compute(scheduler=...)``, both schedulers in turn (rounds, best of
``--repeat``), in this process; the results are compared. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

WORKLOADS: dict[str, Callable[[Any], Any]] = {
    'mean("time")': lambda t: t.mean("time"),
    'std("time")': lambda t: t.std("time"),
    'abs(t - t.mean("time")).max("time")': lambda t: abs(t - t.mean("time")).max("time"),
}

#: The workloads also run on the packed copy.
PACKED_WORKLOADS = ('mean("time")', 'abs(t - t.mean("time")).max("time")')


#: How the packed copy stores ``t2m``: int16 steps of 2 mK around 265 K (±65 K).
PACKING = {"dtype": "int16", "scale_factor": 0.002, "add_offset": 265.0, "_FillValue": -32767}


def dataset(source: Path, data: Path, packed: bool = False) -> Path:
    """The xarray dataset holding `source` as ``t2m``, packed or not (written on first use)."""
    import dask.array as da
    import xarray as xr
    import zarr

    name = f"{source.stem}-xarray{'-packed' if packed else ''}"
    path = data / f"{name}.zarr"
    done = data / f"{name}.ok"
    if not done.exists():
        arr = zarr.open_array(source, mode="r")
        x = da.from_zarr(arr)
        ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), x)})
        encoding = {"chunks": arr.chunks, "compressors": arr.compressors}
        if packed:
            encoding.update(PACKING)
        ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False, encoding={"t2m": encoding})
        done.touch()
    return path


def timed(compute: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = compute()
    return time.perf_counter() - start, value


def xarray_lines(source: Path, data: Path, threads: int, repeat: int) -> list[str]:
    """The report section."""
    import chunkfuse.dask
    import dask
    import xarray as xr

    rows = []
    warnings.simplefilter("ignore", RuntimeWarning)
    # Values agree within float32 rounding of the data's magnitude (the time mean's largest):
    # Dask adds float32 in float32, the engine in float64.
    magnitude = None
    cases = [(False, name, build) for name, build in WORKLOADS.items()]
    cases += [(True, name, WORKLOADS[name]) for name in PACKED_WORKLOADS]
    opened: dict[bool, Any] = {}
    for packed, name, build in cases:
        if packed not in opened:
            path = dataset(source, data, packed)
            opened[packed] = xr.open_zarr(path, consolidated=False).t2m
        t2m = opened[packed]
        if packed:
            name = f"packed: {name}"
        expr = build(t2m)
        ours = theirs = float("inf")
        python_tasks = None
        for _ in range(repeat):
            seconds, got = timed(lambda e=expr: e.compute(scheduler=chunkfuse.dask.get))
            ours = min(ours, seconds)
            stats = chunkfuse.dask.last_stats()
            python_tasks = stats.python_tasks if stats is not None else None
            with dask.config.set(scheduler="threads", num_workers=threads):
                seconds, want = timed(lambda e=expr: e.compute())
            theirs = min(theirs, seconds)
        if magnitude is None:
            magnitude = float(np.nanmax(np.abs(want.values))) or 1.0
        atol = 8 * float(np.finfo(np.float32).eps) * magnitude
        ok = np.allclose(got.values, want.values, rtol=1e-5, atol=atol, equal_nan=True)
        rows.append(
            f"| `{name}` | {ours:.3f} | {theirs:.3f} | {theirs / ours:.1f}× | "
            f"{python_tasks} | {'ok' if ok else 'MISMATCH'} |"
        )
    shape = tuple(opened[False].shape)
    packing = ", ".join(f"{k} {v}" for k, v in PACKING.items())
    return [
        "## xarray on Dask: chunkfuse.dask.get vs Dask's threaded scheduler",
        "",
        f"`xr.open_zarr` of the same array as an xarray dataset (`t2m`, {shape}, float32, one "
        f"time step per chunk, zstd level 3); `.compute(scheduler=...)`; {threads} threads; "
        f"best of {repeat}, in rounds, in one process (`python bench/xarray_dask.py`). "
        "`Python tasks`: the tasks chunkfuse.dask ran in Python. `check`: the two results "
        "agree within 8 float32 ulps of the data's magnitude (Dask adds float32 in float32, "
        "the engine in float64). `packed`: the same values stored as ERA5 is distributed "
        f"({packing}), which xarray decodes lazily (to float64); chunkfuse.dask reads the "
        "int16 chunks and decodes them in its kernels.",
        "",
        "| workload | chunkfuse.dask s | Dask threaded s | speed-up | Python tasks | check |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
        "",
    ]


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source", type=Path, default=here / "data" / "era5-t256-721x1440-zstd3.zarr"
    )
    parser.add_argument("--data", type=Path, default=here / "data")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(xarray_lines(args.source, args.data, args.threads, args.repeat)))


if __name__ == "__main__":
    main()
