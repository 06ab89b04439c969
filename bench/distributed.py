"""chunkfuse's distributed runs on a 2-worker LocalCluster, against the local engine, Dask and
Cubed's DaskExecutor on the same cluster.

    python bench/distributed.py [--data DIR] [--out DIR] [--rounds 5] [--time 64]
                                [--max-mem 1GB] [--worker-mem 2GiB] [--warm-mem SIZE] [--quick]

One `LocalCluster(n_workers=2, threads_per_worker=1, processes=True)` on 127.0.0.1 (no
dashboard, `--worker-mem` each) serves every tool. On two ERA5-like float32 (time, 721, 1440)
arrays, one chunk per step, zstd 3 (the noisy field and the same rounded to 0.5 K, made or
reused by bench/ab_binaries.py's helpers), each round times, the tools of an op in turn:

  sum      plans/era5-sum.json  ((x + 1) * 2 summed over time)
  mean     the first stage of plans/era5-anomaly.json (the time mean, kept as an intermediate)
  anomaly  plans/era5-anomaly.json  (x minus its time mean, written sharded, zstd 3)
  rechunk  plans/era5-rechunk.json  (to (time, 73, 144) chunks, zstd 3)

with chunkfuse.distributed.run_distributed on the cluster (each batch's budget --max-mem), the
local engine in this process (chunkfuse.run_plan, 2 threads, max_mem the workers' budgets
together), Dask on the cluster (`da.from_zarr`, the same expression, `da.to_zarr`; the rechunk
with P2P) and Cubed's DaskExecutor on the cluster (allowed_mem --max-mem). Then the per-batch
overhead: a plan of one tiny chunk per batch against Dask's own `client.map` of a no-op.

Peak RSS is per worker process and per run: before each run every process touches and frees
--warm-mem (bench/run.py's warm_memory) and resets its peak (`/proc/self/clear_refs`); after it,
each reports `VmHWM`. Outputs of the first round are checked (sums against chunkfuse's within
2e-5 of the float64 sum of |y|, means and anomalies against float64 references within 2e-5 of
the time mean of |x|, rechunks exactly against the source).

Appends (or replaces) the section "## Distributed: 2-worker LocalCluster" in --out/RESULTS.md and
writes --out/distributed.png (when matplotlib is importable); with `--time N` other than 64, the
section "..., N time steps" and distributed-N.png, so runs at two sizes stand side by side.
--quick: a smoke run on tiny arrays (8 x 73 x 144, one round) whose report goes to a temporary
directory unless --out is given; it exits 1 when any measurement or check fails (a full run:
when a chunkfuse one does).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import importlib.metadata
import importlib.util
import json
import logging
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# `python bench/distributed.py` puts bench/ first on sys.path, where this file would stand for
# dask's `distributed` package: keep bench/ (for the helpers below) after site-packages. The
# workers, spawned with this sys.path, import the helpers the same way.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH] + [str(BENCH)]

import ab_binaries  # noqa: E402
import many_chunks  # noqa: E402
import peers  # noqa: E402
import run as bench_run  # noqa: E402

SECTION = "## Distributed: 2-worker LocalCluster"


def section_title(time: int) -> str:
    """The RESULTS.md section of a run over `time` steps (64, the default: `SECTION`)."""
    return SECTION if time == 64 else f"{SECTION}, {time} time steps"


def plot_name(time: int) -> str:
    """The plot of a run over `time` steps."""
    return "distributed.png" if time == 64 else f"distributed-{time}.png"


OPS = ("sum", "mean", "anomaly", "rechunk")
CF_DIST = "chunkfuse distributed"
CF_LOCAL = "chunkfuse local, 2 threads"
DASK = "Dask"
CUBED = "Cubed DaskExecutor"
TOOLS = (CF_DIST, CF_LOCAL, DASK, CUBED)
#: The ops timed together: chunkfuse's anomaly plan also gives the mean (its first stage).
GROUPS: tuple[tuple[str, ...], ...] = (("sum",), ("mean", "anomaly"), ("rechunk",))
PLANS = {"sum": "era5-sum", "anomaly": "era5-anomaly", "rechunk": "era5-rechunk"}
#: Tolerance of float results: this share of the magnitude (sum: of the float64 sum of |y|;
#: mean and anomaly: of the time mean of |x|).
RTOL_MAGNITUDE = 2e-5


# --------------------------------------------------------------------------------------------
# Worker-side helpers (run in every process through client.run, and in this one)
# --------------------------------------------------------------------------------------------


def settle(warm_bytes: int) -> tuple[bool, int]:
    """Touch and free `warm_bytes` (so the run starts from memory the host backs, see
    bench/run.py's warm_memory), hand freed heap back (`malloc_trim`, so what an earlier run
    left in the allocator's arenas does not count), then reset this process's peak RSS.
    Returns whether the reset worked (without `/proc/self/clear_refs` peaks are lifetime
    peaks) and the resident set the run starts from, in bytes."""
    bench_run.warm_memory(warm_bytes)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False, _status_bytes("VmRSS:")
    return True, _status_bytes("VmRSS:")


def peak_rss() -> int:
    """This process's peak resident set since `settle` (`VmHWM`), in bytes."""
    return _status_bytes("VmHWM:")


def _status_bytes(key: str) -> int:
    """A size from /proc/self/status (ru_maxrss where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _noop(i: int) -> int:
    return i


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One (data set, op, tool): its runs in round order and the peaks of its processes."""

    runs: list[float] = field(default_factory=list)
    #: Largest peak RSS of each process over the runs (workers by address; "driver").
    peaks: dict[str, int] = field(default_factory=dict)
    #: Largest resident set each process started a run from.
    starts: dict[str, int] = field(default_factory=dict)
    check: str = ""
    note: str = ""

    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None


@dataclass
class Overhead:
    """Seconds per batch of a plan whose batches do almost nothing, and Dask's per task."""

    batches: int = 0
    stage: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    dask_map: list[float] = field(default_factory=list)
    note: str = ""


@dataclass
class Bench:
    """The cluster, its client and the options every measurement shares."""

    client: Any
    address: str
    runtime: Any
    work: Path
    max_mem: str
    local_mem: int
    worker_mem: int
    warm_bytes: int
    peaks_exact: bool = True
    #: The resident set each process started the current run from.
    starts: dict[str, int] = field(default_factory=dict)
    cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)

    def cell(self, data: str, op: str, tool: str) -> Cell:
        return self.cells.setdefault((data, op, tool), Cell())

    def fresh(self, name: str) -> Path:
        """An empty directory under the work directory."""
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def settle_all(self) -> None:
        settled = {str(k): v for k, v in self.client.run(settle, self.warm_bytes).items()}
        settled["driver"] = settle(self.warm_bytes)
        self.peaks_exact = self.peaks_exact and all(ok for ok, _ in settled.values())
        self.starts = {k: rss for k, (_, rss) in settled.items()}

    def peaks(self, local: bool) -> dict[str, int]:
        if local:
            return {"driver": peak_rss()}
        return {str(k): int(v) for k, v in self.client.run(peak_rss).items()}


