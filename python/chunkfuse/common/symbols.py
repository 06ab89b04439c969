"""Symbolic values both front ends translate into the chunkfuse plan IR.

While a front end walks its graph it does not compute anything: each array becomes a *symbol*
describing what the array holds in terms of IR nodes. A `Full` symbol is a whole array the
engine can produce; a `Partial` is the state of a tree reduction that the front end splits into
rounds (the engine does the whole reduction in one streamed pass once the rounds are complete).
The Cubed front end's own symbols are in chunkfuse.cubed.symbols, the Dask front end's in
chunkfuse.dask.symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


class NotNative(Exception):
    """Raised while translating when an op (or one of its inputs) has no native form."""


@dataclass(frozen=True)
class Full:
    """A whole array produced by the IR node `root`."""

    root: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class Const:
    """A 0-d scalar operand (Cubed's `VirtualInMemoryArray` for `x + 1`)."""

    value: Any
    dtype: np.dtype


@dataclass(frozen=True)
class Partial:
    """The state of a tree reduction of `base` over `axes` (Cubed's partial-reduce rounds).

    `complete` once every reduced axis is down to one block, so the state holds the
    reduction of the whole axis. `keepdims` is false after Cubed's final squeeze.
    """

    kind: str
    base: Full
    axes: tuple[int, ...]
    complete: bool
    keepdims: bool = True
    dtype: np.dtype | None = None
    ddof: float = 0.0
    squeezed: tuple[int, ...] = field(default=())

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the reduction's result (reduced axes kept as 1 unless squeezed)."""
        return tuple(
            1 if i in self.axes else n
            for i, n in enumerate(self.base.shape)
            if self.keepdims or i not in self.axes
        )

    def advanced(self, complete: bool) -> Partial:
        """The same reduction after another combine round."""
        return replace(self, complete=complete)
