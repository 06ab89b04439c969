"""Dask's reduction steps read as one engine reduction: each chunk, combine and aggregate
step of sum, prod, min, max, any, all, mean, var, their NaN-skipping forms and the
arg-reductions gives the reduction of a region (`Red`), or that of a step's state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chunkfuse.common.ir import ARG_REDUCTIONS
from chunkfuse.common.symbols import NotNative

from .steps import Steps
from .symbols import (
    Blk,
    Red,
    bounding,
    flat_items,
    grid_items,
    in_grid_order,
    is_hashable,
    with_values,
)

#: Functions of a reduction's chunk, combine and aggregate steps, by the reduction they compute
#: (Dask's own chunk functions join on first use, see `dask_steps`).
REDUCERS: dict[Any, str] = {
    np.sum: "sum",
    np.prod: "prod",
    np.min: "min",
    np.max: "max",
    np.amin: "min",
    np.amax: "max",
    np.any: "any",
    np.all: "all",
    np.nansum: "nansum",
    np.nanprod: "nanprod",
}

#: A combine or aggregate step of Dask's reduction `kind` (chunk step, the function combining
#: its results) that gives another reduction: nansum's partial sums are added by `np.sum`,
#: nanprod's multiplied by `np.prod`.
COMBINED_AS = {("nansum", "sum"): "nansum", ("nanprod", "prod"): "nanprod"}


@dataclass(frozen=True)
class DaskSteps:
    """Dask's own reduction step functions, looked up by identity (imported on first use)."""

    #: `mean_chunk`, `mean_combine`, `mean_agg` → "chunk", "combine", "agg".
    mean: dict[Any, str]
    #: `moment_chunk`, `moment_combine`, `moment_agg` (var and std) → the step.
    moment: dict[Any, str]
    #: `arg_combine`, `arg_agg`, `nanarg_agg` → the step (`arg_chunk` is `arg_chunk`).
    arg: dict[Any, str]
    arg_chunk: Any
    #: `chunk.argmin`/`chunk.argmax` and Dask's NaN-skipping `_nanargmin`/`_nanargmax` → the
    #: reduction, with the value function paired with it.
    argfuncs: dict[Any, tuple[str, Any]]
    #: Counting functions of mean and var: `numel`, `nannumel`.
    numel: Any
    nannumel: Any
    #: std's square root of the variance.
    sqrt: Any
    #: The function behind Dask's zeros, ones and full blocks (`_broadcast_trick_inner`).
    broadcast_fill: Any


@functools.cache
def _natural_dtype(statistic: Any, dtype: np.dtype) -> np.dtype:
    """The dtype numpy's `statistic` (mean, var) gives over values of `dtype`."""
    return np.dtype(statistic(np.ones(1, dtype=dtype)).dtype)


@functools.cache
def dask_steps() -> DaskSteps:
    """Dask's reduction steps; registers its own min/max/nanmin/nanmax chunk functions."""
    from dask.array import chunk, wrap
    from dask.array import reductions as r

    REDUCERS[r.chunk_max] = "max"
    REDUCERS[r.chunk_min] = "min"
    REDUCERS[r._nanmin_skip] = "nanmin"
    REDUCERS[r._nanmax_skip] = "nanmax"
    return DaskSteps(
        mean={r.mean_chunk: "chunk", r.mean_combine: "combine", r.mean_agg: "agg"},
        moment={r.moment_chunk: "chunk", r.moment_combine: "combine", r.moment_agg: "agg"},
        arg={r.arg_combine: "combine", r.arg_agg: "agg", r.nanarg_agg: "agg"},
        arg_chunk=r.arg_chunk,
        argfuncs={
            chunk.argmin: ("argmin", chunk.min),
            chunk.argmax: ("argmax", chunk.max),
            r._nanargmin: ("nanargmin", chunk.nanmin),
            r._nanargmax: ("nanargmax", chunk.nanmax),
        },
        numel=r.numel,
        nannumel=r.nannumel,
        sqrt=r._sqrt,
        broadcast_fill=wrap._broadcast_trick_inner.func,
    )