# --------------------------------------------------------------------------------------------
# The tools: each runs one op (or chunkfuse's anomaly plan: mean and anomaly) and returns
# {op: seconds}
# --------------------------------------------------------------------------------------------


def plan_text(op: str) -> str:
    return (REPO / "plans" / f"{PLANS[op]}.json").read_text()


def plan_params(text: str, source: Path, dst: Path) -> dict[str, str]:
    """The plan's params (read from the plan): its source and its target."""
    declared = set(json.loads(text).get("params", {}))
    if declared != {"source", "target"}:
        raise ValueError(f"expected the params source and target, the plan declares {declared}")
    return {"source": str(source), "target": str(dst)}


def rechunk_target(source: Path) -> tuple[int, ...]:
    """The chunks plans/era5-rechunk.json writes (-1: the whole axis)."""
    import zarr

    shape = zarr.open_array(str(source), mode="r").shape
    op = next(o for o in json.loads(plan_text("rechunk"))["ops"] if o["op"] == "rechunk")
    return tuple(n if c == -1 else min(c, n) for c, n in zip(op["chunks"], shape, strict=True))


def run_chunkfuse(
    bench: Bench, op: str, source: Path, dst: Path, distributed: bool
) -> dict[str, float]:
    import chunkfuse
    from chunkfuse.distributed import run_distributed

    text = plan_text(op)
    params = plan_params(text, source, dst)
    job_dir = bench.fresh("job")
    start = time.perf_counter()
    if distributed:
        run = run_distributed(
            text, params, runtime=bench.runtime, work_dir=str(job_dir), max_mem=bench.max_mem
        )
        seconds = time.perf_counter() - start
        stages = run.stages
    else:
        summary = chunkfuse.run_plan(
            text, params, threads=2, max_mem=bench.local_mem, work_dir=str(job_dir), resume=False
        )
        seconds = time.perf_counter() - start
        stages = summary["stages"]
    out = {op: seconds}
    if op == "anomaly":
        out["mean"] = float(stages[0]["seconds"])
    return out


