"""Builds chunkfuse plan IR (docs/plan-ir.md) from symbols, one node at a time.

Nodes are kept by id; a plan for some writes takes exactly the nodes those writes depend on, so a
symbol built early can be written in any later engine run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from chunkfuse.common.symbols import Const, Full, NotNative, Partial

#: numpy ufunc names the IR evaluates natively (numpy name -> IR name).
UFUNCS: dict[str, str] = {
    **{
        n: n
        for n in (
            "negative sqrt exp log sin cos floor ceil logical_not add subtract multiply divide "
            "floor_divide remainder power maximum minimum equal not_equal less less_equal "
            "greater greater_equal logical_and logical_or logical_xor square sign trunc isnan "
            "isinf isfinite log1p expm1 exp2 log2 log10 tan arcsin arccos arctan sinh cosh tanh "
            "arctan2 hypot fmax fmin rint"
        ).split()
    },
    "absolute": "abs",
    "true_divide": "divide",
}

#: Functions numpy defines for complex numbers that the engine refuses for them (they run in
#: Python then).
COMPLEX_REFUSED = frozenset(
    "sign rint log1p expm1 exp2 log2 log10 tan arcsin arccos arctan sinh cosh tanh".split()
)

#: Reductions the IR runs in one streamed pass.
REDUCTIONS = frozenset(
    "sum prod min max mean var any all argmin argmax "
    "nansum nanprod nanmean nanmin nanmax nanvar nanargmin nanargmax".split()
)

#: Reductions that give indices along one axis.
ARG_REDUCTIONS = frozenset("argmin argmax nanargmin nanargmax".split())

#: Reductions that take a `dtype` (the accumulator's and the result's).
TYPED_REDUCTIONS = frozenset("sum prod mean nansum nanmean nanprod".split())

#: dtypes the IR knows.
DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float32 float64 complex64 complex128".split()
)


def ir_dtype(dtype: Any) -> str:
    """The IR name of a numpy dtype, or NotNative when the engine lacks it."""
    d = np.dtype(dtype)
    if d.fields is not None or d.name not in DTYPES or not d.isnative:
        raise NotNative(f"dtype {d} has no native kernel")
    return d.name


def const_json(value: Any, dtype: np.dtype) -> dict[str, Any]:
    """A typed IR constant for a numpy scalar."""
    name = ir_dtype(dtype)
    v = np.asarray(value, dtype=dtype).item()
    if isinstance(v, complex):
        return {"const": [_float(v.real), _float(v.imag)], "dtype": name}
    if isinstance(v, float):
        return {"const": _float(v), "dtype": name}
    return {"const": v, "dtype": name}


def _float(v: float) -> float | str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


class IrBuilder:
    """Accumulates IR nodes and source arrays; assembles plans for sets of writes."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.sources: dict[str, str] = {}
        self._source_ids: dict[str, str] = {}
        self._squeezes: dict[str, tuple[Full, tuple[int, ...]]] = {}
        self._count = 0

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}.{self._count}"

    def source(self, url: str, shape: tuple[int, ...], dtype: Any) -> Full:
        """A stored Zarr array (one IR input per URL)."""
        ir_dtype(dtype)
        sid = self._source_ids.get(url)
        if sid is None:
            sid = self._fresh("src")
            self._source_ids[url] = sid
            self.sources[sid] = url
        return Full(sid, tuple(shape), np.dtype(dtype))

    def elementwise(
        self, func: str, args: Sequence[Full | Const], shape: tuple[int, ...], dtype: Any
    ) -> Full:
        """`func(*args)` with numpy broadcasting, cast to `dtype` (Cubed's declared dtype)."""
        if func in COMPLEX_REFUSED and any(np.dtype(a.dtype).kind == "c" for a in args):
            raise NotNative(f"{func} of complex numbers")
        inputs: list[str] = []
        exprs: list[dict[str, Any]] = []
        for a in args:
            if isinstance(a, Const):
                exprs.append(const_json(a.value, a.dtype))
            else:
                if a.root not in inputs:
                    inputs.append(a.root)
                exprs.append({"input": inputs.index(a.root)})
        if not inputs:
            raise NotNative(f"{func} of constants only")
        arrays = [tuple(a.shape) for a in args if isinstance(a, Full)]
        try:
            spans = np.broadcast_shapes(*arrays)
        except ValueError:
            spans = None
        if spans != tuple(shape):
            # A constant standing for a whole array (Cubed's `ones`) broadcast the others.
            raise NotNative(f"{func} broadcast by a constant to {tuple(shape)}")
        expr: dict[str, Any] = {"op": func, "args": exprs}
        return self._elementwise(inputs, expr, shape, dtype)

    def astype(self, x: Full, dtype: Any) -> Full:
        """`x` cast to `dtype`.

        The symbol's dtype is Cubed's declared one, which the engine's own typing may not share
        (a reduction's accumulator type, say), so the cast is always written down; the engine
        drops a cast to the dtype a value already has.
        """
        node = self.nodes.get(x.root)
        if node is not None and node["op"] == "elementwise" and x.dtype == np.dtype(dtype):
            return x  # already ends in astype(dtype)
        return self._elementwise([x.root], {"input": 0}, x.shape, dtype)

    def _elementwise(
        self, inputs: list[str], expr: dict[str, Any], shape: tuple[int, ...], dtype: Any
    ) -> Full:
        name = ir_dtype(dtype)
        nid = self._fresh("ew")
        self.nodes[nid] = {
            "id": nid,
            "op": "elementwise",
            "inputs": inputs,
            "expr": {"op": "astype", "dtype": name, "args": [expr]},
        }
        return Full(nid, tuple(shape), np.dtype(dtype))

    def reduce(self, p: Partial, shape: tuple[int, ...], dtype: Any) -> Full:
        """The whole reduction a complete partial state stands for."""
        if not p.complete:
            raise NotNative("an incomplete partial reduction has no native form")
        if p.kind not in REDUCTIONS:
            raise NotNative(f"reduction {p.kind} has no native kernel")
        if any(p.base.shape[a] == 0 for a in p.axes):
            raise NotNative("reduction over an empty axis")
        nid = self._fresh("red")
        op: dict[str, Any] = {
            "id": nid,
            "op": "reduce",
            "input": p.base.root,
            "func": p.kind,
            "axes": list(p.axes),
            "keepdims": p.keepdims,
        }
        if p.kind in TYPED_REDUCTIONS and p.dtype is not None:
            op["dtype"] = ir_dtype(p.dtype)
        if p.kind in ("var", "std", "nanvar"):
            op["ddof"] = p.ddof
        if p.kind in ARG_REDUCTIONS and len(p.axes) != len(p.base.shape):
            # One axis, or every axis (the flattened index, as numpy's axis=None).
            if len(p.axes) != 1:
                raise NotNative("arg reduction over several axes")
            del op["axes"]
            op["axis"] = p.axes[0]
        self.nodes[nid] = op
        kept = p.shape
        out = Full(nid, kept, self.reduce_dtype(p))
        if kept != tuple(shape):
            raise NotNative(f"reduction shape {kept} differs from Cubed's {tuple(shape)}")
        return self.astype(out, dtype)

    @staticmethod
    def reduce_dtype(p: Partial) -> np.dtype:
        """The dtype the engine's reduction of `p` produces (numpy's rules)."""
        base = p.base.dtype
        if p.kind in ARG_REDUCTIONS:
            return np.dtype("int64")
        if p.kind in ("any", "all"):
            return np.dtype("bool")
        if p.kind in TYPED_REDUCTIONS and p.dtype is not None:
            return np.dtype(p.dtype)
        if p.kind in ("sum", "prod", "nansum", "nanprod"):
            return np.sum(np.zeros(1, dtype=base)).dtype
        if p.kind in ("mean", "var", "nanmean", "nanvar") and base.kind in "biu":
            return np.dtype("float64")
        if p.kind in ("var", "nanvar") and base.kind == "c":
            return np.dtype(base.char.lower()) if base.char in "FD" else np.dtype("float64")
        return base

    def slice(self, x: Full, selection: list[Any], shape: tuple[int, ...]) -> Full:
        """Basic indexing of `x` (ints drop axes)."""
        nid = self._fresh("sl")
        self.nodes[nid] = {"id": nid, "op": "slice", "input": x.root, "selection": selection}
        return Full(nid, tuple(shape), x.dtype)

    def transpose(self, x: Full, axes: tuple[int, ...]) -> Full:
        """`x` with its axes reordered: output axis k is input axis `axes[k]`."""
        nid = self._fresh("tr")
        self.nodes[nid] = {"id": nid, "op": "transpose", "input": x.root, "axes": list(axes)}
        return Full(nid, tuple(x.shape[a] for a in axes), x.dtype)

    def squeeze(self, x: Full, axes: tuple[int, ...], shape: tuple[int, ...]) -> Full:
        """`x` without its size-1 `axes`."""
        if any(x.shape[a] != 1 for a in axes):
            raise NotNative("squeeze of an axis longer than 1")
        out = self.slice(x, [0 if i in axes else None for i in range(len(x.shape))], shape)
        self._squeezes[out.root] = (x, tuple(sorted(axes)))
        return out

    def expand_dims(
        self, x: Full, axes: tuple[int, ...], shape: tuple[int, ...] | None = None
    ) -> Full:
        """`x` with new size-1 `axes` (positions in the result). The undoing of a squeeze gives
        back what was squeezed (Cubed squeezes a reduction's axes, xarray puts them back to
        broadcast against the input); anything else is a slice with new axes."""
        undone = self._squeezes.get(x.root)
        if undone is not None and undone[1] == tuple(sorted(axes)):
            return undone[0]
        rank = len(x.shape) + len(axes)
        new = {a + rank if a < 0 else a for a in axes}
        if len(new) != len(axes) or any(not 0 <= a < rank for a in new):
            raise NotNative(f"expand_dims with axes {axes} of a rank-{len(x.shape)} array")
        selection = ["newaxis" if d in new else None for d in range(rank)]
        out = list(x.shape)
        for d in sorted(new):
            out.insert(d, 1)
        if shape is not None and tuple(shape) != tuple(out):
            raise NotNative("expand_dims to another shape")
        nid = self._fresh("nx")
        self.nodes[nid] = {"id": nid, "op": "slice", "input": x.root, "selection": selection}
        return Full(nid, tuple(out), x.dtype)

    def concat(self, xs: Sequence[Full], axis: int) -> Full:
        """`xs` joined along `axis` (numpy's `concatenate`), cast to their common dtype."""
        first = xs[0].shape
        if any(
            len(x.shape) != len(first)
            or any(n != m for d, (n, m) in enumerate(zip(x.shape, first, strict=True)) if d != axis)
            for x in xs
        ):
            raise NotNative(f"a concat of shapes {[x.shape for x in xs]} along axis {axis}")
        dtype = np.result_type(*(x.dtype for x in xs))
        parts = [x if x.dtype == dtype else self.astype(x, dtype) for x in xs]
        shape = list(parts[0].shape)
        shape[axis] = sum(x.shape[axis] for x in parts)
        nid = self._fresh("cat")
        self.nodes[nid] = {
            "id": nid,
            "op": "concat",
            "inputs": [x.root for x in parts],
            "axis": axis,
        }
        return Full(nid, tuple(shape), dtype)

    def rechunk(self, x: Full, chunks: tuple[int, ...]) -> Full:
        """`x` with new chunks (the engine bounds its memory, multi-stage when needed). A
        rechunk of a rechunk reads the first one's input: Cubed's multi-stage rechunks become
        one engine rechunk, which plans its own stages."""
        source = x.root
        node = self.nodes.get(source)
        if node is not None and node["op"] == "rechunk":
            source = node["input"]
        nid = self._fresh("rc")
        self.nodes[nid] = {"id": nid, "op": "rechunk", "input": source, "chunks": list(chunks)}
        return Full(nid, x.shape, x.dtype)

    def fft(self, x: Full, block: Any, shape: tuple[int, ...], dtype: Any) -> Full:
        """`block` (a `chunkfuse.fft.FftBlock`) applied to the whole of `x`."""
        nid = self._fresh("fft")
        node: dict[str, Any] = {
            "id": nid,
            "op": "fft",
            "input": x.root,
            "norm": block.norm,
            "kind": block.kind + ("n" if block.nd else ""),
        }
        if block.nd:
            node.update(axes=list(block.axes), s=list(block.lengths))
        else:
            node.update(axis=block.axes[0], n=block.lengths[0])
        self.nodes[nid] = node
        return Full(nid, tuple(shape), np.dtype(dtype))

    def plan(
        self,
        name: str,
        writes: Sequence[
            tuple[Full, str, tuple[int, ...], dict[str, Any] | None, tuple[int, ...] | None]
        ],
    ) -> dict[str, Any]:
        """A plan that writes each `(symbol, url, chunks, codec, shards)`, with only the nodes
        it needs.

        A codec of None writes into the existing array at the URL, keeping its metadata.
        """
        needed: set[str] = set()
        stack = [w[0].root for w in writes]
        while stack:
            nid = stack.pop()
            if nid in needed:
                continue
            needed.add(nid)
            node = self.nodes.get(nid)
            if node is not None:
                stack.extend(node.get("inputs", []))
                if "input" in node:
                    stack.append(node["input"])
        arrays = [{"id": sid, "zarr": url} for sid, url in self.sources.items() if sid in needed]
        ops = [dict(node) for nid, node in self.nodes.items() if nid in needed]
        for i, (sym, url, chunks, codec, shards) in enumerate(writes):
            write: dict[str, Any] = {"id": f"write.{i}", "op": "write", "input": sym.root}
            if codec is None:
                write.update(target=url, existing=True)
            else:
                write.update(target=url, chunks=list(chunks), codec=codec, zarr_format=3)
                if shards is not None:
                    write["shards"] = list(shards)
            ops.append(write)
        return {"name": name, "arrays": arrays, "ops": ops}
