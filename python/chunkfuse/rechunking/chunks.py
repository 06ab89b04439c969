"""Target chunks (and shards) per array, from what `chunkfuse.rechunk` was given: one size per
axis (-1: the whole axis), `{axis: size}`, `{dimension: size}` (rechunker's form, applied to
every array having those dimensions), or, for a group, `{variable: sizes}` per array."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chunkfuse.rechunking.sources import Variable

#: Sizes per axis, by axis, by dimension name, or by variable (groups).
Chunks = Sequence[int] | Mapping[Any, Any]


def size(value: Any, what: str, where: str) -> int:
    """`value` as a size: an integer, positive or -1 (the whole axis); else an error naming
    `what` (chunks or shards) and `where` (the axis or dimension)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{what}: the size of {where} must be an integer (-1 for the whole axis), got {value!r}"
        )
    if value == 0 or value < -1:
        raise ValueError(
            f"{what}: the size of {where} must be positive (or -1 for the whole axis), got {value}"
        )
    return int(value)


def per_axis(sizes: Any, what: str, var: Variable | None = None) -> list[int]:
    """One size per axis, each checked."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (Sequence, np.ndarray)):
        raise TypeError(
            f"{what}: give one size per axis (e.g. (256, 73, 144)), or sizes by axis or "
            f"dimension name, not {sizes!r}"
        )
    return [size(s, what, f"axis {i}{_in(var)}") for i, s in enumerate(sizes)]


def for_array(sizes: Chunks, var: Variable, what: str) -> list[int]:
    """Sizes for one array's axes; axes not given keep the array's chunks."""
    if not isinstance(sizes, Mapping):
        return per_axis(sizes, what, var)
    out = list(var.chunks)
    rank = len(out)
    for key, value in sizes.items():
        if isinstance(key, str):
            if key not in var.dims:
                named = ", ".join(d for d in var.dims if d) or "none named"
                raise ValueError(
                    f"{what}: {_of(var)}has no dimension {key!r} (its dimensions: {named})"
                )
            out[var.dims.index(key)] = size(value, what, f"dimension {key!r}{_in(var)}")
        elif isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise TypeError(f"{what}: {key!r} is neither an axis nor a dimension name")
        elif not -rank <= int(key) < rank:
            raise ValueError(f"{what}: axis {key} is out of range for an array of rank {rank}")
        else:
            out[int(key)] = size(value, what, f"axis {key}{_in(var)}")
    return out


def for_group(
    sizes: Chunks | None, variables: Sequence[Variable], what: str
) -> dict[str, Chunks | None]:
    """Each variable's sizes (None: keep its chunks) from sizes by dimension name, or by
    variable (a variable not named keeps its chunks). A dimension or variable that none of
    `variables` has is an error."""
    if sizes is None:
        return {v.name: None for v in variables}
    if not isinstance(sizes, Mapping):
        raise ValueError(
            f"{what}: the source is a group, whose arrays have their own axes: give "
            "{dimension: size} (e.g. {'time': -1, 'latitude': 10}) or {variable: sizes}"
        )
    names = {v.name for v in variables}
    per_variable = [
        (isinstance(s, (Mapping, Sequence)) and not isinstance(s, (str, bytes))) or s is None
        for s in sizes.values()
    ]
    if sizes and all(per_variable):
        unknown = [k for k in sizes if k not in names]
        if unknown:
            raise ValueError(
                f"{what}: no variable {unknown[0]!r} in the group (its variables: "
                f"{', '.join(sorted(names))})"
            )
        return {v.name: sizes.get(v.name) for v in variables}
    if any(per_variable):
        raise ValueError(
            f"{what}: give sizes by dimension name ({{'time': -1}}) or by variable "
            "({'t2m': {'time': -1}}), not both"
        )
    dims = {d for v in variables for d in v.dims if d}
    unknown = [k for k in sizes if k not in dims]
    if unknown:
        raise ValueError(
            f"{what}: no array of the group has a dimension {unknown[0]!r} (its dimensions: "
            f"{', '.join(sorted(dims))})"
        )
    return {v.name: {d: s for d, s in sizes.items() if d in v.dims} or None for v in variables}


def shards_for(sizes: Chunks, chunks: Sequence[int], var: Variable, what: str) -> list[int]:
    """Shard sizes for one array: as given per axis, or by axis or dimension name with the
    axes not given as its target chunks (not sharded further)."""
    if not isinstance(sizes, Mapping):
        return per_axis(sizes, what, var)
    return for_array(sizes, Variable(var.name, var.dims, tuple(chunks)), what)


def _of(var: Variable) -> str:
    return f"{var.name!r} " if var.name else "the array "


def _in(var: Variable | None) -> str:
    return f" of {var.name!r}" if var is not None and var.name else ""
