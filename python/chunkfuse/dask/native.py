"""Dask array tasks the engine runs: a symbolic pass over the graph, then one engine plan.

Each task is evaluated on *symbols* instead of data: a zarr getter gives the block of a stored
array, elementwise functions of blocks give blocks of a whole-array IR expression, a reduction's
chunk step and its combine/aggregate steps give the reduction of a region, a zarr store gives a
write. Keys whose values are symbols and that only symbolic tasks consume are never run. The
others that Python tasks (or the caller) need, the *roots*, are computed by one engine plan:
whole arrays written to uncompressed scratch arrays and read back block by block, writes straight
into their target arrays. Everything else runs its Python callable.
"""

from __future__ import annotations

import functools
import math
import operator
import tempfile
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import zarr
from dask._task_spec import Alias, DataNode, NestedContainer, Task, TaskRef, _execute_subgraph

import chunkfuse
from chunkfuse.cubed.ir import UFUNCS, IrBuilder
from chunkfuse.cubed.symbols import Const, Full, NotNative
from chunkfuse.decoding import apply_decoding, decoded_array_behind
from chunkfuse.selection import as_slice, even_runs
from chunkfuse.stored import wraps_stored_array
from chunkfuse.urls import zarr_array_url

from .direct import direct_reads, read_directly
from .joins import JoinBuilder, find_joins
from .reductions import REDUCERS, ReductionSteps, dask_steps
from .symbols import (
    Blk,
    Filled,
    Lit,
    Red,
    Region,
    Src,
    Store,
    Stored,
    Symbol,
    bounding,
    chunk_span,
    flat_items,
    grid_items,
    in_grid_order,
    is_hashable,
    nones,
    store_box,
    touching_groups,
    unwrap,
    with_values,
)

#: numpy's functions that fill a block with one value.
FILLS = (np.zeros_like, np.ones_like, np.full_like)

#: numpy.fft functions the engine's `fft` op computes.
FFTS = frozenset(
    f"{k}{suffix}" for k in ("fft", "ifft", "rfft", "irfft") for suffix in ("", "2", "n")
)


OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.sub: "subtract",
    operator.mul: "multiply",
    operator.truediv: "divide",
    operator.floordiv: "floor_divide",
    operator.mod: "remainder",
    operator.pow: "power",
    operator.neg: "negative",
    operator.abs: "abs",
    operator.eq: "equal",
    operator.ne: "not_equal",
    operator.lt: "less",
    operator.le: "less_equal",
    operator.gt: "greater",
    operator.ge: "greater_equal",
}


