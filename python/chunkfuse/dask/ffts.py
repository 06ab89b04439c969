"""The Interpreter's FFTs: numpy.fft's functions of a block whose transformed axes are whole
(Dask's `da.fft`), as the IR `fft` of the whole array.
"""

from __future__ import annotations

from typing import Any

from chunkfuse.common.symbols import NotNative

from .steps import Steps
from .symbols import Blk, Red

#: numpy.fft functions the engine's `fft` op computes.
FFTS = frozenset(
    f"{k}{suffix}" for k in ("fft", "ifft", "rfft", "irfft") for suffix in ("", "2", "n")
)


class FftSteps(Steps):
    """numpy.fft's functions of blocks."""

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
