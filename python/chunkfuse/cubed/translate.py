"""Translates a Cubed plan DAG into native engine work and Python ops.

Every op is first given a symbol for its output (see `symbols`). An op is *native* when its
function is recognised over inputs the engine can read. Arrays that must exist on disk (the
computation's outputs, and the inputs of ops that run in Python) are written by the engine; a
native op whose output must be written but cannot be (a partial reduction state, a target the
engine cannot write) is turned into a Python op, and the walk repeats until it settles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import numpy as np
from cubed.core import ops
from cubed.primitive.blockwise import BlockwiseSpec, ChunkKey, FunctionArgs
from cubed.runtime.pipeline import visit_nodes

from chunkfuse.common.ir import IrBuilder
from chunkfuse.common.symbols import Full, NotNative
from chunkfuse.cubed.functions import (
    apply,
    block_id_inner,
    finished_plain,
    flatten_fused,
    unwrap,
)
from chunkfuse.cubed.joins import concat_kwargs, concat_symbol, stack_axis, stack_symbol
from chunkfuse.cubed.leaves import LeafResolver, array_url, regular_chunks, write_codec
from chunkfuse.cubed.symbols import Streamed

CREATE_ARRAYS = "create-arrays"


@dataclass(frozen=True)
class Write:
    """An array the engine writes: its symbol, Zarr URL, chunks and codec."""

    array: str
    symbol: Full
    url: str
    chunks: tuple[int, ...]
    codec: dict[str, Any] | None  # None: into the existing array, with its own codecs
    shards: tuple[int, ...] | None = None


#: Largest shard of an intermediate the engine writes (whole shards per task, so this bounds the
#: extra memory a write task holds).
SHARD_BYTES = 32 << 20

#: Arrays smaller than this are not sharded: few files anyway, and Cubed's small budgets
#: (tests use a few hundred bytes) must still fit a write task.
SHARD_MIN_ARRAY_BYTES = 16 << 20


def shard_shape(
    shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int, limit: int = SHARD_BYTES
) -> tuple[int, ...] | None:
    """Shards of whole chunks up to `limit` bytes (last axes grown first), or None when a
    shard would hold a single chunk."""
    shard = list(chunks)
    nbytes = math.prod(chunks) * itemsize
    for d in reversed(range(len(shape))):
        nchunks = -(-shape[d] // chunks[d])
        k = max(1, min(nchunks, limit // max(nbytes, 1)))
        shard[d] = chunks[d] * k
        nbytes *= k
    return None if tuple(shard) == tuple(chunks) else tuple(shard)


@dataclass
class Translation:
    """The outcome of translating one DAG."""

    builder: IrBuilder
    ops: list[tuple[str, dict[str, Any]]]
    native: dict[str, bool] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    writes: dict[str, list[Write]] = field(default_factory=dict)  # by producing op

    def arrays_created_later(self, dag: nx.MultiDiGraph) -> set[str]:
        """Arrays Cubed's create-arrays op need not make: those the engine creates itself when
        it writes them (a new array with codecs) and the outputs of native ops it never writes
        (fused away). `_Run` creates them only if their ops fall back to Python."""
        written = {w.array for ws in self.writes.values() for w in ws}
        by_engine = {w.array for ws in self.writes.values() for w in ws if w.codec is not None}
        fused_away = {
            a
            for name, _ in self.ops
            if name != CREATE_ARRAYS and self.native.get(name)
            for a in op_outputs(dag, name)
            if a not in written
        }
        return by_engine | fused_away


def op_outputs(dag: nx.MultiDiGraph, op: str) -> list[str]:
    """The array nodes an op writes."""
    return [a for a in dag.successors(op) if dag.nodes[a].get("type") == "array"]


def op_inputs(dag: nx.MultiDiGraph, op: str) -> list[str]:
    """The array nodes an op reads (not the housekeeping `arrays` node)."""
    return [a for a in dag.predecessors(op) if dag.nodes[a].get("type") == "array"]


def translate(
    dag: nx.MultiDiGraph,
    stage_dir: str,
    requested: set[str] | None,
    forced_python: set[str] | None = None,
) -> Translation:
    """Decide which ops run natively and what the engine writes."""
    forced = {op: "forced" for op in forced_python or ()}
    while True:
        t = _translate_once(dag, stage_dir, requested, forced)
        more = {
            op: reason[1:]
            for op, reason in t.reasons.items()
            if reason.startswith("!") and op not in forced
        }
        if not more:
            return t
        forced.update(more)


def _translate_once(
    dag: nx.MultiDiGraph, stage_dir: str, requested: set[str] | None, forced: dict[str, str]
) -> Translation:
    builder = IrBuilder()
    leaves = LeafResolver(builder, stage_dir)
    ops = list(visit_nodes(dag))
    t = Translation(builder, ops)
    visited = {name for name, _ in ops}
    symbols: dict[str, Any] = {}
    for name, node in dag.nodes(data=True):
        if node.get("type") != "array":
            continue
        producers = [p for p in dag.predecessors(name) if p in visited]
        if not producers:
            symbols[name] = leaves.symbol(name, node.get("target"))

    for name, node in ops:
        if name == CREATE_ARRAYS:
            continue
        outputs = op_outputs(dag, name)
        if name in forced:
            t.native[name] = False
            t.reasons[name] = forced[name]
            for a in outputs:
                symbols[a] = leaves.symbol(a, dag.nodes[a].get("target"))
            continue
        try:
            sym = _translate_op(builder, node, symbols)
            t.native[name] = True
            symbols[outputs[0]] = sym
        except NotNative as e:
            t.native[name] = False
            t.reasons[name] = str(e)
            for a in outputs:
                symbols[a] = leaves.symbol(a, dag.nodes[a].get("target"))

    needed = _needed_arrays(dag, t, visited, requested)
    python_inputs = {
        a
        for name, _ in ops
        if name != CREATE_ARRAYS and not t.native.get(name)
        for a in op_inputs(dag, name)
    }
    for name, _ in ops:
        if not t.native.get(name):
            continue
        for a in op_outputs(dag, name):
            if a not in needed:
                continue
            target = dag.nodes[a]["target"]
            try:
                write = _write_for(builder, a, target, symbols[a])
                # Cubed's intermediates that only the engine and zarr-python read back are
                # written sharded (fewer files); Python ops write chunk by chunk into theirs.
                nbytes = math.prod(target.shape) * np.dtype(target.dtype).itemsize
                if (
                    write.codec is not None
                    and not _user_target(a, target)
                    and a not in python_inputs
                    and nbytes >= SHARD_MIN_ARRAY_BYTES
                ):
                    shards = shard_shape(
                        tuple(target.shape), write.chunks, np.dtype(target.dtype).itemsize
                    )
                    write = replace(write, shards=shards)
                t.writes.setdefault(name, []).append(write)
            except NotNative as e:
                t.reasons[name] = f"!output {a} cannot be written natively: {e}"
    return t


def _needed_arrays(
    dag: nx.MultiDiGraph, t: Translation, visited: set[str], requested: set[str] | None
) -> set[str]:
    needed: set[str] = set()
    for name, _ in t.ops:
        if name == CREATE_ARRAYS:
            continue
        for a in op_outputs(dag, name):
            users = [s for s in dag.successors(a) if s in visited]
            if (
                not users
                or requested is None
                or a in requested
                or _user_target(a, dag.nodes[a].get("target"))
            ):
                needed.add(a)
        if not t.native.get(name):
            needed.update(op_inputs(dag, name))
    return needed


def _user_target(array: str, target: Any) -> bool:
    """A target the user gave (`store`, `to_zarr`), not one of Cubed's intermediates: written
    even when later ops read it."""
    from cubed.storage.zarr import LazyZarrArray

    if isinstance(target, LazyZarrArray):
        return target.path != array
    return target is not None


def _write_for(b: IrBuilder, array: str, target: Any, sym: Any) -> Write:
    if not isinstance(sym, Full):
        raise NotNative(f"holds a {type(sym).__name__}, not a whole array")
    if sym.dtype != np.dtype(target.dtype):
        sym = b.astype(sym, target.dtype)
    url = array_url(target)
    if url is None:
        raise NotNative("target is not on the local filesystem")
    if tuple(sym.shape) != tuple(target.shape):
        raise NotNative(f"shape {sym.shape} differs from the target's {tuple(target.shape)}")
    codec = write_codec(target)
    chunks = regular_chunks(target)
    return Write(array, sym, url, chunks, codec)


def _translate_op(b: IrBuilder, node: dict[str, Any], symbols: dict[str, Any]) -> Any:
    cfg = node["pipeline"].config
    if not isinstance(cfg, BlockwiseSpec):
        raise NotNative("not a blockwise op")
    if len(cfg.writes_map) != 1:
        raise NotNative("several outputs")
    target = next(iter(cfg.writes_map.values())).array
    if math.prod(target.shape) == 0:
        raise NotNative("empty output")
    fargs = cfg.back_key_function(ChunkKey("out", (0,) * len(target.shape)))

    def evaluate(preds: dict[str, Any], item: Any) -> Any:
        if isinstance(item, ChunkKey):
            sym = symbols.get(item.name)
            if sym is None:
                raise NotNative(f"input {item.name} cannot be read natively")
            return sym
        if isinstance(item, list):
            return [evaluate(preds, i) for i in item]
        if isinstance(item, FunctionArgs):
            if item.output_name in preds:
                root, sub = flatten_fused(preds[item.output_name])
                proxy = cfg.reads_map.get(item.output_name)
                if proxy is None:
                    raise NotNative(f"fused intermediate {item.output_name} has no metadata")
                args = [evaluate(sub or preds, a) for a in item.args]
                return apply(b, root, args, tuple(proxy.array.shape), proxy.array.dtype)
            args = [evaluate(preds, a) for a in item.args]
            return args[0] if len(args) == 1 else args
        try:
            first = next(iter(item))
        except (TypeError, StopIteration) as e:
            raise NotNative("unknown block argument") from e
        return Streamed(evaluate(preds, first))

    if node.get("op_name") == "rechunk":
        return _rechunk(b, cfg, target, [evaluate({}, a) for a in fargs.args])
    root, preds = flatten_fused(cfg.function)
    concat = concat_kwargs(root)
    if concat is not None:
        return concat_symbol(b, cfg, concat, lambda entry: evaluate(preds, entry))
    stack = stack_axis(root)
    if stack is not None:
        shape = tuple(target.shape)
        return stack_symbol(b, cfg, stack, shape, lambda entry: evaluate(preds, entry))
    args = [evaluate(preds, a) for a in fargs.args]
    # A finished sum/min/...: its state is the result itself.
    out = finished_plain(b, apply(b, root, args, tuple(target.shape), target.dtype), target.dtype)
    if isinstance(out, Full) and out.shape != tuple(target.shape):
        raise NotNative(f"result shape {out.shape} differs from Cubed's {tuple(target.shape)}")
    return out


def _rechunk(b: IrBuilder, cfg: BlockwiseSpec, target: Any, args: list[Any]) -> Full:
    inner = block_id_inner(cfg.function)
    fn, kw = unwrap(inner) if inner is not None else (None, {})
    if fn is not ops._assemble_index_chunk or kw.get("func") is not None:
        raise NotNative("rechunk op with an unknown function")
    src = args[0].item if args and isinstance(args[0], Streamed) else None
    if not isinstance(src, Full) or src.shape != tuple(target.shape):
        raise NotNative("rechunk of an unknown input")
    return b.rechunk(src, regular_chunks(target))
