"""Recognises the functions inside Cubed's BlockwiseSpecs and applies them to symbols.

Functions are matched by identity after unwrapping `functools.partial` and Cubed's closures
(`func_with_block_id.<locals>.wrap`, `make_fused_function.<locals>.fused_func_*`); names are
never trusted. Anything unrecognised raises `NotNative`, and the op runs in Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from cubed.array import nan_functions
from cubed.array_api import data_type_functions, manipulation_functions, statistical_functions
from cubed.backend_array_api import namespace as nxp
from cubed.core import ops
from cubed.primitive.blockwise import ChunkKey

from chunkfuse.common.ir import UFUNCS, IrBuilder
from chunkfuse.common.selection import as_slice, even_runs
from chunkfuse.common.symbols import Const, Full, NotNative, Partial
from chunkfuse.cubed.leaves import stored_array_behind
from chunkfuse.cubed.symbols import ArgState, Empty, Offsets, Streamed
from chunkfuse.fft_block import FftBlock

#: Plain reductions by their chunk function (Cubed calls the backend namespace's functions).
PLAIN_REDUCTIONS: dict[Any, str] = {
    nxp.sum: "sum",
    nxp.prod: "prod",
    nxp.max: "max",
    nxp.min: "min",
    nxp.all: "all",
    nxp.any: "any",
}


def closure_cells(f: Callable[..., Any]) -> dict[str, Any]:
    """A closure's free variables by name."""
    code = getattr(f, "__code__", None)
    if code is None:
        return {}
    return dict(
        zip(code.co_freevars, (c.cell_contents for c in (f.__closure__ or ())), strict=False)
    )


def unwrap(f: Any) -> tuple[Any, dict[str, Any]]:
    """`(function, keywords)` of a partial (or the function itself)."""
    if isinstance(f, functools.partial):
        inner, kw = unwrap(f.func)
        if f.args:
            raise NotNative("partial with positional arguments")
        return inner, {**kw, **f.keywords}
    return f, {}


def qualname(f: Any) -> str:
    return getattr(f, "__qualname__", "") or ""


def flatten_fused(f: Any) -> tuple[Any, dict[str, Any]]:
    """`(root function, {intermediate name: function})` of a fused function."""
    if qualname(f).startswith("make_fused_function.<locals>.fused_func"):
        c = closure_cells(f)
        return c["function"], dict(c["predecessor_functions_dict"])
    return f, {}


def block_id_inner(f: Any) -> Any | None:
    """The function inside Cubed's `func_with_block_id` wrapper, if `f` is one."""
    base, kw = unwrap(f)
    if qualname(base).endswith("func_with_block_id.<locals>.wrap"):
        inner = closure_cells(base)["func"]
        return functools.partial(inner, **kw) if kw else inner
    return None


def _is_identity(f: Any) -> bool:
    code = getattr(f, "__code__", None)
    return (
        code is not None
        and code.co_argcount == 1
        and code.co_code == (lambda a: a).__code__.co_code
        and not f.__closure__
    )


def finished_plain(b: IrBuilder, s: Any, dtype: Any = None) -> Any:
    """A finished sum/prod/min/max/any/all state as the whole array it stands for (cast to
    `dtype`, else its own); anything else unchanged."""
    if isinstance(s, Partial) and s.complete and s.kind in PLAIN_REDUCTIONS.values():
        if dtype is None:
            dtype = s.dtype if s.dtype is not None else b.reduce_dtype(s)
        return b.reduce(s, s.shape, dtype)
    return s


def _as_full(b: IrBuilder, s: Any) -> Full | Const:
    """An operand for an elementwise function: whole arrays and constants."""
    s = finished_plain(b, s)
    if isinstance(s, (Full, Const)):
        return s
    raise NotNative(f"operand {type(s).__name__} is not a whole array")


