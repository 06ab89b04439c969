"""Large FFTs of ERA5-like 2 m temperature with xarray + Cubed, run by chunkfuse.

    python examples/era5_fft.py [--time T --lat Y --lon X] [--source era5.zarr]

Opens the dataset (made here unless --source names one with a `t2m` variable) with
`chunked_array_type="cubed"` and, with RustExecutor:

1. transforms every time step along latitude (`rfft`) and back (`irfft`), and reports the
   round-trip error;
2. computes the power spectrum along time, |rfft(t2m, axis=time)|^2, and writes it to Zarr
   with xarray. The data is chunked one time step per chunk, so the engine rechunks the time
   axis whole (bounded memory) before transforming it.

Both are checked against numpy.fft.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import chunkfuse.fft as cf
import cubed
import cubed.array_api as xp
import numpy as np
import xarray as xr
from chunkfuse import RustExecutor
from xarray_cubed import make_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=64)
    parser.add_argument("--lat", type=int, default=721)
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
        t2m = ds.t2m.data  # a Cubed array (time, latitude, longitude)
        nlat = t2m.shape[1]
        native = python = 0

        # 1. Along latitude and back.
        t0 = time.perf_counter()
        spectrum = cf.rfft(t2m, axis=1)
        back = cf.irfft(spectrum, n=nlat, axis=1)
        error = float(xp.max(xp.abs(back - t2m)).compute(executor=executor))
        elapsed = time.perf_counter() - t0
        native += executor.last_stats.native_tasks
        python += executor.last_stats.python_tasks
        print(
            f"rfft along latitude (length {nlat}) and back: "
            f"max round-trip error {error:.2e} K in {elapsed:.3f} s"
        )
        assert error < 1e-3, error

        # 2. The power spectrum along time, written with xarray.
        power = xp.abs(cf.rfft(t2m, axis=0)) ** 2
        freq = np.fft.rfftfreq(t2m.shape[0], d=1.0)  # cycles per time step
        out = xr.DataArray(
            power,
            dims=("frequency", "latitude", "longitude"),
            coords={"frequency": freq, "latitude": ds.latitude, "longitude": ds.longitude},
            name="t2m_power",
        ).to_dataset()
        target = str(Path(tmp) / "power.zarr")
        t0 = time.perf_counter()
        out.to_zarr(
            target,
            mode="w",
            zarr_format=3,
            consolidated=False,
            chunkmanager_store_kwargs={"executor": executor},
        )
        elapsed = time.perf_counter() - t0
        native += executor.last_stats.native_tasks
        python += executor.last_stats.python_tasks
        for op, reason in executor.last_stats.python_ops.items():
            print(f"  {op} ran in Python: {reason}")

        x = xr.open_zarr(source, consolidated=False).t2m.values
        got = xr.open_zarr(target, consolidated=False).t2m_power.values
        want = np.abs(np.fft.rfft(x, axis=0)) ** 2
        worst = float(np.abs(got - want).max() / np.abs(want).max())
        assert worst < 1e-5, worst
        print(
            f"power spectrum along time {got.shape} written in {elapsed:.3f} s; "
            f"max error relative to the peak {worst:.1e}"
        )
        print(f"native tasks {native}, Python tasks {python}; matches numpy")


if __name__ == "__main__":
    main()
