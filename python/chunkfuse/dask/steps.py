"""The state the Interpreter's families of steps share, one IR builder for the whole graph and
the IR nodes built so far, and the steps one family calls in another, each defined by its
family's class: reads and elementwise steps (`elementwise.py`), slices and takes (`slices.py`),
joins of blocks (`joins.py`), FFTs (`ffts.py`), stores (`stores.py`) and reductions
(`reductions.py`). `interpreter.py` puts them together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any

import numpy as np

from chunkfuse.common.ir import IrBuilder
from chunkfuse.common.symbols import Full

from .symbols import Blk, Red


class Steps(ABC):
    """What every family of steps reads and adds to: the graph's IR builder `b` and the IR
    nodes built so far, by what they compute (`_memo`)."""

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

    @abstractmethod
    def apply(self, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The symbol of a step calling `func` (the Interpreter's dispatch)."""

    @abstractmethod
    def _cast(self, full: Full, dtype: np.dtype) -> Full:
        """`full` cast to `dtype` (`ElementwiseSteps`)."""

    @abstractmethod
    def _elementwise(self, func: Any, name: str, args: list[Any]) -> Blk:
        """An elementwise step of IR function `name` (`ElementwiseSteps`)."""

    @abstractmethod
    def _select(self, x: Blk, index: Any) -> Blk:
        """`x[index]` with `index` relative to the block (`SliceSteps`)."""

    @abstractmethod
    def _tiled(self, nested: Any, axis: int) -> Blk:
        """Blocks nested as their block grid joined into one block (`JoinSteps`)."""

    @abstractmethod
    def _region_of(self, x: Blk) -> Full:
        """The values of block `x` as a whole array (`JoinSteps`)."""

    @abstractmethod
    def reduced(self, r: Red) -> Blk:
        """A reduction's values as a block of the whole reduction's result
        (`ReductionSteps`)."""