def _expression(module: Any, x: Any, op: str, chunks: tuple[int, ...]) -> Any:
    """The op on a Dask or Cubed array (`module`: dask.array or cubed.array_api)."""
    if op == "sum":
        return module.sum((x + 1) * 2, axis=0)
    if op == "mean":
        return module.mean(x, axis=0)
    if op == "anomaly":
        return x - module.mean(x, axis=0, keepdims=True)
    return x.rechunk(chunks)


def _target(dst: Path, y: Any, source_chunks: tuple[int, ...], op: str) -> Any:
    """The Zarr v3 zstd-3 array a peer writes: reductions in one chunk, the anomaly in the
    source's chunks (unsharded: writing 8-step shards from 1-step chunks would need a
    rechunk, concurrent writes into one shard being unsafe), the rechunk in its target's."""
    chunks = {"sum": y.shape, "mean": y.shape, "anomaly": source_chunks}.get(op, y.chunksize)
    return peers.zarr_target(str(dst), y.shape, tuple(chunks), y.dtype)


def run_dask(bench: Bench, op: str, source: Path, dst: Path) -> dict[str, float]:
    import dask
    import dask.array as da

    x = da.from_zarr(str(source))
    chunks = rechunk_target(source)
    start = time.perf_counter()
    with dask.config.set({"array.rechunk.method": "p2p"}):
        y = _expression(da, x, op, chunks)
    da.to_zarr(y, _target(dst, y, x.chunksize, op))
    return {op: time.perf_counter() - start}


def run_cubed(bench: Bench, op: str, source: Path, dst: Path) -> dict[str, float]:
    import cubed
    import cubed.array_api as xp
    import cubed.runtime.executors.dask as cubed_dask
    from cubed.runtime.executors.dask import DaskExecutor

    spec = cubed.Spec(work_dir=str(bench.fresh("cubed")), allowed_mem=bench.max_mem)
    x = cubed.from_zarr(str(source), spec=spec)
    executor = DaskExecutor(compute_kwargs={"address": bench.address})
    chunks = rechunk_target(source)
    check_cubed_memory(bench, spec.allowed_mem)
    start = time.perf_counter()
    y = _expression(xp, x, op, chunks)
    with mock.patch.object(cubed_dask, "check_runtime_memory", lambda spec, client: None):
        cubed.store(y, _target(dst, y, x.chunksize, op), executor=executor)
    return {op: time.perf_counter() - start}


