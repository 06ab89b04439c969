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
from dataclasses import dataclass
from typing import Any

from dask._task_spec import Alias, Task, _execute_subgraph

from chunkfuse.cubed.symbols import Full, NotNative

from .symbols import Blk, Red, Region, bounding, in_grid_order

#: One input of a join: the input array's name and its block offset along the joined axis.
Part = tuple[str, int]


@dataclass(frozen=True)
class Join:
    """The blocks of array `name` present in the graph, each an alias of a block of a part."""

    name: str
    axis: int
    #: Parts in order along the axis.
    parts: tuple[Part, ...]
    #: Every aliased block: result key → (part, the input block's key).
    blocks: Mapping[Hashable, tuple[Part, Hashable]]


def _block_key(key: Any) -> bool:
    return (
        isinstance(key, tuple)
        and len(key) > 1
        and isinstance(key[0], str)
        and all(isinstance(i, int) for i in key[1:])
    )


def _aliases(
    graph: Mapping[Hashable, Any], groups: dict[str, dict[Hashable, Hashable]], others: set[str]
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
    groups: dict[str, dict[Hashable, Hashable]] = defaultdict(dict)
    others: set[str] = set()
    _aliases(graph, groups, others)
    joins: dict[Hashable, Join] = {}
    for name, aliases in groups.items():
        join = None if name in others else _join_of(name, aliases)
        if join is not None:
            joins.update(dict.fromkeys(join.blocks, join))
    return joins


def _join_of(name: str, aliases: Mapping[Hashable, Hashable]) -> Join | None:
    axes = {
        d
        for key, target in aliases.items()
        for d in range(1, len(key))
        if key[d] != target[d]  # type: ignore[index]
    }
    if len(axes) != 1:
        return None
    (d,) = axes
    blocks = {
        key: ((target[0], key[d] - target[d]), target)  # type: ignore[index]
        for key, target in aliases.items()
    }
    parts = tuple(sorted({part for part, _ in blocks.values()}, key=lambda p: p[1]))
    if len(parts) < 2:
        return None
    return Join(name, d - 1, parts, blocks)


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
                if _block_key(target):
                    at[part].append((tuple(target[1:]), blk.region))
            fulls: list[Full] = []
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
        return self.interp.b.concat(fulls, join.axis), boxes, starts

    @staticmethod
    def _contiguous(join: Join) -> bool:
        """Whether each part's blocks follow the previous part's along the axis, with none
        left out between them (culling may drop blocks only outside the parts' span)."""
        d = join.axis + 1
        spans: dict[Part, set[int]] = defaultdict(set)
        for key, (part, _) in join.blocks.items():
            spans[part].add(key[d])  # type: ignore[index]
        expected = None
        for part in join.parts:
            idx = sorted(spans[part])
            if idx != list(range(idx[0], idx[-1] + 1)):
                return False
            if expected is not None and idx[0] != expected:
                return False
            expected = idx[-1] + 1
        return True
