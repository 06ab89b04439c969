"""`chunkfuse.rechunk` (defined here, exported by the package): copy a Zarr array into new
chunks (and shards) with bounded memory.

The engine plans it as rechunker and Cubed do: blocks that hold whole source and target
chunks when they fit the budget, else through an intermediate (sharded-free, fast codec) in a
work directory. A job that fails or is killed leaves every target chunk whole or absent, and
rerunning the same call completes it, keeping what was written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import chunkfuse
from chunkfuse import _engine
from chunkfuse.urls import engine_url

#: Target chunk sizes: one per axis (-1: the whole axis), or {axis: size} for some axes.
Chunks = Sequence[int] | Mapping[int, int]


def rechunk(
    source: Any,
    target: str | os.PathLike[str],
    chunks: Chunks,
    max_mem: int | str | None = None,
    shards: Sequence[int] | None = None,
    codecs: Mapping[str, Any] | None = None,
    *,
    zarr_format: int = 3,
    threads: int = 0,
    work_dir: str | None = None,
    resume: bool = True,
    progress: Callable[[int, int], None] | None = None,
    io: str | None = None,
) -> dict[str, Any]:
    """Rechunk the Zarr array `source` (a path or a zarr-python array, Zarr v2 or v3) into
    `target` with `chunks`, within `max_mem` (bytes, or text such as "1GB"); return the run
    summary.

    `shards` gives the shard shape of a sharded Zarr v3 target (each a multiple of the
    chunks). `codecs` is the target's compressor in the plan IR's form
    (`{"name": "zstd", "level": 3}`, the default; `{"name": "blosc", "cname": "lz4",
    "clevel": 5, "shuffle": "shuffle"}`; `{"name": "gzip", "level": 5}`; `{"name": "none"}`).
    Axes missing from a `{axis: size}` mapping keep the source's chunks. With `resume` (the
    default), rerunning an unfinished job keeps the chunks it wrote. `io` sets how local
    files are read (see `chunkfuse.set_io`).
    """
    src = engine_url(source, "source")
    dst = engine_url(target, "target")
    plan = {
        "name": "rechunk",
        "arrays": [{"id": "source", "zarr": src}],
        "ops": [
            {
                "id": "rechunked",
                "op": "rechunk",
                "input": "source",
                "chunks": _chunk_list(chunks, src),
            },
            {
                "id": "target",
                "op": "write",
                "input": "rechunked",
                "target": dst,
                "zarr_format": zarr_format,
                **({"shards": list(shards)} if shards else {}),
                **({"codec": dict(codecs)} if codecs is not None else {}),
            },
        ],
    }
    return chunkfuse.run_plan(
        plan,
        max_mem=_bytes(max_mem),
        threads=threads,
        work_dir=work_dir,
        progress=progress,
        resume=resume,
        io=io,
    )


def _bytes(max_mem: int | str | None) -> int | None:
    if max_mem is None or isinstance(max_mem, int):
        return max_mem
    return _engine.parse_bytes(max_mem)


def _chunk_list(chunks: Chunks, src: str) -> list[int]:
    """Chunk sizes per axis; a mapping is completed with the source's chunks."""
    if not isinstance(chunks, Mapping):
        return [int(c) for c in chunks]
    info = _engine.array_info(src)
    out = [int(c) for c in info["chunks"]]
    for axis, size in chunks.items():
        rank = len(out)
        if not -rank <= int(axis) < rank:
            raise ValueError(f"chunks: axis {axis} is out of range for an array of rank {rank}")
        out[int(axis)] = int(size)
    return out
