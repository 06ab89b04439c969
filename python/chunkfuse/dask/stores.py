"""The Interpreter's stores: Dask's `load_store_chunk` of a block into a zarr array, and the
boxes of their target that the stores into one array fill, each with the values written there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import zarr

from chunkfuse.common.codecs import unsupported_filter
from chunkfuse.common.symbols import NotNative
from chunkfuse.common.urls import zarr_array_url

from .steps import Steps
from .symbols import Blk, Red, Region, Src, Store, chunk_span, store_box, touching_groups


class StoreSteps(Steps):
    """Stores of blocks into zarr arrays."""

    def _store(self, args: list[Any], kwargs: dict[str, Any]) -> Store:
        names = ("x", "out", "index", "region", "lock", "return_stored", "load_stored")
        given = dict(zip(names, args, strict=False)) | kwargs
        x, out, index = given.get("x"), given.get("out"), given.get("index")
        if given.get("return_stored"):
            raise NotNative("store returning what it stored")
        if isinstance(out, Src):
            out = out.array
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk) or not isinstance(out, zarr.Array):
            raise NotNative("store of something else")
        url = zarr_array_url(out)
        if url is None:
            raise NotNative("store into an array off local disk")
        refused = unsupported_filter(out, writing=True)
        if refused is not None:
            raise NotNative(f"store into {refused}")
        shape = tuple(out.shape)
        box = store_box(index, given.get("region"), shape)
        if [b - a for a, b in box] != [b - a for a, b in x.region]:
            raise NotNative("store of a block into a box of another shape")
        full = x.full
        if np.dtype(out.dtype) != full.dtype:
            full = self._cast(full, np.dtype(out.dtype))
        chunks = tuple(out.shards if out.shards is not None else out.chunks)
        return Store(full, x.region, url, shape, box, chunks)

    def stored_array(self, parts: list[Store]) -> tuple[Region, Blk]:
        """The box of their target that the stores into one array tile, and the values they
        write there as one block of the box's shape: one array's blocks written where they
        lie relative to each other, or the blocks joined as their boxes lie (blocks of
        several arrays: a `da.concatenate` rechunked before writing). NotNative when the
        boxes overlap, leave holes or do not form a grid."""
        first = parts[0]
        rank = len(first.shape)
        starts = [sorted({p.box[d][0] for p in parts}) for d in range(rank)]
        box = tuple((starts[d][0], max(p.box[d][1] for p in parts)) for d in range(rank))
        grid: dict[tuple[int, ...], Store] = {}
        for p in parts:
            at = tuple(starts[d].index(p.box[d][0]) for d in range(rank))
            for d, k in enumerate(at):
                end = starts[d][k + 1] if k + 1 < len(starts[d]) else box[d][1]
                if p.box[d][1] != end:
                    raise NotNative("stores that do not tile a box of their target")
            if grid.setdefault(at, p) is not p:
                raise NotNative("stores that overlap")
        counts = [len(s) for s in starts]
        if len(grid) != math.prod(counts):
            raise NotNative("stores that do not tile a box of their target")
        # One array's values, each written at the same offset from where it lies.
        shifts = {tuple(r[0] - b[0] for r, b in zip(p.region, p.box, strict=True)) for p in parts}
        if len(shifts) == 1 and all(p.full == first.full for p in parts):
            (shift,) = shifts
            region = tuple((a + o, b + o) for (a, b), o in zip(box, shift, strict=True))
            return box, Blk(first.full, region)

        def nest(prefix: tuple[int, ...]) -> Any:
            if len(prefix) == len(counts):
                p = grid[prefix]
                return Blk(p.full, p.region)
            return [nest((*prefix, i)) for i in range(counts[len(prefix)])]

        return box, self._tiled(nest(()), 0)

    def stored_boxes(self, parts: list[Store]) -> list[tuple[Region, Blk]]:
        """The boxes of their target that the stores into one array fill, each with the
        values written there (see `stored_array`): the one box they tile, or else boxes
        apart, each tiled by the stores that touch it, no two reaching into one stored
        chunk (each chunk has one writer). NotNative when the stores fill no such boxes."""
        try:
            return [self.stored_array(parts)]
        except NotNative:
            groups = touching_groups([p.box for p in parts])
            if len(groups) == 1:
                raise
        boxes = [self.stored_array([parts[i] for i in g]) for g in groups]
        spans = [chunk_span(box, parts[0].chunks) for box, _ in boxes]
        for i, a in enumerate(spans):
            for b in spans[:i]:
                if all(
                    lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True)
                ):
                    raise NotNative("stores into boxes apart that share a stored chunk")
        return boxes
