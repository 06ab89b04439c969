"""The Interpreter's slices and takes: basic indexing of blocks (boxes, integers, steps, new
axes), transposes, and Dask's `take` of positions (one selection when they step evenly, else
the selections of their runs joined).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from chunkfuse.common.selection import as_slice, even_runs
from chunkfuse.common.symbols import NotNative

from .steps import Steps
from .symbols import Blk, Red


class SliceSteps(Steps):
    """Slices, transposes and takes of blocks."""

    def _getitem(self, x: Any, index: Any) -> Blk:
        """Basic indexing of a block: a box of it (Dask's rechunk splits), or integers and
        steps (`x[5]`, `x[:, 3]`, `x[::2]`, `x[::-1]`)."""
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("getitem of something else")
        return self._select(x, index)

    def _transposed(self, x: Any, axes: Any) -> Blk:
        """`np.transpose` of a block (Dask's `transpose`, `x.T`, xarray's `transpose`): a
        block of the whole array transposed."""
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("transpose of something else")
        rank = len(x.region)
        order = tuple(range(rank))[::-1] if axes is None else tuple(int(a) % rank for a in axes)
        if sorted(order) != list(range(rank)):
            raise NotNative("transpose with axes that are not a permutation")
        key = ("transpose", x.full.root, order)
        if key not in self._memo:
            self._memo[key] = self.b.transpose(x.full, order)
        return Blk(self._memo[key], tuple(x.region[d] for d in order))

    def _taken(self, x: Any, taker: Any) -> Blk:
        """Dask's `take` (`x[:, [8, 7, 6]]`, xarray's `sortby`) of one block:
        `_getitem(block, (1, index))`, where positions in an even progression are a slice."""
        if not isinstance(taker, tuple) or len(taker) != 2 or not isinstance(taker[1], tuple):
            raise NotNative("a take of something else")
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("a take of something else")
        return self._select_runs(x, taker[1])

    def _select_runs(self, x: Blk, index: tuple[Any, ...]) -> Blk:
        """`x[index]` where one item may be an array of positions: one selection when they
        step evenly, else the selections of their runs (see `even_runs`) joined in order."""
        arrays = [d for d, item in enumerate(index) if isinstance(item, np.ndarray)]
        try:
            return self._select(x, tuple(as_slice(item) for item in index))
        except NotNative:
            if len(arrays) != 1:
                raise
        at = arrays[0]
        plain = [as_slice(item) if d != at else item for d, item in enumerate(index)]
        # The output axis of the array: the axes before it less those integers drop.
        axis = sum(1 for item in plain[:at] if not isinstance(item, int | np.integer))
        parts = [
            self._select(x, tuple(run if d == at else item for d, item in enumerate(plain)))
            for run in even_runs(index[at])
        ]
        return self._tiled(parts, axis)

    def _shuffled(self, parts: Any, sorter: Any, axis: Any) -> Blk:
        """Dask's `take` merging the pieces of several blocks: `parts` joined along `axis`,
        then taken in the order `argsort(sorter)` (a slice when an even progression)."""
        if not isinstance(parts, list | tuple) or not isinstance(axis, int):
            raise NotNative("a take's merge of something else")
        if not isinstance(sorter, tuple) or len(sorter) != 2:
            raise NotNative("a take's merge of something else")
        joined = self._tiled(list(parts), axis)
        index: list[Any] = [slice(None)] * len(joined.region)
        index[axis] = np.argsort(np.asarray(sorter[1]))
        return self._select_runs(joined, tuple(index))

    def _select(self, x: Blk, index: Any) -> Blk:
        """`x[index]` with `index` relative to the block: a box of `x.full`, or, with integers
        or steps, a box of the whole array's selection that this block's selection belongs to.
        That selection takes integers at their place in the whole array and steps from the
        first position on their grid (`x[1::2]`'s blocks all give `full[1::2]`; walking
        backwards, from the last: `x[-2::-3]`'s give `full[-2::-3]`), so every block of one
        Dask selection names the same array."""
        shape = tuple(b - a for a, b in x.region)
        if not isinstance(index, tuple):
            index = (index,)
        if any(item is None for item in index):
            return self._expanded(x, index)
        if len(index) != len(shape):
            raise NotNative("not a full tuple of indices")
        selection: list[Any] = []
        region: list[tuple[int, int]] = []
        out_shape: list[int] = []
        for (r0, _), n, n_full, item in zip(x.region, shape, x.full.shape, index, strict=True):
            if isinstance(item, int | np.integer) and not isinstance(item, bool):
                i = int(item) + (n if item < 0 else 0)
                if not 0 <= i < n:
                    raise NotNative("an index out of the block")
                selection.append(r0 + i)
                continue
            if not isinstance(item, slice):
                raise NotNative("not an integer or a slice")
            start, stop, step = item.indices(n)
            count = len(range(start, stop, step))
            if step == 1 or count == 0:
                selection.append(None)
                region.append((r0 + start, r0 + start + count))
                out_shape.append(n_full)
                continue
            first = r0 + start
            # The whole array's selection on this step's grid through `first`: from its
            # lowest index walking forwards, from its highest walking backwards.
            origin = first % step if step > 0 else first + (n_full - 1 - first) // -step * -step
            at = (first - origin) // step
            selection.append([origin, None, step])
            region.append((at, at + count))
            out_shape.append(len(range(origin, n_full if step > 0 else -1, step)))
        if all(s is None for s in selection):
            return Blk(x.full, tuple(region))
        key = ("slice", x.full.root, repr(selection))
        if key not in self._memo:
            self._memo[key] = self.b.slice(x.full, selection, tuple(out_shape))
        return Blk(self._memo[key], tuple(region))

    def _expanded(self, x: Blk, index: tuple[Any, ...]) -> Blk:
        """`x[None, ...]`: where it puts back the axes a reduction dropped (xarray broadcasting
        a mean against its input), the same reduction with its axes kept; else a block of the
        selection with new axes (`da.stack` gives each input one)."""
        red = self._squeezed.get(x.full.root)
        new_axes = tuple(d for d, item in enumerate(index) if item is None)
        if red is None or new_axes != red.axes or len(index) != len(red.base.shape):
            return self._new_axes(x, index, new_axes)
        inner = self._select(x, tuple(item for item in index if item is not None))
        if inner.full != x.full:
            raise NotNative("a new axis beside integers or steps")
        rest = iter(inner.region)
        region = tuple(
            red.region[d] if d in red.axes else next(rest) for d in range(len(red.base.shape))
        )
        return self.reduced(replace(red, keepdims=True, region=region))

    def _new_axes(self, x: Blk, index: tuple[Any, ...], new_axes: tuple[int, ...]) -> Blk:
        """`x[index]` where `index` (one item per axis of the result) has None at `new_axes`."""
        inner = self._select(x, tuple(item for item in index if item is not None))
        rank = len(inner.region) + len(new_axes)
        if len(index) != rank:
            raise NotNative("not a full tuple of indices")
        key = ("newaxis", inner.full.root, new_axes)
        if key not in self._memo:
            shape = list(inner.full.shape)
            for d in new_axes:
                shape.insert(d, 1)
            self._memo[key] = self.b.expand_dims(inner.full, new_axes, tuple(shape))
        region = list(inner.region)
        for d in new_axes:
            region.insert(d, (0, 1))
        return Blk(self._memo[key], tuple(region))
