"""Peak memory of every op kind on an input ten times the budget (issue 38).

    python scripts/memory_table.py [--max-mem 40MB] [--out FILE.jsonl] [--case NAME ...]

Writes a 537 MB float32 array (128 x 1024 x 1024, zstd level 1, 2 MiB chunks), ten times
the default budget (50 MB), then runs one plan per case with `chunkfuse run --max-mem` under
scripts/rss_exec.py and records the process's peak RSS against

    max_mem (as the engine reports it) + baseline + MARGIN

where baseline is the peak RSS of `chunkfuse info` on the same array (binary, allocator and
runtime start-up, thread stacks, metadata) and MARGIN (32 MiB, as tests/test_memory.py)
covers what the budget does not count: allocator fragmentation and per-thread arenas, codec
contexts, the IO layer's buffers. Each case must decode at least the bytes it needs (so a run
cannot stay small by skipping work); the stage strategies the engine chose are recorded. The
windows case runs the training loader in a Python process, against the same process
reading no batch.

Each case is a JSON line; `--out` appends them to a file, from which
`scripts/reliability_report.py` renders the table in docs/reliability.md. Exits non-zero
when a case goes over its limit or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_record  # noqa: E402
from rss_exec import Measured, run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
MARGIN = 32 * MIB
SHAPE = (128, 1024, 1024)
CHUNKS = (1, 512, 1024)
INPUT_BYTES = SHAPE[0] * SHAPE[1] * SHAPE[2] * 4

Op = dict[str, Any]


def make_source(path: Path) -> None:
    import numpy as np
    import zarr
    import zarr.codecs

    arr = zarr.create_array(
        store=str(path),
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="float32",
        compressors=[zarr.codecs.ZstdCodec(level=1)],
        fill_value=0.0,
    )
    rng = np.random.default_rng(38)
    for t in range(0, SHAPE[0], 8):
        block = rng.standard_normal((8, *SHAPE[1:]), dtype=np.float32)
        block[block > 2.5] = np.nan
        arr[t : t + 8] = block


def expr(op: str, *args: Any) -> dict[str, Any]:
    return {"op": op, "args": list(args)}


X = {"input": 0}


def elementwise(e: dict[str, Any]) -> list[Op]:
    return [{"id": "y", "op": "elementwise", "inputs": ["x"], "expr": e}]


def reduce(func: str, axes: list[int] | None, **kw: Any) -> list[Op]:
    op: Op = {"id": "y", "op": "reduce", "input": "x", "func": func, **kw}
    if axes is not None:
        op["axes"] = axes
    return [op]


def fft(kind: str, axis: int) -> list[Op]:
    return [{"id": "y", "op": "fft", "input": "x", "kind": kind, "axis": axis}]


#: (op kind, case, the ops from "x" to "y", what is written, share of the input it decodes).
CASES: list[tuple[str, str, list[Op], Op, float]] = [
    (
        "elementwise",
        "sqrt(|x|) + 1",
        elementwise(expr("add", expr("sqrt", expr("absolute", X)), {"const": 1})),
        {},
        1.0,
    ),
    ("reduction: sums", "sum over time", reduce("sum", [0]), {}, 1.0),
    ("reduction: sums", "nansum over all", reduce("nansum", None), {}, 1.0),
    ("reduction: means", "mean over lat, lon", reduce("mean", [1, 2]), {}, 1.0),
    ("reduction: means", "nanmean over time", reduce("nanmean", [0]), {}, 1.0),
    ("reduction: variances", "var over time, ddof 1", reduce("var", [0], ddof=1), {}, 1.0),
    ("reduction: variances", "nanstd over all", reduce("nanstd", None), {}, 1.0),
    ("reduction: extrema", "max over time", reduce("max", [0]), {}, 1.0),
    ("reduction: extrema", "nanmin over lon", reduce("nanmin", [2]), {}, 1.0),
    ("reduction: arg", "argmax over time", reduce("argmax", [0]), {}, 1.0),
    ("reduction: arg", "argmin over lat", reduce("argmin", [1]), {}, 1.0),
    (
        "slice",
        "x[::2, 100:900, ::-1]",
        [
            {
                "id": "y",
                "op": "slice",
                "input": "x",
                "selection": [[None, None, 2], [100, 900, None], [None, None, -1]],
            }
        ],
        {},
        0.5,
    ),
    (
        "concatenate",
        "[x, x] along time",
        [{"id": "y", "op": "concat", "inputs": ["x", "x"], "axis": 0}],
        {},
        2.0,
    ),
    (
        "concatenate",
        "[x, sqrt(x)] along lon",
        [
            {"id": "s", "op": "elementwise", "inputs": ["x"], "expr": expr("sqrt", X)},
            {"id": "y", "op": "concat", "inputs": ["x", "s"], "axis": 2},
        ],
        {},
        2.0,
    ),
    ("rechunk", "to (128, 64, 64)", [], {"chunks": [128, 64, 64]}, 1.0),
    ("rechunk", "to (10, 1024, 128)", [], {"chunks": [10, 1024, 128]}, 1.0),
    ("rechunk", "to (4, 256, 1024)", [], {"chunks": [4, 256, 1024]}, 1.0),
    ("rechunk", "to (128, 16, 16)", [], {"chunks": [128, 16, 16]}, 1.0),
    ("rechunk", "to (128, 512, 512): chunks over the budget", [], {"chunks": [128, 512, 512]}, 1.0),
    ("fft", "rfft along lon (in chunks)", fft("rfft", 2), {}, 1.0),
    ("fft", "fft along lat (two chunks a transform)", fft("fft", 1), {}, 1.0),
    (
        "fft",
        "rfft along time (every chunk a transform), written in (65, 64, 64)",
        fft("rfft", 0),
        {"chunks": [65, 64, 64]},
        1.0,
    ),
    (
        "write",
        "sharded, blosc lz4",
        [{"id": "y", "op": "elementwise", "inputs": ["x"], "expr": X}],
        {
            "chunks": [1, 256, 256],
            "shards": [4, 1024, 1024],
            "codec": {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
        },
        1.0,
    ),
    (
        "write",
        "Zarr v2, gzip",
        [{"id": "y", "op": "elementwise", "inputs": ["x"], "expr": X}],
        {"zarr_format": 2, "codec": {"name": "gzip", "level": 1}},
        1.0,
    ),
]


def plan_for(ops: list[Op], write: Op, source: Path, target: Path) -> dict[str, Any]:
    # A rechunk is a write of x in other chunks (as `chunkfuse rechunk` plans it).
    last = "y" if ops else "x"
    out: Op = {"id": "out", "op": "write", "input": last, "target": str(target), **write}
    out.setdefault("codec", {"name": "zstd", "level": 1})
    return {"name": "memory", "arrays": [{"id": "x", "zarr": str(source)}], "ops": [*ops, out]}


def binary() -> str:
    return os.environ.get("CHUNKFUSE_BIN", str(ROOT / "target" / "release" / "chunkfuse"))


def measured(argv: list[str]) -> Measured:
    m = run_measured(argv, timeout=900)
    if m.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({m.returncode}): {m.stderr[-2000:]}")
    return m


WINDOWS_CHILD = """
import sys, numpy as np
from chunkfuse.loader import Source, WindowLoader
source, batches = sys.argv[1], int(sys.argv[2])
window = {"dim_0": 1, "dim_1": 256, "dim_2": 256}
loader = WindowLoader([Source("x", source, None, window)], list(window), batch_size=8,
                      seed=0, prefetch=2, cache_bytes=32 * 2**20)
