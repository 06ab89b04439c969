"""Peer implementations timed by bench/run.py, each run in its own process.

    python bench/peers.py TOOL OP SRC DST [--threads N] [--chunks A,B,C] [--max-mem 1GB]

TOOL: dask | chunkfuse-dask (the same Dask code, scheduler=chunkfuse.dask.get) | numpy |
tensorstore | cubed; OP: sum | rechunk | read | fft-lat | power-spectrum
(the FFT ops: dask only). Prints one JSON object:
``{"seconds": compute seconds}`` (imports and opening excluded, writing the result included).

sum      ``((x + 1) * 2).sum(axis=0)`` written to a Zarr v3 array at DST (zstd level 3).
rechunk  ``x`` rechunked to ``--chunks`` and written to DST (Zarr v3, zstd level 3; zarr-python
         3's default ``ZstdCodec`` has level 0, which zstd treats as its default level 3).
read     decode the whole array into memory (no compute, nothing written).
fft-lat  ``abs(rfft(x, axis=1)).mean(axis=0)`` written to DST (dask.array.fft).
power-spectrum  ``abs(rfft(x, axis=0)) ** 2`` written to DST in chunks ``--chunks`` (dask
         needs the time axis in one chunk: ``x.rechunk(chunks)`` first).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ZSTD_LEVEL = 3


def zarr_target(path: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: Any) -> Any:
    import zarr
    import zarr.codecs

    return zarr.create_array(
        store=path,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        compressors=[zarr.codecs.ZstdCodec(level=ZSTD_LEVEL)],
        overwrite=True,
        zarr_format=3,
    )


# --------------------------------------------------------------------------------------------
# dask (threaded scheduler)
# --------------------------------------------------------------------------------------------


def dask_op(
    op: str, src: str, dst: str, threads: int, chunks: tuple[int, ...], scheduler: Any = "threads"
) -> float:
    import dask
    import dask.array as da

    x = da.from_zarr(src)
    with dask.config.set(scheduler=scheduler, num_workers=threads):
        start = time.perf_counter()
        if op == "sum":
            s = ((x + 1) * 2).sum(axis=0)
            target = zarr_target(dst, s.shape, s.shape, s.dtype)
            da.store(s, target, lock=False)
        elif op == "rechunk":
            r = x.rechunk(chunks)
            target = zarr_target(dst, r.shape, chunks, r.dtype)
            da.store(r, target, lock=False)
        elif op == "fft-lat":
            m = abs(da.fft.rfft(x, axis=1)).mean(axis=0)
            target = zarr_target(dst, m.shape, m.shape, m.dtype)
            da.store(m, target, lock=False)
        elif op == "power-spectrum":
            p = abs(da.fft.rfft(x.rechunk(chunks), axis=0)) ** 2
            out_chunks = (p.shape[0], *chunks[1:])
            target = zarr_target(dst, p.shape, out_chunks, p.dtype)
            da.store(p, target, lock=False)
        else:
            x.compute()
        return time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# numpy + zarr-python: read everything, compute in memory
# --------------------------------------------------------------------------------------------


def numpy_op(op: str, src: str, dst: str, threads: int, chunks: tuple[int, ...]) -> float:
    import zarr

    z = zarr.open_array(src, mode="r")
    start = time.perf_counter()
    x = z[...]
    if op == "sum":
        x += 1  # in place: numpy's best case, no temporaries
        x *= 2
        s = x.sum(axis=0)
        zarr_target(dst, s.shape, s.shape, s.dtype)[...] = s
    elif op == "rechunk":
        zarr_target(dst, x.shape, chunks, x.dtype)[...] = x
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# tensorstore (only if installed)
# --------------------------------------------------------------------------------------------


def tensorstore_op(op: str, src: str, dst: str, threads: int, chunks: tuple[int, ...]) -> float:
    import tensorstore as ts

    context = ts.Context({"data_copy_concurrency": {"limit": threads}})
    source = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": src}}, context=context
    ).result()
    start = time.perf_counter()
    if op == "rechunk":
        target = ts.open(
            {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": dst},
                "metadata": {
                    "shape": list(source.shape),
                    "data_type": "float32",
                    "chunk_grid": {
                        "name": "regular",
                        "configuration": {"chunk_shape": list(chunks)},
                    },
                    "codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}},
                    ],
                },
                "create": True,
                "delete_existing": True,
            },
            context=context,
        ).result()
        target.write(source).result()
    else:
        x = source.read().result()
        if op == "sum":
            x += 1
            x *= 2
            s = x.sum(axis=0)
            zarr_target(dst, s.shape, s.shape, s.dtype)[...] = s
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# cubed (only if installed)
# --------------------------------------------------------------------------------------------


def cubed_op(
    op: str, src: str, dst: str, threads: int, chunks: tuple[int, ...], max_mem: str
) -> float:
    import cubed
    import cubed.array_api as xp
    from cubed.runtime.create import create_executor

    with tempfile.TemporaryDirectory() as work:
        spec = cubed.Spec(work_dir=work, allowed_mem=max_mem)
        executor = create_executor("threads", {"max_workers": threads})
        x = cubed.from_zarr(src, spec=spec)
        start = time.perf_counter()
        if op == "sum":
            s = xp.sum((x + 1) * 2, axis=0)
            cubed.to_zarr(s, dst, executor=executor)
        elif op == "rechunk":
            cubed.to_zarr(x.rechunk(chunks), dst, executor=executor)
        else:
            x.compute(executor=executor)
        return time.perf_counter() - start


def _chunkfuse_get() -> Any:
    import chunkfuse.dask

    return chunkfuse.dask.get


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["dask", "chunkfuse-dask", "numpy", "tensorstore", "cubed"])
    parser.add_argument("op", choices=["sum", "rechunk", "read", "fft-lat", "power-spectrum"])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunks", default="")
    parser.add_argument("--max-mem", default="1GB")
    args = parser.parse_args(argv)
    chunks = tuple(int(c) for c in args.chunks.split(",")) if args.chunks else ()
    ops: dict[str, Callable[[], float]] = {
        "dask": lambda: dask_op(args.op, args.src, args.dst, args.threads, chunks),
        # The same Dask code with chunkfuse's scheduler.
        "chunkfuse-dask": lambda: dask_op(
            args.op, args.src, args.dst, args.threads, chunks, _chunkfuse_get()
        ),
        "numpy": lambda: numpy_op(args.op, args.src, args.dst, args.threads, chunks),
        "tensorstore": lambda: tensorstore_op(args.op, args.src, args.dst, args.threads, chunks),
        "cubed": lambda: cubed_op(args.op, args.src, args.dst, args.threads, chunks, args.max_mem),
    }
    seconds = ops[args.tool]()
    print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
