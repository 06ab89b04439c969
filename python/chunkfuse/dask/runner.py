"""Dask array tasks the engine runs: a symbolic pass over the graph, then one engine plan.

Each task is evaluated on *symbols* instead of data: a zarr getter gives the block of a stored
array, elementwise functions of blocks give blocks of a whole-array IR expression, a reduction's
chunk step and its combine/aggregate steps give the reduction of a region, a zarr store gives a
write. Keys whose values are symbols and that only symbolic tasks consume are never run. The
others that Python tasks (or the caller) need, the *roots*, are computed by one engine plan:
whole arrays written to uncompressed scratch arrays and read back block by block, writes straight
into their target arrays. Everything else runs its Python callable.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask._task_spec import DataNode, Task, _execute_subgraph

from chunkfuse.common.stored import wraps_stored_array
from chunkfuse.common.symbols import Full, NotNative
from chunkfuse.engine_calls import run_plan
from chunkfuse.reading import ArrayReader
from chunkfuse.reading import read as read_box

from .direct import direct_reads, read_directly
from .graph import topological
from .interpreter import Interpreter, materializable
from .joins import JoinBuilder, find_joins
from .scratch import base_dir
from .symbols import Blk, Lit, Red, Region, Src, Store, Stored, Symbol


@dataclass
class NativePart:
    """What the engine computed: values of the root keys, the keys it covered, and the
    blocks whose fused elementwise program ran on a GPU."""

    values: dict[Hashable, Any]
    covered: set[Hashable]
    gpu_blocks: int = 0
    #: The stages of the engine's run, as its summary records them.
    stages: list[dict[str, Any]] = field(default_factory=list)
    #: Fused tasks whose native first steps the engine computed, rebuilt with their values.
    tasks: dict[Hashable, Any] = field(default_factory=dict)


def symbols_of(graph: Mapping[Hashable, Any], interp: Interpreter) -> dict[Hashable, Symbol]:
    """The symbol of every top-level key that has one, in dependency order (twice when a
    concatenation's blocks are only known as one array once all were met)."""
    joins = find_joins(graph)
    if joins:
        interp.joins = JoinBuilder(interp, joins)
    symbols = _symbols_once(graph, interp)
    # A pass settles at least one more level of joins of joins.
    for _ in range(_MAX_PASSES):
        if interp.joins is None or not interp.joins.rerun():
            break
        interp.joins.again()
        interp.mixed.clear()
        symbols = _symbols_once(graph, interp)
    return symbols


#: The most passes over a graph with joins of joins (one per level of nesting settled).
_MAX_PASSES = 8


def _symbols_once(graph: Mapping[Hashable, Any], interp: Interpreter) -> dict[Hashable, Symbol]:
    symbols: dict[Hashable, Any] = {}
    failed: set[Hashable] = set()
    interp.reasons.clear()
    for key in topological(graph):
        node = graph[key]
        if any(d in failed for d in node.dependencies):
            failed.add(key)
            interp.reasons[key] = "it reads the value of a task that runs in Python"
            continue
        try:
            value = interp.node(node, symbols)
        except Exception as e:  # noqa: BLE001 - anything unrecognised runs in Python, which
            # raises the task's own error with its key if the task itself fails.
            failed.add(key)
            interp.reasons[key] = str(e) if isinstance(e, NotNative) else _unknown(node, e)
            if isinstance(node, Task):
                prefix = interp.native_prefix(node, symbols)
                if prefix:
                    interp.mixed[key] = prefix
            continue
        if isinstance(value, Src | Blk | Red | Store | Stored):
            symbols[key] = value
        elif isinstance(node, DataNode):
            symbols[key] = Lit(value)
        else:
            failed.add(key)
            interp.reasons[key] = "its value is not an array the engine computes"
    return symbols


def _unknown(node: Any, e: Exception) -> str:
    """Why a task the interpreter could not read runs in Python."""
    func = getattr(node, "func", None)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    what = f"function {name}" if name else type(node).__name__
    return f"{what} is not one the engine runs ({type(e).__name__}: {e})"


def has_zarr_arrays(graph: Mapping[Hashable, Any]) -> bool:
    """True when the graph holds a zarr array, or xarray's lazy wrapper of one: as a node, as
    a direct argument of a task (legacy tuple or task form: Dask inlines stored arrays into
    their getters), or inside a fused task's subgraph. Keys and other nested arguments are not
    searched: this runs on every graph, and must stay cheap for many small Python tasks."""
    return any(_holds_stored_array(node) for node in graph.values())


#: Types that are never a stored array: the keys and literals of most task arguments.
_PLAIN = frozenset({int, float, str, bool, bytes, tuple, type(None)})


def _holds_stored_array(node: Any) -> bool:
    if type(node) is tuple:
        # A legacy task: the callable, then its arguments.
        args: Any = node[1:] if node and callable(node[0]) else ()
    elif isinstance(node, Task):
        if node.func is _execute_subgraph and node.args and isinstance(node.args[0], Mapping):
            return has_zarr_arrays(node.args[0])
        args = (*node.args, *node.kwargs.values())
    else:
        return wraps_stored_array(node.value if isinstance(node, DataNode) else node)
    for a in args:
        if type(a) not in _PLAIN and wraps_stored_array(a.value if isinstance(a, DataNode) else a):
            return True
    return False


@dataclass
class NativeSelection:
    """The part of a graph the engine computes: the interpreter that read it, the symbols
    of the roots (and of fused tasks' native first steps) to compute, the root keys, and every
    key the engine covers."""

    interp: Interpreter
    todo: dict[Hashable, Symbol]
    roots: set[Hashable]
    covered: set[Hashable]


def select_native(
    graph: Mapping[Hashable, Any], wanted: set[Hashable], *, mixed: bool = True
) -> NativeSelection | None:
    """What of `graph` the engine computes for the keys `wanted`; None when nothing.
    `mixed=False` leaves fused tasks whose first steps only are native to Python whole (their
    steps' values cannot be handed to them before the engine has run)."""
    if not has_zarr_arrays(graph):
        return None
    interp = Interpreter()
    symbols = symbols_of(graph, interp)
    _demote_partial_stores(graph, symbols, interp)
    if not mixed:
        for k in interp.mixed:
            interp.reasons.setdefault(k, "a fused task whose first steps only are native")
        interp.mixed.clear()
    if not interp.mixed and not any(
        isinstance(s, Blk | Red | Store | Stored) for s in symbols.values()
    ):
        return None
    # A fused task with native first steps, rebuilt with their values (placeholders until
    # the engine has run): it no longer depends on what only those steps read.
    rebuilt = {
        k: _with_inner_values(graph[k], {i: None for i in p}) for k, p in interp.mixed.items()
    }
    dependents: dict[Hashable, set[Hashable]] = {k: set() for k in graph}
    for k, n in graph.items():
        for d in rebuilt.get(k, n).dependencies:
            if d in dependents:
                dependents[d].add(k)
    while True:
        roots = {
            k
            for k, s in symbols.items()
            if k in wanted or any(d not in symbols for d in dependents[k])
        }
        demote = {k for k in roots if not materializable(symbols[k], k in wanted)}
        if not demote:
            break
        for k in demote:
            del symbols[k]
            interp.reasons[k] = "the engine cannot give Python a reduction's partial result"
    roots = {k for k in roots if not isinstance(symbols[k], Src | Lit)}
    if not roots and not interp.mixed:
        return None
    todo: dict[Hashable, Any] = {k: symbols[k] for k in roots}
    for k, prefix in interp.mixed.items():
        todo.update({_InnerKey(k, i): sym for i, sym in prefix.items()})
    # Source arrays and literals stay in the graph (roots never are either): Python tasks
    # may read them.
    covered = {k for k, s in symbols.items() if not isinstance(s, Src | Lit)}
    return NativeSelection(interp, todo, roots, covered)


def run_native(
    graph: Mapping[Hashable, Any],
    wanted: set[Hashable],
    *,
    max_mem: int | None,
    threads: int,
    device: str = "cpu",
    work_dir: str | None = None,
    on_start: Callable[[set[Hashable]], None] | None = None,
) -> NativePart | None:
    """Computes the graph's native part with the engine (fused elementwise programs on
    `device`, scratch in a directory of its own in `scratch.base_dir(work_dir)`, removed
    when it returns); None when nothing is native. `on_start` is called with the keys the
    engine covers just before it runs."""
    selection = select_native(graph, wanted)
    if selection is None:
        return None
    interp, todo, roots, covered = (
        selection.interp,
        selection.todo,
        selection.roots,
        selection.covered,
    )
    if on_start is not None:
        on_start(covered)
    try:
        # Blocks of stored arrays only: read directly, with no plan run nor scratch array.
        reads = None if interp.mixed else direct_reads(todo, interp.b)
        if reads is not None:
            return NativePart(read_directly(reads, threads), covered)
        with tempfile.TemporaryDirectory(prefix="chunkfuse-dask-", dir=base_dir(work_dir)) as tmp:
            computed, summary = _compute(interp, todo, tmp, max_mem, threads, device)
    except NotNative:
        raise
    except Exception as e:
        example = next(iter(sorted(roots, key=repr)), None)
        e.add_note(
            f"chunkfuse.dask: raised by the engine's run of {len(covered)} tasks"
            + (f" (among them the task with key {example!r})" if example is not None else "")
        )
        raise
    values = {k: v for k, v in computed.items() if not isinstance(k, _InnerKey)}
    tasks = {
        k: _with_inner_values(graph[k], {i: computed[_InnerKey(k, i)] for i in prefix})
        for k, prefix in interp.mixed.items()
    }
    return NativePart(values, covered, summary["gpu_blocks"], summary["stages"], tasks)


def _stores_of(sym: Symbol) -> tuple[Store, ...]:
    """The writes a symbol stands for."""
    if isinstance(sym, Store):
        return (sym,)
    if isinstance(sym, Stored):
        return sym.stores
    return ()


def _demote_partial_stores(
    graph: Mapping[Hashable, Any], symbols: dict[Hashable, Symbol], interp: Interpreter
) -> None:
    """Takes out of `symbols` the stores into targets that the engine cannot write as one
    box (stores that overlap, leave holes or do not form a grid of boxes), and every symbol
    that reads one: those stores run Dask's `load_store_chunk` in Python. What they store is
    still computed by the engine (a fused store task keeps its native steps, as
    `native_prefix` finds them). Stores tiling a box of their target (xarray's `region=` and
    `append_dim` writes, `da.store(..., regions=...)`) stay: the engine writes the box."""
    by_url: dict[str, dict[Region, Store]] = {}
    doubled: set[str] = set()
    for sym in symbols.values():
        for st in _stores_of(sym):
            boxes = by_url.setdefault(st.url, {})
            if boxes.setdefault(st.box, st) != st:
                doubled.add(st.url)  # two stores into one box
    partial: set[str] = set(doubled)
    for url, boxes in by_url.items():
        try:
            interp.stored_boxes(list(boxes.values()))
        except NotNative:
            partial.add(url)
    if not partial:
        return
    demoted = {k for k, s in symbols.items() if any(st.url in partial for st in _stores_of(s))}
    dependents: dict[Hashable, list[Hashable]] = {}
    for k, node in graph.items():
        for d in node.dependencies:
            dependents.setdefault(d, []).append(k)
    stack = list(demoted)
    while stack:
        for d in dependents.get(stack.pop(), ()):
            if d in symbols and d not in demoted:
                demoted.add(d)
                stack.append(d)
    for k in demoted:
        del symbols[k]
    for k in demoted:
        node = graph[k]
        if isinstance(node, Task):
            prefix = interp.native_prefix(node, symbols)
            if prefix:
                interp.mixed[k] = prefix


@dataclass(frozen=True)
class _InnerKey:
    """The key of an inner step of fused task `task` among the engine's results."""

    task: Hashable
    inner: Hashable


def _with_inner_values(task: Task, values: dict[Hashable, Any]) -> Task:
    """Fused `task` with the inner steps in `values` replaced by their values, and without
    the dependencies that only those steps read.

    The subgraph's steps name its inputs by inner keys (Blockwise's ``__dask_blockwise__N``
    tokens), each bound to one of the task's outer arguments (a reference to another key, or
    data such as a store's target array); the rebuilt task keeps the pairs still read."""
    inner, outkey, inkeys, *deps = task.args
    replaced = {k: (DataNode(k, values[k]) if k in values else n) for k, n in inner.items()}
    # Only the steps the output still needs: a replaced step's own inputs drop out.
    nodes: dict[Hashable, Any] = {}
    stack = [outkey]
    while stack:
        k = stack.pop()
        if k in nodes or k not in replaced:
            continue
        nodes[k] = replaced[k]
        stack.extend(nodes[k].dependencies)
    read = {d for n in nodes.values() for d in n.dependencies if d not in nodes}
    pairs = [(k, d) for k, d in zip(inkeys, deps, strict=True) if k in read]
    return Task(
        task.key,
        _execute_subgraph,
        nodes,
        outkey,
        tuple(k for k, _ in pairs),
        *(d for _, d in pairs),
    )


@dataclass
class EnginePlan:
    """The plan that computes a graph's roots: scratch arrays (by root array, with their
    URL) for the blocks Python reads back, and the roots' symbols (a reduction's as a block of
    its whole result)."""

    plan: dict[str, Any]
    scratch: dict[str, tuple[Full, str]]
    roots: dict[Hashable, Symbol]


def engine_plan(interp: Interpreter, roots: dict[Hashable, Symbol], tmp: str) -> EnginePlan:
    """The plan IR computing `roots`, its scratch arrays under the directory `tmp`."""
    b = interp.b
    # A reduction's value is a block of the reduction's whole result.
    roots = {k: interp.reduced(s) if isinstance(s, Red) else s for k, s in roots.items()}
    scratch: dict[str, tuple[Full, str]] = {}
    # The blocks Python reads back from each scratch array, which its chunks follow.
    blocks: dict[str, list[Region]] = {}
    stores: dict[str, list[Store]] = {}
    for sym in roots.values():
        if isinstance(sym, Blk):
            scratch.setdefault(sym.full.root, (sym.full, ""))
            blocks.setdefault(sym.full.root, []).append(sym.region)
        elif isinstance(sym, Store):
            stores.setdefault(sym.url, []).append(sym)
        elif isinstance(sym, Stored):
            for st in sym.stores:
                stores.setdefault(st.url, []).append(st)
    writes: list[tuple[Full, str, tuple[int, ...], dict[str, Any] | None, None]] = []
    for i, (root, (full, _)) in enumerate(sorted(scratch.items())):
        url = f"{tmp}/{i}.zarr"
        scratch[root] = (full, url)
        chunks = _scratch_chunks(full, blocks[root])
        writes.append((full, url, chunks, {"name": "none"}, None))
    # Where each write into part of its target starts (by the write's place in `writes`);
    # a target may take several writes, into boxes apart.
    regions: dict[int, list[int]] = {}
    for url, parts in stores.items():
        # Each target's stores tile a box of it (`_demote_partial_stores`).
        shape = parts[0].shape
        for box, values in interp.stored_boxes(list({p.box: p for p in parts}.values())):
            if box != tuple((0, n) for n in shape):
                regions[len(writes)] = [a for a, _ in box]
            writes.append((interp._region_of(values), url, shape, None, None))
    plan = b.plan("dask", writes)
    for op in plan["ops"]:
        at = _write_index(op)
        if at is not None and at in regions:
            op["region"] = regions[at]
    return EnginePlan(plan, scratch, roots)


def _compute(
    interp: Interpreter,
    roots: dict[Hashable, Symbol],
    tmp: str,
    max_mem: int | None,
    threads: int,
    device: str,
) -> tuple[dict[Hashable, Any], dict[str, Any]]:
    planned = engine_plan(interp, roots, tmp)
    plan, scratch, roots = planned.plan, planned.scratch, planned.roots
    summary = run_plan(
        plan, max_mem=max_mem, threads=threads, work_dir=tmp, resume=False, device=device
    )
    values: dict[Hashable, Any] = {}
    opened: dict[str, ArrayReader] = {}

    def read(full: Full, region: Region) -> np.ndarray:
        # The engine's read path (its threads, the GIL released), not zarr-python's.
        url = scratch[full.root][1]
        reader = opened.get(url)
        if reader is None:
            reader = opened[url] = ArrayReader(url)
        box = tuple(slice(a, b2) for a, b2 in region)
        return np.asarray(read_box(reader, box, threads=threads))

    for key, sym in roots.items():
        if isinstance(sym, Blk):
            values[key] = read(sym.full, sym.region)
        elif isinstance(sym, Stored):
            values[key] = sym.template
        else:
            values[key] = None
    return values, summary


def _write_index(op: dict[str, Any]) -> int | None:
    """The place in the builder's `writes` of the plan's write op `op` (`write.<i>`)."""
    if op.get("op") != "write":
        return None
    return int(str(op["id"]).rsplit(".", 1)[-1])


def _scratch_chunks(full: Full, blocks: list[Region]) -> tuple[int, ...]:
    """Chunks of a scratch array: the `blocks` Python reads back from it when they lie on
    one regular grid (Dask's chunks), so that each block reads its own chunk and no other;
    else about 16 MB, whole trailing axes first."""
    grid = _block_grid(full.shape, blocks)
    if grid is not None:
        return grid
    itemsize = full.dtype.itemsize
    budget = max(1, (16 << 20) // max(1, itemsize))
    chunks = []
    inner = 1
    for n in reversed(full.shape):
        n = max(1, n)
        take = max(1, min(n, budget // inner))
        chunks.append(take)
        inner *= take
    return tuple(reversed(chunks))


def _block_grid(shape: tuple[int, ...], blocks: list[Region]) -> tuple[int, ...] | None:
    """The regular chunk grid whose chunks are `blocks` (per axis: the largest block's
    length, every block starting on a multiple of it and ending on one or at the array's
    end); None when they lie on no such grid."""
    if not blocks:
        return None
    grid = []
    for d, n in enumerate(shape):
        size = max(b[d][1] - b[d][0] for b in blocks)
        if size <= 0:
            if n > 0:
                return None
            grid.append(1)
            continue
        if any(b[d][0] % size or (b[d][1] != n and b[d][1] % size) for b in blocks):
            return None
        grid.append(size)
    return tuple(grid)
