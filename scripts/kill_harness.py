"""Kills chunkfuse writers at random points and checks what they leave behind (issue 38).

    python scripts/kill_harness.py [--seeds N] [--entry NAME ...] [--out FILE.jsonl]

For each entry point that writes (the CLI plan run, `chunkfuse.rechunk` of an array and of a
dataset, RustExecutor under `cubed.to_zarr` and under xarray with cubed-xarray, chunkfuse.dask
under xarray's `to_zarr` and `da.store`, and distributed batches), the harness runs the write
once to completion (the clean run), then for each seed starts it again into a fresh target,
SIGKILLs the process after a delay drawn from the seed (uniform over the clean run's
duration), inspects the target, reruns the same write to completion, and compares the result
with the clean run. A seed passes when:

- every chunk file the killed run left equals the clean run's file of that key, byte for
  byte (no partial chunk: a killed writer's temporaries, chunkfuse's `.partial-...` and
  zarr-python's `NAME.HEX.partial`, are not chunks);
- the killed run's target is visibly unfinished: absent, or marked (the `chunkfuse` attribute
  with `incomplete: true` on an array or group, which zarr-python and xarray show), or, for
  the paths where xarray or zarr-python create the arrays before chunkfuse runs, holding
  those arrays with no chunk written yet; a kill that landed after the run ended must leave
  the clean result;
- the rerun equals the clean run: the same files, chunk bytes equal, metadata documents
  equal as JSON, no temporaries left.

Each seed is a JSON line (entry, seed, delay, what the kill left, whether the rerun resumed,
outcome, seconds); `--out` appends them to a file, from which `scripts/reliability_report.py`
renders the table in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "plans" / "era5-anomaly.json"
#: The source dataset: (time, latitude, longitude) float32, one time step per chunk.
SHAPE = (256, 181, 360)
METADATA = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
TEMPORARY = ".partial-"
#: Entry points whose arrays exist (made by xarray or zarr-python) before chunkfuse runs.
PRE_CREATED = {"cubed-xarray", "dask-to-zarr", "dask-store"}


def make_source(path: Path) -> None:
    """An ERA5-like 2 m temperature dataset (Zarr v3 group, `t2m` one chunk per step)."""
    import numpy as np
    import xarray as xr

    nt, ny, nx = SHAPE
    rng = np.random.default_rng(38)
    lat = np.linspace(90, -90, ny, dtype=np.float32)
    base = (288 - 40 * np.sin(np.deg2rad(lat)) ** 2)[None, :, None]
    t2m = (base + rng.normal(0, 3, (nt, ny, nx))).astype(np.float32)
    t2m[rng.random(t2m.shape) < 0.01] = np.nan
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), t2m, {"units": "K"})},
        coords={
            "time": np.arange(nt),
            "latitude": lat,
            "longitude": np.linspace(0, 360, nx, endpoint=False, dtype=np.float32),
        },
    )
    ds.to_zarr(
        path,
        mode="w",
        encoding={"t2m": {"chunks": (1, ny, nx)}},
        zarr_format=3,
        consolidated=False,
    )


# -- the writes, each run in a child process ------------------------------------------------


def write_cli(src: Path, target: Path, work: Path) -> list[str]:
    """The CLI's command line (run directly, not through Python)."""
    binary = os.environ.get("CHUNKFUSE_BIN", str(ROOT / "target" / "release" / "chunkfuse"))
    return [
        binary, "run", str(PLAN), "--param", f"source={src}/t2m", "--param",
        f"target={target}", "--threads", "1", "--max-mem", "64MB", "--work-dir", str(work),
        "--json",
    ]  # fmt: skip


def resumed(summary: dict[str, Any]) -> bool:
    return any(s.get("resumed") for s in summary.get("stages", []))


def write_rechunk_array(src: Path, target: Path, work: Path) -> bool | None:
    import chunkfuse

    s = chunkfuse.rechunk(
        f"{src}/t2m", target, (64, 32, 32), max_mem="16MB", threads=1, work_dir=str(work)
    )
    return resumed(s)


def write_rechunk_dataset(src: Path, target: Path, work: Path) -> bool | None:
    import chunkfuse

    chunks = {"time": 64, "latitude": 32, "longitude": 32}
    s = chunkfuse.rechunk(src, target, chunks, max_mem="16MB", threads=1, work_dir=str(work))
    return resumed(s)


