"""chunkfuse against its peers on one ERA5-like array, in one run.

    python bench/run.py [--time 256] [--data DIR] [--out DIR] [--repeat 3] [--threads N]
                        [--max-mem 1GB] [--quick]

Makes (or reuses) a float32 (time, 721, 1440) array with scripts/make_era5.py (zstd level 3,
one chunk per step), warms the page cache, then times, best of --repeat (taken in rounds: each
round runs every tool of a comparison once, in turn, so a host whose speed drifts slows them
alike):

  sum      chunkfuse run plans/era5-sum.json  vs  Dask (threads) ((x + 1) * 2).sum(axis=0)
           vs numpy + zarr-python reading everything (all write the result to Zarr v3, zstd 3)
  sum      also chunkfuse bench read (read + decode through the engine, no compute: the sum's floor)
  decode   chunkfuse bench decode (the read/decode floor)  vs  zarr-python and Dask reading all
  rechunk  chunkfuse rechunk to (256, 73, 144), zstd 3, --max-mem  vs  Dask rechunk + store
           (zstd 3), plus the codec floor `chunkfuse bench codec`
  fft-lat, power-spectrum  chunkfuse's FFT plans vs dask.array.fft (bench/fft_report.py)
and tensorstore where importable. Then, if cubed is importable, the Cubed section
(bench/cubed_report.py): sum, mean, the xarray anomaly and the rechunk written by the same Cubed
code with RustExecutor and with Cubed's threads executor, next to each op's codec floor. The
sum also runs as the same Dask code with scheduler=chunkfuse.dask.get, and
bench/dask_overhead.py times 100,000 trivial Python tasks on both Dask schedulers, and
bench/xarray_dask.py xarray's reductions of the array opened with xr.open_zarr, and
bench/many_chunks.py roll, concatenate and fftshift over 730 one-step chunks and a tiny get. Every
measurement is its own child process; its peak RSS is that child's ru_maxrss (os.wait4, through
scripts/rss_exec.py). Results are cross-checked between tools.

Writes RESULTS.md and results.png (if matplotlib is importable) to --out (default bench/; with
--quick a temporary directory). --quick is a smoke run (T=4, 73 x 144, one repeat) that fails
(exit 1) if any measurement fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
PEERS = BENCH / "peers.py"
MAKE_ERA5 = REPO / "scripts" / "make_era5.py"
RSS_EXEC = REPO / "scripts" / "rss_exec.py"
SUM_PLAN = REPO / "plans" / "era5-sum.json"
RECHUNK_TARGET = (256, 73, 144)
CODEC = "zstd:3"


# --------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------


@dataclass
class Proc:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes
    wall: float


def _load_rss_exec() -> Any:
    spec = importlib.util.spec_from_file_location("rss_exec", RSS_EXEC)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {RSS_EXEC}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_warm_bytes(quick: bool) -> int:
    """``--warm-mem`` when not given: 2 GiB, more than any tool's peak here but tensorstore's;
    64 MiB for a ``--quick`` smoke run, which only checks that the step works."""
    return 64 << 20 if quick else 2 << 30


#: Bytes of memory the driver touches and frees just before every child (``--warm-mem``).
WARM_BYTES = default_warm_bytes(False)


def warm_memory(nbytes: int) -> None:
    """Touch ``nbytes`` of fresh memory, then free it, so the next child starts from memory the
    host already backs. On a VM whose balloon reports free pages (Firecracker, cloud VMs), the
    host takes back memory that stays free for ~2 s, and faulting it in again costs 1-3 s per
    GB: without this, whichever tool runs after a small one or after a pause pays that for its
    output, and the order of the tools would decide the comparison."""
    if nbytes > 0:
        block = np.ones(nbytes, dtype=np.uint8)
        del block


def parse_size(text: str) -> int:
    """Bytes from ``2GiB``, ``1.5GB``, ``512MiB`` or a plain integer."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    low = text.strip().lower()
    for suffix, scale in units.items():
        if low.endswith(suffix):
            return int(float(low[: -len(suffix)]) * scale)
    try:
        return int(low.rstrip("b"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--warm-mem: cannot read {text!r} as a size") from None


def run_child(argv: list[str], timeout: float = 3600.0) -> Proc:
    """Run one child under scripts/rss_exec.py: peak RSS is ru_maxrss of exactly that command
    (os.wait4 in a tiny launcher; measured from this process, a child's ru_maxrss would start at
    this driver's own RSS). The driver warms memory first (`warm_memory`)."""
    warm_memory(WARM_BYTES)
    m = _load_rss_exec().run_measured(argv, timeout)
    return Proc(argv, m.returncode, m.stdout, m.stderr, m.peak_rss, m.wall)


@dataclass
class Row:
    op: str
    tool: str
    command: str
    seconds: float | None = None
    wall: float | None = None
    peak_rss: int | None = None
    nbytes: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Seconds of every run, in round order.
    runs: list[float] = field(default_factory=list)

    @property
    def gbps(self) -> float | None:
        return self.nbytes / self.seconds / 1e9 if self.seconds else None


#: One measurement: (op, tool, argv, decoded bytes, output to delete before each run or None).
Job = tuple[str, str, list[str], int, Path | None]


def measure_rounds(jobs: list[Job], repeat: int, seconds_key: str | None = "seconds") -> list[Row]:
    """Best of ``repeat`` runs of each job, taken in rounds: every round runs each job once, in
    turn, so a host whose speed drifts during the bench slows every tool of a comparison alike
    (rather than whichever tool happened to run in the slow minutes). ``seconds_key``: field of
    the child's JSON with its own timing (None: use wall time)."""
    rows = [Row(op, tool, shlex.join(argv), nbytes=nbytes) for op, tool, argv, nbytes, _ in jobs]
    failed = [False] * len(jobs)
    for _ in range(repeat):
        for k, ((op, tool, argv, _, cleanup), row) in enumerate(zip(jobs, rows, strict=True)):
            if not failed[k]:
                failed[k] = not _run_once(op, tool, argv, cleanup, row, seconds_key)
    return rows


def _run_once(
    op: str, tool: str, argv: list[str], cleanup: Path | None, row: Row, seconds_key: str | None
) -> bool:
    """One run of a job into ``row`` (its best time and largest peak RSS); False on failure."""
    if cleanup is not None and cleanup.exists():
        shutil.rmtree(cleanup)
    proc = run_child(argv)
    if proc.returncode != 0:
        row.note = f"failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
        print(f"  {tool} {op}: {row.note}", file=sys.stderr)
        return False
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        row.note = f"no JSON on stdout: {proc.stdout[-200:]!r}"
        return False
    seconds = float(out[seconds_key]) if seconds_key else proc.wall
    row.runs.append(seconds)
    if row.seconds is None or seconds < row.seconds:
        row.seconds, row.wall, row.extra = seconds, proc.wall, out
    row.peak_rss = max(row.peak_rss or 0, proc.peak_rss)
    print(
        f"  {tool:<12} {op:<8} {seconds:8.3f} s  wall {proc.wall:7.3f} s  "
        f"peak RSS {proc.peak_rss / 2**20:8.1f} MiB",
        file=sys.stderr,
    )
    return True


def measure(
    op: str,
    tool: str,
    argv: list[str],
    nbytes: int,
    repeat: int,
    cleanup: Path | None,
    seconds_key: str | None = "seconds",
) -> Row:
    """Best of ``repeat`` runs of one command."""
    return measure_rounds([(op, tool, argv, nbytes, cleanup)], repeat, seconds_key)[0]


# --------------------------------------------------------------------------------------------
# Data and machine
# --------------------------------------------------------------------------------------------


def ensure_data(data_dir: Path, ntime: int, nlat: int, nlon: int) -> tuple[Path, dict[str, Any]]:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"era5-t{ntime}-{nlat}x{nlon}-zstd3.zarr"
    marker = path.with_suffix(".ok.json")
    if path.exists() and marker.exists():
        print(f"reusing {path}", file=sys.stderr)
        return path, json.loads(marker.read_text())
    print(f"writing {path} ...", file=sys.stderr)
    proc = subprocess.run(
        [
            sys.executable,
            str(MAKE_ERA5),
            str(path),
            "--time",
            str(ntime),
            "--lat",
            str(nlat),
            "--lon",
            str(nlon),
            "--level",
            "3",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"make_era5.py failed:\n{proc.stderr}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    marker.write_text(json.dumps(summary))
    return path, summary


def warm_page_cache(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                while f.read(1 << 22):
                    pass


def replace_section(path: Path, lines: list[str]) -> None:
    """Puts `lines` (a section, its title first) in the report at `path` in place of the
    section of the same title, or at its end; the other sections stay as they are."""
    old = path.read_text().splitlines() if path.exists() else []
    title = lines[0].strip()
    start = next((i for i, line in enumerate(old) if line.strip() == title), None)
    if start is None:
        kept_before, kept_after = old, []
    else:
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        kept_before, kept_after = old[:start], old[end:]
    while kept_before and not kept_before[-1].strip():
        kept_before.pop()
    body = [*kept_before, "", *lines] if kept_before else list(lines)
    if kept_after:
        body += ["", *kept_after]
    path.write_text("\n".join(body).rstrip("\n") + "\n")


def _git(*args: str) -> str:
    """The output of `git -C REPO ARGS`, stripped."""
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def commit() -> str:
    """The checkout's commit, saying so when it has uncommitted changes."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"{head}{' with uncommitted changes' if dirty else ''}"


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def versions(binary: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    out["chunkfuse"] = proc.stdout.strip() or "unknown"
    for name in ("numpy", "zarr", "dask", "tensorstore", "zarrs", "cubed"):
        if importlib.util.find_spec(name) is None:
            out[name] = "not installed"
            continue
        try:
            # The installed distribution's version (tensorstore has no __version__).
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "?"
    return out


# --------------------------------------------------------------------------------------------
# Cross-checks
# --------------------------------------------------------------------------------------------


def read_array(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[...])


def check_sum(outputs: dict[str, Path], source: Path) -> dict[str, str]:
    """Compare each tool's sum with chunkfuse's (rtol 1e-5 of the float64 magnitude)."""
    import zarr

    z = zarr.open_array(str(source), mode="r")
    magnitude = np.zeros(z.shape[1:], dtype=np.float64)
    for t in range(0, z.shape[0], 8):
        magnitude += np.abs((z[t : t + 8].astype(np.float64) + 1) * 2).sum(axis=0)
    status: dict[str, str] = {}
    reference = None
    for tool, path in outputs.items():
        if not path.exists():
            status[tool] = "no output"
            continue
        value = read_array(path).astype(np.float64)
        if reference is None:
            reference = value
        ok = value.shape == reference.shape and bool(
            np.all(np.abs(value - reference) <= 2e-5 * magnitude)
        )
        status[tool] = "ok" if ok else "MISMATCH"
    return status


def check_rechunk(outputs: dict[str, Path], source: Path) -> dict[str, str]:
    """Every tool's rechunked copy equals the source exactly."""
    import zarr

    src = zarr.open_array(str(source), mode="r")
    status: dict[str, str] = {}
    step = RECHUNK_TARGET[1]
    for tool, path in outputs.items():
        if not path.exists():
            status[tool] = "no output"
            continue
        out = zarr.open_array(str(path), mode="r")
        ok = out.shape == src.shape
        for i in range(0, src.shape[1], step):
            if not ok:
                break
            ok = np.array_equal(out[:, i : i + step], src[:, i : i + step])
        status[tool] = "ok" if ok else "MISMATCH"
    return status


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def table(rows: list[Row], checks: dict[tuple[str, str], str]) -> list[str]:
    lines = [
        "| op | tool | seconds | GB/s | wall s | peak RSS (MiB) | ratio vs chunkfuse | check "
        "| note |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    base: dict[str, Row] = {}
    for r in rows:
        if r.tool == "chunkfuse" and r.seconds:
            base[r.op] = r
    for r in rows:
        ratio = r.seconds / base[r.op].seconds if r.seconds and r.op in base else None
        rss = r.peak_rss / 2**20 if r.peak_rss else None
        note = r.note
        if r.tool.endswith("floor") and r.op in base:
            note = "; ".join(n for n in (note, per_round(base[r.op], r)) if n)
        lines.append(
            f"| {r.op} | {r.tool} | {fmt(r.seconds, '.3f')} | {fmt(r.gbps, '.2f')} | "
            f"{fmt(r.wall, '.2f')} | {fmt(rss, '.0f')} | {fmt(ratio, '.2f')} | "
            f"{checks.get((r.op, r.tool), '')} | {note} |"
        )
    return lines


def per_round(chunkfuse: Row, floor: Row) -> str:
    """chunkfuse's time over its floor's in each round (the two ran minutes apart at most),
    beside the ratio of their bests: on a host whose speed drifts, the best of one may come
    from a faster minute than the best of the other."""
    if not floor.runs or len(chunkfuse.runs) != len(floor.runs):
        return ""
    ratios = sorted(c / f for c, f in zip(chunkfuse.runs, floor.runs, strict=True) if f > 0)
    if not ratios:
        return ""
    return (
        f"chunkfuse / floor per round: median {statistics.median(ratios):.2f} "
        f"({ratios[0]:.2f}–{ratios[-1]:.2f})"
    )


def plot(rows: list[Row], out: Path) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        return "results.png not written: matplotlib is not installed (the script installs nothing)."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r.op for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 3.5), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        sel = [r for r in rows if r.op == op and r.seconds]
        ax.barh(
            [r.tool for r in sel],
            [r.seconds or 0.0 for r in sel],
            color=["tab:orange" if r.tool.startswith("chunkfuse") else "tab:blue" for r in sel],
        )
        ax.set_title(op)
        ax.set_xlabel("seconds (best of repeats; lower is better)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=120)
    return "![results](results.png)"


def write_report(
    out: Path,
    rows: list[Row],
    checks: dict[tuple[str, str], str],
    args: argparse.Namespace,
    data: dict[str, Any],
    binary: Path,
    started: dt.datetime,
    cubed_results: list[Any],
) -> Path:
    info = machine()
    vers = versions(binary)
    lines = [
        "# chunkfuse benchmark results",
        "",
        f"Command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Date: {started.strftime('%Y-%m-%d %H:%M:%S %Z')}  ",
        (
            f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, {info['os']}, "
            f"Python {info['python']}  "
        ),
        "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
        "",
        (
            f"Data: `{data['path']}`: float32 {tuple(data['shape'])}, "
            f"chunks {tuple(data['chunks'])}, {data['codec']}, "
            f"{data['nbytes'] / 1e6:.1f} MB decoded, {data['stored_bytes'] / 1e6:.1f} MB stored "
            f"(ratio {data['compression_ratio']}). Page cache warm."
        ),
        "",
        (
            f"Threads: {args.threads}; --max-mem {args.max_mem} for chunkfuse (and cubed's "
            f"allowed_mem); best of {args.repeat}, taken in rounds (each round runs every tool "
            "of an op, floors included, once in turn, so the host's drift during the bench "
            "slows all of them alike; before each child the driver touches and frees "
            f"{args.warm_mem / 2**30:.1f} GiB, so every tool starts from memory the host "
            "already backs: see bench/README.md). `seconds` is each tool's own timing of the "
            "work (chunkfuse's `--json` seconds; peers time from after imports and open to the "
            "result written); `wall s` is the whole child process, start-up and imports "
            "included. GB/s = decoded input bytes / seconds. Ratio = seconds / chunkfuse seconds "
            "for the same op (above 1: slower than chunkfuse; the floors show how close "
            "chunkfuse gets to decode/encode alone)."
        ),
        "",
        *table(rows, checks),
        "",
        plot(rows, out),
        "",
    ]
    if cubed_results:
        from cubed_report import cubed_table

        lines += cubed_table(cubed_results)
    missing = [k for k in ("tensorstore", "cubed") if vers.get(k) == "not installed"]
    if missing:
        lines.append("Peers not installed (rows omitted): " + ", ".join(missing) + ".")
        lines.append("")
    path = out / "RESULTS.md"
    path.write_text("\n".join(lines))
    return path


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=256)
    parser.add_argument("--lat", type=int, default=721)
    parser.add_argument("--lon", type=int, default=1440)
    parser.add_argument(
        "--data",
        type=Path,
        default=BENCH / "data",
        help="where the input array is made or reused (default: bench/data, git-ignored)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where RESULTS.md / results.png go (default bench/; --quick: a temp dir)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-mem", default="1GB")
    parser.add_argument(
        "--warm-mem",
        default=None,
        type=parse_size,
        help="memory the driver touches and frees before every child, so each starts with "
        "memory the host has backed (default 2GiB, 64MiB with --quick; 0 to disable; see "
        "warm_memory)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (T=4, 73 x 144)")
    parser.add_argument("--skip", default="", help="comma-separated tools to skip, e.g. numpy,dask")
    args = parser.parse_args(argv)
    global WARM_BYTES
    if args.warm_mem is None:
        args.warm_mem = default_warm_bytes(args.quick)
    WARM_BYTES = args.warm_mem
    if args.quick:
        args.time, args.lat, args.lon, args.repeat = 4, 73, 144, 1
    started = dt.datetime.now(dt.UTC)
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="chunkfuse-bench-quick-")) if args.quick else BENCH
    )
    out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}

    binary = Path(os.environ.get("CHUNKFUSE_BIN", REPO / "target" / "release" / "chunkfuse"))
    if not binary.is_file():
        print(f"chunkfuse binary not found at {binary} (cargo build --release)", file=sys.stderr)
        return 1
    source, data = ensure_data(args.data, args.time, args.lat, args.lon)
    warm_page_cache(source)
    nbytes = int(data["nbytes"])
    threads = str(args.threads)
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="chunkfuse-bench-work-"))
    target_chunks = (
        min(RECHUNK_TARGET[0], args.time),
        min(RECHUNK_TARGET[1], args.lat),
        min(RECHUNK_TARGET[2], args.lon),
    )
    chunks_arg = ",".join(map(str, target_chunks))
    peers = [
        t
        for t in ("dask", "numpy", "tensorstore")
        if t not in skip and importlib.util.find_spec(t) is not None
    ]
    cubed_results: list[Any] = []
    rows: list[Row] = []
    checks: dict[tuple[str, str], str] = {}
    try:
        # (a) sum ------------------------------------------------------------------------
        print("sum:", file=sys.stderr)
        sum_out: dict[str, Path] = {}
        jobs: list[Job] = []
        if SUM_PLAN.exists():
            dst = work / "sum-chunkfuse.zarr"
            jobs.append(
                (
                    "sum",
                    "chunkfuse",
                    [
                        str(binary),
                        "run",
                        str(SUM_PLAN),
                        "--param",
                        f"source={source}",
                        "--param",
                        f"target={dst}",
                        "--threads",
                        threads,
                        "--max-mem",
                        args.max_mem,
                        "--json",
                    ],
                    nbytes,
                    dst,
                )
            )
            sum_out["chunkfuse"] = dst
        else:
            rows.append(Row("sum", "chunkfuse", "", note=f"{SUM_PLAN} missing"))
        for tool in peers:
            dst = work / f"sum-{tool}.zarr"
            jobs.append(
                (
                    "sum",
                    tool,
                    [
                        py,
                        str(PEERS),
                        tool,
                        "sum",
                        str(source),
                        str(dst),
                        "--threads",
                        threads,
                        "--max-mem",
                        args.max_mem,
                    ],
                    nbytes,
                    dst,
                )
            )
            sum_out[tool] = dst
        if "dask" in peers:
            # The same Dask code with scheduler=chunkfuse.dask.get.
            dst = work / "sum-chunkfuse-dask.zarr"
            jobs.append(
                (
                    "sum",
                    "chunkfuse.dask",
                    [
                        py,
                        str(PEERS),
                        "chunkfuse-dask",
                        "sum",
                        str(source),
                        str(dst),
                        "--threads",
                        threads,
                    ],
                    nbytes,
                    dst,
                )
            )
            sum_out["chunkfuse.dask"] = dst
        # The sum's floor: read and decode every chunk through the engine, no compute.
        jobs.append(
            (
                "sum",
                "chunkfuse read floor",
                [str(binary), "bench", "read", str(source), "--threads", threads, "--json"],
                nbytes,
                None,
            )
        )
        rows += measure_rounds(jobs, args.repeat)
        for tool, status in check_sum(sum_out, source).items():
            checks[("sum", tool)] = status

        # (b) decode floor -----------------------------------------------------------------
        print("decode:", file=sys.stderr)
        jobs = []
        jobs.append(
            (
                "decode",
                "chunkfuse",
                [str(binary), "bench", "decode", str(source), "--threads", threads, "--json"],
                nbytes,
                None,
            )
        )
        for tool in peers:
            if tool in ("numpy", "dask", "tensorstore"):
                label = "zarr-python" if tool == "numpy" else tool
                jobs.append(
                    (
                        "decode",
                        label,
                        [
                            py,
                            str(PEERS),
                            tool,
                            "read",
                            str(source),
                            str(work / "unused"),
                            "--threads",
                            threads,
                        ],
                        nbytes,
                        None,
                    )
                )

        rows += measure_rounds(jobs, args.repeat)

        # (c) rechunk ----------------------------------------------------------------------
        print("rechunk:", file=sys.stderr)
        jobs = []
        rechunk_out: dict[str, Path] = {}
        dst = work / "rechunk-chunkfuse.zarr"
        jobs.append(
            (
                "rechunk",
                "chunkfuse",
                [
                    str(binary),
                    "rechunk",
                    str(source),
                    str(dst),
                    "--chunks",
                    chunks_arg,
                    "--codec",
                    CODEC,
                    "--max-mem",
                    args.max_mem,
                    "--threads",
                    threads,
                    "--json",
                ],
                nbytes,
                dst,
            )
        )
        rechunk_out["chunkfuse"] = dst
        jobs.append(
            (
                "rechunk",
                "chunkfuse codec floor",
                [
                    str(binary),
                    "bench",
                    "codec",
                    str(source),
                    "--chunks",
                    chunks_arg,
                    "--codec",
                    CODEC,
                    "--threads",
                    threads,
                    "--json",
                ],
                nbytes,
                None,
            )
        )
        for tool in peers:
            if tool == "numpy":
                continue  # reading 1 GB and writing it back is not a rechunking strategy
            dst = work / f"rechunk-{tool}.zarr"
            jobs.append(
                (
                    "rechunk",
                    tool,
                    [
                        py,
                        str(PEERS),
                        tool,
                        "rechunk",
                        str(source),
                        str(dst),
                        "--chunks",
                        chunks_arg,
                        "--threads",
                        threads,
                        "--max-mem",
                        args.max_mem,
                    ],
                    nbytes,
                    dst,
                )
            )
            rechunk_out[tool] = dst
        rows += measure_rounds(jobs, args.repeat)
        for tool, status in check_rechunk(rechunk_out, source).items():
            checks[("rechunk", tool)] = status

        # (d) FFTs: chunkfuse's FFT plans vs dask.array.fft ---------------------------------
        if "fft" not in skip:
            from fft_report import measure_fft

            fft_rows, fft_checks = measure_fft(
                measure_rounds,
                binary,
                source,
                work,
                nbytes,
                threads,
                args.max_mem,
                args.repeat,
                (args.time, *target_chunks[1:]),
                "dask" in peers,
            )
            rows += fft_rows
            checks.update(fft_checks)

        # (e) Cubed: RustExecutor vs Cubed's threads executor ------------------------------
        if "cubed" not in skip and importlib.util.find_spec("cubed") is not None:
            from cubed_report import measure_cubed

            cubed_results = measure_cubed(
                measure_rounds,
                binary,
                source,
                work,
                nbytes,
                threads,
                args.max_mem,
                args.repeat,
                tuple(data["chunks"]),
                target_chunks,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = write_report(out, rows, checks, args, data, binary, started, cubed_results)
    if "dask" in peers:
        # (f) Scheduler overhead of chunkfuse.dask.get on many trivial Python tasks.
        from dask_overhead import overhead_lines

        print("dask scheduler overhead:", file=sys.stderr)
        lines = overhead_lines(100_000, args.threads)
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + "\n".join(lines))
        # xarray's reductions on Dask (bench/xarray_dask.py).
        from xarray_dask import xarray_lines

        print("xarray on dask:", file=sys.stderr)
        lines = xarray_lines(source, Path(args.data), args.threads, args.repeat)
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + "\n".join(lines))
        # Many small chunks and a tiny get's fixed cost (bench/many_chunks.py).
        from many_chunks import many_chunk_lines

        print("many small chunks:", file=sys.stderr)
        lines = many_chunk_lines(Path(args.data), 730, args.threads, args.repeat)
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + "\n".join(lines))
    storage_failed: list[str] = []
    if "storage" not in skip:
        # (g) Full reads and random crops against zarr-python, zarrs-python and tensorstore,
        # from local disk and from a loopback S3 server (bench/storage.py).
        from storage import storage_lines

        print("storage:", file=sys.stderr)
        lines = storage_lines(
            args.threads,
            source,
            binary=binary,
            repeat=args.repeat,
            s3_time=min(16, args.time),
            data_dir=args.data,
            skip=skip,
            measure=measure,
            failures=storage_failed,
            warm_bytes=WARM_BYTES,
        )
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + "\n".join(lines))
    print(report.read_text())
    print(f"wrote {report}", file=sys.stderr)
    failed = [r for r in rows if r.seconds is None] + [
        r for r in rows if checks.get((r.op, r.tool)) == "MISMATCH"
    ]
    for c in cubed_results:
        if c.rust.seconds is None or c.check == "MISMATCH":
            failed.append(c.rust)
    chunkfuse_failed = [
        r for r in failed if r.tool.startswith("chunkfuse") or r.tool == "RustExecutor"
    ]
    storage_failed = [f for f in storage_failed if args.quick or " chunkfuse" in f]
    if chunkfuse_failed or (args.quick and failed) or storage_failed:
        for r in failed:
            print(
                f"FAILED: {r.op} {r.tool}: {r.note or checks.get((r.op, r.tool))}", file=sys.stderr
            )
        for f in storage_failed:
            print(f"FAILED: storage {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
