"""Symbolic values only the Cubed translator uses, beside the shared ones of
chunkfuse.common.symbols (`Full`, `Const`, `Partial`, `NotNative`).

While the translator walks a Cubed DAG it does not compute anything: each Cubed array becomes a
*symbol* describing what the array holds in terms of IR nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chunkfuse.common.symbols import Const, Full, Partial


@dataclass(frozen=True)
class Offsets:
    """Cubed's block-offsets array, the hidden last input of `block_id` functions."""


@dataclass(frozen=True)
class Empty:
    """Cubed's `VirtualEmptyArray`: the placeholder input of `from_array` and creation ops."""


@dataclass(frozen=True)
class ArgState:
    """The output of Cubed's `_arg_map_func`: per-block (index, value) pairs of argmin/argmax."""

    kind: str  # "argmin" or "argmax"
    base: Full
    axis: int


@dataclass(frozen=True)
class Streamed:
    """An iterator of blocks of one array, as Cubed's reductions and rechunks read them."""

    item: Any


Symbol = Full | Const | Offsets | Empty | ArgState | Partial | Streamed | list
