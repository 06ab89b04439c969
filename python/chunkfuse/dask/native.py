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
import operator
import tempfile
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from dask._task_spec import Alias, DataNode, NestedContainer, Task, TaskRef, _execute_subgraph

import chunkfuse
from chunkfuse.cubed.ir import UFUNCS, IrBuilder
from chunkfuse.cubed.symbols import Const, Full, NotNative, Partial
from chunkfuse.urls import zarr_array_url

Region = tuple[tuple[int, int], ...]


#: numpy.fft functions the engine's `fft` op computes.
FFTS = frozenset(
    f"{k}{suffix}" for k in ("fft", "ifft", "rfft", "irfft") for suffix in ("", "2", "n")
)


@dataclass(frozen=True)
class Src:
    """A stored zarr array on local disk (the `DataNode` of `da.from_zarr`)."""

    array: Any
    url: str


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

    def complete(self) -> bool:
        return all(self.region[a] == (0, self.base.shape[a]) for a in self.axes)


@dataclass(frozen=True)
class Store:
    """`full` over `region` written into the zarr array at `url` (Dask's `load_store_chunk`)."""

    full: Full
    region: Region
    url: str
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Stored:
    """Dask's `finalize` of store tasks: the writes, and what `finalize` makes of their Nones."""

    stores: tuple[Store, ...]
    template: Any


Symbol = Src | Blk | Red | Store | Stored

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

REDUCERS: dict[Any, str] = {np.sum: "sum", np.prod: "prod", np.min: "min", np.max: "max"}
REDUCERS.update({np.amin: "min", np.amax: "max"})


def _hashable(f: Any) -> bool:
    try:
        hash(f)
    except TypeError:
        return False
    return True


@functools.cache
def _mean_steps() -> dict[Any, str]:
    from dask.array import reductions as r

    REDUCERS[r.chunk_max] = "max"
    REDUCERS[r.chunk_min] = "min"
    return {r.mean_chunk: "chunk", r.mean_combine: "combine", r.mean_agg: "agg"}


def _region(index: Any, shape: tuple[int, ...]) -> Region:
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


def _bounding(regions: list[Region]) -> Region:
    """The box the regions tile exactly; NotNative when they do not."""
    box = tuple(
        (min(r[d][0] for r in regions), max(r[d][1] for r in regions))
        for d in range(len(regions[0]))
    )
    volume = int(np.prod([b - a for a, b in box]))
    if sum(int(np.prod([b - a for a, b in r])) for r in regions) != volume:
        raise NotNative("partial reductions that do not tile a box")
    return box


