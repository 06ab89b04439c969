"""The Interpreter: evaluates a Dask graph's tasks on symbols instead of data, building IR in one
`IrBuilder` shared by the whole graph. It reads the graph's nodes (references, aliases, data,
tasks, fused subgraphs) and dispatches each step's function to its family of steps: reads and
elementwise steps, slices and takes, joins, FFTs, stores and reductions (see `steps.py`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
from dask._task_spec import Alias, DataNode, NestedContainer, Task, TaskRef, _execute_subgraph

from chunkfuse.common.ir import UFUNCS
from chunkfuse.common.symbols import NotNative

from .elementwise import ElementwiseSteps
from .ffts import FFTS, FftSteps
from .graph import topological
from .joins import JoinBuilder, JoinSteps
from .reductions import REDUCERS, ReductionSteps, dask_steps
from .slices import SliceSteps
from .stores import StoreSteps
from .symbols import Blk, Lit, Red, Symbol, is_hashable, unwrap

#: numpy's functions that fill a block with one value.
FILLS = (np.zeros_like, np.ones_like, np.full_like)


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


#: numpy's and Python's bitwise NOT, which of booleans is `logical_not`.
INVERTS = (np.invert, operator.invert)


def _all_bool(args: list[Any]) -> bool:
    return bool(args) and all(
        isinstance(a, Blk) and np.dtype(a.full.dtype) == np.bool_ for a in args
    )


class Interpreter(ElementwiseSteps, SliceSteps, JoinSteps, FftSteps, StoreSteps, ReductionSteps):
    """Evaluates tasks on symbols, building IR in one `IrBuilder` shared by the whole graph."""

    def __init__(self) -> None:
        super().__init__()
        #: Fused tasks that are not native as a whole, with the symbols of the inner steps
        #: the engine computes for them (see `native_prefix`).
        self.mixed: dict[Hashable, dict[Hashable, Any]] = {}
        #: The graph's concatenations (see `chunkfuse.dask.joins`).
        self.joins: JoinBuilder | None = None
        #: Why each task the engine does not compute runs in Python, by key.
        self.reasons: dict[Hashable, str] = {}

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
        return {k: done[k] for k in needed if materializable(done[k], True)}

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
        if name is None and hashable and func in INVERTS and _all_bool(args):
            # `~mask` (xarray's notnull when it encodes a _FillValue): NOT of booleans.
            name = "logical_not"
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


def materializable(sym: Symbol, wanted: bool) -> bool:
    """Whether the engine can give a root's value: a reduction's only when it is no step's
    state, and (so that Python reading each block's partial result does not make an engine
    reduction per block) only when it covers the reduced axes or is what the caller asked."""
    if isinstance(sym, Red):
        return not sym.state and (wanted or sym.complete())
    return True


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
        handlers[like] = _filled(like)
    return handlers


def _filled(like: Any) -> Handler:
    """The handler of numpy's or Dask's fill function `like` (see `ElementwiseSteps._filled`)."""
    return lambda i, a, k: i._filled(like, a, k)
