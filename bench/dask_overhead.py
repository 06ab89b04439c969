"""Per-task overhead of chunkfuse.dask.get against Dask's threaded scheduler.

    python bench/dask_overhead.py [--tasks 100000] [--threads N]

The graph: N trivial Python tasks (``inc(i)``), summed in groups of 100, then in total: every
task is needed, none does real work, so the time per task is the scheduler's overhead. Both
schedulers run the same graph in this process, best of 2 each; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

GROUP = 100


def inc(x: int) -> int:
    return x + 1


def total(*xs: int) -> int:
    return sum(xs)


def graph(n: int) -> tuple[dict[Any, Any], int]:
    """The graph and its task count."""
    d: dict[Any, Any] = {("t", i): (inc, i) for i in range(n)}
    for g in range(n // GROUP):
        d[("g", g)] = (total, *[("t", i) for i in range(g * GROUP, (g + 1) * GROUP)])
    d["out"] = (total, *[("g", g) for g in range(n // GROUP)])
    return d, n + n // GROUP + 1


def per_task(get: Callable[..., Any], n: int, threads: int, repeat: int = 2) -> float:
    """Best seconds per task of `get` over `repeat` runs (the result checked)."""
    best = float("inf")
    for _ in range(repeat):
        dsk, tasks = graph(n)
        start = time.perf_counter()
        result = get(dsk, "out", num_workers=threads)
        best = min(best, (time.perf_counter() - start) / tasks)
        if result != n * (n + 1) // 2:
            raise AssertionError(f"wrong result {result}")
    return best


def overhead_lines(n: int, threads: int) -> list[str]:
    """The report section."""
    import chunkfuse.dask
    import dask.threaded

    ours = per_task(chunkfuse.dask.get, n, threads)
    theirs = per_task(dask.threaded.get, n, threads)
    return [
        "## Dask scheduler overhead: chunkfuse.dask.get vs Dask's threaded scheduler",
        "",
        f"{n:,} trivial Python tasks (`inc(i)`), summed in groups of {GROUP}, then in total; "
        f"{threads} threads; best of 2 (`python bench/dask_overhead.py`).",
        "",
        "| scheduler | µs per task | share of threaded |",
        "|---|---:|---:|",
        f"| chunkfuse.dask.get | {ours * 1e6:.1f} | {ours / theirs:.2f} |",
        f"| dask.threaded.get | {theirs * 1e6:.1f} | 1.00 |",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print("\n".join(overhead_lines(args.tasks, args.threads)))


if __name__ == "__main__":
    main()
