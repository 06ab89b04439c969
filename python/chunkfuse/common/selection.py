"""Selections shared by the Cubed and Dask translations: positions that step evenly as
the slice that takes them, and any other list of positions (a groupby's takes, `isel` with a
list) as the runs of evenly stepping positions it is made of, each a slice, joined in order."""

from __future__ import annotations

from typing import Any

import numpy as np

from chunkfuse.common.symbols import NotNative


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


#: Most runs one take is split into; more (a random permutation) stays a Python task.
MAX_RUNS = 512


def even_runs(item: Any) -> list[slice]:
    """The 1-d integer positions `item` as slices that take the same positions in order: each
    maximal run of positions in an even progression (a repeated position is a run of one).
    NotNative for positions counting from the end, other dtypes, or more than `MAX_RUNS`
    runs."""
    if not isinstance(item, np.ndarray) or item.ndim != 1 or item.dtype.kind not in "iu":
        raise NotNative("a take of positions other than integers along one axis")
    positions = item.astype(np.int64)
    if len(positions) and int(positions.min()) < 0:
        raise NotNative("a take counting from the end")
    runs: list[slice] = []
    i, n = 0, len(positions)
    while i < n:
        first = int(positions[i])
        step = int(positions[i + 1]) - first if i + 1 < n else 1
        j = i + 1
        if step != 0:
            while j < n and int(positions[j]) - int(positions[j - 1]) == step:
                j += 1
        else:
            step = 1
        stop = first + step * (j - i)
        runs.append(slice(first, None if stop < 0 else stop, step))
        if len(runs) > MAX_RUNS:
            raise NotNative(f"a take of more than {MAX_RUNS} runs of evenly stepping positions")
        i = j
    return runs