def _nones(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return type(v)(_nones(x) for x in v)
    return None


def _flatten(v: Any) -> list[Any]:
    if isinstance(v, list | tuple):
        return [x for item in v for x in _flatten(item)]
    return [v]


class Interpreter:
    """Evaluates tasks on symbols, building IR in one `IrBuilder` shared by the whole graph."""

    def __init__(self) -> None:
        self.b = IrBuilder()
        self._memo: dict[Any, Full] = {}

    # -- nodes -----------------------------------------------------------------------------

    def node(self, node: Any, env: Mapping[Hashable, Any]) -> Any:
        """The symbol or literal a graph node stands for, given the values of its references."""
        if isinstance(node, TaskRef):
            if node.key not in env:
                raise NotNative(f"{node.key!r} has no symbol")
            return env[node.key]
        if isinstance(node, Alias):
            if node.target not in env:
                raise NotNative(f"{node.target!r} has no symbol")
            return env[node.target]
        if isinstance(node, DataNode):
            return self.literal(node.value)
        if isinstance(node, NestedContainer):
            items = [self.node(a, env) for a in node.args]
            return items if node.klass is list else node.klass(items)
        if isinstance(node, Task):
            return self.task(node, env)
        if isinstance(node, list | tuple):
            return type(node)(self.node(a, env) for a in node)
        return node

    def literal(self, value: Any) -> Any:
        if isinstance(value, zarr.Array):
            url = zarr_array_url(value)
            if url is None:
                raise NotNative("a zarr array off local disk")
            return Src(value, url)
        return value

    def task(self, t: Task, env: Mapping[Hashable, Any]) -> Any:
        if t.func is _execute_subgraph:
            inner, outkey, inkeys, *deps = t.args
            local = dict(env)
            for k, d in zip(inkeys, deps, strict=True):
                local[k] = self.node(d, env)
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

    # -- functions -------------------------------------------------------------------------

    def apply(self, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        import dask.array.chunk as chunk
        import dask.array.core as core
        from dask.array.reductions import _concatenate2
        from toolz.functoolz import Compose

        _mean_steps()  # registers Dask's own min/max chunk functions
        if func in (core.getter, core.getter_nofancy, core.getter_inline):
            return self._getter(args, kwargs)
        if func is core.load_store_chunk:
            return self._store(args, kwargs)
        if func is core.finalize and len(args) == 1 and not kwargs:
            return self._whole(args[0])
        if getattr(func, "__module__", None) == "numpy.fft" and func.__name__ in FFTS:
            return self._fft(func.__name__, args, kwargs)
        if func is chunk.getitem and len(args) == 2 and not kwargs:
            return self._getitem(*args)
        if func is core.concatenate_shaped and len(args) == 2 and not kwargs:
            return self._join(args[0])
        if func is chunk.astype:
            (x,) = args
            if not isinstance(x, Blk) or set(kwargs) - {"astype_dtype", "casting", "copy"}:
                raise NotNative("astype with options")
            return Blk(self._cast(x.full, np.dtype(kwargs["astype_dtype"])), x.region)
        name = OPERATORS.get(func)
        if name is None and isinstance(func, np.ufunc):
            name = UFUNCS.get(func.__name__)
        if name is not None:
            if kwargs:
                raise NotNative("elementwise with keywords")
            return self._elementwise(func, name, args)
        if isinstance(func, functools.partial) and func.func in REDUCERS:
            return self._chunk_reduce(func, args, kwargs)
        if _hashable(func) and func in REDUCERS:
            return self._chunk_reduce(functools.partial(func), args, kwargs)
        if isinstance(func, functools.partial) and func.func in _mean_steps():
            return self._mean(_mean_steps()[func.func], args, {**func.keywords, **kwargs})
        if _hashable(func) and func in _mean_steps():
            return self._mean(_mean_steps()[func], args, kwargs)
        if isinstance(func, Compose):
            inner = func.first
            outer = func.funcs[0] if len(func.funcs) == 1 else None
            if (
                isinstance(inner, functools.partial)
                and inner.func is _concatenate2
                and isinstance(outer, functools.partial)
                and outer.func in REDUCERS
                and len(args) == 1
            ):
                return self._combine(outer, args[0])
        if getattr(func, "__name__", "") == "_identity_cast":
            return list(args)
        raise NotNative(f"{getattr(func, '__name__', func)!r} has no native form")

    def _whole(self, parts: Any) -> Blk | Red:
        """Dask's `finalize` of the blocks of one array: the blocks joined (they must tile it)."""
        items = _flatten(parts)
        first = items[0] if items else None
        if items and all(isinstance(i, Store) for i in items):
            from dask.array.core import finalize

            return Stored(tuple(items), finalize(_nones(parts)))
        if isinstance(first, Blk) and all(
            isinstance(i, Blk) and i.full == first.full for i in items
        ):
            return Blk(first.full, _bounding([i.region for i in items]))
        if isinstance(first, Red) and all(
            isinstance(i, Red)
            and (i.kind, i.base, i.axes, i.keepdims, i.dtype)
            == (first.kind, first.base, first.axes, first.keepdims, first.dtype)
            for i in items
        ):
            return Red(
                first.kind,
                first.base,
                first.axes,
                _bounding([i.region for i in items]),
                first.keepdims,
                first.dtype,
            )
        raise NotNative("finalize of something else")

    def _fft(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Blk:
        """numpy.fft's `name` of a block whose transformed axes are whole (Dask's `da.fft`)."""
        from chunkfuse.fft import FftBlock, _result_dtype

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
        dtype = _result_dtype(kind, x.full.dtype)
        key = ("fft", x.full.root, kind, nd, axes, tuple(lengths), block.norm)
        if key not in self._memo:
            self._memo[key] = self.b.fft(x.full, block, tuple(shape), dtype)
        region = tuple((0, shape[d]) if d in axes else r for d, r in enumerate(x.region))
        return Blk(self._memo[key], region)

    def _getitem(self, x: Any, index: Any) -> Blk:
        """A box of a block (Dask's rechunk splits)."""
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk):
            raise NotNative("getitem of something else")
        sub = _region(index, tuple(b - a for a, b in x.region))
        return Blk(
            x.full, tuple((a + s0, a + s1) for (a, _), (s0, s1) in zip(x.region, sub, strict=True))
        )

    def _join(self, parts: Any) -> Blk:
        """Blocks of one array joined into the box they tile (Dask's rechunk merges)."""
        items = [self.reduced(i) if isinstance(i, Red) else i for i in _flatten(parts)]
        if not items or not all(isinstance(i, Blk) and i.full == items[0].full for i in items):
            raise NotNative("concatenation of something else")
        return Blk(items[0].full, _bounding([i.region for i in items]))

    def _getter(self, args: list[Any], kwargs: dict[str, Any]) -> Blk:
        if len(args) != 2 or not isinstance(args[0], Src) or kwargs.get("lock"):
            raise NotNative("getter of something else")
        src, index = args
        arr = src.array
        shape = tuple(arr.shape)
        full = self.b.source(src.url, shape, arr.dtype)
        return Blk(full, _region(index, shape))

    def _store(self, args: list[Any], kwargs: dict[str, Any]) -> Store:
        x, out, index = (args + [None, None, None])[:3]
        out = kwargs.get("out", out)
        index = kwargs.get("index", index)
        if kwargs.get("region") is not None or kwargs.get("return_stored"):
            raise NotNative("store with a region or returning what it stored")
        if isinstance(out, Src):
            out = out.array
        if isinstance(x, Red):
            x = self.reduced(x)
        if not isinstance(x, Blk) or not isinstance(out, zarr.Array):
            raise NotNative("store of something else")
        url = zarr_array_url(out)
        if url is None or out.shards is not None:
            raise NotNative("store into a sharded array or one off local disk")
        shape = tuple(out.shape)
        if shape != x.full.shape or np.dtype(out.dtype) != x.full.dtype:
            raise NotNative("store of another shape or dtype")
        region = _region(index, shape)
        if region != x.region:
            raise NotNative("store of a block into another place")
        return Store(x.full, region, url, shape)

    def _cast(self, full: Full, dtype: np.dtype) -> Full:
        key = ("astype", full.root, dtype.str)
        if key not in self._memo:
            self._memo[key] = self.b.astype(full, dtype)
        return self._memo[key]

    def reduced(self, r: Red) -> Blk:
        """A complete reduction as the block of the whole reduction's result it is."""
        if not r.complete():
            raise NotNative("an incomplete reduction")
        p = Partial(r.kind, r.base, r.axes, True, r.keepdims, r.dtype)
        key = ("reduce", r.kind, r.base.root, r.axes, r.keepdims, str(r.dtype))
        if key not in self._memo:
            self._memo[key] = self.b.reduce(p, p.shape, self.b.reduce_dtype(p))
        kept = tuple(
            (0, 1) if d in r.axes else span
            for d, span in enumerate(r.region)
            if r.keepdims or d not in r.axes
        )
        return Blk(self._memo[key], kept)

    def _elementwise(self, func: Any, name: str, args: list[Any]) -> Blk:
        args = [self.reduced(a) if isinstance(a, Red) else a for a in args]
        blocks = [a for a in args if isinstance(a, Blk)]
        if not blocks:
            raise NotNative("elementwise of constants")
        try:
            shape = tuple(np.broadcast_shapes(*(b.full.shape for b in blocks)))
        except ValueError as e:
            raise NotNative("elementwise of shapes that do not broadcast") from e
        widest = [b for b in blocks if b.full.shape == shape]
        if not widest:
            raise NotNative("elementwise that broadcasts every operand")
        region = widest[0].region
        for b in blocks:
            # Each operand's block must be the part of it that broadcasts onto `region`.
            lead = len(shape) - len(b.full.shape)
            want = tuple(
                (0, 1) if n == 1 and shape[lead + d] != 1 else region[lead + d]
                for d, n in enumerate(b.full.shape)
            )
            if b.region != want:
                raise NotNative("elementwise of blocks of different places")
        operands: list[Full | Const] = []
        probes: list[Any] = []
        for a in args:
            if isinstance(a, Blk):
                operands.append(a.full)
                probes.append(np.ones(1, dtype=a.full.dtype))
            elif isinstance(a, np.number | np.bool_):
                operands.append(Const(a, a.dtype))
                probes.append(a)
            elif isinstance(a, bool | int | float | complex):
                # A Python scalar is weak (NEP 50): it takes the arrays' type, as in numpy.
                weak = np.result_type(*(b.full.dtype for b in blocks), a)
                operands.append(Const(a, weak))
                probes.append(a)
            else:
                raise NotNative(f"elementwise operand {type(a).__name__}")
        with np.errstate(all="ignore"):
            dtype = np.asarray(func(*probes)).dtype
        key = (
            name,
            tuple(o.root if isinstance(o, Full) else ("c", repr(o.value)) for o in operands),
            dtype.str,
        )
        if key not in self._memo:
            self._memo[key] = self.b.elementwise(name, operands, shape, dtype)
        return Blk(self._memo[key], region)

    def _chunk_reduce(
        self, func: functools.partial, args: list[Any], kwargs: dict[str, Any]
    ) -> Red:
        kw = {**func.keywords, **kwargs}
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
            REDUCERS[func.func],
            x.full,
            axes,
            x.region,
            bool(kw.get("keepdims", False)),
            np.dtype(dtype) if dtype is not None else None,
        )

    def _combine(self, outer: functools.partial, parts: Any) -> Red:
        reds = _flatten(parts)
        if not reds or not all(isinstance(r, Red) for r in reds):
            raise NotNative("combine of something else")
        first = reds[0]
        kw = outer.keywords
        kind = REDUCERS[outer.func]
        axes = self._axes(kw.get("axis"), len(first.base.shape))
        same = all(
            (r.kind, r.base, r.axes, r.dtype) == (first.kind, first.base, first.axes, first.dtype)
            for r in reds
        )
        if not same or kind != first.kind or axes != first.axes or not first.keepdims:
            raise NotNative("combine of different reductions")
        return Red(
            kind,
            first.base,
            axes,
            _bounding([r.region for r in reds]),
            bool(kw.get("keepdims", False)),
            first.dtype,
        )

    def _mean(self, step: str, args: list[Any], kw: dict[str, Any]) -> Red:
        """Dask's mean in three steps: per-block sums and counts, combined, then divided."""
        if len(args) != 1 or kw.get("sum", np.sum) is not np.sum or kw.get("computing_meta"):
            raise NotNative("mean steps with other functions")
        if set(kw) - {"sum", "numel", "dtype", "axis", "keepdims", "computing_meta"}:
            raise NotNative("mean with options")
        if step == "chunk":
            x = args[0]
            if not isinstance(x, Blk):
                raise NotNative("mean of something else")
            axes = self._axes(kw.get("axis"), len(x.full.shape))
            return Red("mean", x.full, axes, x.region, True, None)
        reds = _flatten(args[0])
        if not reds or not all(isinstance(r, Red) and r.kind == "mean" for r in reds):
            raise NotNative("mean combine of something else")
        first = reds[0]
        if any((r.base, r.axes) != (first.base, first.axes) for r in reds):
            raise NotNative("mean combine of different means")
        keepdims = True if step == "combine" else bool(kw.get("keepdims", False))
        return Red(
            "mean", first.base, first.axes, _bounding([r.region for r in reds]), keepdims, None
        )

    @staticmethod
    def _axes(axis: Any, rank: int) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(rank))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return tuple(sorted(a % rank for a in axes))


