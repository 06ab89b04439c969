"""What `chunkfuse.rechunk` was given to rechunk: one stored array, or the arrays of a stored
group (a Zarr group path or URL, a zarr.Group, or an xarray Dataset opened from Zarr), each
with its dimension names and chunks as stored."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zarr

import chunkfuse._engine as _engine
from chunkfuse.common.urls import engine_url, local_url

from .as_stored import changed


@dataclass(frozen=True)
class Variable:
    """A stored array of a group: its name, dimension names and chunks."""

    name: str
    dims: tuple[str | None, ...]
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class ArraySource:
    """One stored array, at `url`."""

    url: str

    def variable(self, named: bool) -> Variable:
        """The array's chunks (as the engine reads them) and, when `named`, its dimension
        names (read with zarr-python)."""
        chunks = tuple(int(c) for c in _engine.array_info(self.url)["chunks"])
        if not named:
            return Variable("", (None,) * len(chunks), chunks)
        return Variable("", _variable("", zarr.open_array(self.url, mode="r")).dims, chunks)


@dataclass(frozen=True)
class GroupSource:
    """Arrays of the group at `url`, by name."""

    url: str
    variables: tuple[Variable, ...]


def resolve(source: Any) -> ArraySource | GroupSource:
    """The array or group `source` names: a path or URL, a zarr.Array, a zarr.Group, or an
    xarray Dataset opened from Zarr (its variables, data and coordinates, as stored)."""
    if isinstance(source, zarr.Group):
        sp = source.store_path
        url = local_url(sp.store, sp.path)
        if url is None:
            raise ValueError(
                f"source: the zarr group lives in a {type(sp.store).__name__}; chunkfuse reads "
                "groups on local disk and object storage (pass a path or URL)"
            )
        return _group(url, source, None)
    if _is_dataset(source):
        return _dataset(source)
    url = engine_url(source, "source")
    group = _open_group(url)
    return ArraySource(url) if group is None else _group(url, group, None)


def _open_group(url: str) -> zarr.Group | None:
    """The group at `url`, or None where there is none (an array, or nothing: the engine
    names what it finds there)."""
    try:
        node = zarr.open(url, mode="r")
    except Exception:  # noqa: BLE001 - not a group; the engine reports on arrays itself
        return None
    return node if isinstance(node, zarr.Group) else None


def _variable(name: str, array: zarr.Array) -> Variable:
    return Variable(name, _dimension_names(array), tuple(int(c) for c in array.chunks))


def _dimension_names(array: zarr.Array) -> tuple[str | None, ...]:
    """The array's dimension names (Zarr v3 metadata, else xarray's `_ARRAY_DIMENSIONS`
    attribute); none named where it has none, or they are not one name (or null) per axis."""
    dims = getattr(array.metadata, "dimension_names", None)
    if dims is None:
        dims = array.attrs.get("_ARRAY_DIMENSIONS")
    if (
        not isinstance(dims, list | tuple)
        or len(dims) != array.ndim
        or not all(d is None or isinstance(d, str) for d in dims)
    ):
        return (None,) * array.ndim
    return tuple(dims)


def _group(url: str, group: zarr.Group, names: Sequence[str] | None) -> GroupSource:
    arrays = dict(group.arrays())
    nested = [name for name, _ in group.groups()]
    if nested and names is None:
        raise ValueError(
            f"source: the group {url} holds nested groups ({', '.join(sorted(nested))}); "
            "only flat groups (arrays directly in the group, as xarray writes datasets) are "
            "supported"
        )
    wanted = sorted(arrays) if names is None else list(names)
    missing = [n for n in wanted if n not in arrays]
    if missing:
        raise ValueError(
            f"source: variable(s) {', '.join(missing)} of the dataset are not stored in {url}; "
            "chunkfuse.rechunk copies stored variables (write computed ones with to_zarr)"
        )
    if not wanted:
        raise ValueError(f"source: the group {url} holds no arrays")
    return GroupSource(url, tuple(_variable(n, arrays[n]) for n in wanted))


def _is_dataset(source: Any) -> bool:
    try:
        import xarray as xr
    except ImportError:
        return False
    return isinstance(source, xr.Dataset)


def _dataset(ds: Any) -> GroupSource:
    path = ds.encoding.get("source")
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            "source: the dataset was not opened from a Zarr store (ds.encoding has no "
            "'source'); open it with xr.open_zarr(path), or pass the store's path"
        )
    url = engine_url(path, "source")
    group = _open_group(url)
    if group is None:
        raise ValueError(f"source: the dataset's store {url} is not a Zarr group")
    source = _group(url, group, [str(n) for n in ds.variables])
    arrays = dict(group.arrays())
    for name, var in ds.variables.items():
        why = changed(var, str(name), arrays[str(name)])
        if why is not None:
            raise ValueError(
                f"source: variable {name} of the dataset is not the array stored in {url}: "
                f"{why}; chunkfuse.rechunk copies stored variables (write the dataset with "
                "to_zarr, or pass the store's path)"
            )
    return source
