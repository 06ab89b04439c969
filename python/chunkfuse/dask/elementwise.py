"""The Interpreter's reads and elementwise steps: zarr getters give blocks of a stored array
(decoded as xarray decodes it), numpy's ufuncs, operators, casts, fills, `where` and `round` of
blocks give blocks of a whole-array IR expression.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from chunkfuse.common.codecs import unsupported_filter
from chunkfuse.common.decoding import apply_decoding, decoded_array_behind
from chunkfuse.common.stored import wraps_stored_array
from chunkfuse.common.symbols import Const, Full, NotNative
from chunkfuse.common.urls import zarr_array_url

from .steps import Steps
from .symbols import Blk, Filled, Red, Region, Src, is_hashable


class ElementwiseSteps(Steps):
    """Reads of stored arrays and elementwise steps of blocks."""

    def literal(self, value: Any) -> Any:
        """A stored Zarr array (or one behind xarray's lazy wrappers) as a source."""
        if wraps_stored_array(value):
            arr, steps = decoded_array_behind(value)
            url = zarr_array_url(arr)
            if url is None:
                raise NotNative("a zarr array off local disk")
            refused = unsupported_filter(arr, writing=False)
            if refused is not None:
                raise NotNative(refused)
            return Src(arr, url, steps)
        return value

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

    def _rounded(self, x: Any, decimals: int) -> Blk:
        """`np.round(x, decimals)` of a float block as numpy computes it: scaled by
        `10 ** decimals` (divided for negative decimals), rounded half to even, scaled back,
        each step in the block's dtype."""
        if not isinstance(x, Blk) or x.full.dtype.kind != "f":
            raise NotNative("round of something other than floats")
        if decimals == 0:
            return self._elementwise(np.rint, "rint", [x])
        scale = 10.0 ** abs(decimals)
        up: tuple[np.ufunc, str] = (np.multiply, "multiply")
        down: tuple[np.ufunc, str] = (np.true_divide, "divide")
        (there, there_name), (back, back_name) = (up, down) if decimals > 0 else (down, up)
        scaled = self._elementwise(there, there_name, [x, scale])
        rounded = self._elementwise(np.rint, "rint", [scaled])
        return self._elementwise(back, back_name, [rounded, scale])

    def _cast(self, full: Full, dtype: np.dtype) -> Full:
        key = ("astype", full.root, dtype.str)
        if key not in self._memo:
            self._memo[key] = self.b.astype(full, dtype)
        return self._memo[key]

    def _elementwise(self, func: Any, name: str, args: list[Any]) -> Blk:
        sig = _elementwise_signature(func, args)
        if sig is not None:
            seen = self._elementwise_seen.get(sig)
            region = _shared_region(args) if seen is not None else None
            if seen is not None and region is not None:
                return Blk(seen, region)
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