@dataclass
class NativePart:
    """What the engine computed: values of the root keys, the keys it covered, and the
    blocks whose fused elementwise program ran on a GPU."""

    values: dict[Hashable, Any]
    covered: set[Hashable]
    gpu_blocks: int = 0


def symbols_of(graph: Mapping[Hashable, Any], interp: Interpreter) -> dict[Hashable, Symbol]:
    """The symbol of every top-level key that has one, in dependency order."""
    symbols: dict[Hashable, Any] = {}
    failed: set[Hashable] = set()
    for key in _topological(graph):
        node = graph[key]
        if any(d in failed for d in node.dependencies):
            failed.add(key)
            continue
        try:
            value = interp.node(node, symbols)
        except Exception:  # noqa: BLE001 - anything unrecognised runs in Python, which
            # raises the task's own error with its key if the task itself fails.
            failed.add(key)
            continue
        if isinstance(value, Src | Blk | Red | Store | Stored):
            symbols[key] = value
        else:
            failed.add(key)
    return symbols


def _topological(graph: Mapping[Hashable, Any]) -> list[Hashable]:
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


def _materializable(sym: Symbol) -> bool:
    if isinstance(sym, Red):
        return sym.complete()
    return True


def has_zarr_arrays(graph: Mapping[Hashable, Any]) -> bool:
    """True when the graph holds a zarr array (as a data node or a literal)."""
    return any(
        isinstance(n.value if isinstance(n, DataNode) else n, zarr.Array) for n in graph.values()
    )