def apply(
    b: IrBuilder,
    f: Any,
    args: list[Any],
    shape: tuple[int, ...],
    dtype: np.dtype,
) -> Any:
    """The symbol of `f(*args)`, whose declared result is `shape`/`dtype`; or NotNative."""
    inner = block_id_inner(f)
    if inner is not None:
        if not args or not isinstance(args[-1], Offsets):
            raise NotNative("block_id function without its offsets input")
        return _apply_block_id(b, inner, args[:-1], shape)
    fn, kw = unwrap(f)
    if _is_identity(fn) and not kw and len(args) == 1:
        return args[0]
    if isinstance(fn, np.ufunc):
        name = UFUNCS.get(fn.__name__)
        if name is None or kw or fn.nin != len(args):
            raise NotNative(f"ufunc {fn.__name__} with {kw or len(args)}")
        return b.elementwise(name, [_as_full(b, a) for a in args], shape, dtype)
    if fn is nxp.round and not kw and len(args) == 1:
        x = _as_full(b, args[0])
        if isinstance(x, Const) or np.dtype(x.dtype).kind != "f":
            raise NotNative("round of something other than a float array")
        return b.elementwise("rint", [x], shape, dtype)
    if fn is nxp.clip and not kw and len(args) in (2, 3):
        # Cubed's clip: both bounds, or the lower one alone (a maximum).
        name = "clip" if len(args) == 3 else "maximum"
        return b.elementwise(name, [_as_full(b, a) for a in args], shape, dtype)
    if fn is nxp.where and not kw and len(args) == 3:
        return b.elementwise("where", [_as_full(b, a) for a in args], shape, dtype)
    if fn is data_type_functions._astype and set(kw) == {"astype_dtype"}:
        x = _as_full(b, args[0])
        if isinstance(x, Const):
            raise NotNative("astype of a constant")
        return b.astype(x, kw["astype_dtype"])
    if fn is nxp.permute_dims and set(kw) == {"axes"} and len(args) == 1:
        x = _as_full(b, args[0])
        if isinstance(x, Const):
            raise NotNative("permute_dims of a constant")
        return b.transpose(x, tuple(int(a) % len(x.shape) for a in kw["axes"]))
    if fn is nxp.squeeze and set(kw) == {"axis"}:
        return _squeeze(b, args[0], tuple(kw["axis"]), shape)
    if fn is manipulation_functions._expand_dims and set(kw) == {"axis"}:
        full = _as_full(b, args[0])
        if isinstance(full, Const):
            raise NotNative("expand_dims of a constant")
        axis = kw["axis"]
        axes = tuple(axis) if isinstance(axis, tuple) else (int(axis),)
        return b.expand_dims(full, axes, shape)
    if isinstance(fn, FftBlock) and not kw and len(args) == 1:
        x = _as_full(b, args[0])
        if isinstance(x, Const):
            raise NotNative("FFT of a constant")
        return b.fft(x, fn, shape, dtype)
    if fn is ops._partial_reduce:
        return _partial_reduce(args, kw, shape)
    if fn is statistical_functions._mean_aggregate:
        return _aggregate(b, args[0], "mean", shape, dtype)
    if fn is statistical_functions._var_aggregate:
        return _aggregate(b, args[0], "var", shape, dtype)
    if fn is nan_functions._nanmean_aggregate:
        return _aggregate(b, args[0], "nanmean", shape, dtype)
    if fn is ops._arg_aggregate:
        p = args[0]
        if not isinstance(p, Partial) or p.kind not in ("argmin", "argmax"):
            raise NotNative("arg aggregate of an unknown state")
        return _aggregate(b, p, p.kind, shape, dtype)
    raise NotNative(f"function {qualname(fn) or fn!r}")


def _apply_block_id(b: IrBuilder, inner: Any, args: list[Any], shape: tuple[int, ...]) -> Any:
    fn, kw = unwrap(inner)
    if fn is ops._from_array and len(args) == 1 and isinstance(args[0], Empty):
        src = stored_array_behind(kw.get("input_array"), b)
        if src.shape != tuple(shape):
            raise NotNative("from_array with a different shape")
        return src
    if fn is ops._arg_map_func:
        arg_func = kw.get("arg_func")
        kind = {nxp.argmax: "argmax", nxp.argmin: "argmin"}.get(arg_func)
        base = args[0] if len(args) == 1 else None
        if kind is None or not isinstance(base, Full) or "axis" not in kw:
            raise NotNative("arg reduction of an unknown kind")
        return ArgState(kind, base, int(kw["axis"]))
    if fn is ops._assemble_index_chunk and kw.get("func") is None and len(args) == 1:
        return _index(b, args[0], kw, shape)
    if fn is ops._assemble_index_chunk and kw.get("func") is nxp.flip and len(args) == 1:
        return _flip(b, args[0], kw, shape)
    raise NotNative(f"block_id function {qualname(fn) or fn!r}")


def _flip(b: IrBuilder, streamed: Any, kw: dict[str, Any], shape: tuple[int, ...]) -> Full:
    """Cubed's `flip`: each output block is its mirror block of the input, flipped; as a
    whole, the input walked backwards along the flipped axes."""
    src = streamed.item if isinstance(streamed, Streamed) else None
    axis = kw.get("axis")
    if not isinstance(src, Full) or src.shape != tuple(shape) or not isinstance(axis, tuple):
        raise NotNative("flip of an unknown input")
    axes = {int(a) % len(shape) for a in axis}
    return b.slice(src, [[None, None, -1] if d in axes else None for d in range(len(shape))], shape)


