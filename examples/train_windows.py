"""Train a small PyTorch model on windows of two Zarr sources, interrupt it, resume it from its
checkpoint, and check the resumed run saw the same batches and ended with the same weights as
a run that was never interrupted.

The sources: an ERA5-like dataset (t2m, u10; 6-hourly, 1-degree-like grid) and a forecast-like
one (tp; hourly, on a grid half as fine), aligned by time (exact) and by nearest latitude and
longitude. Each example is 2 steps of ERA5 history around an anchor and 6 hours of the other
source; the model predicts the anchor's mean t2m from them.

    python examples/train_windows.py [--time 40] [--lat 46] [--lon 90] [--steps 200]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
from chunkfuse.loader import Shuffle, Source, Split, WindowLoader
from chunkfuse.loader.torch_data import WindowDataset
from torch.utils.data import DataLoader

WINDOW = 8  # grid points per side of the ERA5 window


def write_sources(root: Path, nt: int, ny: int, nx: int) -> tuple[Path, Path]:
    """Two small stores: ERA5-like (Zarr v2, one step per chunk) and forecast-like (v3)."""
    rng = np.random.default_rng(0)
    lat = np.linspace(90.0, -90.0, ny)
    lon = np.linspace(0.0, 360.0, nx, endpoint=False)
    shape = (nt, ny, nx)
    t2m = (280 + rng.standard_normal(shape)).astype("float32")
    t2m[:, : max(1, ny // 8)] = np.nan  # no data over the northern cap
    era5 = xr.Dataset(
        {
            "t2m": (("time", "latitude", "longitude"), t2m),
            "u10": (
                ("time", "latitude", "longitude"),
                rng.standard_normal(shape).astype("float32"),
            ),
        },
        coords={
            "time": pd.date_range("2020-01-01", periods=nt, freq="6h"),
            "latitude": lat,
            "longitude": lon,
        },
    )
    chunks = {"chunks": (1, ny, nx)}
    era5.to_zarr(
        root / "era5.zarr", zarr_format=2, mode="w", encoding={"t2m": chunks, "u10": chunks}
    )
    fine, coarse = nt * 6, (len(lat[::2]), len(lon[::2]))
    forecast = xr.Dataset(
        {
            "tp": (
                ("time", "latitude", "longitude"),
                rng.random((fine, *coarse), dtype="float32"),
            )
        },
        coords={
            "time": pd.date_range("2020-01-01", periods=fine, freq="1h"),
            "latitude": lat[::2],
            "longitude": lon[::2],
        },
    )
    forecast.to_zarr(
        root / "forecast.zarr",
        zarr_format=3,
        mode="w",
        consolidated=False,
        encoding={"tp": {"chunks": (6, *coarse)}},
    )
    return root / "era5.zarr", root / "forecast.zarr"


def build(paths: tuple[Path, Path], split: Split) -> WindowLoader:
    """The loader (called in each DataLoader worker, which opens the sources itself)."""
    era5, forecast = paths
    sources = [
        Source(
            "era5",
            era5,
            ["t2m", "u10"],
            {"time": (-1, 2), "latitude": WINDOW, "longitude": WINDOW},
            max_missing=0.0,  # no window reaching into the cap without data
        ),
        Source(
            "forecast",
            forecast,
            ["tp"],
            {"time": (-5, 6), "latitude": WINDOW // 2, "longitude": WINDOW // 2},
            align={"latitude": "nearest", "longitude": "nearest"},
        ),
    ]
    return WindowLoader(
        sources,
        ["time", "latitude", "longitude"],
        16,
        seed=7,
        shuffle=Shuffle(block=8, buffer=4),
        stride={"latitude": 4, "longitude": 4},
        split=split,
    )


def features(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (the history before the anchor and the forecast) and the target."""
    era5, fc = sample["data"]["era5"], sample["data"]["forecast"]
    n = era5["t2m"].shape[0]
    x = torch.cat(
        [
            era5["t2m"][:, 0].reshape(n, -1) - 280,
            era5["u10"][:, 0].reshape(n, -1),
            fc["tp"].reshape(n, -1),
        ],
        dim=1,
    )
    y = era5["t2m"][:, 1].mean(dim=(1, 2)) - 280
    return x, y


def train(
    paths: tuple[Path, Path], steps: int, stop_at: int | None, checkpoint: Path, resume: bool
) -> tuple[list[str], dict[str, torch.Tensor]]:
    """Trains up to `steps` batches (or stops after `stop_at`, saving a checkpoint); returns
    a fingerprint of each batch seen and the weights."""
    torch.manual_seed(0)
    data = WindowDataset(functools.partial(build, paths))
    inputs = 2 * WINDOW * WINDOW + 6 * (WINDOW // 2) ** 2
    model = torch.nn.Linear(inputs, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    done = 0
    if resume:
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        data.load_state_dict(state["loader"])
        done = state["done"]
    seen = []
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
    while done < steps:
        for sample in loader:
            x, y = features(sample)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(hashlib.sha1(sample["ids"].numpy().tobytes()).hexdigest()[:12])
            done += 1
            if done == stop_at:
                after = {"epoch": sample["epoch"], "step": sample["step"] + 1}
                torch.save(
                    {
                        "model": model.state_dict(),
                        "opt": opt.state_dict(),
                        "loader": after,
                        "done": done,
                    },
                    checkpoint,
                )
                return seen, model.state_dict()
            if done == steps:
                break
    return seen, model.state_dict()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=40)
    parser.add_argument("--lat", type=int, default=46)
    parser.add_argument("--lon", type=int, default=90)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = write_sources(root, args.time, args.lat, args.lon)
        checkpoint = root / "checkpoint.pt"
        whole, w_whole = train(paths, args.steps, None, checkpoint, resume=False)
        stop = args.steps // 2 + 1
        first, _ = train(paths, args.steps, stop, checkpoint, resume=False)
        rest, w_resumed = train(paths, args.steps, None, checkpoint, resume=True)
        per_epoch = len(build(paths, Split()))
    print(f"{args.steps} steps ({per_epoch} batches per epoch), interrupted after {stop}")
    same_batches = first + rest == whole
    same_weights = all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
    print(f"same batches after resuming: {same_batches}; same weights: {same_weights}")
    # Windows reaching into the cap without data were dropped before the first batch.
    finite = all(bool(torch.isfinite(w).all()) for w in w_whole.values())
    print(f"weights finite (no missing value reached training): {finite}")
    return 0 if same_batches and same_weights and finite else 1


if __name__ == "__main__":
    raise SystemExit(main())
