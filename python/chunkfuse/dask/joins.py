"""Dask's `da.concatenate` in the symbolic pass.

Dask joins arrays with no task at all: every block of the result is an `Alias` of a block of one
of the inputs. Per block that is just the input's block, but a reduction over the result combines
blocks of different arrays, which only one whole-array symbol can express. So the aliases of one
result array (top-level, or inside the subgraphs Dask fuses them into) are read as a layout (which
input, and at which block offset along which axis, each block comes from) and, once every input
block has a symbol, the result becomes the IR `concat` of the inputs: its blocks are blocks of
that one array. A block met before the symbols of all the blocks it joins are known stands for
its input's block; the pass over the graph then runs again (see `JoinBuilder.rerun`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from dask._task_spec import Alias, Task, _execute_subgraph

from chunkfuse.common.symbols import Full, NotNative

from .steps import Steps
from .symbols import (
    Blk,
    Red,
    Region,
    Store,
    Stored,
    bounding,
    flat_items,
    grid_items,
    in_grid_order,
    nones,
    with_values,
)

#: One input of a join: the input array's name and its block offset along the joined axis.
Part = tuple[str, int]

#: A block's key in a Dask graph: its array's name, then its index along each axis.
BlockKey = tuple[str, *tuple[int, ...]]


@dataclass(frozen=True)
class Join:
    """The blocks of array `name` present in the graph, each an alias of a block of a part."""

    name: str
    axis: int
    #: Parts in order along the axis.
    parts: tuple[Part, ...]
    #: Every aliased block: result key → (part, the input block's key).
    blocks: Mapping[Hashable, tuple[Part, BlockKey]]


def _block_key(key: object) -> TypeGuard[BlockKey]:
    return (
        isinstance(key, tuple)
        and len(key) > 1
        and isinstance(key[0], str)
        and all(isinstance(i, int) for i in key[1:])
    )


def _aliases(
    graph: Mapping[Hashable, Any], groups: dict[str, dict[BlockKey, BlockKey]], others: set[str]
) -> None:
    """Collects each array's blocks that alias a block of another array into `groups`, and
    the names of arrays with any other block into `others` (a rechunk aliases the blocks it
    keeps and merges the rest: not a concatenation)."""
    for key, node in graph.items():
        if isinstance(node, Task) and node.func is _execute_subgraph and node.args:
            inner = node.args[0]
            if isinstance(inner, Mapping):
                _aliases(inner, groups, others)
        if not _block_key(key):
            continue
        target = node.target if isinstance(node, Alias) else None
        if _block_key(target) and len(target) == len(key) and target[0] != key[0]:
            groups[key[0]][key] = target
        else:
            others.add(key[0])


def find_joins(graph: Mapping[Hashable, Any]) -> dict[Hashable, Join]:
    """The join each aliased block of a concatenation belongs to, by the block's key."""
    groups: dict[str, dict[BlockKey, BlockKey]] = defaultdict(dict)
    others: set[str] = set()
    _aliases(graph, groups, others)
    joins: dict[Hashable, Join] = {}
    for name, aliases in groups.items():
        join = None if name in others else _join_of(name, aliases)
        if join is not None:
            joins.update(dict.fromkeys(join.blocks, join))
    return joins


def _join_of(name: str, aliases: Mapping[BlockKey, BlockKey]) -> Join | None:
    axes = {
        d
        for key, target in aliases.items()
        for d, (k, t) in enumerate(zip(key[1:], target[1:], strict=True))
        if k != t
    }
    if len(axes) != 1:
        return None
    (axis,) = axes
    blocks: dict[Hashable, tuple[Part, BlockKey]] = {
        key: ((target[0], key[1:][axis] - target[1:][axis]), target)
        for key, target in aliases.items()
    }
    parts = tuple(sorted({part for part, _ in blocks.values()}, key=lambda p: p[1]))
    if len(parts) < 2:
        return None
    return Join(name, axis, parts, blocks)