def _index(b: IrBuilder, streamed: Any, kw: dict[str, Any], shape: tuple[int, ...]) -> Full:
    """Cubed's indexing (`x[2:8, ::2]`, `x[3]`, `x[:, [4, 2, 0]]`, and the merges after it):
    each output block's selection of the input, recovered as one selection of the whole input.
    Along an axis, the blocks' slices step on from the first block's start; positions of an
    integer array are the blocks' positions in order, native when they step evenly."""
    src = streamed.item if isinstance(streamed, Streamed) else None
    select = kw.get("selection_function")
    if not isinstance(src, Full) or select is None or tuple(kw.get("in_shape", ())) != src.shape:
        raise NotNative("index of an unknown input")

    def block(out_axis: int, k: int) -> tuple[Any, ...]:
        coords = [0] * len(shape)
        coords[out_axis] = k
        return tuple(select(ChunkKey("out", tuple(coords))))

    first = block(0, 0) if shape else tuple(select(ChunkKey("out", ())))
    selection: list[Any] = []
    # An integer array whose positions do not step evenly: its runs, and its place.
    runs: list[slice] = []
    run_axes = (0, 0)
    out_axis = 0
    for d, item in enumerate(first):
        if isinstance(item, int | np.integer):
            selection.append(int(item))
            continue
        n = shape[out_axis]
        if isinstance(item, slice):
            start, step = item.start or 0, item.step or 1
            if step < 1:
                raise NotNative("index with a backward step")
            selection.append([start, start + step * n, step])
        elif isinstance(item, np.ndarray):
            pieces = [item]
            while sum(len(p) for p in pieces) < n:
                piece = block(out_axis, len(pieces))[d]
                if not isinstance(piece, np.ndarray) or len(piece) == 0:
                    raise NotNative("index positions that do not fill the output")
                pieces.append(piece)
            positions = np.concatenate(pieces)
            try:
                s = as_slice(positions)
            except NotNative:
                if runs:
                    raise
                runs = even_runs(positions)
                run_axes = (len(selection), out_axis)
                s = runs[0]
            selection.append([s.start, s.stop, s.step])
        else:
            raise NotNative(f"index of {type(item).__name__}")
        out_axis += 1
    if out_axis != len(shape):
        raise NotNative("index of another rank")
    if not runs:
        return b.slice(src, selection, shape)
    # Uneven positions (a groupby's takes, `isel` with a list): the slices of their runs,
    # joined along the output axis.
    at, axis = run_axes
    parts = []
    for run in runs:
        part_shape = list(shape)
        part_shape[axis] = len(range(*run.indices(src.shape[at])))
        part_selection = list(selection)
        part_selection[at] = [run.start, run.stop, run.step]
        parts.append(b.slice(src, part_selection, tuple(part_shape)))
    return b.concat(parts, axis)


def _squeeze(b: IrBuilder, x: Any, axes: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    if isinstance(x, Partial) and x.complete and x.keepdims and set(axes) == set(x.axes):
        return replace(x, keepdims=False)
    full = _as_full(b, x)
    if isinstance(full, Const):
        raise NotNative("squeeze of a constant")
    return b.squeeze(full, axes, shape)


def _partial_reduce(args: list[Any], kw: dict[str, Any], shape: tuple[int, ...]) -> Partial:
    if len(args) != 1 or not isinstance(args[0], Streamed):
        raise NotNative("partial reduce over something other than a stream of blocks")
    x = args[0].item
    axes = tuple(int(a) for a in kw.get("axis", ()))
    complete = all(shape[a] == 1 for a in axes)
    initial = kw.get("initial_func")
    reduce_fn, reduce_kw = unwrap(kw.get("reduce_func"))
    if isinstance(x, Partial):
        if initial is not None or tuple(x.axes) != axes or not x.keepdims:
            raise NotNative("combine round that does not continue its reduction")
        return x.advanced(complete)
    if isinstance(x, ArgState):
        init_fn, _ = unwrap(initial) if initial is not None else (None, {})
        if init_fn is not ops._arg_func or axes != (x.axis,):
            raise NotNative("arg reduction with an unknown first round")
        return Partial(x.kind, x.base, axes, complete)
    if not isinstance(x, Full) or initial is None:
        raise NotNative("partial reduce of an unknown input")
    init_fn, init_kw = unwrap(initial)
    if tuple(init_kw.get("axis", ())) != axes or not init_kw.get("keepdims"):
        raise NotNative("partial reduce with unusual axes")
    kind = PLAIN_REDUCTIONS.get(init_fn)
    if kind is not None:
        if PLAIN_REDUCTIONS.get(reduce_fn) != kind:
            raise NotNative("reduction whose combine differs from its first round")
        dtype = init_kw.get("dtype")
        return Partial(kind, x, axes, complete, dtype=None if dtype is None else np.dtype(dtype))
    if init_fn is statistical_functions._mean_func:
        return Partial("mean", x, axes, complete)
    if init_fn is nan_functions._nanmean_func:
        return Partial("nanmean", x, axes, complete)
    if init_fn is statistical_functions._var_func:
        return Partial("var", x, axes, complete, ddof=float(init_kw.get("correction", 0.0)))
    raise NotNative(f"reduction {qualname(init_fn) or init_fn!r}")


def _aggregate(b: IrBuilder, p: Any, kind: str, shape: tuple[int, ...], dtype: np.dtype) -> Full:
    if not isinstance(p, Partial) or p.kind != kind or not p.complete:
        raise NotNative(f"{kind} aggregate of an unfinished reduction")
    return b.reduce(p, shape, dtype)
