"""Whether the variables of an xarray Dataset are still the arrays its Zarr store holds.

`chunkfuse.rechunk(ds, ...)` copies the stored arrays of `ds`'s variables. A Dataset that was
changed after opening (a selection such as `isel`, an `assign` of a computed value, values
changed in memory) no longer is what is stored, and copying the store would silently write
something other than what the user passed. Such a variable is refused, named, with why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

#: Layers of a Dask array xarray's `open_zarr` makes, or that only rechunk it
#: (`Dataset.chunk`): the values are still the stored ones.
_OPENING_LAYERS = ("original-open_dataset-", "open_dataset-", "rechunk-")

#: In-memory variables up to this size are compared with the store value by value.
_COMPARED_BYTES = 256 * 2**20


def changed(var: Any, name: str, stored: zarr.Array) -> str | None:
    """Why the Dataset variable `var` (named `name`) is not the array `stored`, in words;
    None when it is."""
    if tuple(var.shape) != tuple(stored.shape):
        return (
            f"its shape {tuple(var.shape)} is not the stored {tuple(stored.shape)} "
            "(a selection such as isel)"
        )
    data = var._data
    if _is_dask(data):
        made = [name_ for name_ in data.dask.layers if not name_.startswith(_OPENING_LAYERS)]
        if made:
            return f"it was computed after opening (by {made[-1].rsplit('-', 1)[0]})"
        return None
    key = _lazy_key(data)
    if key is not None:
        full = all(
            isinstance(k, slice) and k.indices(n) == (0, n, 1)
            for k, n in zip(key, stored.shape, strict=False)
        )
        return None if full else "it was selected after opening (such as by isel)"
    if isinstance(data, np.ndarray) or type(data).__name__ == "PandasIndexingAdapter":
        return _compared(var, name, stored)
    return (
        f"it is held as {type(data).__module__}.{type(data).__name__}, whose changes "
        "chunkfuse cannot see"
    )


def _is_dask(data: Any) -> bool:
    try:
        import dask.array as da
    except ImportError:
        return False
    return isinstance(data, da.Array)


def _lazy_key(data: Any) -> tuple[Any, ...] | None:
    """The indexer of xarray's lazily indexed backend array under `data`'s wrappers
    (`open_dataset` without chunks), as a tuple; None where there is none."""
    seen = 0
    while data is not None and seen < 8:
        key = getattr(data, "key", None)
        if key is not None and hasattr(key, "tuple"):
            return tuple(key.tuple)
        data = getattr(data, "array", None)
        seen += 1
    return None


def _compared(var: Any, name: str, stored: zarr.Array) -> str | None:
    """An in-memory variable (loaded, or an index) against the store, encoded as xarray
    would write it."""
    if var.nbytes > _COMPARED_BYTES:
        return "it is held in memory, where it may have changed since opening"
    from xarray.conventions import encode_cf_variable

    mine = np.asarray(encode_cf_variable(var, name=name).values)
    theirs = np.asarray(stored[...])
    try:
        same = np.array_equal(mine, theirs, equal_nan=mine.dtype.kind in "fc")
    except (TypeError, ValueError):
        same = False
    return None if same else "its values in memory are not the stored ones"
