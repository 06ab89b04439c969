"""The Zarr array behind xarray's lazy backend wrappers (shared by the Cubed and Dask paths).

xarray opens a Zarr variable as a chain of lazy wrappers; when none of them decodes or indexes
(no CF scaling or masking, the whole array selected), the engine reads the Zarr array itself.
"""

from __future__ import annotations

from typing import Any

import zarr

from chunkfuse.common.symbols import NotNative

#: xarray's lazy wrappers that pass every element through unchanged, and the attribute holding
#: the wrapped array.
_PASS_THROUGH = {
    ("xarray.core.indexing", "ImplicitToExplicitIndexingAdapter"): "array",
    ("xarray.core.indexing", "CopyOnWriteArray"): "array",
    ("xarray.core.indexing", "MemoryCachedArray"): "array",
    ("xarray.core.indexing", "LazilyIndexedArray"): "array",
    ("xarray.backends.zarr", "ZarrArrayWrapper"): "_array",
}


def wraps_stored_array(obj: Any) -> bool:
    """Whether `obj` is a Zarr array or one of xarray's lazy wrappers around one."""
    cls = type(obj)
    return isinstance(obj, zarr.Array) or (cls.__module__, cls.__name__) in _PASS_THROUGH


def zarr_array_behind(obj: Any) -> zarr.Array:
    """The Zarr array behind xarray's lazily indexed backend arrays without decoding (or `obj`
    itself); NotNative otherwise."""
    for _ in range(16):
        if isinstance(obj, zarr.Array):
            return obj
        inner = passed_through(obj)
        if inner is None:
            cls = type(obj)
            raise NotNative(f"from_array of a {cls.__module__}.{cls.__name__}")
        obj = inner
    raise NotNative("from_array of a deeply wrapped array")


def passed_through(obj: Any) -> Any | None:
    """What `obj` wraps when it is one of xarray's wrappers that pass every element through
    unchanged (None when it is not one); NotNative for a lazily indexed part of an array."""
    cls = type(obj)
    attr = _PASS_THROUGH.get((cls.__module__, cls.__name__))
    if attr is None:
        return None
    if cls.__name__ == "LazilyIndexedArray" and not _whole(obj):
        raise NotNative("from_array of an indexed xarray array")
    return getattr(obj, attr)


def _whole(lazy: Any) -> bool:
    key = getattr(lazy, "key", None)
    inner = getattr(lazy, "array", None)
    items = getattr(key, "tuple", None)
    if items is None or inner is None:
        return False
    return len(items) == len(inner.shape) and all(
        isinstance(k, slice) and k == slice(None) for k in items
    )