seen = 0
for i, batch in zip(range(batches), loader):
    seen += int(np.isfinite(batch.data["x"]["x"]).sum())
assert seen > 0 or batches == 0
"""


def windows_row(source: Path) -> dict[str, Any]:
    """The training loader: 200 batches of 8 windows (256 x 256) from random anchors, a
    chunk cache of 32 MiB; the budget is the cache plus the batches the loader holds (the one
    handed out and two prefetched). The baseline is the same process reading no batch
    (Python, numpy, xarray and zarr-python, the source opened)."""
    baseline = min(measured([sys.executable, "-c", WINDOWS_CHILD, str(source), "0"]).peak_rss
                   for _ in range(2))  # fmt: skip
    t0 = time.perf_counter()
    m = measured([sys.executable, "-c", WINDOWS_CHILD, str(source), "200"])
    held = 32 * MIB + 3 * 8 * 256 * 256 * 4
    return row("windows", "8 windows of 256 x 256 a batch, 32 MiB cache", "loader", held,
               baseline, m.peak_rss, 0, time.perf_counter() - t0)  # fmt: skip


def row(
    kind: str,
    case: str,
    strategy: str,
    budget: int,
    baseline: int,
    peak: int,
    decoded: int,
    seconds: float,
) -> dict[str, Any]:
    limit = budget + baseline + MARGIN
    return {
        "kind": kind,
        "case": case,
        "strategy": strategy,
        "input_mib": round(INPUT_BYTES / MIB, 1),
        "budget_mib": round(budget / MIB, 1),
        "baseline_mib": round(baseline / MIB, 1),
        "peak_mib": round(peak / MIB, 1),
        "limit_mib": round(limit / MIB, 1),
        "within": peak < limit,
        "decoded_mib": round(decoded / MIB, 1),
        "seconds": round(seconds, 2),
    }


def run_case(
    kind: str,
    case: str,
    ops: list[Op],
    write: Op,
    share: float,
    source: Path,
    scratch: Path,
    max_mem: str,
    baseline: int,
) -> dict[str, Any]:
    target = scratch / "out.zarr"
    plan = scratch / "plan.json"
    plan.write_text(json.dumps(plan_for(ops, write, source, target)))
    t0 = time.perf_counter()
    m = measured([binary(), "run", str(plan), "--max-mem", max_mem, "--json", "--work-dir",
                  str(scratch / "work")])  # fmt: skip
    seconds = time.perf_counter() - t0
    summary = json.loads(m.stdout)
    strategies = [s["strategy"] for s in summary["stages"]]
    decoded = int(summary["decoded_bytes"])
    if decoded < share * INPUT_BYTES * 0.99:
        raise RuntimeError(f"{case}: decoded {decoded} bytes, fewer than it must read")
    shutil.rmtree(target, ignore_errors=True)
    return row(kind, case, " then ".join(strategies), int(summary["max_mem"]), baseline,
               m.peak_rss, decoded, seconds)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mem", default="50MB")
    parser.add_argument("--out", type=Path, help="append a JSON line per case to this file")
    parser.add_argument("--case", action="append", help="run only cases whose name has this")
    args = parser.parse_args()
    over = 0
    stamp = run_record.stamp()

    def report(r: dict[str, Any]) -> None:
        nonlocal over
        over += not r["within"]
        run_record.record({**r, **stamp}, args.out)

    with tempfile.TemporaryDirectory(prefix="chunkfuse-memory-") as tmp:
        scratch = Path(tmp)
        source = scratch / "x.zarr"
        make_source(source)
        baseline = min(measured([binary(), "info", str(source), "--json"]).peak_rss
                       for _ in range(2))  # fmt: skip
        chosen: list[tuple[str, str, list[Op], Op, float]] = [
            c for c in CASES if not args.case or any(n in c[1] for n in args.case)
        ]
        for kind, case, ops, write, share in chosen:
            report(run_case(kind, case, ops, write, share, source, scratch, args.max_mem,
                            baseline))  # fmt: skip
        if not args.case or any(n in "windows" for n in args.case):
            report(windows_row(source))
    if over:
        sys.exit(f"{over} cases over their limit")


if __name__ == "__main__":
    main()
