"""A small ERA5-like dataset for the rechunk tests: written as ARCO-ERA5 is, Zarr v2 with
Blosc lz4 chunks of one time step, consolidated metadata, CF attributes and encodings.

Three float32 variables with NaNs, one packed int16 variable (``scale_factor``,
``add_offset``, ``_FillValue``, as ERA5's packed NetCDF), a CF-encoded time coordinate (int32
hours since 1900 on the proleptic Gregorian calendar), descending latitude, longitude; one
chunk of ``t2m`` and one of ``sp`` deleted from the store (missing chunks read as fill).
"""

from __future__ import annotations

from pathlib import Path

import numcodecs
import numpy as np
import pandas as pd
import xarray as xr

SHAPE = (12, 19, 36)
FLOATS = ("t2m", "u10", "v10")
#: Chunks deleted from the store: (variable, v2 chunk key, time step).
MISSING = (("t2m", "5.0.0", 5), ("sp", "7.0.0", 7))


def era5_dataset() -> xr.Dataset:
    """The dataset in memory, before it is written (NaNs where the store will miss chunks
    are set by :func:`write_era5_v2`)."""
    nt, ny, nx = SHAPE
    rng = np.random.default_rng(34)
    ds = xr.Dataset(
        coords={
            "time": pd.date_range("1959-01-01", periods=nt, freq="6h"),
            "latitude": (
                "latitude",
                np.linspace(90.0, -90.0, ny),
                {"units": "degrees_north", "long_name": "latitude"},
            ),
            "longitude": (
                "longitude",
                np.linspace(0.0, 360.0, nx, endpoint=False),
                {"units": "degrees_east", "long_name": "longitude"},
            ),
        },
        attrs={"Conventions": "CF-1.6", "institution": "synthetic, ERA5-like"},
    )
    ds["time"].attrs["long_name"] = "time"
    units = {"t2m": "K", "u10": "m s**-1", "v10": "m s**-1"}
    for name in FLOATS:
        values = (rng.standard_normal(SHAPE) * 10 + 280).astype("float32")
        values[rng.random(SHAPE) < 0.05] = np.nan
        ds[name] = (
            ("time", "latitude", "longitude"),
            values,
            {"units": units[name], "long_name": f"synthetic {name}", "standard_name": name},
        )
    sp = np.round(rng.uniform(95000, 105000, SHAPE), 0)
    sp[rng.random(SHAPE) < 0.05] = np.nan
    ds["sp"] = (("time", "latitude", "longitude"), sp, {"units": "Pa", "long_name": "pressure"})
    return ds


def write_era5_v2(path: Path) -> Path:
    """Writes the dataset as Zarr v2 (Blosc lz4, one time step per chunk, consolidated) and
    deletes the chunks of :data:`MISSING`."""
    ds = era5_dataset()
    nt, ny, nx = SHAPE
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    encoding: dict[str, dict[str, object]] = {
        name: {"compressors": blosc, "chunks": (1, ny, nx)} for name in FLOATS
    }
    encoding["sp"] = {
        "compressors": blosc,
        "chunks": (1, ny, nx),
        "dtype": "int16",
        "scale_factor": 0.5,
        "add_offset": 100000.0,
        "_FillValue": -32767,
    }
    encoding["time"] = {
        "units": "hours since 1900-01-01 00:00:00.0",
        "calendar": "proleptic_gregorian",
        "dtype": "int32",
    }
    ds.to_zarr(path, zarr_format=2, encoding=encoding, mode="w", consolidated=True)
    for name, key, _ in MISSING:
        (path / name / key).unlink()
    return path