def write_cubed(src: Path, target: Path, work: Path) -> bool | None:
    import cubed
    import cubed.array_api as xp
    from chunkfuse import RustExecutor

    executor = RustExecutor(max_workers=1)
    spec = cubed.Spec(work_dir=str(work), allowed_mem="64MB", executor=executor)
    x = cubed.from_zarr(str(src), path="t2m", spec=spec)
    cubed.to_zarr(x - xp.mean(x, axis=0, keepdims=True), str(target), executor=executor)
    return None


def write_cubed_xarray(src: Path, target: Path, work: Path) -> bool | None:
    import cubed
    import xarray as xr
    from chunkfuse import RustExecutor

    executor = RustExecutor(max_workers=1)
    spec = cubed.Spec(work_dir=str(work), allowed_mem="64MB", executor=executor)
    ds = xr.open_zarr(
        src, chunked_array_type="cubed", from_array_kwargs={"spec": spec}, consolidated=False
    )
    anomaly = (ds.t2m - ds.t2m.mean("time")).to_dataset(name="anomaly")
    anomaly.to_zarr(
        target,
        mode="w",
        zarr_format=3,
        consolidated=False,
        chunkmanager_store_kwargs={"executor": executor},
    )
    return None


def write_dask_to_zarr(src: Path, target: Path, work: Path) -> bool | None:
    import chunkfuse.dask
    import dask
    import xarray as xr

    ds = xr.open_zarr(src, chunks={"time": 8}, consolidated=False)
    anomaly = (ds.t2m - ds.t2m.mean("time")).to_dataset(name="anomaly")
    # The engine's scratch in `work` (Dask's own setting): a killed run leaves it there.
    with dask.config.set(
        scheduler=chunkfuse.dask.get, num_workers=1, temporary_directory=str(work)
    ):
        anomaly.to_zarr(target, mode="w", zarr_format=3, consolidated=False)
    return None


def write_dask_store(src: Path, target: Path, work: Path) -> bool | None:
    import chunkfuse.dask
    import dask.array as da
    import zarr

    x = da.from_zarr(str(src), component="t2m")
    out = zarr.create_array(
        str(target), shape=x.shape, chunks=(8, *x.shape[1:]), dtype=x.dtype, overwrite=True
    )
    da.store(
        x - x.mean(axis=0), out, scheduler=chunkfuse.dask.get, num_workers=1, work_dir=str(work)
    )
    return None


def write_distributed(src: Path, target: Path, work: Path) -> bool | None:
    from chunkfuse.distributed import LocalRuntime, run_distributed

    run = run_distributed(
        PLAN.read_text(),
        {"source": f"{src}/t2m", "target": str(target)},
        runtime=LocalRuntime(2),
        work_dir=str(work),
        max_mem="64MB",
    )
    return resumed({"stages": run.stages})


WRITES: dict[str, Callable[[Path, Path, Path], bool | None]] = {
    "rechunk-array": write_rechunk_array,
    "rechunk-dataset": write_rechunk_dataset,
    "cubed-to-zarr": write_cubed,
    "cubed-xarray": write_cubed_xarray,
    "dask-to-zarr": write_dask_to_zarr,
    "dask-store": write_dask_store,
    "distributed": write_distributed,
}
ENTRIES = ["cli-plan", *WRITES]


def child(name: str, src: Path, target: Path, work: Path) -> None:
    """Runs one write in this process, telling the harness when it starts and ends."""
    write = WRITES[name]
    # What the writes import is imported before the kill window opens.
    import chunkfuse.dask  # noqa: F401
    import chunkfuse.distributed  # noqa: F401
    import cubed.array_api  # noqa: F401
    import dask.array  # noqa: F401
    import xarray  # noqa: F401

    print("START", flush=True)
    t0 = time.perf_counter()
    again = write(src, target, work)
    print("DONE " + json.dumps({"seconds": time.perf_counter() - t0, "resumed": again}))


# -- the harness ----------------------------------------------------------------------------


@dataclass
class Run:
    """One run of a write: how it ended and what it said."""

    returncode: int
    seconds: float
    resumed: bool | None
    stderr: str


def start(name: str, src: Path, target: Path, work: Path) -> subprocess.Popen[str]:
    if name == "cli-plan":
        cmd = write_cli(src, target, work)
    else:
        cmd = [sys.executable, __file__, "child", name, str(src), str(target), str(work)]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )


