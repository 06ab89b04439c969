"""The loader's memory: a whole epoch over a dataset more than ten times larger than its
prefetch and cache budgets stays within those budgets plus a fixed baseline (the engine's
bounded buffer pool and the decode of the chunks in flight). Measured in a fresh process,
as VmHWM over the process's resident size once the loader was built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

MB = 1 << 20
SHAPE = (200, 512, 1024)  # float32: 400 MiB
CHUNKS = (1, 512, 1024)  # 2 MiB
WINDOW = (4, 128, 128)  # 256 KiB
BATCH = 32  # 8 MiB a batch
PREFETCH = 2
CACHE = 16 * MB
#: The engine's buffer pool holds at most this much (engine/src/array/pool.rs).
POOL = 64 * MB
#: Interpreter and allocator noise.
SLACK = 32 * MB

SCRIPT = """
import json, sys
from chunkfuse.loader import Source, WindowLoader

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

path, batch, prefetch, cache = sys.argv[1], *map(int, sys.argv[2:5])
window = {"time": 4, "latitude": 128, "longitude": 128}
loader = WindowLoader(
    [Source("x", path, ["x"], window)],
    ["time", "latitude", "longitude"],
    batch,
    stride=window,
    prefetch=prefetch,
    cache_bytes=cache,
    threads=2,
)
base = rss("VmRSS")
read = 0
ids = []
for b in loader:
    read += b.data["x"]["x"].nbytes
    ids.extend(b.ids.tolist())
print(json.dumps({
    "base": base, "peak": rss("VmHWM"), "read": read, "anchors": len(set(ids)),
    "count": loader.anchors.count, "cache": loader.cache.bytes if loader.cache else 0,
}))
"""


def test_an_epoch_over_a_dataset_ten_times_the_budgets_stays_within_them(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    values = rng.standard_normal(SHAPE, dtype=np.float32)
    ds = xr.Dataset(
        {"x": (("time", "latitude", "longitude"), values)},
        coords={
            "time": pd.date_range("2000-01-01", periods=SHAPE[0], freq="6h"),
            "latitude": np.linspace(90, -90, SHAPE[1]),
            "longitude": np.linspace(0, 360, SHAPE[2], endpoint=False),
        },
    )
    path = tmp_path / "big.zarr"
    ds.to_zarr(path, zarr_format=3, consolidated=False, encoding={"x": {"chunks": CHUNKS}})
    del ds, values
    batch_bytes = BATCH * int(np.prod(WINDOW)) * 4
    budgets = CACHE + PREFETCH * batch_bytes
    data_bytes = int(np.prod(SHAPE)) * 4
    assert data_bytes >= 10 * budgets
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), str(BATCH), str(PREFETCH), str(CACHE)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # The epoch read every window of the tiling once: the whole array.
    assert got["anchors"] == got["count"] == data_bytes // (int(np.prod(WINDOW)) * 4)
    assert got["read"] == data_bytes
    assert 0 < got["cache"] <= CACHE
    # Batches: the prefetched ones, the one the loop holds and the one being read. Decode:
    # a compressed and a decoded chunk per decode thread.
    allowed = CACHE + (PREFETCH + 2) * batch_bytes + POOL + 2 * 2 * 2 * MB + SLACK
    grew = got["peak"] - got["base"]
    assert grew <= allowed, (
        f"peak RSS grew {grew / MB:.0f} MiB over the loader's baseline for {data_bytes / MB:.0f}"
        f" MiB of data; the budgets allow {allowed / MB:.0f} MiB"
    )