class JoinBuilder:
    """Builds each join's IR `concat` once, from the symbols of its parts' blocks."""

    def __init__(self, interp: Any, joins: Mapping[Hashable, Join]) -> None:
        self.interp = interp
        self.joins = joins
        #: The symbols of the joined blocks met so far, by key.
        self.seen: dict[Hashable, Any] = {}
        #: name → (the joined array, each part's box in its array, each part's start).
        self._built: dict[str, tuple[Full, dict[Part, Region], dict[Part, int]] | None] = {}
        #: Joins a block of which stood for its input's block, all blocks not yet known.
        self._early: set[str] = set()
        #: name → the array each part's blocks were blocks of when the join was built.
        self._frames: dict[str, dict[Part, Full]] = {}

    def block(self, key: Hashable, target_symbol: Any) -> Any:
        """The symbol of aliased block `key`, whose input block's symbol is `target_symbol`:
        a block of the joined array once every joined block is known, else the input's."""
        join = self.joins[key]
        self.seen[join.blocks[key][1]] = target_symbol
        built = self._built.get(join.name, ...)
        if built is ...:
            if any(t not in self.seen for _, t in join.blocks.values()):
                self._early.add(join.name)
                return target_symbol
            built = self._build(join)
            self._built[join.name] = built
        if built is None:
            return target_symbol
        full, boxes, starts = built
        part = join.blocks[key][0]
        blk = self._blk(target_symbol)
        if blk.full == full:
            return blk  # already a block of the join (met again inside a fused subgraph)
        if blk.full != self._frames[join.name][part]:
            # Built from blocks that stood for their inputs' blocks (a join of a join not
            # yet built): its boxes lie in other arrays. Built again once every block of it
            # is known in this pass; the pass after maps its blocks.
            del self._built[join.name]
            for _, t in join.blocks.values():
                self.seen.pop(t, None)
            self.seen[join.blocks[key][1]] = target_symbol
            self._early.add(join.name)
            return target_symbol
        box = boxes[part]
        shift = [-a for a, _ in box]
        shift[join.axis] += starts[part]
        return Blk(full, tuple((a + s, b + s) for (a, b), s in zip(blk.region, shift, strict=True)))

    def rerun(self) -> bool:
        """Whether a join was built after some of its blocks stood for their inputs' blocks:
        the pass must run again for them to be blocks of the joined array."""
        return any(self._built.get(name) is not None for name in self._early)

    def again(self) -> None:
        """Ready for the pass to run again: the joins built stay."""
        self._early.clear()

    def _blk(self, sym: Any) -> Blk:
        if isinstance(sym, Red):
            sym = self.interp.reduced(sym)
        if not isinstance(sym, Blk):
            raise NotNative("a block of something else")
        return sym

    def _build(self, join: Join) -> tuple[Full, dict[Part, Region], dict[Part, int]] | None:
        by_part: dict[Part, list[Blk]] = defaultdict(list)
        try:
            at: dict[Part, list[tuple[tuple[int, ...], Region]]] = defaultdict(list)
            for part, target in join.blocks.values():
                blk = self._blk(self.seen[target])
                by_part[part].append(blk)
                at[part].append((tuple(target[1:]), blk.region))
            fulls: list[Full] = []
            frames: dict[Part, Full] = {}
            boxes: dict[Part, Region] = {}
            starts: dict[Part, int] = {}
            start = 0
            for part in join.parts:
                blks = by_part[part]
                full = blks[0].full
                if any(b.full != full for b in blks):
                    return None
                if not in_grid_order(at[part]):
                    return None
                box = bounding(list({b.region for b in blks}))
                if len(full.shape) <= join.axis:
                    return None
                boxes[part] = box
                frames[part] = full
                starts[part] = start
                start += box[join.axis][1] - box[join.axis][0]
                fulls.append(self.interp._region_of(Blk(full, box)))
        except NotNative:
            return None
        off_axis = {
            tuple(b - a for k, (a, b) in enumerate(boxes[p]) if k != join.axis) for p in join.parts
        }
        if len(off_axis) != 1 or not self._contiguous(join):
            return None
        self._frames[join.name] = frames
        return self.interp.b.concat(fulls, join.axis), boxes, starts

    @staticmethod
    def _contiguous(join: Join) -> bool:
        """Whether each part's blocks follow the previous part's along the axis, with none
        left out between them (culling may drop blocks only outside the parts' span)."""
        spans: dict[Part, set[int]] = defaultdict(set)
        for key, (part, _) in join.blocks.items():
            assert _block_key(key)  # `_join_of` keys the blocks by their block keys
            spans[part].add(key[1:][join.axis])
        expected = None
        for part in join.parts:
            idx = sorted(spans[part])
            if idx != list(range(idx[0], idx[-1] + 1)):
                return False
            if expected is not None and idx[0] != expected:
                return False
            expected = idx[-1] + 1
        return True