def run_native(
    graph: Mapping[Hashable, Any],
    wanted: set[Hashable],
    *,
    max_mem: int | None,
    threads: int,
    device: str = "cpu",
) -> NativePart | None:
    """Computes the graph's native part with the engine (fused elementwise programs on
    `device`); None when nothing is native."""
    if not has_zarr_arrays(graph):
        return None
    interp = Interpreter()
    symbols = symbols_of(graph, interp)
    if not any(isinstance(s, Blk | Red | Store | Stored) for s in symbols.values()):
        return None
    dependents: dict[Hashable, set[Hashable]] = {k: set() for k in graph}
    for k, n in graph.items():
        for d in n.dependencies:
            if d in dependents:
                dependents[d].add(k)
    while True:
        roots = {
            k
            for k, s in symbols.items()
            if k in wanted or any(d not in symbols for d in dependents[k])
        }
        demote = {k for k in roots if not _materializable(symbols[k])}
        if not demote:
            break
        for k in demote:
            del symbols[k]
    roots = {k for k in roots if not isinstance(symbols[k], Src)}
    if not roots:
        return None
    with tempfile.TemporaryDirectory(prefix="chunkfuse-dask-") as tmp:
        values, gpu_blocks = _compute(
            interp, {k: symbols[k] for k in roots}, tmp, max_mem, threads, device
        )
    # Source arrays stay in the graph (roots never are sources): Python tasks may read them.
    covered = {k for k, s in symbols.items() if not isinstance(s, Src)}
    return NativePart(values, covered, gpu_blocks)


