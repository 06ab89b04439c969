"""Python ops through the engine: the engine reads, decodes, encodes and writes each chunk; only
the op's own function (Cubed's fused function around the user's code) runs under the GIL.

An op qualifies when it writes one plain (not structured), unsharded local Zarr array, one whole
chunk per task, and reads only local Zarr arrays (sharded ones by their inner chunks) besides
Cubed's virtual inputs (block offsets, small in-memory arrays), which are served in Python. Other
ops run Cubed's own task function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr
from cubed.primitive.blockwise import (
    BlockwiseSpec,
    ChunkKey,
    FunctionArgs,
    get_results_in_different_scope,
    key_to_slices,
)
from cubed.runtime.types import Callback
from cubed.storage.virtual import VirtualArray
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.bytes import Endian

import chunkfuse._engine as _engine
from chunkfuse.cubed.budget import engine_call
from chunkfuse.cubed.events import TaskProgress
from chunkfuse.cubed.leaves import array_url


@dataclasses.dataclass
class EngineOp:
    """What the engine needs to run one Python op."""

    inputs: dict[str, tuple[int, zarr.Array]]  # read name -> (input number, array)
    urls: list[str]
    target: zarr.Array
    target_url: str
    tasks: list[tuple[int, ...]]  # output chunk coords, in task order
    reads: list[list[tuple[int, tuple[int, ...]]]]


def _plain_local(arr: Any, *, read: bool = False) -> str | None:
    """The URL of a local, non-empty Zarr array of a numeric dtype (not strings, objects,
    records or datetimes, which stay with Cubed's Python path), or None: unsharded, or for
    an array only read (`read`), sharded with a shard index the engine reads itself (its
    inner chunks, which Cubed's tasks name, are then read one by one)."""
    if not isinstance(arr, zarr.Array) or 0 in arr.shape:
        return None
    dtype = arr.dtype
    if not isinstance(dtype, np.dtype) or dtype.fields is not None or dtype.kind not in "biufc":
        return None
    codecs = getattr(arr.metadata, "codecs", ())
    sharded = any(isinstance(c, ShardingCodec) for c in codecs)
    if sharded and not (read and _standard_shards(codecs)):
        return None
    return array_url(arr)


def _standard_shards(codecs: Sequence[Any]) -> bool:
    """Whether an array's only codec is sharding with the standard index (little-endian
    bytes, optionally crc32c), as zarr-python and the engine write it."""
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return False
    index = codecs[0].index_codecs
    first = index[0] if index else None
    little = isinstance(first, BytesCodec) and first.endian in (None, Endian.little)
    rest = tuple(type(c) for c in index[1:])
    return little and rest in ((), (Crc32cCodec,))


def prepare(node: dict[str, Any]) -> EngineOp | None:
    """The engine form of an op's tasks, or None when the op does not qualify."""
    cfg = node["pipeline"].config
    if not isinstance(cfg, BlockwiseSpec) or len(cfg.writes_map) != 1:
        return None
    if cfg.return_writes_stores or any(n != 1 for n in cfg.num_output_blocks):
        return None
    proxy = next(iter(cfg.writes_map.values()))
    try:
        target = proxy.open()
    except Exception:
        return None
    target_url = _plain_local(target)
    if target_url is None or tuple(proxy.chunks) != tuple(target.chunks):
        return None
    inputs: dict[str, tuple[int, zarr.Array]] = {}
    urls: list[str] = []
    tasks: list[tuple[int, ...]] = []
    reads: list[list[tuple[int, tuple[int, ...]]]] = []
    for m in node["pipeline"].mappable:
        coords = tuple(int(c) for c in m)
        keys: list[ChunkKey] = []
        _collect(cfg.back_key_function(ChunkKey("out", coords)), keys)
        task_reads = []
        for k in keys:
            src = cfg.reads_map.get(k.name)
            if src is None:
                return None
            if isinstance(src.array, VirtualArray):
                continue  # served in Python by Cubed's own proxy
            if k.name not in inputs:
                arr = src.open()
                url = _plain_local(arr, read=True)
                if url is None:
                    return None
                inputs[k.name] = (len(urls), arr)
                urls.append(url)
            task_reads.append((inputs[k.name][0], tuple(int(c) for c in k.coords)))
        tasks.append(coords)
        reads.append(task_reads)
    return EngineOp(inputs, urls, target, target_url, tasks, reads)


def _collect(node: Any, out: list[ChunkKey]) -> None:
    """Every ChunkKey of a back-key structure, in a fixed traversal order."""
    if isinstance(node, ChunkKey):
        out.append(node)
    elif isinstance(node, FunctionArgs):
        for a in node.args:
            _collect(a, out)
    elif isinstance(node, (list, tuple)):
        for a in node:
            _collect(a, out)
    else:  # an iterator of keys (reductions, rechunks)
        for a in node:
            _collect(a, out)


class _Served:
    """Stands in for a stored input inside one task: serves the chunks the engine decoded."""

    def __init__(self, arr: zarr.Array, chunks: dict[tuple[int, ...], list[np.ndarray]]) -> None:
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.chunks = arr.chunks
        self.ndim = arr.ndim
        self._chunks = chunks

    def __getitem__(self, selection: tuple[slice, ...]) -> np.ndarray:
        coords = tuple(s.start // c for s, c in zip(selection, self.chunks, strict=True))
        return self._chunks[coords].pop()


class _ServedProxy:
    def __init__(self, served: _Served, chunks: Any) -> None:
        self.array = served
        self.chunks = chunks
        self._served = served

    def open(self) -> _Served:
        return self._served


def run(
    name: str,
    node: dict[str, Any],
    op: EngineOp,
    callbacks: Sequence[Callback] | None,
    workers: int,
    max_mem: Any,
    work_dir: str | None,
) -> int:
    """Run the op's tasks in the engine; fire a TaskEndEvent as each finishes."""
    cfg: BlockwiseSpec = node["pipeline"].config
    target = op.target
    by_number = {number: (read_name, arr) for read_name, (number, arr) in op.inputs.items()}

    def compute(task: int, buffers: list[bytearray]) -> bytes:
        coords = op.tasks[task]
        served: dict[str, dict[tuple[int, ...], list[np.ndarray]]] = {}
        for (number, idx), buf in zip(op.reads[task], buffers, strict=True):
            read_name, arr = by_number[number]
            region = key_to_slices(idx, arr)
            shape = tuple(s.stop - s.start for s in region)
            chunk = np.frombuffer(buf, dtype=arr.dtype).reshape(shape)
            served.setdefault(read_name, {}).setdefault(idx, []).append(chunk)
        reads_map = dict(cfg.reads_map)
        for read_name, chunks in served.items():
            arr = op.inputs[read_name][1]
            reads_map[read_name] = _ServedProxy(_Served(arr, chunks), arr.chunks)
        task_cfg = dataclasses.replace(cfg, reads_map=reads_map)
        try:
            result = get_results_in_different_scope(list(coords), config=task_cfg)
        except BaseException as e:
            e.add_note(f"chunkfuse: in Cubed op {name!r}, output chunk {list(coords)}")
            raise
        region = key_to_slices(coords, target)
        shape = tuple(s.stop - s.start for s in region)
        out = _fitted(np.asarray(result, dtype=target.dtype), shape)
        return np.ascontiguousarray(out).tobytes()

    progress = TaskProgress([(name, len(op.tasks))], callbacks)
    tasks = [
        (list(t), [(n, list(i)) for n, i in r]) for t, r in zip(op.tasks, op.reads, strict=True)
    ]
    engine_call(
        max_mem,
        lambda budget: _engine.run_chunk_function(
            f"Cubed op {name}",
            op.urls,
            op.target_url,
            target.dtype.name,
            tasks,
            compute,
            budget,
            workers,
            work_dir,
            progress if callbacks else None,
        ),
    )
    progress.finish()
    return len(op.tasks)


def _fitted(block: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`block` as the output chunk of `shape`: broadcast when smaller, its leading part when
    larger along some axes, as Cubed's own executors store it through zarr (Cubed's float
    `arange` gives a block one value too long where the step does not divide exactly)."""
    if block.ndim == len(shape) and any(b > s for b, s in zip(block.shape, shape, strict=True)):
        block = block[tuple(slice(0, s) for s in shape)]
    return np.broadcast_to(block, shape)