def run_write(
    name: str, src: Path, target: Path, work: Path, kill_after: float | None = None
) -> Run:
    """Runs the write to its end, or SIGKILLs it `kill_after` seconds after it started
    writing (for the CLI, after the process started)."""
    proc = start(name, src, target, work)
    assert proc.stdout is not None and proc.stderr is not None
    t0 = time.perf_counter()
    if name != "cli-plan":
        line = proc.stdout.readline()
        if line.strip() != "START":
            proc.wait()
            raise RuntimeError(f"{name}: child failed before it started: {proc.stderr.read()}")
        t0 = time.perf_counter()
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    again: bool | None = None
    if name == "cli-plan" and proc.returncode == 0:
        again = resumed(json.loads(out))
    for line in out.splitlines():
        if line.startswith("DONE "):
            done = json.loads(line[5:])
            seconds, again = done["seconds"], done["resumed"]
    if kill_after is None and proc.returncode != 0:
        raise RuntimeError(f"{name}: the write failed (exit {proc.returncode}): {err[-2000:]}")
    return Run(proc.returncode, seconds, again, err)


def files(target: Path) -> dict[str, Path]:
    """Every file under `target`, by its path relative to it."""
    if not target.exists():
        return {}
    return {str(p.relative_to(target)): p for p in target.rglob("*") if p.is_file()}


def is_temporary(key: str) -> bool:
    """A writer's temporary: chunkfuse's (`.partial-...`) or zarr-python's, which xarray
    writes coordinates and metadata through (`NAME.HEX.partial`). Neither is ever read."""
    name = key.rsplit("/", 1)[-1]
    return TEMPORARY in name or name.endswith(".partial")


def is_chunk(key: str) -> bool:
    return key.rsplit("/", 1)[-1] not in METADATA and not is_temporary(key)


def marked(tree: dict[str, Path]) -> bool:
    """Whether an array or group in the tree carries the unfinished-job marker."""
    for key, path in tree.items():
        name = key.rsplit("/", 1)[-1]
        if name not in ("zarr.json", ".zattrs"):
            continue
        doc = json.loads(path.read_bytes() or b"{}")
        attrs = doc.get("attributes", {}) if name == "zarr.json" else doc
        if isinstance(attrs, dict) and (attrs.get("chunkfuse") or {}).get("incomplete"):
            return True
    return False


def arrays_of(tree: dict[str, Path]) -> list[str]:
    """The directories (relative, "" for the root) holding an array's metadata."""
    out = []
    for key, path in tree.items():
        name = key.rsplit("/", 1)[-1]
        parent = key.rsplit("/", 1)[0] if "/" in key else ""
        if name == ".zarray" or (
            name == "zarr.json" and json.loads(path.read_bytes()).get("node_type") == "array"
        ):
            out.append(parent)
    return out


def chunks_under(tree: dict[str, Path], array: str) -> set[str]:
    """The chunk keys of the array at `array` (not those of arrays nested under it)."""
    prefix = f"{array}/" if array else ""
    nested = [a for a in arrays_of(tree) if a != array and a.startswith(prefix)]
    return {
        k
        for k in tree
        if k.startswith(prefix) and is_chunk(k) and not any(k.startswith(f"{n}/") for n in nested)
    }


def left_by_kill(killed: dict[str, Path], clean: dict[str, Path]) -> tuple[str, str]:
    """What a killed run left, checked against the clean run: (state, problem or "")."""
    for key, path in killed.items():
        if not is_chunk(key):
            continue
        if key not in clean:
            return "bad", f"chunk {key} is not one of the clean run's"
        if path.read_bytes() != clean[key].read_bytes():
            return "bad", f"chunk {key} differs from the clean run's (partial or wrong)"
    if not any(k.rsplit("/", 1)[-1] in METADATA for k in killed):
        return "absent", ""
    if marked(killed):
        return "marked", ""
    if same_tree(killed, clean) == "":
        return "complete", ""
    begun = [a for a in arrays_of(killed) if 0 < len(chunks_under(killed, a))]
    partial = [a for a in begun if chunks_under(killed, a) != chunks_under(clean, a)]
    if not partial:
        return "not begun", ""
    return "bad", f"arrays {partial} hold some of their chunks and carry no marker"


