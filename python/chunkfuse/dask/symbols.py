"""What the Dask scheduler's symbolic pass gives a task's value: a block of a whole-array IR
symbol, the reduction of a region, a write, or a stored array.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from chunkfuse.common.symbols import Full, NotNative, Partial

Region = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Src:
    """A stored zarr array on local disk (the `DataNode` of `da.from_zarr`), decoded by
    `steps` (xarray's CF decoding; none for the stored values)."""

    array: Any
    url: str
    steps: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Blk:
    """The values of the whole-array symbol `full` over `region`."""

    full: Full
    region: Region


@dataclass(frozen=True)
class Red:
    """The reduction `kind` of `base` over `axes`, restricted to `region` of `base`."""

    kind: str
    base: Full
    axes: tuple[int, ...]
    region: Region
    keepdims: bool
    dtype: np.dtype | None
    ddof: float = 0.0
    #: Dask's value of the key is a step's state (mean's sums and counts, var's moments, an
    #: arg-reduction's values and indices), not the reduction's values: never read back.
    state: bool = False
    #: Dask's index of the region's start along the (single) reduced axis, where it is not
    #: the region's start in `base`: an arg reduction's step over a block of one of several
    #: arrays Dask joined (its indices count from the joined array's start).
    origin: int | None = None

    def complete(self) -> bool:
        return all(self.region[a] == (0, self.base.shape[a]) for a in self.axes)

    def spec(self) -> tuple[Any, ...]:
        """What identifies the reduction's whole result (everything but the region)."""
        return (self.kind, self.base.root, self.axes, self.keepdims, self.dtype, self.ddof)

    def partial(self) -> Partial:
        """The complete reduction as the IR builder takes it."""
        return Partial(
            self.kind, self.base, self.axes, True, self.keepdims, self.dtype, ddof=self.ddof
        )


@dataclass(frozen=True)
class Filled:
    """A block of `shape` holding `value` (a numpy scalar of the block's dtype) everywhere;
    an operand of elementwise functions only."""

    value: Any
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Store:
    """`full` over `region` written into box `box` of the zarr array of `shape` at `url`
    (Dask's `load_store_chunk`), whose stored chunks (shards when sharded) are `chunks`."""

    full: Full
    region: Region
    url: str
    shape: tuple[int, ...]
    box: Region
    chunks: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Stored:
    """Dask's `finalize` of store tasks: the writes, and what `finalize` makes of their Nones."""

    stores: tuple[Store, ...]
    template: Any


@dataclass(frozen=True, eq=False)
class Lit:
    """A plain value a top-level data node holds (the positions of Dask's `take`): steps
    read it; it stays in the graph for Python tasks, which may read it too."""

    value: Any


Symbol = Src | Blk | Red | Store | Stored | Lit


def is_hashable(f: Any) -> bool:
    """Whether `f` can be looked up in a dict (partials of unhashable values cannot)."""
    try:
        hash(f)
    except TypeError:
        return False
    return True


def unwrap(func: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A function with the positional and keyword arguments `functools.partial` bound."""
    if isinstance(func, functools.partial):
        return func.func, func.args, dict(func.keywords)
    return func, (), {}


def unit_box(index: Any, shape: tuple[int, ...]) -> Region:
    """The box a tuple of unit-step slices selects."""
    if not isinstance(index, tuple) or len(index) != len(shape):
        raise NotNative("not a full tuple of slices")
    out = []
    for s, n in zip(index, shape, strict=True):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise NotNative("not a unit-step slice")
        start, stop, _ = s.indices(n)
        out.append((start, max(start, stop)))
    return tuple(out)


def store_box(index: Any, region: Any, shape: tuple[int, ...]) -> Region:
    """The box of an array of `shape` that Dask's `load_store_chunk` writes: `index` within
    `region` (`out[region][index]`; the whole array when `region` is empty), both tuples of
    unit-step slices."""
    if not region:
        return unit_box(index, shape)
    if not isinstance(region, tuple) or len(region) > len(shape):
        raise NotNative("a store region that is not a tuple of slices")
    # Axes the region leaves out are whole, as numpy indexes them.
    outer = unit_box(region + (slice(None),) * (len(shape) - len(region)), shape)
    inner = unit_box(index, tuple(b - a for a, b in outer))
    return tuple((a + lo, a + hi) for (a, _), (lo, hi) in zip(outer, inner, strict=True))


def touching_groups(boxes: list[Region]) -> list[list[int]]:
    """The indices of `boxes` in groups of boxes that touch (overlap or share a face, edge or
    corner), directly or through others of the group."""
    parent = list(range(len(boxes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(boxes):
        for j in range(i):
            b = boxes[j]
            if all(lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True)):
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(boxes)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def chunk_span(box: Region, chunks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The stored chunks (first and last index along each axis) that `box` reaches into."""
    return tuple((a // c, (max(a, b - 1)) // c) for (a, b), c in zip(box, chunks, strict=True))


def bounding(regions: list[Region]) -> Region:
    """The box the regions tile exactly; NotNative when they do not."""
    box = tuple(
        (min(r[d][0] for r in regions), max(r[d][1] for r in regions))
        for d in range(len(regions[0]))
    )
    volume = math.prod(b - a for a, b in box)
    if sum(math.prod(b - a for a, b in r) for r in regions) != volume:
        raise NotNative("partial reductions that do not tile a box")
    return box


def grid_items(nested: Any, at: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Any]]:
    """The items of blocks nested as their grid (lists along axes 0, 1, ...), each with its
    grid index."""
    if isinstance(nested, list | tuple):
        return [p for k, n in enumerate(nested) for p in grid_items(n, (*at, k))]
    return [(at, nested)]


def in_grid_order(items: list[tuple[tuple[int, ...], Region]]) -> bool:
    """Whether blocks at grid indices lie in their array in the grid's order: along each
    axis, the blocks at a higher index lie after those at a lower one. Dask's `take` may list
    blocks of one array in another order (`x[[3, 2, 1, 0]]` over chunks of one row), whose
    values then cannot be read as the box they cover. Blocks without values are passed over."""
    spans: dict[tuple[int, int], tuple[int, int]] = {}
    for index, region in items:
        if any(b <= a for a, b in region):
            continue
        for d, k in enumerate(index[: len(region)]):
            lo, hi = region[d]
            old = spans.get((d, k), (lo, hi))
            spans[(d, k)] = (min(old[0], lo), max(old[1], hi))
    ordered = sorted(spans.items())
    return all(
        d1 != d2 or s1[1] <= s2[0]
        for ((d1, _), s1), ((d2, _), s2) in zip(ordered, ordered[1:], strict=False)
    )


def with_values(items: list[Any]) -> list[Any]:
    """The blocks and reductions whose region holds values, or all of them when none does
    (an empty block of a strided selection may name another selection of the same array)."""
    kept = [i for i in items if not isinstance(i, Blk | Red) or all(b > a for a, b in i.region)]
    return kept or items


def nones(v: Any) -> Any:
    """`v`'s nesting of lists and tuples with None for every item (what stores return)."""
    if isinstance(v, list | tuple):
        return type(v)(nones(x) for x in v)
    return None


def flat_items(v: Any) -> list[Any]:
    """The items of nested lists and tuples, in order."""
    if isinstance(v, list | tuple):
        return [x for item in v for x in flat_items(item)]
    return [v]
