"""Dask arrays computed by chunkfuse: one argument, ``scheduler=chunkfuse.dask.get``.

    python examples/dask_quickstart.py [--time T --lat Y --lon X]

Makes a small ERA5-like 2 m temperature dataset, opens it with ``da.from_zarr`` and, with
``chunkfuse.dask.get`` as the scheduler:

1. computes ``((x + 1) * 2).sum(axis=0)`` and the time mean;
2. writes the anomaly ``x - mean`` to Zarr (``to_zarr(..., compute=False)`` then ``compute``);
3. shows ``dask.diagnostics.ProgressBar`` working with it;
4. opens the dataset with xarray (Dask-backed) and computes the standard deviation over time
   and the largest anomaly, xarray's NaN-skipping reductions;
5. joins the first and last weeks along time (``da.concatenate``) and stacks their means
   (``da.stack``).

All of these tasks are ones chunkfuse recognises, so they run in the engine (it prints how many
tasks ran where).

Every result is checked against numpy (and the written array against the anomaly).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import chunkfuse.dask
import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr
from dask.diagnostics import ProgressBar
from xarray_cubed import make_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--lat", type=int, default=181)
    parser.add_argument("--lon", type=int, default=360)
    args = parser.parse_args()
    get = chunkfuse.dask.get

    with tempfile.TemporaryDirectory() as tmp:
        source = str(Path(tmp) / "era5.zarr")
        make_dataset(source, args.time, args.lat, args.lon)
        x = da.from_zarr(source, component="t2m")
        values = zarr.open_array(source, path="t2m")[:]

        # 1. A fused elementwise chain into a reduction, and a mean.
        t0 = time.perf_counter()
        total, mean = dask.compute(((x + 1) * 2).sum(axis=0), x.mean(axis=0), scheduler=get)
        elapsed = time.perf_counter() - t0
        np.testing.assert_allclose(total, ((values + 1) * 2).sum(axis=0), rtol=1e-5)
        np.testing.assert_allclose(mean, values.mean(axis=0), rtol=1e-5)
        first = chunkfuse.dask.last_stats()
        print(f"sum and mean of {x.shape} {x.dtype} in {elapsed:.2f} s")

        # 2. The anomaly written to Zarr, with a progress bar.
        target = str(Path(tmp) / "anomaly.zarr")
        store = (x - x.mean(axis=0)).to_zarr(target, compute=False)
        with ProgressBar():
            store.compute(scheduler=get)
        second = chunkfuse.dask.last_stats()
        written = zarr.open_array(target)[:]
        # Dask's own scheduler computes the same, its float32 mean to float32 precision.
        reference = (x - x.mean(axis=0)).compute(scheduler="sync")
        np.testing.assert_allclose(written, reference, atol=1e-4)
        name = Path(target).name
        print(f"anomaly written to {name}: {written.shape}, matches Dask's sync scheduler")

        # 4. xarray on Dask: its reductions skip NaNs (nanvar, nansum through where/isnan).
        t2m = xr.open_zarr(source, consolidated=False).t2m
        spread = t2m.std("time")
        extreme = abs(t2m - t2m.mean("time")).max("time")
        t0 = time.perf_counter()
        got_spread = spread.compute(scheduler=get)
        third = chunkfuse.dask.last_stats()
        got_extreme = extreme.compute(scheduler=get)
        fourth = chunkfuse.dask.last_stats()
        elapsed = time.perf_counter() - t0
        want_spread, want_extreme = dask.compute(spread, extreme, scheduler="sync")
        np.testing.assert_allclose(got_spread, want_spread, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_extreme, want_extreme, rtol=1e-4, atol=1e-4)
        print(f"xarray: std over time and largest anomaly in {elapsed:.2f} s, match Dask's")
        # 5. Joins: the first and last weeks of the record joined along time, and their
        # means stacked (`da.concatenate` and `da.stack` are the engine's `concat`).
        week = min(7, args.time // 2)
        ends = da.concatenate([x[:week], x[-week:]], axis=0)
        means = da.stack([x[:week].mean(axis=0), x[-week:].mean(axis=0)])
        got_peak, got_means = dask.compute(ends.max(axis=0), means, scheduler=get)
        fifth = chunkfuse.dask.last_stats()
        joined = np.concatenate([values[:week], values[-week:]])
        np.testing.assert_array_equal(got_peak, joined.max(axis=0))
        want_means = np.stack([values[:week].mean(axis=0), values[-week:].mean(axis=0)])
        np.testing.assert_allclose(got_means, want_means, rtol=1e-5)
        print(f"first and last {week} steps joined and their means stacked: {got_means.shape}")
        runs = (first, second, third, fourth, fifth)
        native = sum(r.native_tasks for r in runs)
        python = sum(r.python_tasks for r in runs)
        print(f"Dask tasks run by the engine {native}, Python tasks {python}")


if __name__ == "__main__":
    main()
