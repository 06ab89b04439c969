"""Training-loader throughput: random windows from ERA5-like arrays, batch after batch.

    python bench/loader.py [--data DIR] [--out DIR] [--rounds 3] [--batches 20] [--quick]

Each example is a window of 4 time steps x 128 x 128 (float32) at a random anchor, 32 per batch,
the anchors of each batch those of `chunkfuse.loader.WindowLoader`'s order (a uniform
shuffle, seed 0), over a noisy and a quantized (1, 721, 1440)-chunked array of 64 steps
(zstd), and over sharded copies of both (a shard per step, 8 x 8 inner chunks of 91 x 180).
Tools, all timed in this process the same way (wall time of `--batches` batches after a
warm-up): chunkfuse's `WindowLoader` (prefetch 2, no chunk cache: a uniform shuffle over a
store larger than the cache rarely repeats a chunk, and these arrays would fit in it whole),
the same through PyTorch's `DataLoader` with 2 persistent worker processes, xbatcher + Dask +
`DataLoader` as Earthmover's cloud-native-dataloader post sets it up (xbatcher's tiles of the
window's size in a shuffled order, since it has no random anchors; Dask's synchronous
scheduler in each of 2 forkserver workers), a zarr-python loop (one slice per window) and
tensorstore (every window of a batch read concurrently); and chunkfuse and tensorstore in the
chunk-aware order (blocks of 4 time steps' anchors, 2 blocks shuffled together) with the
same 96 MiB decoded-chunk budget (`cache_bytes`, tensorstore's cache pool). The decode
floor: the least each batch must decode, each chunk it touches once through the last element
a window needs (for a sharded array, each touched inner chunk once, whole), decoded by the
engine on all cores with nothing copied out (a one-element read at each such last element).
Reported: samples/s, GB/s of window values, each tool's time against chunkfuse's, and
chunkfuse's against the floor. Appends (or replaces) "## Training loader" in --out/RESULTS.md.
--quick: tiny arrays (8 x 73 x 144, windows 4 x 32 x 32, 8 per batch, 3 batches, one round),
report to a temporary directory unless --out is given; exits 1 when a tool fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH] + [str(BENCH)]

import ab_binaries  # noqa: E402
import many_chunks  # noqa: E402
import run as bench_run  # noqa: E402

SECTION = "## Training loader"
OURS = "chunkfuse WindowLoader"
XBATCHER = "xbatcher + Dask + DataLoader, 2 workers"
#: The chunk-aware pair: the same order (blocks of `AWARE_STEPS` consecutive time steps'
#: anchors, `AWARE_BUFFER` blocks shuffled together) and the same decoded-chunk budget.
OURS_AWARE = "chunkfuse WindowLoader, chunk-aware + cache"
TENSORSTORE_AWARE = "tensorstore, chunk-aware + cache"
TOOLS = (
    OURS,
    "chunkfuse in DataLoader, 2 workers",
    XBATCHER,
    "zarr-python loop",
    "tensorstore",
    OURS_AWARE,
    TENSORSTORE_AWARE,
)
#: Consecutive anchor time steps per block of the chunk-aware order (with 4-step windows, a
#: block touches 7 chunks of a (1, 721, 1440)-chunked array).
AWARE_STEPS = 4
#: Blocks one buffer of the chunk-aware order mixes.
AWARE_BUFFER = 2
#: The decoded-chunk budget of the chunk-aware rows: about a third of the full-size arrays,
#: the chunks of a buffer's blocks and some to spare.
AWARE_CACHE = 96 << 20
#: Batches the chunk-aware rows read before timing: the first batches of a buffer decode its
#: chunks (prefixes first, then whole on their next touch), which an epoch's run of some
#: 10^5 batches per buffer amortizes; timed after them, the rows give that steady state.
AWARE_WARMUP = 8
FLOOR = "decode floor (touched chunks)"
#: Inner chunks of the sharded copies: this many per shard along each window axis.
INNER_PER_SHARD = 8


def sharded(array: Path, data: Path) -> Path:
    """A sharded copy of `array`: one time step per shard, in 8 x 8 inner chunks (the last
    shard row reaching past the array where its size does not divide)."""
    import chunkfuse
    import zarr

    path = data / f"{array.name.removesuffix('.zarr')}-sharded.zarr"
    if not path.exists():
        _, ny, nx = zarr.open_array(str(array), mode="r").shape
        inner = (1, -(-ny // INNER_PER_SHARD), -(-nx // INNER_PER_SHARD))
        shards = (1, inner[1] * INNER_PER_SHARD, inner[2] * INNER_PER_SHARD)
        chunkfuse.rechunk(str(array), str(path), inner, shards=shards)
    return path


def grouped(array: Path, root: Path, name: str) -> Path:
    """A Zarr v3 group around `array` (its chunks linked, not copied) with the coordinates and
    dimension names xarray needs."""
    import pandas as pd
    import xarray as xr
    import zarr

    group = root / f"{name}.zarr"
    if group.exists():
        return group
    a = zarr.open_array(str(array), mode="r")
    nt, ny, nx = a.shape
    coords = {
        "time": pd.date_range("2000-01-01", periods=nt, freq="1h"),
        "latitude": np.linspace(90, -90, ny),
        "longitude": np.linspace(0, 360, nx, endpoint=False),
    }
    xr.Dataset(coords=coords).to_zarr(group, zarr_format=3, consolidated=False)
    meta = json.loads((array / "zarr.json").read_text())
    meta["dimension_names"] = ["time", "latitude", "longitude"]
    (group / "t2m").mkdir()
    (group / "t2m" / "zarr.json").write_text(json.dumps(meta))
    os.symlink(array.resolve() / "c", group / "t2m" / "c")
    return group


class Setup:
    """One data set: its group, the loader, and the window corners of each batch."""

    def __init__(self, group: Path, window: tuple[int, int, int], batch: int) -> None:
        from chunkfuse.loader import Shuffle, Source, WindowLoader

        self.group, self.window, self.batch = group, window, batch
        t, y, x = window
        self.build = lambda split=None: WindowLoader(
            [Source("era5", group, ["t2m"], {"time": t, "latitude": y, "longitude": x})],
            ["time", "latitude", "longitude"],
            batch,
            seed=0,
            prefetch=2,
            cache_bytes=0,
            **({"split": split} if split is not None else {}),
        )
        self.loader = self.build()
        per_step = int(np.prod(self.loader.anchors.shape[1:]))
        #: The chunk-aware order: blocks of `AWARE_STEPS` time steps' anchors (which share
        #: their chunks), `AWARE_BUFFER` of them shuffled together.
        self.aware = WindowLoader(
            [Source("era5", group, ["t2m"], {"time": t, "latitude": y, "longitude": x})],
            ["time", "latitude", "longitude"],
            batch,
            seed=0,
            prefetch=2,
            shuffle=Shuffle(block=AWARE_STEPS * per_step, buffer=AWARE_BUFFER),
            cache_bytes=AWARE_CACHE,
        )

    def corners(self, steps: range, loader: Any = None) -> list[np.ndarray]:
        """Each batch's window corners in `loader`'s order (default: the uniform one)."""
        loader = loader or self.loader
        out = []
        for s in steps:
            ids = loader.batches.anchors(0, s)
            where = loader.anchors.at(ids)
            index = loader.anchors.index[0]
            dims = loader.anchors.dims
            out.append(np.stack([index[d][where[k]] for k, d in enumerate(dims)], axis=1))
        return out


def build_split(group: str, window: tuple[int, int, int], batch: int, split: Any) -> Any:
    return Setup(Path(group), window, batch).build(split)


def time_ours(setup: Setup, n: int, loader: Any = None, warmup: int = 1) -> float:
    it = iter(loader or setup.loader)
    for _ in range(warmup):
        next(it)
    started = time.perf_counter()
    for _ in range(n):
        next(it)
    return time.perf_counter() - started


def time_dataloader(setup: Setup, n: int) -> float:
    import functools

    from chunkfuse.loader.torch_data import WindowDataset
    from torch.utils.data import DataLoader

    data = WindowDataset(
        functools.partial(build_split, str(setup.group), setup.window, setup.batch)
    )
    it = iter(DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True))
    next(it)
    next(it)  # both workers started
    started = time.perf_counter()
    for _ in range(n):
        next(it)
    return time.perf_counter() - started


def time_zarr(setup: Setup, n: int) -> float:
    import zarr

    arr = zarr.open_array(str(setup.group / "t2m"), mode="r")
    t, y, x = setup.window
    batches = setup.corners(range(n + 1))

    def one(c: np.ndarray) -> np.ndarray:
        return np.stack([arr[a : a + t, b : b + y, d : d + x] for a, b, d in c.tolist()])

    one(batches[0])
    started = time.perf_counter()
    for c in batches[1:]:
        one(c)
    return time.perf_counter() - started


def time_aware(setup: Setup, n: int) -> float:
    """chunkfuse in the chunk-aware order with its decoded-chunk cache."""
    return time_ours(setup, n, setup.aware, AWARE_WARMUP)


def time_tensorstore(setup: Setup, n: int, aware: bool = False) -> float:
    """tensorstore reading each batch's windows concurrently: in the uniform order without a
    cache, or (`aware`) in the chunk-aware order with a cache pool of the same budget."""
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(setup.group / "t2m")}}
    if aware:
        spec["context"] = {"cache_pool": {"total_bytes_limit": AWARE_CACHE}}
        spec["recheck_cached_data"] = False
    arr = ts.open(spec).result()
    t, y, x = setup.window
    warmup = AWARE_WARMUP if aware else 1
    batches = setup.corners(range(n + warmup), setup.aware if aware else None)

    def one(c: np.ndarray) -> np.ndarray:
        reads = [arr[a : a + t, b : b + y, d : d + x].read() for a, b, d in c.tolist()]
        return np.stack([r.result() for r in reads])

    for c in batches[:warmup]:
        one(c)
    started = time.perf_counter()
    for c in batches[warmup:]:
        one(c)
    return time.perf_counter() - started


def _synchronous_dask(worker: int) -> None:
    """Each DataLoader worker computes its Dask graphs in its own thread (Earthmover's
    setting: the workers are the parallelism)."""
    import dask

    dask.config.set(scheduler="synchronous")


def time_xbatcher(setup: Setup, n: int) -> float:
    """xbatcher's tiles of the window's size (a grid: it has no random anchors) in a shuffled
    order, one Dask-backed DataArray per sample, `batch` per DataLoader batch, as
    Earthmover's cloud-native-dataloader post sets it up, at 2 workers for 2 cores."""
    import torch
    import xarray as xr
    import xbatcher
    from torch.utils.data import DataLoader
    from xbatcher.loaders.torch import MapDataset

    ds = xr.open_dataset(setup.group, engine="zarr", chunks={}, consolidated=False)
    t, y, x = setup.window
    tiles = xbatcher.BatchGenerator(
        ds["t2m"], input_dims={"time": t, "latitude": y, "longitude": x}
    )
    loader = DataLoader(
        MapDataset(tiles),
        batch_size=setup.batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=2,
        prefetch_factor=2,
        persistent_workers=True,
        multiprocessing_context="forkserver",
        worker_init_fn=_synchronous_dask,
    )
    batches = max(1, len(loader))
    it = iter(loader)
    next(it)
    next(it)  # both workers started
    started = time.perf_counter()
    for k in range(n):
        if (k + 2) % batches == 0:
            it = iter(loader)  # a new epoch (the grid holds few tiles)
        next(it)
    return time.perf_counter() - started


