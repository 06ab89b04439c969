"""xarray + Cubed on chunkfuse: a temperature anomaly from the time mean, written to Zarr.

    python examples/xarray_cubed.py [--time T --lat Y --lon X] [--source era5.zarr]

Opens an ERA5-like dataset (made here with a `t2m` variable unless --source names one) with
`chunked_array_type="cubed"`, computes `t2m - t2m.mean("time")`, writes it to Zarr with
RustExecutor (zstd level 3), and checks the result against numpy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import cubed
import numpy as np
import xarray as xr
from chunkfuse import RustExecutor


def make_dataset(path: str, nt: int, ny: int, nx: int) -> None:
    """A small ERA5-like 2 m temperature dataset, one chunk per time step."""
    rng = np.random.default_rng(0)
    lat = np.linspace(90, -90, ny, dtype=np.float32)
    lon = np.linspace(0, 360, nx, endpoint=False, dtype=np.float32)
    base = 288 - 40 * np.sin(np.deg2rad(lat))[:, None] ** 2 + 5 * np.cos(np.deg2rad(lon))[None, :]
    season = 10 * np.sin(np.arange(nt) * 2 * np.pi / 365)[:, None, None]
    t2m = (base[None] + season + rng.normal(0, 0.3, (nt, ny, nx))).astype(np.float32)
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), t2m, {"units": "K"})},
        coords={"time": np.arange(nt), "latitude": lat, "longitude": lon},
    )
    ds.to_zarr(
        path,
        mode="w",
        encoding={"t2m": {"chunks": (1, ny, nx)}},
        zarr_format=3,
        consolidated=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--lat", type=int, default=181)
    parser.add_argument("--lon", type=int, default=360)
    parser.add_argument("--source", help="an existing dataset with a t2m variable")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        source = args.source or str(Path(tmp) / "era5.zarr")
        if args.source is None:
            make_dataset(source, args.time, args.lat, args.lon)
        executor = RustExecutor()
        spec = cubed.Spec(work_dir=tmp, allowed_mem="1GB", executor=executor)
        ds = xr.open_zarr(
            source,
            chunked_array_type="cubed",
            from_array_kwargs={"spec": spec},
            consolidated=False,
        )
        anomaly = (ds.t2m - ds.t2m.mean("time")).to_dataset(name="t2m_anomaly")
        target = str(Path(tmp) / "anomaly.zarr")
        t0 = time.perf_counter()
        anomaly.to_zarr(
            target,
            mode="w",
            zarr_format=3,
            consolidated=False,
            chunkmanager_store_kwargs={"executor": executor},
        )
        elapsed = time.perf_counter() - t0
        stats = executor.last_stats
        for op, reason in stats.python_ops.items():
            print(f"  {op} ran in Python: {reason}")

        got = xr.open_zarr(target, consolidated=False).t2m_anomaly.values
        x = xr.open_zarr(source, consolidated=False).t2m.values
        np.testing.assert_allclose(got, x - x.mean(axis=0), rtol=1e-4, atol=1e-3)
        print(
            f"anomaly {x.shape} written in {elapsed:.3f} s; native tasks {stats.native_tasks}, "
            f"Python tasks {stats.python_tasks}; matches numpy"
        )


if __name__ == "__main__":
    main()
