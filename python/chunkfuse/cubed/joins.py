"""Cubed's `concat` and `stack` as the engine's `concat` op (`stack`: of inputs given a new
axis each).

Cubed joins arrays with one blockwise op whose function, `_read_concat_chunk`, copies the slices
of the inputs each output block spans. The op entries its inputs only through its key function
(which chunks of which arrays an output block reads), and an array may be an input twice, so the
inputs are recovered in order from the key function: for each input, the output block holding its
first element lists the chunks of every input it spans, input by input.
"""

from __future__ import annotations

from bisect import bisect
from collections.abc import Callable, Sequence
from typing import Any

from cubed.array_api import manipulation_functions
from cubed.primitive.blockwise import BlockwiseSpec, ChunkKey, FunctionArgs

from chunkfuse.common.ir import IrBuilder
from chunkfuse.common.symbols import Full, NotNative
from chunkfuse.cubed.functions import block_id_inner, unwrap


def concat_kwargs(function: Any) -> dict[str, Any] | None:
    """The keyword arguments of Cubed's concat function when `function` is it, else None."""
    inner = block_id_inner(function)
    if inner is None:
        return None
    fn, kw = unwrap(inner)
    if fn is not manipulation_functions._read_concat_chunk:
        return None
    return kw


def _overlapping(chunks: int | Sequence[int], lo: int, hi: int) -> int:
    """How many of the chunks along one axis (a regular size, or each chunk's size) overlap
    [lo, hi)."""
    if hi <= lo:
        return 0
    if isinstance(chunks, int):
        return (hi - 1) // chunks - lo // chunks + 1
    count, start = 0, 0
    for n in chunks:
        if start < hi and start + n > lo:
            count += 1
        start += n
    return count


def _name(entry: Any) -> str:
    """The array a key-function entry reads: a stored chunk's, or a fused step's output."""
    if isinstance(entry, ChunkKey):
        return entry.name
    if isinstance(entry, FunctionArgs) and entry.output_name is not None:
        return entry.output_name
    raise NotNative("a concat whose key function lists other keys")


def concat_inputs(cfg: BlockwiseSpec, kw: dict[str, Any]) -> list[Any]:
    """Each input of a concat op, in order, as the key-function entry of its first chunk (a
    stored array's `ChunkKey`, or the `FunctionArgs` of a step fused into the op); None for an
    input of length 0."""
    axis, offsets, in_shapes = kw["axis"], kw["offsets"], kw["in_shapes"]
    chunks, shape = kw["target_chunks"], kw["target_shape"]
    size = chunks[axis][0]
    entries: list[Any] = []
    for i, in_shape in enumerate(in_shapes):
        if in_shape[axis] == 0:
            entries.append(None)
            continue
        block = offsets[i] // size
        coords = tuple(block if d == axis else 0 for d in range(len(shape)))
        keys = list(cfg.back_key_function(ChunkKey("out", coords)).args[0])
        start, stop = block * size, min((block + 1) * size, shape[axis])
        pos = 0
        entry = None
        for j, part in _slices(offsets, start, stop):
            if pos >= len(keys):
                raise NotNative("a concat whose key function lists fewer keys")
            if j == i:
                entry = keys[pos]
                break
            proxy = cfg.reads_map.get(_name(keys[pos]))
            if proxy is None:
                raise NotNative("a concat input without metadata")
            arr_chunks = proxy.array.chunks
            spans = [
                _overlapping(arr_chunks[d], part.start, part.stop)
                if d == axis
                else _overlapping(arr_chunks[d], 0, chunks[d][0])
                for d in range(len(shape))
            ]
            n = 1
            for s in spans:
                n *= s
            pos += n
        if entry is None:
            raise NotNative("a concat input not found in its key function")
        entries.append(entry)
    return entries


def _slices(offsets: Sequence[int], start: int, stop: int) -> list[tuple[int, slice]]:
    """Which input, and which slice of it, each part of [start, stop) of the join is."""
    out = []
    at = start
    while at < stop:
        i = bisect(offsets, at) - 1
        end = min(stop, offsets[i + 1])
        out.append((i, slice(at - offsets[i], end - offsets[i])))
        at = end
    return out


def concat_symbol(
    b: IrBuilder, cfg: BlockwiseSpec, kw: dict[str, Any], symbol_of: Callable[[Any], Any]
) -> Full:
    """The IR `concat` of a concat op's inputs; `symbol_of` gives an input's whole-array
    symbol from its key-function entry."""
    parts: list[Full] = []
    for entry in concat_inputs(cfg, kw):
        if entry is None:
            continue
        sym = symbol_of(entry)
        if not isinstance(sym, Full):
            raise NotNative(f"concat input {_name(entry)} cannot be read natively")
        parts.append(sym)
    if not parts:
        raise NotNative("a concat of empty arrays only")
    return b.concat(parts, int(kw["axis"]))


def stack_axis(function: Any) -> int | None:
    """The new axis of Cubed's stack function when `function` is it, else None."""
    fn, kw = unwrap(function)
    if fn is not manipulation_functions._read_stack_chunk or set(kw) != {"axis"}:
        return None
    return int(kw["axis"])


def stack_symbol(
    b: IrBuilder,
    cfg: BlockwiseSpec,
    axis: int,
    shape: tuple[int, ...],
    symbol_of: Callable[[Any], Any],
) -> Full:
    """The inputs of a stack op (of result `shape`), each with the new `axis`, joined along
    it: output block `i` along the axis is input `i`'s block."""
    parts: list[Full] = []
    for i in range(shape[axis]):
        coords = tuple(i if d == axis else 0 for d in range(len(shape)))
        (entry,) = cfg.back_key_function(ChunkKey("out", coords)).args
        sym = symbol_of(entry)
        if not isinstance(sym, Full):
            raise NotNative(f"stack input {_name(entry)} cannot be read natively")
        parts.append(b.expand_dims(sym, (axis,)))
    return b.concat(parts, axis)