def check_cubed_memory(bench: Bench, allowed_mem: int) -> None:
    """Cubed's DaskExecutor refuses a cluster whose workers offer a task less memory than
    `allowed_mem`; it reads them from its asynchronous client's `scheduler_info()`, which
    distributed no longer fills with workers ("Cluster has no workers running"). The same
    rule, from this process's client; `run_cubed` then skips Cubed's own check."""
    workers = bench.client.scheduler_info(n_workers=-1)["workers"].values()
    if not workers:
        raise ValueError("the cluster has no workers")
    offered = min(int(w["memory_limit"]) // int(w["nthreads"]) for w in workers)
    if offered < allowed_mem:
        raise ValueError(
            f"workers offer a task {offered} bytes, less than allowed_mem {allowed_mem}"
        )


#: One timed call: (the op whose output it writes, the ops it times, the call).
Call = tuple[str, tuple[str, ...], Callable[[Bench, Path, Path], dict[str, float]]]


def calls(group: tuple[str, ...], tool: str) -> list[Call]:
    """The calls `tool` makes for `group`: chunkfuse runs the anomaly plan once for mean and
    anomaly; the peers run each op."""
    if tool in (CF_DIST, CF_LOCAL):
        op = group[-1]
        dist = tool == CF_DIST
        return [(op, group, lambda b, s, d, op=op: run_chunkfuse(b, op, s, d, dist))]
    runner = run_dask if tool == DASK else run_cubed
    return [(op, (op,), lambda b, s, d, op=op: runner(b, op, s, d)) for op in group]


def measure(bench: Bench, data: str, tool: str, call: Call, source: Path, dst: Path) -> bool:
    """One timed call into its cells; False when it failed."""
    op, covers, fn = call
    shutil.rmtree(dst, ignore_errors=True)
    bench.settle_all()
    try:
        seconds = fn(bench, source, dst)
    except Exception as e:  # a failed tool is a row with its error, not a failed bench
        note = f"failed: {type(e).__name__}: {str(e)[:300]}"
        print(f"  {data} {op} {tool}: {note}", file=sys.stderr)
        for o in covers:
            bench.cell(data, o, tool).note = note
        return False
    peaks = bench.peaks(tool == CF_LOCAL)
    for o in covers:
        cell = bench.cell(data, o, tool)
        cell.runs.append(seconds[o])
        for k, v in peaks.items():
            cell.peaks[k] = max(cell.peaks.get(k, 0), v)
            cell.starts[k] = max(cell.starts.get(k, 0), bench.starts.get(k, 0))
    worst = max(peaks.values()) / 2**20
    print(
        f"  {data:<9} {op:<8} {tool:<26} {seconds[op]:8.3f} s  peak {worst:6.0f} MiB",
        file=sys.stderr,
    )
    return True


# --------------------------------------------------------------------------------------------
# Checks (first round's outputs)
# --------------------------------------------------------------------------------------------


def _time_mean(source: Path) -> tuple[np.ndarray, np.ndarray]:
    """The float64 time mean of x and of |x|."""
    import zarr

    z = zarr.open_array(str(source), mode="r")
    total = np.zeros(z.shape[1:])
    magnitude = np.zeros(z.shape[1:])
    for t in range(0, z.shape[0], 8):
        slab = z[t : t + 8].astype(np.float64)
        total += slab.sum(axis=0)
        magnitude += np.abs(slab).sum(axis=0)
    return total / z.shape[0], magnitude / z.shape[0]


def check_mean_anomaly(
    outputs: dict[tuple[str, str], Path], source: Path
) -> dict[tuple[str, str], str]:
    """Each mean and anomaly against float64 references, within RTOL_MAGNITUDE of the time
    mean of |x|."""
    import zarr

    mean, magnitude = _time_mean(source)
    tol = RTOL_MAGNITUDE * magnitude
    src = zarr.open_array(str(source), mode="r")
    status: dict[tuple[str, str], str] = {}
    for (op, tool), path in outputs.items():
        if not path.exists():
            status[(op, tool)] = "no output"
            continue
        out = zarr.open_array(str(path), mode="r")
        if op == "mean":
            ok = out.shape == mean.shape and bool(np.all(np.abs(out[...] - mean) <= tol))
        else:
            ok = out.shape == src.shape
            for t in range(0, src.shape[0], 8):
                if not ok:
                    break
                want = src[t : t + 8].astype(np.float64) - mean
                ok = bool(np.all(np.abs(out[t : t + 8] - want) <= tol))
        status[(op, tool)] = "ok" if ok else "MISMATCH"
    return status


def check_round(
    bench: Bench, data: str, source: Path, outputs: dict[tuple[str, str], Path]
) -> None:
    """Sets the check of every cell of `data` from the first round's outputs."""
    by_op: dict[str, dict[str, Path]] = {}
    for (op, tool), path in outputs.items():
        by_op.setdefault(op, {})[tool] = path
    status: dict[tuple[str, str], str] = {}
    if "sum" in by_op:
        status.update({("sum", t): s for t, s in bench_run.check_sum(by_op["sum"], source).items()})
    if "rechunk" in by_op:
        done = bench_run.check_rechunk(by_op["rechunk"], source)
        status.update({("rechunk", t): s for t, s in done.items()})
    status.update(
        check_mean_anomaly(
            {k: p for k, p in outputs.items() if k[0] in ("mean", "anomaly")}, source
        )
    )
    for (op, tool), s in status.items():
        bench.cell(data, op, tool).check = s
    for tool in (CF_DIST, CF_LOCAL):
        # chunkfuse's mean is an intermediate of the anomaly plan: its anomaly checks it.
        anomaly = status.get(("anomaly", tool))
        if anomaly is not None:
            bench.cell(data, "mean", tool).check = f"{anomaly} (by its anomaly)"


# --------------------------------------------------------------------------------------------
# Per-batch overhead
# --------------------------------------------------------------------------------------------

TINY_PLAN = {
    "name": "tiny-batches",
    "description": "x + 1 of a tiny array, one chunk per batch: the cost of a batch",
    "params": {"source": "input Zarr array", "target": "output Zarr array"},
    "arrays": [{"id": "x", "zarr": "${source}"}],
    "ops": [
        {
            "id": "y",
            "op": "elementwise",
            "inputs": ["x"],
            "expr": {"op": "add", "args": [{"input": 0}, {"const": 1}]},
        },
        {"id": "out", "op": "write", "input": "y", "target": "${target}"},
    ],
}


def tiny_source(bench: Bench, steps: int) -> Path:
    import zarr

    path = bench.work / "tiny.zarr"
    z = zarr.create_array(
        str(path), shape=(steps, 4, 4), chunks=(1, 4, 4), dtype="float32", overwrite=True
    )
    z[...] = np.arange(steps * 16, dtype=np.float32).reshape(steps, 4, 4)
    return path


def measure_overhead(bench: Bench, source: Path, result: Overhead) -> None:
    """One round: the tiny plan, one task per batch, and `client.map` of as many no-ops."""
    from chunkfuse.distributed import run_distributed

    steps = _steps(source)
    dst = bench.work / "tiny-out.zarr"
    shutil.rmtree(dst, ignore_errors=True)
    try:
        run = run_distributed(
            json.dumps(TINY_PLAN),
            {"source": str(source), "target": str(dst)},
            runtime=bench.runtime,
            work_dir=str(bench.fresh("job")),
            max_mem=bench.max_mem,
            batches_per_worker=steps,
        )
    except Exception as e:
        result.note = f"failed: {type(e).__name__}: {str(e)[:300]}"
        return
    result.batches = run.stages[0]["batches"]
    result.stage.append(float(run.stages[0]["seconds"]))
    result.inside.append(statistics.median(float(b["seconds"]) for b in run.batches))
    start = time.perf_counter()
    bench.client.gather(bench.client.map(_noop, range(result.batches), pure=False))
    result.dask_map.append(time.perf_counter() - start)


def _steps(source: Path) -> int:
    import zarr

    return int(zarr.open_array(str(source), mode="r").shape[0])


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _range(values: list[float], spec: str) -> str:
    if not values:
        return "–"
    med = format(statistics.median(values), spec)
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), spec)}–{format(max(values), spec)})"


