"""`chunkfuse.fft`: numpy's FFTs (the array API fft extension) for Cubed arrays.

Each transform is one Cubed op whose block function (`FftBlock`) runs numpy.fft, so it works
on every Cubed executor. Cubed needs the transformed axes whole in each chunk, so the input is
first rechunked (Cubed's bounded-memory rechunk) to chunks that are whole along those axes and
small enough along the others for the spec's `allowed_mem`. RustExecutor recognises `FftBlock`
and runs the transform with the engine's rustfft kernels; it also folds the rechunk into its
own choice between re-reading the source and spilling a rechunked copy.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import cubed
import cubed.array_api as xp
import numpy as np
from numpy.exceptions import AxisError

from chunkfuse.fft_block import FftBlock, result_dtype

__all__ = [
    "FftBlock",
    "fft",
    "fftfreq",
    "fftn",
    "fftshift",
    "ifft",
    "ifftn",
    "ifftshift",
    "irfft",
    "irfftn",
    "rfft",
    "rfftfreq",
    "rfftn",
]

NORMS = ("backward", "ortho", "forward")


def _check_input(x: Any, kind: str) -> None:
    if not isinstance(x, cubed.Array):
        raise TypeError(f"chunkfuse.fft.{kind} takes a Cubed array, got {type(x).__name__}")
    if x.dtype == np.dtype(bool) or x.dtype.kind not in "iufc":
        raise TypeError(f"{kind} needs a numeric array, got dtype {x.dtype}")
    if kind == "rfft" and x.dtype.kind == "c":
        raise TypeError(f"rfft needs real values, got dtype {x.dtype} (use fft)")
    if x.ndim == 0:
        raise ValueError(f"{kind} of a 0-d array")


def _normalise_axes(x: Any, axes: Sequence[int], kind: str) -> tuple[int, ...]:
    out: list[int] = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise TypeError(
                f"{kind}: axes are integers (Cubed arrays have no dimension names), got {a!r}"
            )
        if not -x.ndim <= int(a) < x.ndim:
            raise AxisError(int(a), x.ndim, f"{kind}: axis")
        a = int(a) % x.ndim
        if a in out:
            raise ValueError(f"{kind}: axis {a} is given twice")
        out.append(a)
    return tuple(out)


def _whole_axis_chunks(x: Any, axes: tuple[int, ...], out_itemsize: int) -> tuple[int, ...]:
    """Chunks whole along `axes` and halved along the others (largest first) until a block,
    its output and numpy's working copies fit the spec's allowed memory."""
    spec = x.spec
    budget = (spec.allowed_mem - spec.reserved_mem) if spec.allowed_mem else 2**31
    per_element = 2 * x.dtype.itemsize + 4 * out_itemsize
    chunks = [x.shape[d] if d in axes else x.chunksize[d] for d in range(x.ndim)]
    while math.prod(chunks) * per_element > budget:
        others = [d for d in range(x.ndim) if d not in axes and chunks[d] > 1]
        if not others:
            break  # Cubed reports the op's projected memory against allowed_mem.
        widest = max(others, key=lambda d: chunks[d])
        chunks[widest] = -(-chunks[widest] // 2)
    return tuple(max(c, 1) for c in chunks)


def _transform(
    x: Any,
    kind: str,
    nd: bool,
    axes: Sequence[int] | None,
    lengths: Sequence[int] | None,
    norm: str,
) -> tuple[FftBlock, tuple[int, ...], np.dtype]:
    """The block function, result shape and dtype of a transform, validated."""
    name = kind + ("n" if nd else "")
    _check_input(x, kind)
    if axes is None:
        if nd:
            axes = range(x.ndim) if lengths is None else range(x.ndim - len(lengths), x.ndim)
        else:
            axes = (-1,)
    ax = _normalise_axes(x, axes, name)
    if not ax:
        raise ValueError(f"{name} needs at least one axis")
    if lengths is None:
        n = [x.shape[a] for a in ax]
        if kind == "irfft":
            n[-1] = 2 * (x.shape[ax[-1]] - 1)
    else:
        n = [int(v) for v in lengths]
        if len(n) != len(ax):
            raise ValueError(f"{name}: {len(n)} lengths for {len(ax)} axes")
    for a, v in zip(ax, n, strict=True):
        if v <= 0:
            raise ValueError(f"{name}: invalid number of data points ({v}) along axis {a}")
    out_dtype = result_dtype(kind, x.dtype)
    shape = list(x.shape)
    for i, (a, v) in enumerate(zip(ax, n, strict=True)):
        shape[a] = v // 2 + 1 if kind == "rfft" and i == len(ax) - 1 else v
    return FftBlock(kind, nd, ax, tuple(n), norm), tuple(shape), out_dtype


def _apply(
    x: Any,
    kind: str,
    nd: bool,
    axes: Sequence[int] | None,
    lengths: Sequence[int] | None,
    norm: str | None,
) -> Any:
    norm = norm or "backward"
    if norm not in NORMS:
        raise ValueError(f"invalid norm {norm!r}; must be one of {', '.join(NORMS)}")
    block, shape, out_dtype = _transform(x, kind, nd, axes, lengths, norm)
    chunks = _whole_axis_chunks(x, block.axes, out_dtype.itemsize)
    if chunks != tuple(x.chunksize) or any(len(x.chunks[a]) > 1 for a in block.axes):
        x = x.rechunk(chunks)
    out_chunks = tuple((shape[d],) if d in block.axes else x.chunks[d] for d in range(x.ndim))
    return cubed.map_blocks(block, x, dtype=out_dtype, chunks=out_chunks)


def fft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Any:
    """numpy.fft.fft of a Cubed array."""
    return _apply(x, "fft", False, (axis,), None if n is None else (n,), norm)


def ifft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Any:
    """numpy.fft.ifft of a Cubed array."""
    return _apply(x, "ifft", False, (axis,), None if n is None else (n,), norm)


def rfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Any:
    """numpy.fft.rfft of a Cubed array (real input)."""
    return _apply(x, "rfft", False, (axis,), None if n is None else (n,), norm)


def irfft(x: Any, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Any:
    """numpy.fft.irfft of a Cubed array (Hermitian input, real output)."""
    return _apply(x, "irfft", False, (axis,), None if n is None else (n,), norm)


def fftn(
    x: Any,
    /,
    *,
    s: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    norm: str = "backward",
) -> Any:
    """numpy.fft.fftn of a Cubed array."""
    return _apply(x, "fft", True, axes, s, norm)


def ifftn(
    x: Any,
    /,
    *,
    s: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    norm: str = "backward",
) -> Any:
    """numpy.fft.ifftn of a Cubed array."""
    return _apply(x, "ifft", True, axes, s, norm)


def rfftn(
    x: Any,
    /,
    *,
    s: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    norm: str = "backward",
) -> Any:
    """numpy.fft.rfftn of a Cubed array."""
    return _apply(x, "rfft", True, axes, s, norm)


def irfftn(
    x: Any,
    /,
    *,
    s: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    norm: str = "backward",
) -> Any:
    """numpy.fft.irfftn of a Cubed array."""
    return _apply(x, "irfft", True, axes, s, norm)


def fftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, spec: Any = None) -> Any:
    """The sample frequencies of an FFT of length `n` with spacing `d`, as a Cubed array."""
    if n <= 0:
        raise ValueError(f"fftfreq: n must be positive, got {n}")
    values = np.fft.fftfreq(n, d).astype(dtype or np.float64)
    return cubed.from_array(values, spec=spec)


def rfftfreq(n: int, /, *, d: float = 1.0, dtype: Any = None, spec: Any = None) -> Any:
    """The sample frequencies of an rfft of length `n` with spacing `d`, as a Cubed array."""
    if n <= 0:
        raise ValueError(f"rfftfreq: n must be positive, got {n}")
    values = np.fft.rfftfreq(n, d).astype(dtype or np.float64)
    return cubed.from_array(values, spec=spec)


def _shift(x: Any, axes: int | Sequence[int] | None, inverse: bool) -> Any:
    if not isinstance(x, cubed.Array):
        raise TypeError(f"fftshift takes a Cubed array, got {type(x).__name__}")
    if axes is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axes, int):
        axes = (axes,)
    ax = _normalise_axes(x, axes, "ifftshift" if inverse else "fftshift")
    shifts = tuple(-(x.shape[a] // 2) if inverse else x.shape[a] // 2 for a in ax)
    return xp.roll(x, shifts, axis=ax)


def fftshift(x: Any, /, *, axes: int | Sequence[int] | None = None) -> Any:
    """Moves the zero-frequency term to the centre (numpy.fft.fftshift)."""
    return _shift(x, axes, inverse=False)


def ifftshift(x: Any, /, *, axes: int | Sequence[int] | None = None) -> Any:
    """The inverse of fftshift."""
    return _shift(x, axes, inverse=True)
