"""The README's quick starts run as written, on a small ERA5-like dataset in the current
directory: its Python blocks in order in one namespace (the S3 URL read from the local copy),
then its CLI block through the built binary."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

ROOT = Path(__file__).resolve().parent.parent


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _era5(path: Path) -> xr.Dataset:
    rng = np.random.default_rng(7)
    values = (280 + 10 * rng.standard_normal((24, 73, 144))).astype("float32")
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), values, {"units": "K"})},
        coords={
            "time": pd.date_range("2020-01-01", periods=24, freq="6h"),
            "latitude": np.linspace(90, -90, 73),
            "longitude": np.linspace(0, 357.5, 144),
        },
    )
    ds.chunk({"time": 1}).to_zarr(path, zarr_format=3, consolidated=True)
    return ds


def test_the_readme_quick_starts_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunkfuse_bin: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    ds = _era5(tmp_path / "era5.zarr")
    t2m = ds.t2m.values
    namespace: dict[str, object] = {}
    python = _blocks("python")
    assert len(python) >= 4
    for block in python:
        exec(compile(block.replace("s3://bucket/", ""), "README.md", "exec"), namespace)
    np.testing.assert_allclose(namespace["s"], ((t2m + 1) * 2).sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(namespace["total"], ((t2m + 1) * 2).sum(axis=0), rtol=1e-5)
    expected = t2m - t2m.mean(axis=0)
    for target, name in (("anomaly.zarr", "anomaly"), ("anomaly-dask.zarr", "t2m")):
        got = xr.open_zarr(target)[name].values
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(zarr.open_array("t2m-ts.zarr")[...], t2m)
    xr.testing.assert_identical(
        xr.open_zarr("era5-ts.zarr").load(), xr.open_zarr("era5.zarr").load()
    )
    np.testing.assert_array_equal(namespace["day"], t2m[:4])
    np.testing.assert_array_equal(namespace["crops"][1], t2m[8:12, 40:56, 100:116])
    for line in _blocks("bash")[-1].strip().splitlines():
        args = shlex.split(line)
        assert args[0] == "chunkfuse"
        args = [str(chunkfuse_bin), *(a.replace("plans/", f"{ROOT}/plans/") for a in args[1:])]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stderr)
    np.testing.assert_allclose(zarr.open_array("anom.zarr")[...], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(zarr.open_array("t2m-series.zarr")[...], t2m)