class Interpreter(ReductionSteps):
    """Evaluates tasks on symbols, building IR in one `IrBuilder` shared by the whole graph."""

    def __init__(self) -> None:
        self.b = IrBuilder()
        self._memo: dict[Any, Full] = {}
        #: Elementwise result dtypes, by function and operand kinds (see `_operand_kind`).
        self._typing: dict[Any, tuple[np.dtype, tuple[np.dtype | None, ...]]] = {}
        #: Whole-array results of elementwise steps whose blocks share one region, by
        #: `_elementwise_signature`: every block of such a step gives the same array.
        self._elementwise_seen: dict[Hashable, Full] = {}
        #: Reductions that dropped their axes, by the result's root (for `x[None, ...]`).
        self._squeezed: dict[str, Red] = {}
        #: Fused tasks that are not native as a whole, with the symbols of the inner steps
        #: the engine computes for them (see `native_prefix`).
        self.mixed: dict[Hashable, dict[Hashable, Any]] = {}
        #: The graph's concatenations (see `chunkfuse.dask.joins`).
        self.joins: JoinBuilder | None = None

    # -- nodes -----------------------------------------------------------------------------

    def node(self, node: Any, env: Mapping[Hashable, Any]) -> Any:
        """The symbol or literal a graph node stands for, given the values of its references."""
        kind = _NODE_KINDS.get(type(node))
        if kind is None:
            kind = _NODE_KINDS[type(node)] = _node_kind(node)
        if kind == "plain":
            return node
        if kind == "ref":
            if node.key not in env:
                raise NotNative(f"{node.key!r} has no symbol")
            return unlit(env[node.key])
        if kind == "task":
            return self.task(node, env)
        if kind == "alias":
            if node.target not in env:
                raise NotNative(f"{node.target!r} has no symbol")
            if self.joins is not None and node.key in self.joins.joins:
                return self.joins.block(node.key, env[node.target])
            return unlit(env[node.target])
        if kind == "data":
            return self.literal(node.value)
        if kind == "container":
            items = [self.node(a, env) for a in node.args]
            return items if node.klass is list else node.klass(items)
        return type(node)(self.node(a, env) for a in node)

    def literal(self, value: Any) -> Any:
        """A stored Zarr array (or one behind xarray's lazy wrappers) as a source."""
        if wraps_stored_array(value):
            arr, steps = decoded_array_behind(value)
            url = zarr_array_url(arr)
            if url is None:
                raise NotNative("a zarr array off local disk")
            return Src(arr, url, steps)
        return value

    def task(self, t: Task, env: Mapping[Hashable, Any]) -> Any:
        if t.func is _execute_subgraph:
            inner, outkey, inkeys, *deps = t.args
            # The subgraph's steps read only each other and its inputs (not a copy of `env`:
            # that would grow with the graph, once per fused task).
            local = {k: self.node(d, env) for k, d in zip(inkeys, deps, strict=True)}
            self._subgraph(inner, outkey, local)
            return local[outkey]
        args = [self.node(a, env) for a in t.args]
        kwargs = {k: self.node(v, env) for k, v in t.kwargs.items()}
        return self.apply(t.func, args, kwargs)

    def _subgraph(self, inner: Mapping[Hashable, Any], key: Hashable, env: dict[Any, Any]) -> None:
        stack = [key]
        while stack:
            k = stack[-1]
            if k in env:
                stack.pop()
                continue
            node = inner.get(k)
            if node is None:
                raise NotNative(f"{k!r} missing from a fused subgraph")
            missing = [d for d in node.dependencies if d not in env and d in inner]
            if missing:
                stack.extend(missing)
                continue
            env[k] = self.node(node, env)
            stack.pop()

    def native_prefix(self, t: Task, env: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """Of a fused task that is not native as a whole (Dask fuses xarray's `finalize` into
        the last step of a reduction): the symbols of its inner steps that the steps which
        are not native consume, to be computed by the engine and handed to the rest."""
        if t.func is not _execute_subgraph:
            return {}
        inner, _, inkeys, *deps = t.args
        if not isinstance(inner, Mapping):
            return {}
        local: dict[Hashable, Any] = {}
        for k, d in zip(inkeys, deps, strict=True):
            if isinstance(d, TaskRef) and d.key in env:
                local[k] = env[d.key]
            elif isinstance(d, DataNode):
                try:
                    local[k] = self.node(d, env)
                except NotNative:
                    continue  # the steps reading it run in Python
        done: dict[Hashable, Any] = {}
        python: set[Hashable] = set()
        for k in topological(inner):
            node = inner[k]
            if any(d in python or (d not in local and d not in inner) for d in node.dependencies):
                python.add(k)
                continue
            try:
                value = self.node(node, local)
            except Exception:  # noqa: BLE001 - the step runs in Python
                python.add(k)
                continue
            local[k] = value
            if isinstance(value, Blk | Red):
                done[k] = value
            else:
                python.add(k)
        needed = {d for k in python for d in inner[k].dependencies if d in done}
        return {k: done[k] for k in needed if _materializable(done[k], True)}

    # -- functions -------------------------------------------------------------------------

    def apply(self, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        hashable = is_hashable(func)
        handler = _direct_handlers().get(func) if hashable else None
        if handler is not None:
            return handler(self, args, kwargs)
        if getattr(func, "__module__", None) == "numpy.fft" and func.__name__ in FFTS:
            return self._fft(func.__name__, args, kwargs)
        name = OPERATORS.get(func) if hashable else None
        if name is None and isinstance(func, np.ufunc):
            name = UFUNCS.get(func.__name__)
        if name is not None:
            if kwargs:
                raise NotNative("elementwise with keywords")
            return self._elementwise(func, name, args)
        return self._wrapped(func, args, kwargs)

    def _wrapped(self, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Dask's reduction steps, fills and casts: partials and compositions of its own
        functions."""
        from dask.array.reductions import _concatenate2
        from toolz.functoolz import Compose

        steps = dask_steps()
        base, bound, kw = unwrap(func)
        kw.update(kwargs)
        # Dask's zeros/ones/full blocks: partial(curry(_broadcast_trick_inner, zeros_like)).
        if getattr(base, "func", None) is steps.broadcast_fill and not bound:
            like = (getattr(base, "args", ()) or (None,))[0]
            if is_hashable(like) and like in FILLS:
                return self._filled(like, args, kw)
        if is_hashable(base) and not isinstance(func, Compose):
            if base in REDUCERS and not bound:
                return self._chunk_reduce(REDUCERS[base], args, kw)
            if base in steps.mean and not bound:
                return self._mean(steps.mean[base], args, kw)
            if base in steps.moment and not bound:
                return self._moment(steps.moment[base], args, kw)
            if base is steps.arg_chunk:
                return self._arg_chunk(bound, args, kw)
            if base is steps.sqrt and len(args) == 1 and not bound and not kw:
                # std: Dask's `safe_sqrt` of the variance.
                return self._elementwise(np.sqrt, "sqrt", args)
        if isinstance(func, Compose) and len(func.funcs) == 1 and len(args) == 1:
            inner, outer = unwrap(func.first), unwrap(func.funcs[0])
            if inner[0] is _concatenate2 and is_hashable(outer[0]):
                ofunc, obound, okw = outer
                if ofunc in REDUCERS and not obound:
                    return self._combine(REDUCERS[ofunc], okw, args[0])
                if ofunc in steps.arg:
                    return self._arg_combine(steps.arg[ofunc], obound, okw, args[0])
        if getattr(func, "__name__", "") == "_identity_cast":
            return list(args)
        raise NotNative(f"{getattr(func, '__name__', func)!r} has no native form")

    def _whole(self, parts: Any) -> Blk | Red:
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

    def _filled(self, like: Any, args: list[Any], kwargs: dict[str, Any]) -> Filled:
        """numpy's `zeros_like`, `ones_like` or `full_like` of a block, or Dask's zeros, ones
        and full blocks (`_broadcast_trick_inner(zeros_like)(shape)`, as xarray's nansum uses
        for the zeros it puts where values are NaN)."""
        kwargs = dict(kwargs)
        if like is np.full_like:
            if len(args) == 2:
                args, kwargs["fill_value"] = args[:1], args[1]
            value = kwargs.pop("fill_value", None)
        else:
            value = 0 if like is np.zeros_like else 1
        if len(args) != 1 or set(kwargs) - {"dtype", "order", "meta"}:
            raise NotNative("a filled block with options")
        (x,) = args
        if isinstance(x, Red):
            x = self.reduced(x)
        if isinstance(x, Blk):
            shape = tuple(b - a for a, b in x.region)
            dtype = np.dtype(kwargs.get("dtype") or x.full.dtype)
        elif isinstance(x, tuple) and all(isinstance(n, int) for n in x):
            shape, dtype = x, np.dtype(kwargs.get("dtype") or "f8")
        else:
            raise NotNative("a filled block of something else")
        if not isinstance(value, int | float | bool | np.number | np.bool_):
            raise NotNative("a filled block of a value that is not a number")
        return Filled(np.asarray(value).astype(dtype)[()], shape)

    def _enforced(self, args: list[Any], kwargs: dict[str, Any]) -> Blk:
        """Dask's `_enforce_dtype`: a block function's result cast to the dtype Dask inferred."""
        kwargs = dict(kwargs)
        dtype = kwargs.pop("enforce_dtype", None)
        inner = kwargs.pop("enforce_dtype_function", None)
        if dtype is None or inner is None:
            raise NotNative("_enforce_dtype without its function")
        value = self.apply(inner, args, kwargs)
        if isinstance(value, Red):
            value = self.reduced(value)
        if not isinstance(value, Blk):
            raise NotNative("_enforce_dtype of something else")
        dtype = np.dtype(dtype)
        if dtype.kind == "O" or dtype == value.full.dtype:
            return value
        if not np.can_cast(value.full.dtype, dtype, casting="same_kind"):
            raise NotNative("_enforce_dtype that Dask would refuse")
        return Blk(self._cast(value.full, dtype), value.region)

    def _fft(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Blk:
        """numpy.fft's `name` of a block whose transformed axes are whole (Dask's `da.fft`)."""
        from chunkfuse.fft_block import FftBlock, result_dtype

        nd = name.endswith(("2", "n"))
        kind = name[:-1] if nd else name
        params = ("s", "axes", "norm") if nd else ("n", "axis", "norm")
        if not args or set(kwargs) - set(params) or len(args) > 4:
            raise NotNative("fft with other arguments")
        x = args[0]
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("fft of something else")
        given = dict(zip(params, args[1:], strict=False)) | kwargs
        rank = len(x.full.shape)
        if nd:
            default = (-2, -1) if name.endswith("2") else tuple(range(rank))
            axes = tuple(a % rank for a in (given.get("axes") or default))
        else:
            axes = (given.get("axis", -1) % rank,)
        sizes = given.get("s") if nd else (given.get("n"),)
        shape = list(x.full.shape)
        if any(x.region[a] != (0, shape[a]) for a in axes):
            raise NotNative("fft along a split axis")
        lengths = []
        for i, a in enumerate(axes):
            n = sizes[i] if sizes is not None and sizes[i] is not None else None
            last = i == len(axes) - 1
            if n is None:
                n = 2 * (shape[a] - 1) if kind == "irfft" and last else shape[a]
            lengths.append(int(n))
            shape[a] = n // 2 + 1 if kind == "rfft" and last else n
        block = FftBlock(kind, nd, axes, tuple(lengths), given.get("norm") or "backward")
        dtype = result_dtype(kind, x.full.dtype)
        key = ("fft", x.full.root, kind, nd, axes, tuple(lengths), block.norm)
        if key not in self._memo:
            self._memo[key] = self.b.fft(x.full, block, tuple(shape), dtype)
        region = tuple((0, shape[d]) if d in axes else r for d, r in enumerate(x.region))
        return Blk(self._memo[key], region)

    def _getitem(self, x: Any, index: Any) -> Blk:
        """Basic indexing of a block: a box of it (Dask's rechunk splits), or integers and
        steps (`x[5]`, `x[:, 3]`, `x[::2]`, `x[::-1]`)."""
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("getitem of something else")
        return self._select(x, index)

    def _rounded(self, x: Any, decimals: int) -> Blk:
        """`np.round(x, decimals)` of a float block as numpy computes it: scaled by
        `10 ** decimals` (divided for negative decimals), rounded half to even, scaled back,
        each step in the block's dtype."""
        if not isinstance(x, Blk) or x.full.dtype.kind != "f":
            raise NotNative("round of something other than floats")
        if decimals == 0:
            return self._elementwise(np.rint, "rint", [x])
        scale = 10.0 ** abs(decimals)
        up, down = (np.multiply, "multiply"), (np.true_divide, "divide")
        there, back = (up, down) if decimals > 0 else (down, up)
        scaled = self._elementwise(*there, [x, scale])
        rounded = self._elementwise(np.rint, "rint", [scaled])
        return self._elementwise(*back, [rounded, scale])

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

    def _join(self, parts: Any, shape: Any) -> Blk:
        """Blocks joined into the box they tile (Dask's rechunk merges): of one array, or of
        several through IR concats."""
        from dask.array.core import reshapelist

        if not isinstance(parts, list | tuple) or not isinstance(shape, tuple | list):
            raise NotNative("concatenation of something else")
        return self._joined(reshapelist(tuple(shape), list(parts)))

    def _getter(self, args: list[Any], kwargs: dict[str, Any]) -> Blk:
        if len(args) != 2 or not isinstance(args[0], Src) or kwargs.get("lock"):
            raise NotNative("getter of something else")
        src, index = args
        arr = src.array
        shape = tuple(arr.shape)
        key = ("source", src.url, src.steps)
        if key not in self._memo:
            full = self.b.source(src.url, shape, arr.dtype)
            self._memo[key] = apply_decoding(self.b, full, src.steps)
        return self._select(Blk(self._memo[key], tuple((0, n) for n in shape)), index)

    def _store(self, args: list[Any], kwargs: dict[str, Any]) -> Store:
        names = ("x", "out", "index", "region", "lock", "return_stored", "load_stored")
        given = dict(zip(names, args, strict=False)) | kwargs
        x, out, index = given.get("x"), given.get("out"), given.get("index")
        if given.get("return_stored"):
            raise NotNative("store returning what it stored")
        if isinstance(out, Src):
            out = out.array
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk) or not isinstance(out, zarr.Array):
            raise NotNative("store of something else")
        url = zarr_array_url(out)
        if url is None:
            raise NotNative("store into an array off local disk")
        shape = tuple(out.shape)
        box = store_box(index, given.get("region"), shape)
        if [b - a for a, b in box] != [b - a for a, b in x.region]:
            raise NotNative("store of a block into a box of another shape")
        full = x.full
        if np.dtype(out.dtype) != full.dtype:
            full = self._cast(full, np.dtype(out.dtype))
        chunks = tuple(out.shards if out.shards is not None else out.chunks)
        return Store(full, x.region, url, shape, box, chunks)

    def stored_array(self, parts: list[Store]) -> tuple[Region, Blk]:
        """The box of their target that the stores into one array tile, and the values they
        write there as one block of the box's shape: one array's blocks written where they
        lie relative to each other, or the blocks joined as their boxes lie (blocks of
        several arrays: a `da.concatenate` rechunked before writing). NotNative when the
        boxes overlap, leave holes or do not form a grid."""
        first = parts[0]
        rank = len(first.shape)
        starts = [sorted({p.box[d][0] for p in parts}) for d in range(rank)]
        box = tuple((starts[d][0], max(p.box[d][1] for p in parts)) for d in range(rank))
        grid: dict[tuple[int, ...], Store] = {}
        for p in parts:
            at = tuple(starts[d].index(p.box[d][0]) for d in range(rank))
            for d, k in enumerate(at):
                end = starts[d][k + 1] if k + 1 < len(starts[d]) else box[d][1]
                if p.box[d][1] != end:
                    raise NotNative("stores that do not tile a box of their target")
            if grid.setdefault(at, p) is not p:
                raise NotNative("stores that overlap")
        counts = [len(s) for s in starts]
        if len(grid) != math.prod(counts):
            raise NotNative("stores that do not tile a box of their target")
        # One array's values, each written at the same offset from where it lies.
        shifts = {tuple(r[0] - b[0] for r, b in zip(p.region, p.box, strict=True)) for p in parts}
        if len(shifts) == 1 and all(p.full == first.full for p in parts):
            (shift,) = shifts
            region = tuple((a + o, b + o) for (a, b), o in zip(box, shift, strict=True))
            return box, Blk(first.full, region)

        def nest(prefix: tuple[int, ...]) -> Any:
            if len(prefix) == len(counts):
                p = grid[prefix]
                return Blk(p.full, p.region)
            return [nest((*prefix, i)) for i in range(counts[len(prefix)])]

        return box, self._tiled(nest(()), 0)

    def stored_boxes(self, parts: list[Store]) -> list[tuple[Region, Blk]]:
        """The boxes of their target that the stores into one array fill, each with the
        values written there (see `stored_array`): the one box they tile, or else boxes
        apart, each tiled by the stores that touch it, no two reaching into one stored
        chunk (each chunk has one writer). NotNative when the stores fill no such boxes."""
        try:
            return [self.stored_array(parts)]
        except NotNative:
            groups = touching_groups([p.box for p in parts])
            if len(groups) == 1:
                raise
        boxes = [self.stored_array([parts[i] for i in g]) for g in groups]
        spans = [chunk_span(box, parts[0].chunks) for box, _ in boxes]
        for i, a in enumerate(spans):
            for b in spans[:i]:
                if all(
                    lo1 <= hi2 and lo2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b, strict=True)
                ):
                    raise NotNative("stores into boxes apart that share a stored chunk")
        return boxes

    def _cast(self, full: Full, dtype: np.dtype) -> Full:
        key = ("astype", full.root, dtype.str)
        if key not in self._memo:
            self._memo[key] = self.b.astype(full, dtype)
        return self._memo[key]

    def reduced(self, r: Red) -> Blk:
        """A reduction's values as the block of the whole reduction's result it is. One over
        part of the reduced axes (of a slice such as `x[3:9].sum(axis=0)`, or a tree
        reduction's partial step) reduces that part of its base."""
        if r.state:
            raise NotNative("a reduction step's state")
        if r.origin is not None:
            raise NotNative("an arg reduction whose indices count from elsewhere")
        if not r.complete():
            part = [
                [a, b, 1] if d in r.axes and (a, b) != (0, n) else None
                for d, ((a, b), n) in enumerate(zip(r.region, r.base.shape, strict=True))
            ]
            key = ("slice", r.base.root, repr(part))
            if key not in self._memo:
                shape = tuple(
                    n if p is None else p[1] - p[0] for p, n in zip(part, r.base.shape, strict=True)
                )
                self._memo[key] = self.b.slice(r.base, part, shape)
            region = tuple(
                (0, b - a) if d in r.axes else (a, b) for d, (a, b) in enumerate(r.region)
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

    def _elementwise(self, func: Any, name: str, args: list[Any]) -> Blk:
        sig = _elementwise_signature(func, args)
        if sig is not None:
            full = self._elementwise_seen.get(sig)
            region = _shared_region(args) if full is not None else None
            if region is not None:
                return Blk(full, region)
        args = [self.reduced(a) if isinstance(a, Red) else a for a in args]
        blocks = [a for a in args if isinstance(a, Blk)]
        if not blocks:
            raise NotNative("elementwise of constants")
        shapes = {b.full.shape for b in blocks}
        if len(shapes) == 1:
            (shape,) = shapes
        else:
            try:
                shape = tuple(np.broadcast_shapes(*shapes))
            except ValueError as e:
                raise NotNative("elementwise of shapes that do not broadcast") from e
        widest = [b for b in blocks if b.full.shape == shape]
        if not widest:
            raise NotNative("elementwise that broadcasts every operand")
        region = widest[0].region
        for b in blocks:
            if b.region == region and b.full.shape == shape:
                continue
            # Each operand's block must be the part of it that broadcasts onto `region`.
            lead = len(shape) - len(b.full.shape)
            want = tuple(
                (0, 1) if n == 1 and shape[lead + d] != 1 else region[lead + d]
                for d, n in enumerate(b.full.shape)
            )
            if b.region != want:
                raise NotNative("elementwise of blocks of different places")
        kinds = tuple(_operand_kind(a) for a in args)
        typing = self._typing.get((func, kinds))
        if typing is None:
            typing = self._typing[(func, kinds)] = _result_types(func, args, blocks)
        dtype, weak = typing
        block = tuple(b - a for a, b in region)
        operands: list[Full | Const] = []
        for a, weak_dtype in zip(args, weak, strict=True):
            if isinstance(a, Blk):
                operands.append(a.full)
            elif isinstance(a, Filled):
                # A filled block is a constant, once it is seen to fill no more than the block.
                try:
                    fits = np.broadcast_shapes(a.shape, block) == block
                except ValueError:
                    fits = False
                if not fits:
                    raise NotNative("elementwise of a filled block of another shape")
                operands.append(Const(a.value, a.value.dtype))
            elif weak_dtype is not None:
                operands.append(Const(a, weak_dtype))
            else:
                operands.append(Const(a, a.dtype))
        key = (
            name,
            tuple(o.root if isinstance(o, Full) else ("c", repr(o.value)) for o in operands),
            dtype.str,
        )
        if key not in self._memo:
            self._memo[key] = self.b.elementwise(name, operands, shape, dtype)
        if sig is not None and len(shapes) == 1 and all(b.region == region for b in blocks):
            self._elementwise_seen[sig] = self._memo[key]
        return Blk(self._memo[key], region)


#: Python and numpy scalar types, which `_elementwise_signature` keys by type and value.
_SCALARS = (bool, int, float, complex, np.number, np.bool_)


def _elementwise_signature(func: Any, args: list[Any]) -> Hashable | None:
    """What decides an elementwise step's whole-array result when its blocks share one
    region: the function, each block's array and each scalar's type and value; None when an
    operand is anything else (reductions, filled blocks) or the function is not hashable."""
    parts: list[Hashable] = []
    for a in args:
        if type(a) is Blk:
            parts.append(a.full.root)
        elif isinstance(a, _SCALARS):
            # The repr too: -0.0 == 0.0, but x + -0.0 keeps x's negative zeros.
            parts.append((type(a), a, repr(a)))
        else:
            return None
    return (func, tuple(parts)) if is_hashable(func) else None


def _shared_region(args: list[Any]) -> Region | None:
    """The region every block among `args` covers, when they all cover the same one."""
    region = None
    for a in args:
        if type(a) is Blk:
            if region is None:
                region = a.region
            elif a.region != region:
                return None
    return region


def _operand_kind(a: Any) -> Hashable:
    """What decides an elementwise operand's part in the result's dtype: a block's or a
    numpy scalar's dtype, or a Python scalar's type and value (NEP 50: it is weak)."""
    if isinstance(a, Blk):
        return a.full.dtype
    if isinstance(a, Filled):
        return ("filled", a.value.dtype)
    if isinstance(a, np.number | np.bool_):
        return ("scalar", a.dtype)
    if isinstance(a, bool | int | float | complex):
        return ("weak", type(a), a)
    raise NotNative(f"elementwise operand {type(a).__name__}")


def _result_types(
    func: Any, args: list[Any], blocks: list[Blk]
) -> tuple[np.dtype, tuple[np.dtype | None, ...]]:
    """numpy's dtype of `func` over `args` (probed on one value of each), and the dtype each
    Python scalar takes (the arrays' type, as in numpy; None for other operands)."""
    probes: list[Any] = []
    weak: list[np.dtype | None] = []
    for a in args:
        if isinstance(a, Blk):
            probes.append(np.ones(1, dtype=a.full.dtype))
        elif isinstance(a, Filled):
            probes.append(np.ones(1, dtype=a.value.dtype))
        else:
            probes.append(a)
        is_weak = not isinstance(a, Blk | Filled | np.number | np.bool_)
        weak.append(np.result_type(*(b.full.dtype for b in blocks), a) if is_weak else None)
    with np.errstate(all="ignore"):
        dtype = np.asarray(func(*probes)).dtype
    return dtype, tuple(weak)


#: What a step's function gets: the interpreter, the step's arguments and keywords.
Handler = Callable[[Interpreter, list[Any], dict[str, Any]], Any]


def _when(ok: Callable[[list[Any], dict[str, Any]], bool], run: Handler, what: str) -> Handler:
    """`run`, for the steps whose arguments `ok` accepts; NotNative naming `what` for others."""

    def handler(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not ok(args, kwargs):
            raise NotNative(f"{what} with other arguments")
        return run(interp, args, kwargs)

    return handler


def _astype(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Blk:
    (x,) = args
    if not isinstance(x, Blk) or set(kwargs) - {"astype_dtype", "casting", "copy"}:
        raise NotNative("astype with options")
    return Blk(interp._cast(x.full, np.dtype(kwargs["astype_dtype"])), x.region)


def _clip(interp: Interpreter, args: list[Any], kwargs: dict[str, Any]) -> Blk:
    # Dask's clip: a missing bound is a one-sided maximum or minimum.
    x, lo, hi = args
    if lo is None and hi is not None:
        return interp._elementwise(np.minimum, "minimum", [x, hi])
    if hi is None and lo is not None:
        return interp._elementwise(np.maximum, "maximum", [x, lo])
    return interp._elementwise(np.clip, "clip", args)


@functools.cache
def _direct_handlers() -> dict[Any, Handler]:
    """The functions recognised by identity, each with its handler (looked up once per step,
    so that many small blocks do not pay a chain of comparisons each)."""
    import dask.array._shuffle as shuffle
    import dask.array.chunk as chunk
    import dask.array.core as core

    def plain(n: int) -> Callable[[list[Any], dict[str, Any]], bool]:
        return lambda a, k: len(a) == n and not k

    handlers: dict[Any, Handler] = {
        core.getter: lambda i, a, k: i._getter(a, k),
        core.getter_nofancy: lambda i, a, k: i._getter(a, k),
        core.getter_inline: lambda i, a, k: i._getter(a, k),
        core._enforce_dtype: lambda i, a, k: i._enforced(a, k),
        core.load_store_chunk: lambda i, a, k: i._store(a, k),
        core.finalize: _when(plain(1), lambda i, a, k: i._whole(a[0]), "finalize"),
        chunk.getitem: _when(plain(2), lambda i, a, k: i._getitem(*a), "getitem"),
        np.transpose: _when(
            lambda a, k: len(a) == 1 and set(k) <= {"axes"},
            lambda i, a, k: i._transposed(a[0], k.get("axes")),
            "transpose",
        ),
        shuffle._getitem: _when(plain(2), lambda i, a, k: i._taken(*a), "take"),
        shuffle.concatenate_arrays: _when(plain(3), lambda i, a, k: i._shuffled(*a), "take"),
        core.concatenate_shaped: _when(plain(2), lambda i, a, k: i._join(*a), "concatenate"),
        chunk.astype: _astype,
        # x != x holds exactly where x is NaN (never for integers), as isnan does.
        np.isnan: _when(
            plain(1),
            lambda i, a, k: i._elementwise(np.not_equal, "not_equal", [a[0], a[0]]),
            "isnan",
        ),
        np.where: _when(plain(3), lambda i, a, k: i._elementwise(np.where, "where", a), "where"),
        np.round: _when(
            lambda a, k: len(a) == 1 and set(k) <= {"decimals"},
            lambda i, a, k: i._rounded(a[0], int(k.get("decimals", 0))),
            "round",
        ),
        np.clip: _when(plain(3), _clip, "clip"),
    }
    for like in FILLS:
        handlers[like] = lambda i, a, k, like=like: i._filled(like, a, k)
    return handlers


@dataclass
class NativePart:
    """What the engine computed: values of the root keys, the keys it covered, and the
    blocks whose fused elementwise program ran on a GPU."""

    values: dict[Hashable, Any]
    covered: set[Hashable]
    gpu_blocks: int = 0
    #: Fused tasks whose native first steps the engine computed, rebuilt with their values.
    tasks: dict[Hashable, Any] = field(default_factory=dict)


def symbols_of(graph: Mapping[Hashable, Any], interp: Interpreter) -> dict[Hashable, Symbol]:
    """The symbol of every top-level key that has one, in dependency order (twice when a
    concatenation's blocks are only known as one array once all were met)."""
    joins = find_joins(graph)
    if joins:
        interp.joins = JoinBuilder(interp, joins)
    symbols = _symbols_once(graph, interp)
    if interp.joins is not None and interp.joins.rerun():
        interp.joins.again()
        interp.mixed.clear()
        symbols = _symbols_once(graph, interp)
    return symbols


def _symbols_once(graph: Mapping[Hashable, Any], interp: Interpreter) -> dict[Hashable, Symbol]:
    symbols: dict[Hashable, Any] = {}
    failed: set[Hashable] = set()
    for key in topological(graph):
        node = graph[key]
        if any(d in failed for d in node.dependencies):
            failed.add(key)
            continue
        try:
            value = interp.node(node, symbols)
        except Exception:  # noqa: BLE001 - anything unrecognised runs in Python, which
            # raises the task's own error with its key if the task itself fails.
            failed.add(key)
            if isinstance(node, Task):
                prefix = interp.native_prefix(node, symbols)
                if prefix:
                    interp.mixed[key] = prefix
            continue
        if isinstance(value, Src | Blk | Red | Store | Stored):
            symbols[key] = value
        elif isinstance(node, DataNode):
            symbols[key] = Lit(value)
        else:
            failed.add(key)
    return symbols


def _kept_region(r: Any) -> Region:
    """A reduction's region along the axes of its result (its base's kept axes, or all with
    keepdims): where its block lies in the result's grid."""
    if not isinstance(r, Red) or r.keepdims:
        return r.region
    return tuple(span for d, span in enumerate(r.region) if d not in r.axes)


#: How `Interpreter.node` reads a node of each type (see `_node_kind`), by type.
_NODE_KINDS: dict[type, str] = {}


def _node_kind(node: Any) -> str:
    """How `Interpreter.node` reads `node`: a reference, an alias, data, a container of
    nodes, a task, a list or tuple of nodes, or a plain value (itself)."""
    if isinstance(node, TaskRef):
        return "ref"
    if isinstance(node, Alias):
        return "alias"
    if isinstance(node, DataNode):
        return "data"
    if isinstance(node, NestedContainer):
        return "container"
    if isinstance(node, Task):
        return "task"
    if isinstance(node, list | tuple):
        return "sequence"
    return "plain"


def unlit(value: Any) -> Any:
    """A symbol as steps read it: a literal's value, any other symbol itself."""
    return value.value if isinstance(value, Lit) else value


def topological(graph: Mapping[Hashable, Any]) -> list[Hashable]:
    """The keys of a task-spec graph, each after its dependencies."""
    order: list[Hashable] = []
    state: dict[Hashable, int] = {}
    for start in graph:
        if start in state:
            continue
        stack: list[tuple[Hashable, bool]] = [(start, False)]
        while stack:
            key, done = stack.pop()
            if done:
                state[key] = 2
                order.append(key)
                continue
            if key in state:
                continue
            state[key] = 1
            stack.append((key, True))
            for d in graph[key].dependencies:
                if d in graph and d not in state:
                    stack.append((d, False))
    return order


def _materializable(sym: Symbol, wanted: bool) -> bool:
    """Whether the engine can give a root's value: a reduction's only when it is no step's
    state, and (so that Python reading each block's partial result does not make an engine
    reduction per block) only when it covers the reduced axes or is what the caller asked."""
    if isinstance(sym, Red):
        return not sym.state and (wanted or sym.complete())
    return True


def has_zarr_arrays(graph: Mapping[Hashable, Any]) -> bool:
    """True when the graph holds a zarr array, or xarray's lazy wrapper of one: as a node, as
    a direct argument of a task (legacy tuple or task form: Dask inlines stored arrays into
    their getters), or inside a fused task's subgraph. Keys and other nested arguments are not
    searched: this runs on every graph, and must stay cheap for many small Python tasks."""
    return any(_holds_stored_array(node) for node in graph.values())


#: Types that are never a stored array: the keys and literals of most task arguments.
_PLAIN = frozenset({int, float, str, bool, bytes, tuple, type(None)})


def _holds_stored_array(node: Any) -> bool:
    if type(node) is tuple:
        # A legacy task: the callable, then its arguments.
        args: Any = node[1:] if node and callable(node[0]) else ()
    elif isinstance(node, Task):
        if node.func is _execute_subgraph and node.args and isinstance(node.args[0], Mapping):
            return has_zarr_arrays(node.args[0])
        args = (*node.args, *node.kwargs.values())
    else:
        return wraps_stored_array(node.value if isinstance(node, DataNode) else node)
    for a in args:
        if type(a) not in _PLAIN and wraps_stored_array(a.value if isinstance(a, DataNode) else a):
            return True
    return False


def run_native(
    graph: Mapping[Hashable, Any],
    wanted: set[Hashable],
    *,
    max_mem: int | None,
    threads: int,
    device: str = "cpu",
    on_start: Callable[[set[Hashable]], None] | None = None,
) -> NativePart | None:
    """Computes the graph's native part with the engine (fused elementwise programs on
    `device`); None when nothing is native. `on_start` is called with the keys the engine
    covers just before it runs."""
    if not has_zarr_arrays(graph):
        return None
    interp = Interpreter()
    symbols = symbols_of(graph, interp)
    _demote_partial_stores(graph, symbols, interp)
    if not interp.mixed and not any(
        isinstance(s, Blk | Red | Store | Stored) for s in symbols.values()
    ):
        return None
    # A fused task with native first steps, rebuilt with their values (placeholders until
    # the engine has run): it no longer depends on what only those steps read.
    rebuilt = {
        k: _with_inner_values(graph[k], {i: None for i in p}) for k, p in interp.mixed.items()
    }
    dependents: dict[Hashable, set[Hashable]] = {k: set() for k in graph}
    for k, n in graph.items():
        for d in rebuilt.get(k, n).dependencies:
            if d in dependents:
                dependents[d].add(k)
    while True:
        roots = {
            k
            for k, s in symbols.items()
            if k in wanted or any(d not in symbols for d in dependents[k])
        }
        demote = {k for k in roots if not _materializable(symbols[k], k in wanted)}
        if not demote:
            break
        for k in demote:
            del symbols[k]
    roots = {k for k in roots if not isinstance(symbols[k], Src | Lit)}
    if not roots and not interp.mixed:
        return None
    todo: dict[Hashable, Any] = {k: symbols[k] for k in roots}
    for k, prefix in interp.mixed.items():
        todo.update({_InnerKey(k, i): sym for i, sym in prefix.items()})
    # Source arrays and literals stay in the graph (roots never are either): Python tasks
    # may read them.
    covered = {k for k, s in symbols.items() if not isinstance(s, Src | Lit)}
    if on_start is not None:
        on_start(covered)
    try:
        # Blocks of stored arrays only: read directly, with no plan run nor scratch array.
        reads = None if interp.mixed else direct_reads(todo, interp.b)
        if reads is not None:
            return NativePart(read_directly(reads, threads), covered)
        with tempfile.TemporaryDirectory(prefix="chunkfuse-dask-") as tmp:
            computed, gpu_blocks = _compute(interp, todo, tmp, max_mem, threads, device)
    except NotNative:
        raise
    except Exception as e:
        example = next(iter(sorted(roots, key=repr)), None)
        e.add_note(
            f"chunkfuse.dask: raised by the engine's run of {len(covered)} tasks"
            + (f" (among them the task with key {example!r})" if example is not None else "")
        )
        raise
    values = {k: v for k, v in computed.items() if not isinstance(k, _InnerKey)}
    tasks = {
        k: _with_inner_values(graph[k], {i: computed[_InnerKey(k, i)] for i in prefix})
        for k, prefix in interp.mixed.items()
    }
    return NativePart(values, covered, gpu_blocks, tasks)


def _stores_of(sym: Symbol) -> tuple[Store, ...]:
    """The writes a symbol stands for."""
    if isinstance(sym, Store):
        return (sym,)
    if isinstance(sym, Stored):
        return sym.stores
    return ()


def _demote_partial_stores(
    graph: Mapping[Hashable, Any], symbols: dict[Hashable, Symbol], interp: Interpreter
) -> None:
    """Takes out of `symbols` the stores into targets that the engine cannot write as one
    box (stores that overlap, leave holes or do not form a grid of boxes), and every symbol
    that reads one: those stores run Dask's `load_store_chunk` in Python. What they store is
    still computed by the engine (a fused store task keeps its native steps, as
    `native_prefix` finds them). Stores tiling a box of their target (xarray's `region=` and
    `append_dim` writes, `da.store(..., regions=...)`) stay: the engine writes the box."""
    by_url: dict[str, dict[Region, Store]] = {}
    doubled: set[str] = set()
    for sym in symbols.values():
        for st in _stores_of(sym):
            boxes = by_url.setdefault(st.url, {})
            if boxes.setdefault(st.box, st) != st:
                doubled.add(st.url)  # two stores into one box
    partial: set[str] = set(doubled)
    for url, boxes in by_url.items():
        try:
            interp.stored_boxes(list(boxes.values()))
        except NotNative:
            partial.add(url)
    if not partial:
        return
    demoted = {k for k, s in symbols.items() if any(st.url in partial for st in _stores_of(s))}
    dependents: dict[Hashable, list[Hashable]] = {}
    for k, node in graph.items():
        for d in node.dependencies:
            dependents.setdefault(d, []).append(k)
    stack = list(demoted)
    while stack:
        for d in dependents.get(stack.pop(), ()):
            if d in symbols and d not in demoted:
                demoted.add(d)
                stack.append(d)
    for k in demoted:
        del symbols[k]
    for k in demoted:
        node = graph[k]
        if isinstance(node, Task):
            prefix = interp.native_prefix(node, symbols)
            if prefix:
                interp.mixed[k] = prefix


@dataclass(frozen=True)
class _InnerKey:
    """The key of an inner step of fused task `task` among the engine's results."""

    task: Hashable
    inner: Hashable


def _with_inner_values(task: Task, values: dict[Hashable, Any]) -> Task:
    """Fused `task` with the inner steps in `values` replaced by their values, and without
    the dependencies that only those steps read.

    The subgraph's steps name its inputs by inner keys (Blockwise's ``__dask_blockwise__N``
    tokens), each bound to one of the task's outer arguments (a reference to another key, or
    data such as a store's target array); the rebuilt task keeps the pairs still read."""
    inner, outkey, inkeys, *deps = task.args
    replaced = {k: (DataNode(k, values[k]) if k in values else n) for k, n in inner.items()}
    # Only the steps the output still needs: a replaced step's own inputs drop out.
    nodes: dict[Hashable, Any] = {}
    stack = [outkey]
    while stack:
        k = stack.pop()
        if k in nodes or k not in replaced:
            continue
        nodes[k] = replaced[k]
        stack.extend(nodes[k].dependencies)
    read = {d for n in nodes.values() for d in n.dependencies if d not in nodes}
    pairs = [(k, d) for k, d in zip(inkeys, deps, strict=True) if k in read]
    return Task(
        task.key,
        _execute_subgraph,
        nodes,
        outkey,
        tuple(k for k, _ in pairs),
        *(d for _, d in pairs),
    )


def _compute(
    interp: Interpreter,
    roots: dict[Hashable, Symbol],
    tmp: str,
    max_mem: int | None,
    threads: int,
    device: str,
) -> tuple[dict[Hashable, Any], int]:
    b = interp.b
    # A reduction's value is a block of the reduction's whole result.
    roots = {k: interp.reduced(s) if isinstance(s, Red) else s for k, s in roots.items()}
    scratch: dict[str, tuple[Full, str]] = {}
    stores: dict[str, list[Store]] = {}
    for sym in roots.values():
        if isinstance(sym, Blk):
            scratch.setdefault(sym.full.root, (sym.full, ""))
        elif isinstance(sym, Store):
            stores.setdefault(sym.url, []).append(sym)
        elif isinstance(sym, Stored):
            for st in sym.stores:
                stores.setdefault(st.url, []).append(st)
    writes: list[tuple[Full, str, tuple[int, ...], dict[str, Any] | None, None]] = []
    for i, (root, (full, _)) in enumerate(sorted(scratch.items())):
        url = f"{tmp}/{i}.zarr"
        scratch[root] = (full, url)
        writes.append((full, url, _scratch_chunks(full), {"name": "none"}, None))
    # Where each write into part of its target starts (by the write's place in `writes`);
    # a target may take several writes, into boxes apart.
    regions: dict[int, list[int]] = {}
    for url, parts in stores.items():
        # Each target's stores tile a box of it (`_demote_partial_stores`).
        shape = parts[0].shape
        for box, values in interp.stored_boxes(list({p.box: p for p in parts}.values())):
            if box != tuple((0, n) for n in shape):
                regions[len(writes)] = [a for a, _ in box]
            writes.append((interp._region_of(values), url, shape, None, None))
    plan = b.plan("dask", writes)
    for op in plan["ops"]:
        i = _write_index(op)
        if i in regions:
            op["region"] = regions[i]
    summary = chunkfuse.run_plan(
        plan, max_mem=max_mem, threads=threads, work_dir=tmp, resume=False, device=device
    )
    values: dict[Hashable, Any] = {}
    opened: dict[str, Any] = {}

    def read(full: Full, region: Region) -> np.ndarray:
        url = scratch[full.root][1]
        arr = opened.get(url)
        if arr is None:
            arr = opened[url] = zarr.open_array(url, mode="r")
        return np.asarray(arr[tuple(slice(a, b2) for a, b2 in region)])

    for key, sym in roots.items():
        if isinstance(sym, Blk):
            values[key] = read(sym.full, sym.region)
        elif isinstance(sym, Stored):
            values[key] = sym.template
        else:
            values[key] = None
    return values, summary["gpu_blocks"]


def _write_index(op: dict[str, Any]) -> int | None:
    """The place in the builder's `writes` of the plan's write op `op` (`write.<i>`)."""
    if op.get("op") != "write":
        return None
    return int(str(op["id"]).rsplit(".", 1)[-1])


def _scratch_chunks(full: Full) -> tuple[int, ...]:
    """Chunks of a scratch array: about 16 MB, whole trailing axes first."""
    itemsize = full.dtype.itemsize
    budget = max(1, (16 << 20) // max(1, itemsize))
    chunks = []
    inner = 1
    for n in reversed(full.shape):
        n = max(1, n)
        take = max(1, min(n, budget // inner))
        chunks.append(take)
        inner *= take
    return tuple(reversed(chunks))