def ratios(bench: Bench, data: str, op: str, tool: str, base: str = CF_DIST) -> list[float]:
    """`tool`'s seconds over `base`'s, round by round."""
    mine, theirs = bench.cell(data, op, tool).runs, bench.cell(data, op, base).runs
    if len(mine) != len(theirs):
        return []
    return [m / t for m, t in zip(mine, theirs, strict=True) if t > 0]


def _per_process(sizes: dict[str, int]) -> str:
    """MiB of each process, workers in address order."""
    return " / ".join(f"{v / 2**20:.0f}" for _, v in sorted(sizes.items())) or "–"


def table(bench: Bench, sets: dict[str, Path], nbytes: dict[str, int]) -> list[str]:
    lines = [
        "| data | op | tool | seconds, median (range) | GB/s | ratio vs chunkfuse distributed "
        "| peak RSS per process (MiB) | at start (MiB) | check | note |",
        "|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for data in sets:
        for op in OPS:
            for tool in TOOLS:
                cell = bench.cell(data, op, tool)
                med = cell.median()
                gbps = f"{nbytes[data] / med / 1e9:.2f}" if med else "–"
                ratio = _range(ratios(bench, data, op, tool), ".2f") if tool != CF_DIST else "1"
                peaks = _per_process(cell.peaks)
                starts = _per_process(cell.starts)
                lines.append(
                    f"| {data} | {op} | {tool} | {_range(cell.runs, '.3f')} | {gbps} | "
                    f"{ratio if med else '–'} | {peaks} | {starts} | {cell.check} | {cell.note} |"
                )
    return lines


def goals(bench: Bench, sets: dict[str, Path]) -> list[str]:
    """The issue's comparisons, measured (per-round ratios, median and range)."""
    lines = []
    wanted = [
        ("chunkfuse distributed / local engine", CF_DIST, CF_LOCAL, ("sum", "rechunk"), "≤ 1.25"),
        (
            "Dask / chunkfuse distributed",
            DASK,
            CF_DIST,
            ("sum", "rechunk"),
            "sum ≥ 3, rechunk ≥ 1.3",
        ),
        (
            "Cubed DaskExecutor / chunkfuse distributed",
            CUBED,
            CF_DIST,
            OPS,
            "sum, mean ≥ 10; anomaly, rechunk ≥ 3",
        ),
    ]
    for title, tool, base, ops, goal in wanted:
        parts = []
        for data in sets:
            for op in ops:
                parts.append(f"{data} {op} {_range(ratios(bench, data, op, tool, base), '.2f')}")
        lines.append(f"- {title} (issue 36's goal: {goal}): " + "; ".join(parts) + ".")
    return lines


def overhead_lines(over: Overhead, steps: int) -> list[str]:
    if over.note or not over.stage:
        return [f"Per-batch overhead: {over.note or 'not measured'}."]
    per_batch = [2 * s / over.batches for s in over.stage]
    per_task = [2 * s / over.batches for s in over.dask_map]
    return [
        f"Per-batch overhead: a plan of `x + 1` over a ({steps}, 4, 4) float32 array, one chunk "
        f"and one task per batch ({over.batches} batches on the 2 workers): "
        f"{_range([1e3 * s for s in per_batch], '.1f')} ms of worker time per batch (the "
        "stage's wall time × 2 workers / batches), of which "
        f"{_range([1e3 * s for s in over.inside], '.1f')} ms inside `run_batch` (the median "
        "batch: attaching the job once per process, reading, computing, writing); Dask's own "
        f"`client.map` of as many no-ops costs {_range([1e3 * s for s in per_task], '.1f')} ms "
        "per task the same way.",
    ]


def plot(bench: Bench, sets: dict[str, Path], out: Path, name: str) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        return f"{name} not written: matplotlib is not installed."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(OPS), figsize=(3.2 * len(OPS) + 1.5, 3.4), squeeze=False, sharey=True
    )
    height = 0.8 / len(sets)
    colors = ["tab:orange", "tab:blue", "tab:green", "tab:purple"]
    for ax, op in zip(axes[0], OPS, strict=True):
        for k, data in enumerate(sets):
            meds, lows, highs = [], [], []
            for tool in TOOLS:
                runs = bench.cell(data, op, tool).runs or [0.0]
                med = statistics.median(runs)
                meds.append(med)
                lows.append(med - min(runs))
                highs.append(max(runs) - med)
            ax.barh(
                [i + k * height for i in range(len(TOOLS))],
                meds,
                height=height,
                xerr=[lows, highs],
                color=colors[k % len(colors)],
                label=data,
            )
        ax.set_title(op)
        ax.set_xlabel("seconds (median, range)")
    axes[0][0].set_yticks([i + height * (len(sets) - 1) / 2 for i in range(len(TOOLS))])
    axes[0][0].set_yticklabels(TOOLS)
    axes[0][0].invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(sets), fontsize="small")
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return f"![distributed]({name})"


