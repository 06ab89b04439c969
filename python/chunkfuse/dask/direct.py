"""Values the engine reads straight from a stored array: blocks that are a basic selection of
one source (``x[5, :32, :32]`` of ``da.from_zarr``), read with the engine's direct read path
(`chunkfuse.read`) instead of a plan run, its work directory and a scratch array."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from chunkfuse.common.ir import IrBuilder
from chunkfuse.reading import ArrayReader, read

from .symbols import Blk

#: A basic selection of a stored array: per axis an index or a slice.
Selection = tuple[int | slice, ...]


def _selected(
    region: tuple[tuple[int, int], ...], node: dict[str, Any] | None, shape: tuple[int, ...]
) -> Selection | None:
    """The selection of the array of `shape` that `region` of its slice `node` (the array
    itself when None) reads; None for a slice that adds axes."""
    if node is None:
        return tuple(slice(a, b) for a, b in region)
    if len(node["selection"]) != len(shape):
        return None  # a new axis, or an ellipsis: read through the plan
    out: list[int | slice] = []
    axes = iter(region)
    for n, item in zip(shape, node["selection"], strict=True):
        if isinstance(item, int):
            out.append(item % n if n else item)
            continue
        if item is None:
            r = range(n)
        elif isinstance(item, list) and len(item) == 3:
            r = range(*slice(*item).indices(n))
        else:
            return None
        a, b = next(axes)
        sub = r[a:b]
        stop: int | None = sub.stop if sub.stop >= 0 else None
        out.append(slice(sub.start, stop, sub.step))
    if next(axes, None) is not None:
        return None
    return tuple(out)


def direct_reads(
    roots: Mapping[Hashable, Any], b: IrBuilder
) -> dict[Hashable, tuple[ArrayReader, Selection]] | None:
    """The opened source array and selection of every root, when each is a block of a source
    array or of one basic slice of it (each source opened once); None when any root needs the
    engine's plan."""
    readers: dict[str, ArrayReader] = {}
    reads: dict[Hashable, tuple[ArrayReader, Selection]] = {}
    for key, sym in roots.items():
        if not isinstance(sym, Blk):
            return None
        node = b.nodes.get(sym.full.root)
        source = sym.full.root if node is None else node.get("input")
        url = None
        if isinstance(source, str) and (node is None or node.get("op") == "slice"):
            url = b.sources.get(source)
        if url is None:
            return None
        reader = readers.get(url)
        if reader is None:
            reader = readers[url] = ArrayReader(url)
        selection = _selected(sym.region, node, tuple(int(n) for n in reader.shape))
        if selection is None:
            return None
        reads[key] = (reader, selection)
    return reads


def read_directly(
    reads: Mapping[Hashable, tuple[ArrayReader, Selection]], threads: int
) -> dict[Hashable, np.ndarray]:
    """The values of `reads`."""
    return {
        key: np.asarray(read(reader, selection, threads=threads))
        for key, (reader, selection) in reads.items()
    }
