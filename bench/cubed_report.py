"""The Cubed section of bench/run.py: RustExecutor against Cubed's threads executor.

Each workload of bench/cubed_workloads.py runs with both executors in the same run, on the same
array, each in its own child process (peak RSS from that child). Next to them stands the
workload's codec floor: the engine's own decode (and encode) time for the bytes the op must
touch, measured with `chunkfuse bench read|codec`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORKLOADS = ("sum", "mean", "anomaly", "rechunk")
SCRIPT = Path(__file__).resolve().parent / "cubed_workloads.py"


@dataclass
class CubedResult:
    op: str
    rust: Any  # Row
    threads: Any  # Row
    floor_seconds: float | None
    floor_what: str
    check: str


def _output(path: Path, op: str) -> np.ndarray:
    import zarr

    if op == "anomaly":
        return zarr.open_group(path, mode="r")["t2m_anomaly"][...]
    return zarr.open_array(path, mode="r")[...]


def _check(rust_dst: Path, threads_dst: Path, op: str) -> str:
    try:
        ours, theirs = _output(rust_dst, op), _output(threads_dst, op)
    except Exception as e:  # a failed run leaves nothing to compare
        return f"not compared ({type(e).__name__})"
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
        return "MISMATCH"
    return "ok" if np.allclose(ours, theirs, rtol=1e-5, atol=1e-4) else "MISMATCH"


def measure_cubed(
    measure_rounds: Callable[..., Any],
    binary: Path,
    source: Path,
    work: Path,
    nbytes: int,
    threads: str,
    allowed_mem: str,
    repeat: int,
    source_chunks: tuple[int, ...],
    rechunk_chunks: tuple[int, ...],
) -> list[CubedResult]:
    """Time every workload with both executors plus its floor, in rounds (each round runs the
    floor's commands and both executors once, so a drifting host slows all of them alike);
    compare the executors' outputs."""
    py = sys.executable

    def floor_job(kind: str, chunks: tuple[int, ...] | None) -> Any:
        argv = [str(binary), "bench", kind, str(source), "--threads", threads, "--json"]
        if chunks is not None:
            argv[4:4] = ["--chunks", ",".join(map(str, chunks)), "--codec", "zstd:3"]
        return ("floor", f"chunkfuse {kind}", argv, nbytes, None)

    def floor_jobs(op: str) -> tuple[list[Any], str]:
        if op in ("sum", "mean"):
            return [floor_job("read", None)], "decode the input"
        if op == "anomaly":
            return (
                [floor_job("read", None), floor_job("codec", source_chunks)],
                "decode the input twice (mean, then anomaly) and encode the output (zstd 3)",
            )
        return [floor_job("codec", rechunk_chunks)], "decode the input, encode (zstd 3)"

    results = []
    for op in WORKLOADS:
        print(f"cubed {op}:", file=sys.stderr)
        floors, floor_what = floor_jobs(op)
        jobs = list(floors)
        for executor in ("rust", "threads"):
            dst = work / f"cubed-{op}-{executor}.zarr"
            argv = [py, str(SCRIPT), executor, op, str(source), str(dst)]
            argv += ["--threads", threads, "--allowed-mem", allowed_mem]
            if op == "rechunk":
                argv += ["--chunks", ",".join(map(str, rechunk_chunks))]
            label = "RustExecutor" if executor == "rust" else "cubed threads"
            jobs.append((f"cubed {op}", label, argv, nbytes, dst))
        measured = measure_rounds(jobs, repeat)
        floor_rows, (rust, threads_row) = measured[: len(floors)], measured[len(floors) :]
        parts = [r.seconds for r in floor_rows]
        floor_seconds = sum(parts) if all(parts) else None
        check = _check(work / f"cubed-{op}-rust.zarr", work / f"cubed-{op}-threads.zarr", op)
        results.append(CubedResult(op, rust, threads_row, floor_seconds, floor_what, check))
    return results


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def cubed_table(results: list[CubedResult]) -> list[str]:
    """Markdown: speed-ups over Cubed's threads executor and distance from the codec floor."""
    lines = [
        "## Cubed: RustExecutor vs Cubed's threads executor (same Cubed code, same run)",
        "",
        "| workload | RustExecutor s | threads s | speed-up | floor s | RustExecutor / floor "
        "| peak RSS Rust (MiB) | peak RSS threads (MiB) | Python tasks | check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        rust, threads = r.rust.seconds, r.threads.seconds
        speedup = threads / rust if rust and threads else None
        to_floor = rust / r.floor_seconds if rust and r.floor_seconds else None
        rss_r = r.rust.peak_rss / 2**20 if r.rust.peak_rss else None
        rss_t = r.threads.peak_rss / 2**20 if r.threads.peak_rss else None
        py_tasks = r.rust.extra.get("python_tasks") if r.rust.extra else None
        lines.append(
            f"| {r.op} | {_fmt(rust, '.3f')} | {_fmt(threads, '.3f')} | {_fmt(speedup, '.1f')}× "
            f"| {_fmt(r.floor_seconds, '.3f')} | {_fmt(to_floor, '.2f')} | {_fmt(rss_r, '.0f')} "
            f"| {_fmt(rss_t, '.0f')} | {py_tasks if py_tasks is not None else '–'} | {r.check} |"
        )
    lines += [
        "",
        "Floors: " + "; ".join(f"{r.op}: {r.floor_what}" for r in results) + ".",
        "",
    ]
    return lines
