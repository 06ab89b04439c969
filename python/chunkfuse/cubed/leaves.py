"""Where Cubed's arrays live: local Zarr URLs, constants and staged in-memory arrays."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zarr
from cubed.storage.store import get_storage_name
from cubed.storage.virtual import (
    VirtualEmptyArray,
    VirtualFullArray,
    VirtualInMemoryArray,
    VirtualOffsetsArray,
)
from cubed.storage.zarr import LazyZarrArray

from chunkfuse.common.decoding import apply_decoding, decoded_array_behind
from chunkfuse.common.ir import IrBuilder
from chunkfuse.common.symbols import Const, Full, NotNative
from chunkfuse.common.urls import local_url, zarr_array_url
from chunkfuse.cubed.symbols import Empty, Offsets

#: Cubed storage back ends whose arrays are plain Zarr v3 that the engine may write.
NATIVE_STORAGE = ("zarr-python-v3", "zarrs-python")


def array_url(target: Any) -> str | None:
    """The local URL of a stored Zarr array (opened or lazy), or None."""
    if isinstance(target, LazyZarrArray):
        return local_url(target.store, target.path)
    if isinstance(target, zarr.Array):
        return zarr_array_url(target)
    return None


def write_codec(target: Any) -> dict[str, Any] | None:
    """The IR codec matching what Cubed would have created for `target`; None to write into
    an existing Zarr array (xarray's `to_zarr` targets) with its own codecs; or NotNative."""
    if isinstance(target, zarr.Array):
        if target.metadata.zarr_format == 3 and getattr(target, "shards", None) is not None:
            raise NotNative("existing sharded target")
        return None
    if not isinstance(target, LazyZarrArray):
        raise NotNative("target is not a Zarr array")
    if get_storage_name() not in NATIVE_STORAGE:
        raise NotNative(f"storage {get_storage_name()} is not Zarr v3")
    compressor = target.kwargs.get("compressor", "default")
    if compressor in ("default", "auto"):
        return {"name": "zstd", "level": 0}
    if compressor is None:
        return {"name": "none"}
    raise NotNative(f"compressor {compressor!r}")


def regular_chunks(target: Any) -> tuple[int, ...]:
    """A target's regular chunk shape, or NotNative for rectilinear grids."""
    chunks = tuple(target.chunks)
    if not all(isinstance(c, (int, np.integer)) for c in chunks):
        raise NotNative("rectilinear chunks")
    return tuple(int(c) for c in chunks)


class LeafResolver:
    """Symbols for arrays that no op in this computation produces."""

    def __init__(self, builder: IrBuilder, stage_dir: str) -> None:
        self.builder = builder
        self.stage_dir = stage_dir

    def symbol(self, name: str, target: Any) -> Any:
        """The symbol of a leaf array, or None when the engine cannot read it."""
        if isinstance(target, VirtualOffsetsArray):
            return Offsets()
        if isinstance(target, VirtualEmptyArray):
            return Empty()
        if isinstance(target, VirtualInMemoryArray):
            return self._in_memory(name, target)
        if isinstance(target, VirtualFullArray):
            # `full(shape, v)` (xarray's nansum puts one into `where`): the value, broadcast
            # wherever it meets whole arrays, as a 0-d operand is; ops that need its shape
            # refuse constants.
            dtype = np.dtype(target.dtype)
            if dtype.kind not in "biufc":
                return None
            return Const(np.asarray(target.fill_value, dtype=dtype).item(), dtype)
        url = array_url(target)
        if url is None:
            return None
        try:
            return self.builder.source(url, tuple(target.shape), target.dtype)
        except NotNative:
            return None

    def _in_memory(self, name: str, target: VirtualInMemoryArray) -> Any:
        arr = np.asarray(target.array)
        if arr.ndim == 0:
            if arr.dtype.kind not in "biufc":
                return None
            return Const(arr.item(), arr.dtype)
        if arr.dtype.kind not in "biufc" or arr.size == 0:
            return None
        # Small (at most 1 MB by Cubed's rule): staged once as a Zarr array the engine reads.
        url = os.path.join(self.stage_dir, name)
        if not os.path.exists(url):
            z = zarr.create_array(
                url,
                shape=arr.shape,
                chunks=regular_chunks(target),
                dtype=arr.dtype,
                compressors=None,
                overwrite=True,
            )
            z[...] = arr
        try:
            return self.builder.source(url, arr.shape, arr.dtype)
        except NotNative:
            return None


def stored_array_behind(obj: Any, builder: IrBuilder) -> Full:
    """The stored Zarr array behind `cubed.from_array`'s input (xarray's lazily indexed
    backend arrays, decoded as xarray decodes them, or a Zarr array), as a source;
    NotNative otherwise."""
    arr, steps = decoded_array_behind(obj)
    url = array_url(arr)
    if url is None:
        raise NotNative("from_array of a Zarr array outside the local filesystem")
    return apply_decoding(builder, builder.source(url, tuple(arr.shape), arr.dtype), steps)
