"""xarray's CF decoding of a stored variable as IR expressions.

xarray decodes a packed variable (ERA5 as int16 with `scale_factor`, `add_offset` and a
`_FillValue`) lazily: its backend array is wrapped in `_ElementwiseFunctionArray`s whose
functions mask the fill values and apply scale and offset. Those two functions are read back
here as steps, and the same arithmetic is written as IR over the stored array, so the engine
reads the packed chunks and decodes them in its fused kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from chunkfuse.common.ir import IrBuilder
from chunkfuse.common.stored import passed_through, zarr_array_behind
from chunkfuse.common.symbols import Const, Full, NotNative

#: The wrapper class xarray's lazy decoding uses, and the attribute holding what it wraps.
_ELEMENTWISE = ("xarray.coding.common", "_ElementwiseFunctionArray")


@dataclass(frozen=True)
class Mask:
    """`_apply_mask`: cast to `dtype`, values equal to one of `fills` become `decoded`."""

    fills: tuple[Any, ...]
    decoded: Any
    dtype: np.dtype


@dataclass(frozen=True)
class ScaleOffset:
    """`_scale_offset_decoding`: cast to `dtype`, times `scale`, plus `offset` (each optional)."""

    scale: Any
    offset: Any
    dtype: np.dtype


Step = Mask | ScaleOffset


def _step(func: Any) -> Step:
    if not isinstance(func, functools.partial) or func.args:
        raise NotNative("a decoding function of another kind")
    name = getattr(func.func, "__name__", "")
    module = getattr(func.func, "__module__", "")
    kw = func.keywords
    if module != "xarray.coding.variables":
        raise NotNative(f"decoding by {module}.{name}")
    if name == "_apply_mask" and set(kw) == {"encoded_fill_values", "decoded_fill_value", "dtype"}:
        fills = tuple(kw["encoded_fill_values"] or ())
        if kw["decoded_fill_value"] is None and fills:
            raise NotNative("a mask without a decoded fill value")
        return Mask(fills, kw["decoded_fill_value"], np.dtype(kw["dtype"]))
    if name == "_scale_offset_decoding" and set(kw) == {"scale_factor", "add_offset", "dtype"}:
        return ScaleOffset(kw["scale_factor"], kw["add_offset"], np.dtype(kw["dtype"]))
    raise NotNative(f"decoding by {name}")


def decoded_array_behind(obj: Any) -> tuple[zarr.Array, tuple[Step, ...]]:
    """The Zarr array behind xarray's lazy wrappers and the decoding steps applied to it,
    innermost first (none when the variable is read as stored); NotNative otherwise."""
    steps: list[Step] = []
    for _ in range(16):
        cls = type(obj)
        if (cls.__module__, cls.__name__) == _ELEMENTWISE:
            steps.append(_step(obj.func))
            obj = obj.array
            continue
        inner = passed_through(obj)
        if inner is None:
            return zarr_array_behind(obj), tuple(reversed(steps))
        obj = inner
    raise NotNative("from_array of a deeply wrapped array")


def _const(value: Any, like: np.dtype) -> Const:
    """`value` as an operand: numpy scalars keep their dtype (strong, as in numpy), Python
    numbers take the array's (weak)."""
    if isinstance(value, np.generic | np.ndarray):
        arr = np.asarray(value)
        if arr.size != 1:
            raise NotNative("a decoding parameter with several values")
        return Const(arr.reshape(()).item(), arr.dtype)
    return Const(value, like)


def apply_decoding(b: IrBuilder, x: Full, steps: tuple[Step, ...]) -> Full:
    """`x` decoded by `steps` (innermost first) as xarray does it."""
    for step in steps:
        x = b.astype(x, step.dtype)
        if isinstance(step, Mask):
            if not step.fills:
                continue
            equal = [
                b.elementwise("equal", [x, _const(fill, step.dtype)], x.shape, np.bool_)
                for fill in step.fills
            ]
            cond = equal[0]
            for eq in equal[1:]:
                cond = b.elementwise("logical_or", [cond, eq], x.shape, np.bool_)
            decoded = Const(step.decoded, step.dtype)
            x = b.elementwise("where", [cond, decoded, x], x.shape, step.dtype)
        else:
            if step.scale is not None:
                scale = _const(step.scale, step.dtype)
                x = b.elementwise("multiply", [x, scale], x.shape, step.dtype)
            if step.offset is not None:
                offset = _const(step.offset, step.dtype)
                x = b.elementwise("add", [x, offset], x.shape, step.dtype)
    return x