def _compute(
    interp: Interpreter,
    roots: dict[Hashable, Symbol],
    tmp: str,
    max_mem: int | None,
    threads: int,
    device: str,
) -> tuple[dict[Hashable, Any], int]:
    b = interp.b
    reductions: dict[tuple[Any, ...], Full] = {}
    scratch: dict[str, tuple[Full, str]] = {}
    stores: dict[tuple[str, str], list[Store]] = {}
    for sym in roots.values():
        if isinstance(sym, Blk):
            scratch.setdefault(sym.full.root, (sym.full, ""))
        elif isinstance(sym, Red):
            key = (sym.kind, sym.base.root, sym.axes, sym.keepdims, sym.dtype)
            if key not in reductions:
                p = Partial(sym.kind, sym.base, sym.axes, True, sym.keepdims, sym.dtype)
                full = b.reduce(p, p.shape, b.reduce_dtype(p))
                reductions[key] = full
                scratch.setdefault(full.root, (full, ""))
        elif isinstance(sym, Store):
            stores.setdefault((sym.url, sym.full.root), []).append(sym)
        elif isinstance(sym, Stored):
            for st in sym.stores:
                stores.setdefault((st.url, st.full.root), []).append(st)
    writes: list[tuple[Full, str, tuple[int, ...], dict[str, Any] | None, None]] = []
    for i, (root, (full, _)) in enumerate(sorted(scratch.items())):
        url = f"{tmp}/{i}.zarr"
        scratch[root] = (full, url)
        writes.append((full, url, _scratch_chunks(full), {"name": "none"}, None))
    for (url, _), parts in stores.items():
        shape = parts[0].shape
        covered = sum(int(np.prod([b2 - a for a, b2 in p.region])) for p in parts)
        if covered != int(np.prod(shape)):
            raise NotNative("stores that do not cover their target")
        writes.append((parts[0].full, url, shape, None, None))
    plan = b.plan("dask", writes)
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
        elif isinstance(sym, Red):
            full = reductions[(sym.kind, sym.base.root, sym.axes, sym.keepdims, sym.dtype)]
            kept = [
                (0, 1) if d in sym.axes else r
                for d, r in enumerate(sym.region)
                if sym.keepdims or d not in sym.axes
            ]
            values[key] = read(full, tuple(kept))
        elif isinstance(sym, Stored):
            values[key] = sym.template
        else:
            values[key] = None
    return values, summary["gpu_blocks"]


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