def _nested_map(v: Any, f: Any) -> Any:
    """`v`'s nesting of lists and tuples with `f` of every item."""
    if isinstance(v, list | tuple):
        return [_nested_map(x, f) for x in v]
    return f(v)


def _depth(v: Any) -> int:
    """How deep lists and tuples nest in `v` (along its first items)."""
    depth = 0
    while isinstance(v, list | tuple) and v:
        depth += 1
        v = v[0]
    return depth


#: Reductions that fail on a lane of their input (numpy's "all-NaN slice encountered").
LANE_FAILING = frozenset({"nanargmin", "nanargmax"})


class ReductionSteps(Steps):
    """The Interpreter's reading of Dask's reduction steps, each into a `Red`, and a `Red`'s
    values as IR (`reduced`)."""

    def reduced(self, r: Red) -> Blk:
        """A reduction's values as the block of the whole reduction's result it is. One over
        part of the reduced axes (of a slice such as `x[3:9].sum(axis=0)`, or a tree
        reduction's partial step) reduces that part of its base."""
        if r.state:
            raise NotNative("a reduction step's state")
        if r.origin is not None:
            raise NotNative("an arg reduction whose indices count from elsewhere")
        # Kept axes are sliced after reducing the whole base (one reduction serves every
        # slice of it), except for reductions that fail on a lane (a NaN-skipping arg
        # reduction's all-NaN lane): a lane outside the slice must not fail it.
        sliced = [
            (a, b) != (0, n) and (d in r.axes or r.kind in LANE_FAILING)
            for d, ((a, b), n) in enumerate(zip(r.region, r.base.shape, strict=True))
        ]
        if any(sliced):
            part = [
                [a, b, 1] if cut else None for (a, b), cut in zip(r.region, sliced, strict=True)
            ]
            key = ("slice", r.base.root, repr(part))
            if key not in self._memo:
                shape = tuple(
                    n if p is None else p[1] - p[0] for p, n in zip(part, r.base.shape, strict=True)
                )
                self._memo[key] = self.b.slice(r.base, part, shape)
            region = tuple(
                (0, b - a) if cut else (a, b) for (a, b), cut in zip(r.region, sliced, strict=True)
            )
            r = replace(r, base=self._memo[key], region=region)
        p = r.partial()
        key = ("reduce", *r.spec())
        if key not in self._memo:
            self._memo[key] = self.b.reduce(p, p.shape, self.b.reduce_dtype(p))
        if not r.keepdims:
            self._squeezed[self._memo[key].root] = r
        kept = tuple(
            (0, 1) if d in r.axes else span
            for d, span in enumerate(r.region)
            if r.keepdims or d not in r.axes
        )
        return Blk(self._memo[key], kept)

    def _chunk_reduce(self, kind: str, args: list[Any], kw: dict[str, Any]) -> Red:
        """A reduction's chunk step: `kind` of one block, reduced axes kept."""
        if (
            len(args) != 1
            or not isinstance(args[0], Blk)
            or set(kw) - {"axis", "keepdims", "dtype"}
        ):
            raise NotNative("reduction chunk of something else")
        x = args[0]
        axes = self._axes(kw.get("axis"), len(x.full.shape))
        dtype = kw.get("dtype")
        return Red(
            kind,
            x.full,
            axes,
            x.region,
            bool(kw.get("keepdims", False)),
            np.dtype(dtype) if dtype is not None else None,
        )

    def _parts(self, parts: Any, kind: str, state: bool) -> Red:
        """The chunk or combine results a combine step joins as one, after checking they are
        all steps of one reduction of `kind` (states when `state`), reduced axes kept. Steps of
        the same reduction of different arrays (the blocks of a `da.stack`, or of a
        concatenation Dask inlined) reduce those arrays joined as their blocks lie."""
        reds = with_values(flat_items(parts))
        if not reds or not all(isinstance(r, Red) for r in reds):
            raise NotNative("combine of something else")
        first = reds[0]
        if first.kind != kind or first.state != state or not first.keepdims:
            raise NotNative(f"{kind} combine of another reduction")
        same = all(r.spec() == first.spec() and r.state == first.state for r in reds)
        # Parts nested along every axis must lie in their grid's order (a take may reorder).
        ordered = _depth(parts) != len(first.region) or in_grid_order(
            [(k, r.region) for k, r in grid_items(parts) if isinstance(r, Red)]
        )
        if same and ordered and all(r.origin is None for r in reds):
            try:
                return replace(first, region=bounding([r.region for r in reds]))
            except NotNative:
                pass  # blocks of one array that lie apart in it: joined as below
        rest = first.spec()[:1] + first.spec()[2:]
        if any(r.spec()[:1] + r.spec()[2:] != rest or r.state != state for r in reds):
            raise NotNative("combine of different reductions")
        if any(isinstance(r, Red) and not r.keepdims for r in flat_items(parts)):
            raise NotNative("combine of reductions without their axes")
        inputs = _nested_map(parts, lambda r: Blk(r.base, r.region))
        # Steps nest their parts along every axis, or (arg reductions) list them along the
        # reduced axis only.
        depth = _depth(parts)
        if depth == len(first.region):
            joined = self._tiled(inputs, 0)
        elif depth == 1 and len(first.axes) == 1:
            joined = self._tiled(inputs, first.axes[0])
        else:
            raise NotNative("combine of parts nested otherwise")
        # Where Dask counts the joined region from along the reduced axis (arg reductions).
        d = first.axes[0] if len(first.axes) == 1 and first.kind in ARG_REDUCTIONS else None
        origin = None
        if d is not None:
            origin = min(r.region[d][0] if r.origin is None else r.origin for r in reds)
            if origin == 0 and joined.region[d][0] != 0:
                # Dask counts from the joined box's start: the box as an array of its own.
                joined = Blk(self._region_of(joined), tuple((0, b - a) for a, b in joined.region))
            if origin == joined.region[d][0]:
                origin = None
        return replace(first, base=joined.full, region=joined.region, origin=origin)

    def _combine(self, combiner: str, kw: dict[str, Any], parts: Any) -> Red:
        """A combine or aggregate step that reduces the joined chunk results again."""
        reds = flat_items(parts)
        first = reds[0] if reds else None
        if not isinstance(first, Red):
            raise NotNative("combine of something else")
        kind = COMBINED_AS.get((first.kind, combiner), combiner)
        joined = self._parts(parts, kind, False)
        if self._axes(kw.get("axis"), len(joined.base.shape)) != joined.axes:
            raise NotNative("combine over other axes")
        if set(kw) - {"axis", "keepdims", "dtype"}:
            raise NotNative("combine with options")
        return replace(joined, keepdims=bool(kw.get("keepdims", False)))

    def _mean(self, step: str, args: list[Any], kw: dict[str, Any]) -> Red:
        """Dask's mean and nanmean in three steps: per-block sums and counts, combined, then
        divided."""
        steps = dask_steps()
        counting = (kw.get("sum", np.sum), kw.get("numel", steps.numel))
        kinds = {(np.sum, steps.numel): "mean", (np.nansum, steps.nannumel): "nanmean"}
        kind = kinds.get(counting) if all(is_hashable(f) for f in counting) else None
        if step == "agg" and not {"sum", "numel"} & set(kw):
            # mean_agg divides the sums by the counts whichever mean made them.
            parts = flat_items(args[0]) if args else []
            kind = parts[0].kind if parts and isinstance(parts[0], Red) else None
        if len(args) != 1 or kind not in ("mean", "nanmean") or kw.get("computing_meta"):
            raise NotNative("mean steps with other functions")
        if set(kw) - {"sum", "numel", "dtype", "axis", "keepdims", "computing_meta"}:
            raise NotNative("mean with options")
        if step == "chunk":
            x = args[0]
            if not isinstance(x, Blk):
                raise NotNative("mean of something else")
            axes = self._axes(kw.get("axis"), len(x.full.shape))
            # Dask passes the result's dtype: only one other than numpy's default (such as
            # float64 for float32 values) goes to the engine, which then adds in it.
            natural = _natural_dtype(np.mean, x.full.dtype)
            dtype = np.dtype(kw.get("dtype") or natural)
            typed = None if dtype == natural else dtype
            return Red(kind, x.full, axes, x.region, True, typed, state=True)
        joined = self._parts(args[0], kind, True)
        if step == "combine":
            return joined
        return replace(joined, keepdims=bool(kw.get("keepdims", False)), state=False)

    def _moment(self, step: str, args: list[Any], kw: dict[str, Any]) -> Red:
        """Dask's var and nanvar (std and nanstd are their square roots) in three steps:
        per-block sums, counts and second moments, combined, then divided by the count less
        `ddof`."""
        steps = dask_steps()
        if len(args) != 1 or kw.get("order", 2) != 2 or kw.get("computing_meta"):
            raise NotNative("moments other than the variance")
        if kw.get("implicit_complex_dtype"):
            raise NotNative("var of complex values")
        options = {"order", "sum", "numel", "dtype", "axis", "keepdims", "ddof"}
        if set(kw) - options - {"computing_meta", "implicit_complex_dtype"}:
            raise NotNative("var with options")
        adder, counter = kw.get("sum", np.sum), kw.get("numel", steps.numel)
        if not is_hashable(adder) or not is_hashable(counter):
            raise NotNative("var steps with other functions")
        if step == "chunk":
            kinds = {(np.sum, steps.numel): "var", (np.nansum, steps.nannumel): "nanvar"}
            kind = kinds.get((adder, counter))
            x = args[0]
            if kind is None or not isinstance(x, Blk) or x.full.dtype.kind not in "iuf":
                raise NotNative("var of something else")
            axes = self._axes(kw.get("axis"), len(x.full.shape))
            # var(dtype=...) computes in that dtype: the values cast to it first.
            natural = _natural_dtype(np.var, x.full.dtype)
            dtype = np.dtype(kw.get("dtype") or natural)
            if dtype.kind != "f":
                raise NotNative("var in a dtype other than a float")
            base = x.full if dtype == natural else self._cast(x.full, dtype)
            return Red(kind, base, axes, x.region, True, None, state=True)
        parts = flat_items(args[0])
        kind = parts[0].kind if parts and isinstance(parts[0], Red) else None
        # nanvar's combine steps add with nansum; both aggregates add with sum.
        expected = np.nansum if kind == "nanvar" and step == "combine" else np.sum
        if kind not in ("var", "nanvar") or adder is not expected:
            raise NotNative("var steps with other functions")
        joined = self._parts(parts, kind, True)
        if step == "combine":
            return joined
        ddof = kw.get("ddof", 0)
        if not isinstance(ddof, int | float | np.integer | np.floating) or isinstance(ddof, bool):
            raise NotNative("var with a ddof that is not a number")
        count = np.prod([b - a for a, b in (joined.region[d] for d in joined.axes)])
        if kind == "var" and ddof > count:
            # numpy (and the engine) divide by zero there; Dask's own steps give NaN.
            raise NotNative("var with ddof above the count")
        if kind == "nanvar" and ddof > 1:
            # Where exactly ddof values are left Dask divides by zero; numpy (and the
            # engine) give NaN. With ddof 0 or 1 both give NaN wherever no freedom is left.
            raise NotNative("nanvar with ddof above 1")
        return replace(
            joined, keepdims=bool(kw.get("keepdims", False)), ddof=float(ddof), state=False
        )

    def _arg_chunk(self, bound: tuple[Any, ...], args: list[Any], kw: dict[str, Any]) -> Red:
        """argmin/argmax of one block (`arg_chunk(min, argmin, block, axis, offset)`): its
        values and indices along one axis, indices counted from the array's start."""
        steps = dask_steps()
        if len(bound) != 2 or len(args) != 3 or kw or not is_hashable(bound[1]):
            raise NotNative("arg reduction chunk of something else")
        value_fn, arg_fn = bound
        kind, paired = steps.argfuncs.get(arg_fn, (None, None))
        x, axis, offset = args
        if kind is None or value_fn is not paired or not isinstance(x, Blk):
            raise NotNative("arg reduction chunk of something else")
        rank = len(x.full.shape)
        axes = self._axes(axis, rank)
        expected: tuple[tuple[int, ...], tuple[int, ...]] | int
        if len(axes) == 1:
            # Dask's index of the block's start: along the axis, or (1-D) ravelled.
            start = x.region[axes[0]][0]
            expected = ((start,), x.full.shape) if rank == 1 else start
        elif axes == tuple(range(rank)):
            # Over every axis (`da.argmax(x)`): the block's start and the shape Dask ravels
            # indices in, which must be the whole array's.
            expected = (tuple(a for a, _ in x.region), x.full.shape)
        else:
            raise NotNative("arg reduction over several axes")
        try:
            at_start = bool(offset == expected)
        except (TypeError, ValueError):
            at_start = False
        if at_start:
            return Red(kind, x.full, axes, x.region, True, None, state=True)
        if len(axes) == rank:
            return self._arg_chunk_of_box(kind, x, axes, offset)
        if not isinstance(offset, int | np.integer):
            raise NotNative("arg reduction chunk at another offset")
        return Red(kind, x.full, axes, x.region, True, None, state=True, origin=int(offset))

    def _arg_chunk_of_box(self, kind: str, x: Blk, axes: tuple[int, ...], offset: Any) -> Red:
        """An arg reduction over every axis (of a 1-D array, its only one) of a box of the
        stored array (`da.argmax(x[2:9])`): Dask gives the block's start in the box and the
        box's shape, so the box is known and the reduction is of the box as an array of its
        own."""
        try:
            starts, box_shape = (tuple(int(v) for v in part) for part in offset)
        except (TypeError, ValueError):
            raise NotNative("arg reduction chunk at another offset") from None
        if len(starts) != len(axes) or len(box_shape) != len(axes):
            raise NotNative("arg reduction chunk at another offset")
        origin = tuple(a - s for (a, _), s in zip(x.region, starts, strict=True))
        box = tuple((o, o + n) for o, n in zip(origin, box_shape, strict=True))
        if any(o < 0 or e > n for (o, e), n in zip(box, x.full.shape, strict=True)):
            raise NotNative("arg reduction chunk at another offset")
        base = self._region_of(Blk(x.full, box))
        region = tuple((a - o, b - o) for (a, b), o in zip(x.region, origin, strict=True))
        return Red(kind, base, axes, region, True, None, state=True)

    def _arg_combine(
        self, step: str, bound: tuple[Any, ...], kw: dict[str, Any], parts: Any
    ) -> Red:
        """Dask's arg-reduction combine and aggregate steps (`arg_agg` gives the indices)."""
        steps = dask_steps()
        if len(bound) != 1 or not is_hashable(bound[0]) or bound[0] not in steps.argfuncs:
            raise NotNative("arg reduction combine of something else")
        if set(kw) - {"axis", "keepdims"}:
            raise NotNative("arg reduction combine with options")
        kind = steps.argfuncs[bound[0]][0]
        joined = self._parts(parts, kind, True)
        if self._axes(kw.get("axis"), len(joined.base.shape)) != joined.axes:
            raise NotNative("arg reduction combine over another axis")
        if step == "combine":
            return joined
        return replace(joined, keepdims=bool(kw.get("keepdims", False)), state=False)

    @staticmethod
    def _axes(axis: Any, rank: int) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(rank))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted(a % rank for a in axes))
