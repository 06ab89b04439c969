"""Write an ERA5-like 2 m temperature array: float32 (time, lat, lon), one chunk per time step.

    python scripts/make_era5.py OUT.zarr --time 256 [--lat 721 --lon 1440] [--level 3]
                                [--zarr-format 3] [--seed 0]

The field is smooth (a meridional gradient, land/sea-like zonal waves, a seasonal and a diurnal
cycle, 6-hourly steps) plus Gaussian noise N(0, 0.3), so it compresses like real reanalysis data
(zstd ratio ~1.3). Values are deterministic for a given seed and step: step ``t`` draws its noise
from ``default_rng([seed, t])``, so any slab can be regenerated on its own.

The array is written with zarr-python 3, zstd at ``--level`` (ZstdCodec; numcodecs Zstd for
``--zarr-format 2``), a few time steps at a time, so a 256 x 721 x 1440 (~1 GB) array needs
only ~100 MB of memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.codecs

STEPS_PER_DAY = 4  # 6-hourly, like ERA5's common subsampling
DAYS_PER_YEAR = 365.25


def base_field(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time-independent parts: mean temperature, seasonal amplitude, diurnal amplitude."""
    lat = np.deg2rad(np.linspace(90.0, -90.0, nlat, dtype=np.float64))[:, None]
    lon = np.deg2rad(np.linspace(0.0, 360.0, nlon, endpoint=False, dtype=np.float64))[None, :]
    mean = (
        250.0
        + 40.0 * np.cos(lat)
        + 6.0 * np.sin(3.0 * lon) * np.cos(lat) ** 2  # continents and oceans, roughly
        + 3.0 * np.cos(5.0 * lon + 2.0 * lat)
    )
    seasonal = 12.0 * np.sin(lat) * (1.0 + 0.3 * np.cos(2.0 * lon))
    diurnal = 4.0 * np.cos(lat) ** 2 + 0.0 * lon
    return mean, seasonal, diurnal


def time_step(
    t: int, seed: int, mean: np.ndarray, seasonal: np.ndarray, diurnal: np.ndarray, lon: np.ndarray
) -> np.ndarray:
    """One (lat, lon) float32 slab for step ``t``."""
    year_phase = 2.0 * np.pi * t / (STEPS_PER_DAY * DAYS_PER_YEAR)
    day_phase = 2.0 * np.pi * (t % STEPS_PER_DAY) / STEPS_PER_DAY
    field = mean + seasonal * np.sin(year_phase) + diurnal * np.cos(day_phase + lon)
    rng = np.random.default_rng([seed, t])
    noise = rng.standard_normal(field.shape, dtype=np.float32) * np.float32(0.3)
    return field.astype(np.float32) + noise


def create(out: Path, shape: tuple[int, int, int], level: int, zarr_format: int) -> Any:
    chunks = (1, shape[1], shape[2])
    if zarr_format == 3:
        compressors: Any = [zarr.codecs.ZstdCodec(level=level)]
    else:
        import numcodecs

        compressors = [numcodecs.Zstd(level=level)]
    return zarr.create_array(
        store=str(out),
        shape=shape,
        chunks=chunks,
        dtype="float32",
        compressors=compressors,
        fill_value=0.0,
        zarr_format=zarr_format,  # type: ignore[arg-type]
        dimension_names=("time", "latitude", "longitude") if zarr_format == 3 else None,
        attributes={
            "long_name": "2 metre temperature (synthetic, ERA5-like)",
            "units": "K",
        },
        overwrite=True,
    )


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_era5(
    out: Path,
    *,
    ntime: int,
    nlat: int = 721,
    nlon: int = 1440,
    level: int = 3,
    zarr_format: int = 3,
    seed: int = 0,
    batch: int = 8,
    quiet: bool = False,
) -> dict[str, Any]:
    """Write the array; returns a summary (also printed unless ``quiet``)."""
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    arr = create(out, (ntime, nlat, nlon), level, zarr_format)
    mean, seasonal, diurnal = base_field(nlat, nlon)
    lon = np.deg2rad(np.linspace(0.0, 360.0, nlon, endpoint=False))[None, :]
    for t0 in range(0, ntime, batch):
        t1 = min(ntime, t0 + batch)
        block = np.stack([time_step(t, seed, mean, seasonal, diurnal, lon) for t in range(t0, t1)])
        arr[t0:t1] = block
        if not quiet and (t1 == ntime or (t0 // batch) % 8 == 7):
            print(f"  wrote steps {t1}/{ntime}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    nbytes = ntime * nlat * nlon * 4
    stored = stored_bytes(out)
    summary = {
        "path": str(out),
        "zarr_format": zarr_format,
        "shape": [ntime, nlat, nlon],
        "chunks": [1, nlat, nlon],
        "dtype": "float32",
        "codec": f"zstd level {level}",
        "seed": seed,
        "nbytes": nbytes,
        "stored_bytes": stored,
        "compression_ratio": round(nbytes / stored, 3) if stored else None,
        "seconds": round(seconds, 2),
    }
    if not quiet:
        print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output Zarr array (replaced if it exists)")
    parser.add_argument("--time", type=int, required=True, help="number of (6-hourly) steps")
    parser.add_argument("--lat", type=int, default=721)
    parser.add_argument("--lon", type=int, default=1440)
    parser.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    parser.add_argument("--zarr-format", type=int, choices=(2, 3), default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8, help="time steps written per call")
    args = parser.parse_args(argv)
    for name in ("time", "lat", "lon", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive")
    write_era5(
        args.out,
        ntime=args.time,
        nlat=args.lat,
        nlon=args.lon,
        level=args.level,
        zarr_format=args.zarr_format,
        seed=args.seed,
        batch=args.batch,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