class JoinSteps(Steps):
    """Blocks joined into one: Dask's `finalize` of an array's blocks, its rechunk merges,
    and the joins other steps make (of a take's runs, of stores tiling a box)."""

    def _whole(self, parts: Any) -> Blk | Red | Stored:
        """Dask's `finalize` of the blocks of one array: the blocks joined (they must tile it)."""
        items = with_values(flat_items(parts))
        first = items[0] if items else None
        if items and all(isinstance(i, Store) for i in items):
            from dask.array.core import finalize

            return Stored(tuple(items), finalize(nones(parts)))
        if (
            isinstance(first, Red)
            and all(
                isinstance(i, Red) and (i.spec(), i.state) == (first.spec(), first.state)
                for i in items
            )
            and in_grid_order([(k, _kept_region(r)) for k, r in grid_items(parts)])
        ):
            return replace(first, region=bounding([i.region for i in items]))
        return self._joined(parts)

    def _joined(self, nested: Any) -> Blk:
        """Blocks nested as their block grid joined into one block: the box they tile in
        their one array, or else as `_tiled` joins them."""
        grid = [(k, self.reduced(i) if isinstance(i, Red) else i) for k, i in grid_items(nested)]
        items = with_values([i for _, i in grid])
        in_order = all(isinstance(i, Blk) for _, i in grid) and in_grid_order(
            [(k, i.region) for k, i in grid]
        )
        if in_order and items and all(i.full == items[0].full for i in items):
            try:
                return Blk(items[0].full, bounding([i.region for i in items]))
            except NotNative:
                pass  # blocks of one array that lie apart in it
        return self._tiled(nested, 0)

    def _tiled(self, nested: Any, axis: int) -> Blk:
        """Blocks nested as their block grid (lists along axes `axis`, `axis + 1`, ...) joined
        into one block; runs of blocks of different arrays join through IR concats (the
        blocks of a `da.concatenate` whose aliases Dask inlined)."""
        if not isinstance(nested, list | tuple):
            item = self.reduced(nested) if isinstance(nested, Red) else nested
            if not isinstance(item, Blk):
                raise NotNative("a join of something else")
            return item
        items = [self._tiled(n, axis + 1) for n in nested]
        # Blocks without values (of a strided selection) add nothing to the join.
        items = [b for b in items if all(hi > lo for lo, hi in b.region)] or items[:1]
        runs: list[Blk] = []
        for b in items:
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.full == b.full
                and last.region[axis][1] == b.region[axis][0]
                and all(last.region[k] == b.region[k] for k in range(len(b.region)) if k != axis)
            ):
                region = list(b.region)
                region[axis] = (last.region[axis][0], b.region[axis][1])
                runs[-1] = Blk(b.full, tuple(region))
            else:
                runs.append(b)
        if not runs:
            raise NotNative("a join of nothing")
        if len(runs) == 1:
            return runs[0]
        off_axis = {tuple(b - a for k, (a, b) in enumerate(r.region) if k != axis) for r in runs}
        if len(off_axis) != 1 or any(len(r.region) <= axis for r in runs):
            raise NotNative("blocks that do not tile a box")
        parts = [self._region_of(r) for r in runs]
        joined = self.b.concat(parts, axis)
        return Blk(joined, tuple((0, n) for n in joined.shape))

    def _region_of(self, x: Blk) -> Full:
        """The values of block `x` as a whole array (a slice of its array unless whole)."""
        if all(r == (0, n) for r, n in zip(x.region, x.full.shape, strict=True)):
            return x.full
        key = ("region", x.full.root, x.region)
        if key not in self._memo:
            shape = tuple(b - a for a, b in x.region)
            self._memo[key] = self.b.slice(x.full, [[a, b, 1] for a, b in x.region], shape)
        return self._memo[key]

    def _join(self, parts: Any, shape: Any) -> Blk:
        """Blocks joined into the box they tile (Dask's rechunk merges): of one array, or of
        several through IR concats."""
        from dask.array.core import reshapelist

        if not isinstance(parts, list | tuple) or not isinstance(shape, tuple | list):
            raise NotNative("concatenation of something else")
        return self._joined(reshapelist(tuple(shape), list(parts)))


def _kept_region(r: Any) -> Region:
    """A reduction's region along the axes of its result (its base's kept axes, or all with
    keepdims): where its block lies in the result's grid."""
    if not isinstance(r, Red) or r.keepdims:
        return r.region
    return tuple(span for d, span in enumerate(r.region) if d not in r.axes)