def versions() -> str:
    names = ("chunkfuse", "dask", "distributed", "cubed", "zarr", "numpy")
    out = []
    for name in names:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} ?")
    return ", ".join(out)


def section(
    bench: Bench,
    args: argparse.Namespace,
    sets: dict[str, Path],
    nbytes: dict[str, int],
    over: Overhead,
    steps: int,
    started: dt.datetime,
    out: Path,
) -> list[str]:
    info = bench_run.machine()
    shape = _shape(next(iter(sets.values())))
    described = ", ".join(
        f"{k} (compression ratio {many_chunks._ratio(p):.2f})" for k, p in sets.items()
    )
    peaks = (
        "each process's peak since a reset just before the run (`/proc/self/clear_refs`, then "
        "`VmHWM`)"
        if bench.peaks_exact
        else "lifetime peaks (`/proc/self/clear_refs` is not available here)"
    )
    return [
        section_title(args.time),
        "",
        f"Command: `{shlex.join(['python', 'bench/distributed.py', *sys.argv[1:]])}` at "
        f"{bench_run.commit()}, {started.strftime('%Y-%m-%d %H:%M %Z')}  ",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, {info['os']}, "
        f"Python {info['python']}  ",
        f"Versions: {versions()}",
        "",
        f"Data: float32 {shape}, one chunk per step, zstd 3: {described}; page cache warm. "
        f"One `LocalCluster(n_workers=2, threads_per_worker=1, processes=True)` on 127.0.0.1, "
        f"memory_limit {bench.worker_mem / 2**30:.1f} GiB per worker, for every tool. "
        f"chunkfuse distributed: `run_distributed` with `DaskRuntime`, each batch's budget "
        f"{args.max_mem}; the local engine: `chunkfuse.run_plan(threads=2, "
        f"max_mem={bench.local_mem})` in the driver process (its peak RSS is the driver's); "
        f"Dask: `da.from_zarr`, the same expression, `da.to_zarr` (zstd 3), the rechunk with "
        f"`array.rechunk.method = p2p`; Cubed: `DaskExecutor` on the same cluster, "
        f"allowed_mem {args.max_mem}. chunkfuse's mean is the first stage of its anomaly plan "
        "(the mean kept as an intermediate); the peers write theirs to Zarr. The peers write "
        "the anomaly in the source's chunks unsharded (chunkfuse's plan writes 8-step shards). "
        f"{args.rounds} round(s), the tools of an op in turn, their order rotating by round; "
        "seconds from the expression built (arrays opened before) to the output written; "
        "ratios taken round by round (median, range). GB/s: decoded input bytes / seconds. "
        f"Peak RSS: {peaks}, one figure per worker (or the driver), the largest over rounds, "
        "beside the resident set the run started from (after `malloc_trim` handed freed heap "
        "back); "
        f"before each run every process touched and freed {bench.warm_bytes / 2**20:.0f} MiB. "
        "Checks on the first round's outputs: sums against chunkfuse's within 2e-5 of the "
        "float64 sum of |y|, means and anomalies against float64 references within 2e-5 of the "
        "time mean of |x|, rechunks exactly against the source.",
        "",
        *table(bench, sets, nbytes),
        "",
        *goals(bench, sets),
        "",
        *overhead_lines(over, steps),
        "",
        plot(bench, sets, out, plot_name(args.time)),
        "",
    ]


