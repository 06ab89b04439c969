"""Cubed workloads timed by bench/run.py with RustExecutor and with Cubed's threads executor.

    python bench/cubed_workloads.py EXECUTOR OP SRC DST [--threads N] [--allowed-mem 1GB]
                                    [--chunks A,B,C]

EXECUTOR: rust | threads. OP:
  sum      ``xp.sum((x + 1) * 2, axis=0)`` written to DST
  mean     ``xp.mean(x, axis=0)`` written to DST
  anomaly  xarray: ``t2m - t2m.mean("time")`` over ``cubed.from_zarr(SRC)``, ``to_zarr(DST)`` with
           zstd level 3 (so the op is codec-bound)
  rechunk  ``x.rechunk(--chunks)`` written to DST

The same Cubed code runs with both executors; only ``executor=`` differs. Prints one JSON object
``{"seconds": ..., "native_tasks": ..., "python_tasks": ...}`` (seconds from after opening to the
result written; imports excluded).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

ZSTD_LEVEL = 3


def make_executor(name: str, threads: int) -> Any:
    if name == "rust":
        from chunkfuse import RustExecutor

        return RustExecutor(max_workers=threads)
    from cubed.runtime.create import create_executor

    return create_executor("threads", {"max_workers": threads})


def import_libraries(op: str) -> None:
    """Import what `run` uses before the clock starts (imports are not the workload)."""
    import cubed.array_api
    import zarr.codecs  # noqa: F401

    if op == "anomaly":
        import cubed_xarray  # noqa: F401
        import xarray

        # Wrapping a chunked array imports xarray's duck-array modules (dask among them).
        xarray.DataArray(cubed.array_api.ones((1,), chunks=(1,)))


def run(
    op: str, executor: Any, src: str, dst: str, work: str, allowed_mem: str, chunks: Any
) -> None:
    import cubed
    import cubed.array_api as xp
    import zarr
    from zarr.codecs import ZstdCodec

    spec = cubed.Spec(work_dir=work, allowed_mem=allowed_mem)
    x = cubed.from_zarr(src, spec=spec)
    if op == "sum":
        cubed.to_zarr(xp.sum((x + 1) * 2, axis=0), dst, executor=executor)
    elif op == "mean":
        cubed.to_zarr(xp.mean(x, axis=0), dst, executor=executor)
    elif op == "rechunk":
        cubed.to_zarr(x.rechunk(chunks), dst, executor=executor)
    elif op == "anomaly":
        import xarray as xr

        t2m = xr.DataArray(x, dims=("time", "latitude", "longitude"), name="t2m")
        anomaly = (t2m - t2m.mean("time")).rename("t2m_anomaly").to_dataset()
        anomaly.to_zarr(
            dst,
            mode="w",
            zarr_format=3,
            consolidated=False,
            encoding={
                "t2m_anomaly": {
                    "chunks": tuple(zarr.open_array(src).chunks),
                    "compressors": [ZstdCodec(level=ZSTD_LEVEL)],
                }
            },
            chunkmanager_store_kwargs={"executor": executor},
        )
    else:
        raise ValueError(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executor", choices=["rust", "threads"])
    parser.add_argument("op", choices=["sum", "mean", "anomaly", "rechunk"])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allowed-mem", default="1GB")
    parser.add_argument("--chunks", default="")
    args = parser.parse_args(argv)
    chunks = tuple(int(c) for c in args.chunks.split(",")) if args.chunks else None
    executor = make_executor(args.executor, args.threads)
    import_libraries(args.op)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        run(args.op, executor, args.src, args.dst, work, args.allowed_mem, chunks)
        seconds = time.perf_counter() - start
    stats = getattr(executor, "last_stats", None)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "native_tasks": getattr(stats, "native_tasks", None),
                "python_tasks": getattr(stats, "python_tasks", None),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
