"""Selections shared by the Cubed and Dask translations: positions that step evenly as
the slice that takes them."""

from __future__ import annotations

from typing import Any

import numpy as np

from chunkfuse.cubed.symbols import NotNative


def as_slice(item: Any) -> Any:
    """An index item, with an array of positions in an even progression (a `take` of
    `[8, 7, ..., 0]` or `[2, 3, 4]`) as the slice that takes the same positions in order;
    NotNative for other positions."""
    if not isinstance(item, np.ndarray):
        return item
    if item.ndim != 1 or item.dtype.kind not in "iu":
        raise NotNative("a take of positions other than integers along one axis")
    positions = item.astype(np.int64)
    if len(positions) == 0:
        return slice(0, 0)
    first = int(positions[0])
    if first < 0:
        raise NotNative("a take counting from the end")
    step = int(positions[1] - first) if len(positions) > 1 else 1
    if step == 0 or np.any(np.diff(positions) != step):
        raise NotNative("a take of positions that are not an even progression")
    stop = first + step * len(positions)
    return slice(first, None if stop < 0 else stop, step)