def _shape(path: Path) -> tuple[int, ...]:
    import zarr

    return tuple(zarr.open_array(str(path), mode="r").shape)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def data_sets(args: argparse.Namespace) -> dict[str, Path]:
    args.data.mkdir(parents=True, exist_ok=True)
    if args.quick:
        return {
            "noisy": many_chunks._array(args.data, 8),
            "quantized": many_chunks._quantized(args.data, 8),
        }
    return {
        "noisy": ab_binaries._noisy(args.data, args.time),
        "quantized": ab_binaries._quantized(args.data, args.time),
    }


def one_round(bench: Bench, sets: dict[str, Path], index: int) -> None:
    for data, source in sets.items():
        bench_run.warm_page_cache(source)
        outputs: dict[tuple[str, str], Path] = {}
        for group in GROUPS:
            tools = TOOLS[index % len(TOOLS) :] + TOOLS[: index % len(TOOLS)]
            for tool in tools:
                for call in calls(group, tool):
                    dst = bench.work / "out" / f"{data}-{call[0]}-{TOOLS.index(tool)}.zarr"
                    if not measure(bench, data, tool, call, source, dst):
                        continue
                    if call[0] == "anomaly" and tool in (CF_DIST, CF_LOCAL):
                        outputs[("anomaly", tool)] = dst
                    else:
                        outputs[(call[0], tool)] = dst
        if index == 0:
            check_round(bench, data, source, outputs)
        shutil.rmtree(bench.work / "out", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=BENCH / "data")
    parser.add_argument("--out", type=Path, default=None, help="default bench/ (--quick: temp)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--time", type=int, default=64, help="time steps of the arrays")
    parser.add_argument("--max-mem", default="1GB", help="each batch's budget, Cubed's allowed_mem")
    parser.add_argument("--worker-mem", default="2GiB", type=bench_run.parse_size)
    parser.add_argument("--warm-mem", default=None, type=bench_run.parse_size)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (8 x 73 x 144)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    warm = bench_run.default_warm_bytes(args.quick) if args.warm_mem is None else args.warm_mem
    # A worker touching more than half its limit would meet Dask's memory thresholds.
    warm = min(warm, args.worker_mem // 2)
    started = dt.datetime.now(dt.UTC)
    out = args.out or (Path(tempfile.mkdtemp(prefix="chunkfuse-dist-")) if args.quick else BENCH)
    out.mkdir(parents=True, exist_ok=True)
    sets = data_sets(args)
    nbytes = {k: _nbytes(p) for k, p in sets.items()}

    import cubed.runtime.executors.dask  # noqa: F401  (imported before any clock starts)
    import dask
    from chunkfuse.distributed.dask_runtime import DaskRuntime
    from chunkfuse.sizes import budget_bytes
    from distributed import Client, LocalCluster

    batch_budget = budget_bytes(args.max_mem, "--max-mem")
    assert batch_budget is not None
    work = Path(tempfile.mkdtemp(prefix="chunkfuse-dist-work-"))
    steps = 64 if args.quick else 400
    over = Overhead()
    try:
        with (
            # Every Dask scratch space (workers', P2P's) under this run's work directory.
            dask.config.set({"temporary-directory": str(work / "dask")}),
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                memory_limit=args.worker_mem,
                local_directory=str(work / "dask"),
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):
            bench = Bench(
                client=client,
                address=cluster.scheduler_address,
                runtime=DaskRuntime(client),
                work=work,
                max_mem=args.max_mem,
                local_mem=2 * batch_budget,
                worker_mem=args.worker_mem,
                warm_bytes=warm,
            )
            client.run(_import_everything)
            _import_everything()
            tiny = tiny_source(bench, steps)
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                one_round(bench, sets, r)
                measure_overhead(bench, tiny, over)
            lines = section(bench, args, sets, nbytes, over, steps, started, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = out / "RESULTS.md"
    bench_run.replace_section(report, lines)
    print("\n".join(lines))
    print(f"wrote {report}", file=sys.stderr)
    failed = [
        (k, c)
        for k, c in bench.cells.items()
        if not c.runs or c.check.startswith(("MISMATCH", "no output"))
    ]
    if over.note:
        failed.append((("tiny", "overhead", CF_DIST), Cell(note=over.note)))
    ours = [f for f in failed if f[0][2] in (CF_DIST, CF_LOCAL)]
    for (data, op, tool), c in failed:
        print(f"FAILED: {data} {op} {tool}: {c.note or c.check}", file=sys.stderr)
    return 1 if ours or (args.quick and failed) else 0


def _nbytes(path: Path) -> int:
    import zarr

    return int(zarr.open_array(str(path), mode="r").nbytes)


def _import_everything() -> None:
    """Imports what the tools use, in this process and in the workers, before any clock starts
    (imports are not the workload)."""
    import chunkfuse.distributed.batch  # noqa: F401
    import cubed.array_api  # noqa: F401
    import dask.array  # noqa: F401
    import zarr.codecs  # noqa: F401


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