def _last_elements(setup: Setup, corners: np.ndarray) -> list[list[int]]:
    """The least a batch must decode, as one element per decoded unit: for each chunk its
    windows touch, the last element (C order) any of them needs, since the engine decodes a
    chunk only that far; for a sharded array, the last element of each touched inner chunk,
    which the engine decodes whole."""
    meta = json.loads((setup.group / "t2m" / "zarr.json").read_text())
    shape = meta["shape"]
    grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
    sharding = [c for c in meta["codecs"] if c["name"] == "sharding_indexed"]
    t, y, x = setup.window
    last: dict[tuple[int, ...], tuple[int, int, int]] = {}
    for a, b, d in corners.tolist():
        if sharding:
            inner = sharding[0]["configuration"]["chunk_shape"]
            for k in range(a, a + t):
                for i in range(b // inner[1], (b + y - 1) // inner[1] + 1):
                    for j in range(d // inner[2], (d + x - 1) // inner[2] + 1):
                        end = (
                            k,
                            min(shape[1], (i + 1) * inner[1]) - 1,
                            min(shape[2], (j + 1) * inner[2]) - 1,
                        )
                        last[(k, i, j)] = end
        else:
            for k in range(a // grid[0], (a + t - 1) // grid[0] + 1):
                # Rows are whole in these chunks: the window's last row and column.
                end = (k, b + y - 1, d + x - 1)
                last[(k,)] = max(last.get((k,), end), end)
    return [list(e) for e in last.values()]


def time_floor(setup: Setup, n: int) -> float:
    """Each batch's least decode (`_last_elements`): one engine read per batch of a single
    element at each decoded unit's last needed element, so each unit is decoded as far as the
    windows need it, once, on all cores, and nothing else is copied."""
    from chunkfuse.reading import ArrayReader

    reader = ArrayReader(str(setup.group / "t2m"))
    plans = [_last_elements(setup, c) for c in setup.corners(range(1, n + 1))]
    outs = [np.empty(len(p), dtype=reader.dtype) for p in plans]
    started = time.perf_counter()
    for ends, out in zip(plans, outs, strict=True):
        reader.read_into(ends, [1, 1, 1], out.view(np.uint8), 0)
    return time.perf_counter() - started


TIMERS: dict[str, Callable[[Setup, int], float]] = {
    OURS: time_ours,
    TOOLS[1]: time_dataloader,
    XBATCHER: time_xbatcher,
    TOOLS[3]: time_zarr,
    TOOLS[4]: time_tensorstore,
    OURS_AWARE: time_aware,
    TENSORSTORE_AWARE: lambda setup, n: time_tensorstore(setup, n, aware=True),
    FLOOR: time_floor,
}
NEEDS = {
    TOOLS[1]: "torch",
    XBATCHER: "xbatcher",
    TOOLS[4]: "tensorstore",
    TENSORSTORE_AWARE: "tensorstore",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=BENCH / "data")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    args.data.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.rounds, args.batches = 1, 3
        arrays = {"noisy": many_chunks._array(args.data, 8)}
        arrays["quantized"] = many_chunks._quantized(args.data, 8)
        window, batch = (4, 32, 32), 8
    else:
        arrays = {"noisy": ab_binaries._noisy(args.data, 64)}
        arrays["quantized"] = ab_binaries._quantized(args.data, 64)
        window, batch = (4, 128, 128), 32
    out = args.out or (Path(tempfile.mkdtemp(prefix="chunkfuse-loader-")) if args.quick else BENCH)
    out.mkdir(parents=True, exist_ok=True)
    # The grouped copies of the data sets are made for this run and go with it.
    with tempfile.TemporaryDirectory(prefix="chunkfuse-loader-groups-") as work:
        return _measure(args, arrays, window, batch, Path(work), out, started)


def _measure(
    args: argparse.Namespace,
    arrays: dict[str, Path],
    window: tuple[int, int, int],
    batch: int,
    work: Path,
    out: Path,
    started: dt.datetime,
) -> int:
    """Times every tool on every data set (grouped copies made under `work`) and writes the
    report to `out`; 1 when a tool failed or chunkfuse did not run."""
    for k in list(arrays):
        arrays[f"{k}, sharded"] = sharded(arrays[k], args.data)
    setups = {
        k: Setup(grouped(p, work, k.replace(", ", "-")), window, batch) for k, p in arrays.items()
    }
    runs: dict[tuple[str, str], list[float]] = {}
    notes: dict[tuple[str, str], str] = {}
    for r in range(args.rounds):
        for data, setup in setups.items():
            order = [*TOOLS, FLOOR]
            order = order[r % len(order) :] + order[: r % len(order)]
            for tool in order:
                need = NEEDS.get(tool)
                if need and importlib.util.find_spec(need) is None:
                    notes[(data, tool)] = f"{need} is not installed"
                    continue
                try:
                    seconds = TIMERS[tool](setup, args.batches)
                except Exception as e:  # a tool that fails is reported, not hidden
                    notes[(data, tool)] = f"failed: {type(e).__name__}: {e}"[:200]
                    continue
                runs.setdefault((data, tool), []).append(seconds)
                print(f"  {data:9} {tool:36} {seconds:7.3f} s", file=sys.stderr)
    lines = report(args, setups, runs, notes, started)
    lines += ["", plot(setups, runs, args.batches, out)]
    bench_run.replace_section(out / "RESULTS.md", lines)
    print("\n".join(lines))
    failed = [k for k, v in notes.items() if v.startswith("failed") or (k[1] == OURS)]
    return 1 if failed else 0


def plot(
    setups: dict[str, Setup], runs: dict[tuple[str, str], list[float]], batches: int, out: Path
) -> str:
    """A bar chart of samples/s (median, range) per tool and data set: --out/loader.png."""
    name = "loader.png"
    if importlib.util.find_spec("matplotlib") is None:
        return f"{name} not written: matplotlib is not installed."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tools = [*TOOLS, FLOOR]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    height = 0.8 / len(setups)
    colors = ["tab:orange", "tab:blue", "tab:green", "tab:purple"]
    for k, (data, setup) in enumerate(setups.items()):
        meds, lows, highs = [], [], []
        for tool in tools:
            rates = [batches * setup.batch / s for s in runs.get((data, tool), [])] or [0.0]
            med = statistics.median(rates)
            meds.append(med)
            lows.append(med - min(rates))
            highs.append(max(rates) - med)
        ax.barh(
            [i + k * height for i in range(len(tools))],
            meds,
            height=height,
            xerr=[lows, highs],
            color=colors[k % len(colors)],
            label=data,
        )
    ax.set_xscale("log")
    ax.set_xlabel("samples/s (median, range; log scale)")
    ax.set_yticks([i + height * (len(setups) - 1) / 2 for i in range(len(tools))])
    ax.set_yticklabels(tools, fontsize="small")
    ax.invert_yaxis()
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return f"![training loader]({name})"


def report(
    args: argparse.Namespace,
    setups: dict[str, Setup],
    runs: dict[tuple[str, str], list[float]],
    notes: dict[tuple[str, str], str],
    started: dt.datetime,
) -> list[str]:
    info = bench_run.machine()
    any_setup = next(iter(setups.values()))
    t, y, x = any_setup.window
    window_bytes = t * y * x * 4 * any_setup.batch
    lines = [
        SECTION,
        "",
        f"Command: `{shlex.join(['python', 'bench/loader.py', *sys.argv[1:]])}`, "
        f"{started.strftime('%Y-%m-%d %H:%M %Z')}, commit {bench_run.commit()}  ",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, {info['os']}  ",
        "",
        f"Windows of {t} x {y} x {x} float32, {any_setup.batch} per batch at the anchors of "
        "`WindowLoader`'s order (uniform shuffle, seed 0), the same for every tool; "
        f"{args.batches} batches timed after a warm-up batch, {args.rounds} round(s), tools in "
        "turn, in this process (the DataLoader's workers are its children). chunkfuse runs "
        "without its chunk cache. xbatcher has no random anchors: its rows read its tiles of "
        "the same size in a shuffled order (Dask's synchronous scheduler in each worker). The "
        "floor decodes the least each batch must: every chunk it touches once, through the "
        "last element a window needs (sharded: every touched inner chunk once, whole), on all "
        "cores, copying nothing out (a one-element read at each such element). "
        "The sharded copies hold a shard per step in 8 x 8 inner chunks. "
        "The chunk-aware rows visit the anchors in `Shuffle(block=the anchors of "
        f"{AWARE_STEPS} time steps, buffer={AWARE_BUFFER})` order (each batch from "
        f"{AWARE_BUFFER} runs of {AWARE_STEPS} consecutive time steps, picked at random, "
        "whose windows share chunks) with a decoded-chunk budget of "
        f"{AWARE_CACHE >> 20} MiB, chunkfuse's `cache_bytes` and tensorstore's cache pool alike "
        "(the tensorstore chunk-aware row's time is against chunkfuse's chunk-aware row), "
        f"timed after {AWARE_WARMUP} warm-up batches: a buffer's first batches decode its "
        "chunks, which an epoch amortizes over some 10^5 batches per buffer.",
        "",
        "| data | tool | samples/s, median (range) | GB/s of windows | time vs chunkfuse | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for data in setups:
        ours = runs.get((data, OURS))
        for tool in [*TOOLS, FLOOR]:
            secs = runs.get((data, tool))
            if not secs:
                lines.append(f"| {data} | {tool} | | | | {notes.get((data, tool), '')} |")
                continue
            med = statistics.median(secs)
            rate = [args.batches * any_setup.batch / s for s in secs]
            base = runs.get((data, OURS_AWARE)) if tool == TENSORSTORE_AWARE else ours
            rel = f"{med / statistics.median(base):.2f}" if base else ""
            lines.append(
                f"| {data} | {tool} | {statistics.median(rate):.0f} ({min(rate):.0f}–"
                f"{max(rate):.0f}) | {args.batches * window_bytes / med / 1e9:.2f} | {rel} | "
                f"{notes.get((data, tool), '')} |"
            )
    lines += ["", *ratios(setups, runs)]
    return lines


def ratios(setups: dict[str, Setup], runs: dict[tuple[str, str], list[float]]) -> list[str]:
    """The ratios issue 37 asks for, per data set: peers' time over chunkfuse's (uniform and
    chunk-aware orders) and chunkfuse's over the decode floor."""

    def over(a: str, b: str, data: str) -> str:
        x, y = runs.get((data, a)), runs.get((data, b))
        return f"{statistics.median(x) / statistics.median(y):.2f}" if x and y else "n/a"

    lines = [
        "| data | xbatcher ÷ ours | xbatcher ÷ ours chunk-aware | tensorstore ÷ ours "
        "| tensorstore ÷ ours, both chunk-aware | ours ÷ floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for data in setups:
        cells = [
            over(XBATCHER, OURS, data),
            over(XBATCHER, OURS_AWARE, data),
            over(TOOLS[4], OURS, data),
            over(TENSORSTORE_AWARE, OURS_AWARE, data),
            over(OURS, FLOOR, data),
        ]
        lines.append(f"| {data} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