def same_tree(got: dict[str, Path], clean: dict[str, Path]) -> str:
    """Empty when `got` holds the clean run's files (chunks byte for byte, metadata as JSON),
    else what differs."""
    if set(got) != set(clean):
        extra, missing = sorted(set(got) - set(clean)), sorted(set(clean) - set(got))
        return f"files differ: extra {extra[:5]}, missing {missing[:5]}"
    for key, path in got.items():
        a, b = path.read_bytes(), clean[key].read_bytes()
        if a == b:
            continue
        if not is_chunk(key) and json.loads(a) == json.loads(b):
            continue
        return f"{key} differs from the clean run's"
    return ""


@dataclass
class SeedResult:
    """One seed of one entry point (a line of the report)."""

    entry: str
    seed: int
    kill_after_s: float
    killed: bool
    left: str
    chunks_left: int
    chunks_total: int
    temporaries_left: int
    rerun_resumed: bool | None
    exact: bool
    problem: str
    seconds: float


def try_seed(
    name: str, seed: int, src: Path, clean: dict[str, Path], clean_s: float, scratch: Path
) -> SeedResult:
    t0 = time.perf_counter()
    rng = random.Random(f"{name}/{seed}")
    delay = rng.uniform(0.0, 0.9 * clean_s)
    here = scratch / f"{name}-{seed}"
    target, work = here / "target.zarr", here / "work"
    work.mkdir(parents=True)
    run = run_write(name, src, target, work, kill_after=delay)
    killed = run.returncode == -signal.SIGKILL
    problem = ""
    if not killed and run.returncode != 0:
        problem = f"the run failed (exit {run.returncode}): {run.stderr[-500:]}"
    tree = files(target)
    left, why = left_by_kill(tree, clean)
    if not killed and left != "complete":
        why = why or f"the run ended but left its target {left}"
    problem = problem or why
    chunks_left = sum(is_chunk(k) for k in tree)
    temporaries = sum(is_temporary(k) for k in tree)
    again: bool | None = None
    if left == "complete":
        # The kill came after the job ended (while the process exited): nothing to rerun, and
        # a rerun would rightly be refused (the target is finished).
        differs = ""
    else:
        try:
            again = run_write(name, src, target, work).resumed
            differs = same_tree(files(target), clean)
        except RuntimeError as e:
            differs = f"the rerun failed: {e}"
        if again is False and chunks_left and left == "marked":
            # An entry point that resumes kept nothing of what the kill left.
            differs = differs or f"the rerun wrote again the {chunks_left} chunks the kill left"
    problem = problem or differs
    shutil.rmtree(here, ignore_errors=True)
    return SeedResult(
        entry=name,
        seed=seed,
        kill_after_s=round(delay, 3),
        killed=killed,
        left=left,
        chunks_left=chunks_left,
        chunks_total=sum(is_chunk(k) for k in clean),
        temporaries_left=temporaries,
        rerun_resumed=again,
        exact=differs == "",
        problem=problem,
        seconds=round(time.perf_counter() - t0, 2),
    )


def run_entry(
    name: str, seeds: range, src: Path, scratch: Path, report: Callable[[SeedResult], None]
) -> list[SeedResult]:
    clean_target, clean_work = scratch / f"{name}-clean" / "target.zarr", scratch / "clean-work"
    clean_work.mkdir(parents=True, exist_ok=True)
    clean_run = run_write(name, src, clean_target, clean_work)
    clean = files(clean_target)
    results = []
    for seed in seeds:
        r = try_seed(name, seed, src, clean, clean_run.seconds, scratch)
        report(r)
        results.append(r)
    shutil.rmtree(clean_target.parent, ignore_errors=True)
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        name, src, target, work = sys.argv[2:6]
        child(name, Path(src), Path(target), Path(work))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--entry", action="append", choices=ENTRIES)
    parser.add_argument("--out", type=Path, help="append a JSON line per seed to this file")
    args = parser.parse_args()
    failed = 0
    stamp = run_record.stamp()

    def report(r: SeedResult) -> None:
        nonlocal failed
        failed += r.problem != ""
        run_record.record({**asdict(r), **stamp}, args.out)

    with tempfile.TemporaryDirectory(prefix="chunkfuse-kill-") as tmp:
        scratch = Path(tmp)
        src = scratch / "era5.zarr"
        make_source(src)
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        for name in args.entry or ENTRIES:
            run_entry(name, seeds, src, scratch, report)
    if failed:
        sys.exit(f"{failed} seeds failed")


if __name__ == "__main__":
    main()
