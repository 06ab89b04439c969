"""`chunkfuse.rechunk` (defined here, exported by the package): copy a Zarr array, or every
array of a Zarr group or xarray Dataset, into new chunks (and shards) with bounded memory.

The engine plans it as rechunker and Cubed do: blocks that hold whole source and target
chunks when they fit the budget, else through an intermediate (sharded-free, fast codec) in a
work directory. Targets keep their source's attributes, dimension names and fill value (a
group's target its attributes too), so xarray opens the result as it opens the source. A job
that fails or is killed leaves every target chunk whole or absent and its targets marked
unfinished (the `chunkfuse` attribute), and rerunning the same call completes it, keeping
what was written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chunkfuse.common.urls import engine_url
from chunkfuse.engine_calls import run_plan
from chunkfuse.rechunking.chunks import Chunks
from chunkfuse.rechunking.plans import array_plan, group_plan
from chunkfuse.rechunking.sources import GroupSource, resolve
from chunkfuse.sizes import budget_bytes

__all__ = ["Chunks", "rechunk"]


def rechunk(
    source: Any,
    target: str | os.PathLike[str],
    chunks: Chunks | None,
    max_mem: int | str | None = None,
    shards: Sequence[int] | Mapping[Any, Any] | None = None,
    codecs: Mapping[str, Any] | None = None,
    *,
    zarr_format: int = 3,
    overwrite: bool = False,
    threads: int = 0,
    work_dir: str | None = None,
    resume: bool = True,
    progress: Callable[[int, int], None] | None = None,
    io: str | None = None,
) -> dict[str, Any]:
    """Rechunk `source` into `target` with `chunks`, within `max_mem` (bytes, or text such as
    "1GB"); return the run summary.

    `source` is a Zarr array (a path or URL, or a zarr-python array; Zarr v2 or v3), or a
    Zarr group (a path or URL, or a zarr.Group) or an xarray Dataset opened from Zarr, whose
    arrays (for a Dataset, its variables, data and coordinates, as stored) are each rechunked
    into the array of the same name in the group `target`, which takes the source group's
    attributes (and consolidated metadata when the source has some), so that
    `xr.open_zarr(target)` equals the source dataset.

    `chunks` gives sizes (-1: the whole axis) per axis (`(256, 73, 144)`), by axis
    (`{0: 256}`), by dimension name (`{"time": -1, "latitude": 10}`: for a group, applied to
    every array having those dimensions, as rechunker's `target_chunks`), or for a group by
    variable (`{"t2m": {"time": -1}, "u10": (256, 73, 144)}`); axes and variables not given
    keep their chunks (`None` keeps every array's). `shards` gives a sharded Zarr v3 target's
    shard sizes the same ways (each a multiple of the chunks; axes not given are not sharded
    further). `codecs` is the targets' compressor in the plan IR's form
    (`{"name": "zstd", "level": 3}`, the default; `{"name": "blosc", "cname": "lz4",
    "clevel": 5, "shuffle": "shuffle"}`; `{"name": "gzip", "level": 5}`; `{"name": "none"}`).

    Every target keeps its source's attributes, dimension names and fill value (a missing
    source chunk stays missing). A target path that already holds an array or group is
    refused (ValueError naming it) unless `overwrite`, or unless it is what an unfinished
    run of this same call left: with `resume` (the default) that run is completed, keeping
    the chunks it wrote; with `resume=False` it is started over. While the job runs, and
    after it fails or is killed, each target (and target group) has the attribute
    `"chunkfuse": {"incomplete": true, "job": ...}`, which zarr-python and xarray show; it
    is removed when the job completes. `io` sets how local files are read (see
    `chunkfuse.set_io`).
    """
    src = resolve(source)
    dst = engine_url(target, "target")
    write: dict[str, Any] = {"zarr_format": zarr_format, "overwrite": bool(overwrite)}
    if codecs is not None:
        write["codec"] = dict(codecs)
    if isinstance(src, GroupSource):
        plan = group_plan(src, dst, chunks, write, shards)
    else:
        if chunks is None:
            raise ValueError("chunks: give the target chunks of the array")
        plan = array_plan(src, dst, chunks, write, shards)
    return run_plan(
        plan,
        max_mem=budget_bytes(max_mem, "max_mem"),
        threads=threads,
        work_dir=work_dir,
        progress=progress,
        resume=resume,
        io=io,
    )
