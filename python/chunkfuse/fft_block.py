"""The block function of a chunkfuse FFT (numpy.fft over whole axes) and its result dtype.

Kept apart from `chunkfuse.fft` so that the Dask scheduler, which recognises numpy.fft calls
as the same transform, works without Cubed installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FftBlock:
    """The block function of a chunkfuse FFT op: numpy.fft's `kind` (`fft`, `ifft`, `rfft`,
    `irfft`, or their n-d forms when `nd`) over `axes` with `lengths` and `norm`."""

    kind: str
    nd: bool
    axes: tuple[int, ...]
    lengths: tuple[int, ...]
    norm: str

    def __call__(self, block: np.ndarray) -> np.ndarray:
        if self.nd:
            f = getattr(np.fft, self.kind + "n")
            return f(block, s=self.lengths, axes=self.axes, norm=self.norm)
        f = getattr(np.fft, self.kind)
        return f(block, n=self.lengths[0], axis=self.axes[0], norm=self.norm)


def result_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    """numpy 2's result dtype: single precision stays single; irfft gives reals."""
    single = dtype in (np.dtype("float32"), np.dtype("complex64"))
    if kind == "irfft":
        return np.dtype("float32" if single else "float64")
    return np.dtype("complex64" if single else "complex128")
