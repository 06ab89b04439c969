"""Property tests: elementwise expressions and reductions computed by chunkfuse equal numpy's.

Each hypothesis example writes a few small Zarr v3 arrays (irregular last chunks, fill values,
deleted chunks), runs the CLI once on a plan with several outputs, reads every output back with
zarr-python 3 and compares values, shape and dtype with numpy evaluating the same expression.

Comparison rules
- integer and bool results, and float results of IEEE-exact operations (+ - * / sqrt, casts,
  comparisons, min/max, where, clip, floor/ceil, floor_divide/remainder as numpy defines them):
  exact, NaN == NaN;
- results that went through exp/log/sin/cos/power (float) or complex multiply/divide/abs/sqrt,
  whose last bits differ between math libraries: ``rtol`` 2e-5 (single) / 1e-11 (double) plus an
  absolute tolerance of the same size relative to the largest intermediate magnitude. Operations
  whose result jumps (comparisons, casts to int, floor, log/sqrt near 0, division, ...) are only
  ever applied to exact sub-expressions, so a last-bit difference cannot flip them;
- float sums/means/products: within ``max(1e-5, 4 (n + 1) eps)`` relative to ``sum(|x|)`` (mean:
  ``max |x|``, product: ``|prod x|``), var/std within that relative to ``4 mean(|x|^2)``;
  complex products past the dtype's range are non-finite in both (numpy's complex64 multiply
  turns inf * 0 into NaN; the engine multiplies in complex128 and overflows as it casts);
- min/max/argmin/argmax and their nan variants: exact (an all-NaN lane makes numpy refuse
  nanargmin/nanargmax; `test_nanargmin_of_an_all_nan_lane_is_an_error` covers the engine's refusal).

Inputs numpy leaves undefined are never generated: float->int casts of NaN or out-of-range
values, integer division/remainder by zero (or MIN // -1), integer powers with negative exponents,
complex ordering, results in dtypes outside the plan IR (float16).

Set ``CHUNKFUSE_HYPOTHESIS_EXAMPLES`` to change the number of examples per test.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from conftest import (
    ENGINE_DTYPES,
    apply_missing,
    assert_no_partial_files,
    chunk_grid,
    dtype_eps,
    read_zarr,
    single_precision,
    tolerance_floor,
    write_v3,
)
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

EXAMPLES = int(os.environ.get("CHUNKFUSE_HYPOTHESIS_EXAMPLES", "30"))

PROPERTY_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
    print_blob=True,
)

RunPlan = Callable[..., dict[str, Any]]

#: Float functions of one argument beside exp, log, sin and cos (no complex values).
FLOAT_MATH = (
    "log1p",
    "expm1",
    "exp2",
    "log2",
    "log10",
    "tan",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
)
UNARY = (
    "negative",
    "abs",
    "sqrt",
    "exp",
    "log",
    "sin",
    "cos",
    "floor",
    "ceil",
    "logical_not",
    "square",
    "sign",
    "trunc",
    "isnan",
    "isinf",
    "isfinite",
    "rint",
    *FLOAT_MATH,
)
BINARY = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "floor_divide",
    "remainder",
    "power",
    "maximum",
    "minimum",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "arctan2",
    "hypot",
    "fmax",
    "fmin",
)
#: numpy orders complex numbers lexicographically; the engine need not.
ORDERING = {
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "maximum",
    "minimum",
    "clip",
    "fmax",
    "fmin",
}
#: Ops numpy defines for complex numbers that the engine refuses for them.
COMPLEX_REFUSED = {"sign", "rint", *FLOAT_MATH}
#: Ops whose float result is not correctly rounded (libm / SIMD implementations differ).
TRANSCENDENTAL = {"exp", "log", "sin", "cos", "power", "arctan2", "hypot", *FLOAT_MATH}
#: Ops whose result jumps for a tiny change of an argument: arguments must be exact.
DISCONTINUOUS = {
    "floor",
    "ceil",
    "trunc",
    "rint",
    "sign",
    "isnan",
    "isinf",
    "isfinite",
    "log1p",
    "log2",
    "log10",
    "tan",
    "arcsin",
    "arccos",
    "arctan2",
    "sqrt",
    "log",
    "logical_not",
    "divide",
    "floor_divide",
    "remainder",
    "power",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
}
#: Integer ops where numpy silently returns 0 (division by zero) or MIN (MIN // -1).
INT_FPE_CHECKED = {"floor_divide", "remainder", "power", "divide"}

FLOAT_CONSTS = (0.5, 1.0, -2.25, 3.0, 100.0, 1e-3, 0.1)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class InputArray:
    """One generated Zarr input: written values, chunking, fill value, deleted chunks."""

    data: np.ndarray
    chunks: tuple[int, ...]
    fill_value: Any
    missing: list[tuple[int, ...]]
    declare: bool  # also state shape and dtype in the plan's "arrays" entry
    expected: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.expected = apply_missing(self.data, self.chunks, self.missing, self.fill_value)

    def write(self, path: Path) -> None:
        got = write_v3(
            path,
            self.data,
            self.chunks,
            codec="zstd",
            level=1,
            fill_value=self.fill_value,
            missing=self.missing,
        )
        np.testing.assert_array_equal(got, self.expected)

    def describe(self) -> str:
        return (
            f"dtype={self.data.dtype} shape={self.data.shape} chunks={self.chunks} "
            f"fill={self.fill_value!r} missing={self.missing}\n{self.expected!r}"
        )


def elements(dtype: np.dtype[Any], profile: str) -> st.SearchStrategy[Any]:
    """Element values; ``profile`` "small" keeps products finite."""
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        small = st.integers(max(info.min, -3), min(info.max, 3))
        if profile == "small":
            return small
        return st.one_of(
            small,
            st.integers(max(info.min, -100), min(info.max, 100)),
            st.integers(int(info.min), int(info.max)),
        )
    width = dtype.itemsize * 8
    if dtype.kind == "f":
        bound = 1.5 if profile == "small" else (1e3 if profile == "reduce" else 50.0)
        finite = st.floats(-bound, bound, width=width)
        specials = (
            [math.nan, 0.0, -0.0]
            if profile != "elementwise"
            else [math.nan, math.inf, -math.inf, 0.0, -0.0]
        )
        return st.one_of(finite, finite, finite, st.sampled_from(specials))
    bound = 1.5 if profile == "small" else 50.0
    return st.complex_numbers(
        max_magnitude=bound, allow_nan=False, allow_infinity=False, width=width
    )


@st.composite
def input_arrays(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: np.dtype[Any],
    profile: str,
) -> InputArray:
    shape = tuple(shape)
    data = draw(hnp.arrays(dtype, shape, elements=elements(dtype, profile)))
    chunks = tuple(draw(st.integers(1, max(1, s))) for s in shape)
    fill = draw(elements(dtype, "small"))
    if dtype.kind == "f" and draw(st.integers(0, 5)) == 0:
        fill = math.nan
    fill = np.asarray(fill).astype(dtype)[()]
    grid = chunk_grid(shape, chunks)
    missing: list[tuple[int, ...]] = []
    if len(grid) > 1:
        missing = draw(st.lists(st.sampled_from(grid), max_size=2, unique=True))
    return InputArray(data, chunks, fill, missing, draw(st.booleans()))


@st.composite
def broadcast_shapes(draw: st.DrawFn, count: int, max_dim: int = 6) -> list[tuple[int, ...]]:
    """``count`` shapes (rank 1-3) that broadcast together (trailing-aligned, some dims 1)."""
    rank = draw(st.integers(1, 3))
    base = [draw(st.integers(1, max_dim)) for _ in range(rank)]
    shapes = []
    for _ in range(count):
        r = draw(st.integers(1, rank))
        dims = base[rank - r :]
        shapes.append(tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in dims))
    return shapes


# --------------------------------------------------------------------------------------------
# Expressions and their numpy values
# --------------------------------------------------------------------------------------------


@dataclass
class Node:
    expr: dict[str, Any]
    value: Any  # np.ndarray for array expressions; a Python or numpy scalar for constants
    const: bool
    exact: bool
    used: frozenset[int]
    scale: float
    #: relative error that inexact operations below may have introduced, in their own precision
    #: (cos of complex64 promoted to complex128 is only as good as complex64); 0 when exact
    rtol: float = 0.0


def dtype_of(value: Any) -> np.dtype[Any]:
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype
    # weak Python scalars: their "kind" is what matters for the rules below
    if isinstance(value, bool):
        return np.dtype(bool)
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    return np.dtype(np.complex128)


def magnitude(value: Any) -> float:
    arr = np.abs(np.asarray(value))
    finite = arr[np.isfinite(arr)]
    return float(finite.max()) if finite.size else 0.0


def apply_op(op: str, values: list[Any], dtype: str | None) -> Any:
    if op == "where":
        return np.where(values[0], values[1], values[2])
    if op == "clip":
        return np.clip(values[0], values[1], values[2])
    if op == "astype":
        return np.asarray(values[0]).astype(dtype)
    return getattr(np, op)(*values)


def cast_is_defined(source: np.ndarray, target: str) -> bool:
    """numpy leaves float->int casts of NaN, inf and out-of-range values undefined."""
    t = np.dtype(target)
    if t.kind not in "iu" or source.dtype.kind not in "fc":
        return True
    info = np.iinfo(t)
    for v in np.asarray(source).ravel().tolist():
        v = v.real if isinstance(v, complex) else v
        if not math.isfinite(v):
            return False
        if not (info.min <= math.trunc(v) <= info.max):
            return False
    return True


def evaluate(op: str, args: list[Node], dtype: str | None = None) -> np.ndarray | None:
    """numpy's result, or None where numpy refuses the op or leaves it undefined."""
    values = [a.value for a in args]
    if op in ORDERING | COMPLEX_REFUSED and any(dtype_of(v).kind == "c" for v in values):
        return None
    if op == "astype" and not cast_is_defined(np.asarray(values[0]), dtype or ""):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            with np.errstate(all="ignore"):
                result = apply_op(op, values, dtype)
            if op in INT_FPE_CHECKED and all(dtype_of(v).kind in "biu" for v in values):
                with np.errstate(all="raise"):
                    apply_op(op, values, dtype)
        except (
            TypeError,
            ValueError,
            OverflowError,
            FloatingPointError,
            ZeroDivisionError,
            np.exceptions.ComplexWarning,
        ):
            return None
    if not isinstance(result, np.ndarray) or result.ndim == 0:
        return None
    if result.dtype.name not in ENGINE_DTYPES:
        return None
    return result


def op_is_exact(op: str, args: list[Node], result: np.ndarray) -> bool:
    if not all(a.exact for a in args):
        return False
    if op in TRANSCENDENTAL - {"power"}:
        return False
    if op == "power":
        return result.dtype.kind in "biu"
    if result.dtype.kind == "c" or any(dtype_of(a.value).kind == "c" for a in args):
        return op not in {"multiply", "divide", "sqrt", "abs", "power", "square"}
    return True


def needs_exact_args(op: str, args: list[Node], dtype: str | None) -> list[int]:
    """Indices of arguments that must be exact for the op's result to be comparable."""
    if op in DISCONTINUOUS:
        return list(range(len(args)))
    if op == "where":
        return [0]
    if op == "astype" and np.dtype(dtype).kind not in "fc":
        return [0]
    return []


def make_node(op: str, args: list[Node], dtype: str | None = None) -> Node | None:
    if all(a.const for a in args):
        return None
    if any(not args[i].exact for i in needs_exact_args(op, args, dtype)):
        return None
    result = evaluate(op, args, dtype)
    if result is None:
        return None
    expr: dict[str, Any] = {"op": op, "args": [a.expr for a in args]}
    if op == "astype":
        expr["dtype"] = dtype
    used: frozenset[int] = frozenset().union(*(a.used for a in args))
    scale = max([magnitude(result)] + [a.scale for a in args])
    exact = op_is_exact(op, args, result)
    rtol = max([a.rtol for a in args] + [0.0 if exact else inexact_rtol(result.dtype)])
    return Node(expr, result, False, exact, used, scale, rtol)


def json_scalar(value: Any) -> Any:
    if isinstance(value, complex):
        return [float(value.real), float(value.imag)]
    return value


@st.composite
def constants(draw: st.DrawFn, peer: Node, op: str) -> Node:
    """A constant operand suited to ``peer`` (the array operand) and ``op``."""
    kind = dtype_of(peer.value).kind
    value: Any
    if op in {"floor_divide", "remainder"} and kind in "biu":
        value = draw(st.sampled_from([1, 2, 3, 5, -2, -3]))
    elif op == "power":
        value = draw(st.sampled_from([0, 1, 2, 3] if kind in "biu" else [0.5, 2.0, 3, -1.0, 2]))
    else:
        choice = draw(st.sampled_from(["same", "same", "same", "int", "float", "bool", "complex"]))
        if choice == "same":
            choice = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}[kind]
        if choice == "bool":
            value = draw(st.booleans())
        elif choice == "int":
            lo = 0 if kind == "u" else -5
            value = draw(st.integers(lo, 5))
        elif choice == "float":
            value = draw(st.sampled_from(FLOAT_CONSTS)) * draw(st.sampled_from([1.0, -1.0]))
        else:
            value = complex(draw(st.sampled_from(FLOAT_CONSTS)), draw(st.sampled_from([0.5, -2.0])))
    if draw(st.integers(0, 4)) == 0:
        # a typed (numpy) scalar: takes part in promotion like an array
        typed = draw(st.sampled_from(ENGINE_DTYPES))
        t = np.dtype(typed)
        v = value
        if t.kind == "b":
            v = bool(value)
        elif t.kind in "iu":
            v = abs(int(value.real if isinstance(value, complex) else value)) or 1
        elif t.kind == "f":
            v = float(value.real if isinstance(value, complex) else value)
        else:
            v = complex(value)
        expr = {"const": json_scalar(v), "dtype": typed}
        return Node(expr, t.type(v), True, True, frozenset(), abs(complex(v)))
    return Node({"const": json_scalar(value)}, value, True, True, frozenset(), abs(complex(value)))


@st.composite
def expressions(draw: st.DrawFn, inputs: Sequence[np.ndarray], depth: int = 0) -> Node:
    max_depth = 3
    if depth >= max_depth or (depth > 0 and draw(st.integers(0, 2)) == 0):
        i = draw(st.integers(0, len(inputs) - 1))
        return Node({"input": i}, inputs[i], False, True, frozenset([i]), magnitude(inputs[i]))
    family = draw(
        st.sampled_from(["unary", "binary", "binary", "binary", "where", "clip", "astype"])
    )
    first = draw(expressions(inputs, depth + 1))
    node: Node | None = None
    if family == "unary":
        node = make_node(draw(st.sampled_from(UNARY)), [first])
    elif family == "binary":
        op = draw(st.sampled_from(BINARY))
        other = (
            draw(constants(first, op))
            if draw(st.integers(0, 2)) == 0
            else draw(expressions(inputs, depth + 1))
        )
        args = [other, first] if draw(st.booleans()) else [first, other]
        node = make_node(op, args)
    elif family == "where":
        cond = first
        if draw(st.integers(0, 3)) > 0:
            cmp = draw(st.sampled_from(["less", "greater", "equal", "not_equal"]))
            cond = make_node(cmp, [first, draw(constants(first, cmp))]) or first
        a = draw(expressions(inputs, depth + 1))
        b = (
            draw(constants(a, "where"))
            if draw(st.booleans())
            else draw(expressions(inputs, depth + 1))
        )
        node = make_node("where", [cond, a, b])
    elif family == "clip":
        lo = draw(constants(first, "clip"))
        hi = draw(constants(first, "clip"))
        if (
            dtype_of(lo.value).kind != "c"
            and dtype_of(hi.value).kind != "c"
            and hi.value < lo.value
        ):
            lo, hi = hi, lo
        node = make_node("clip", [first, lo, hi])
    else:
        node = make_node("astype", [first], draw(st.sampled_from(ENGINE_DTYPES)))
    return node if node is not None else first


def remap_inputs(expr: Any, mapping: dict[int, int]) -> Any:
    if isinstance(expr, dict):
        if "input" in expr:
            return {"input": mapping[expr["input"]]}
        return {k: remap_inputs(v, mapping) for k, v in expr.items()}
    if isinstance(expr, list):
        return [remap_inputs(v, mapping) for v in expr]
    return expr


@st.composite
def elementwise_cases(draw: st.DrawFn) -> tuple[list[InputArray], list[Node]]:
    count = draw(st.integers(1, 3))
    shapes = draw(broadcast_shapes(count))
    inputs = [
        draw(input_arrays(s, np.dtype(draw(st.sampled_from(ENGINE_DTYPES))), "elementwise"))
        for s in shapes
    ]
    values = [inp.expected for inp in inputs]
    nodes = []
    for _ in range(3):
        node = draw(expressions(values))
        if "op" not in node.expr:  # the random op was refused: one more try for a real expression
            node = draw(expressions(values))
        nodes.append(node)
    return inputs, nodes


def array_entry(name: str, path: Path, inp: InputArray) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": name, "zarr": str(path)}
    if inp.declare:
        entry["shape"] = list(inp.data.shape)
        entry["dtype"] = inp.data.dtype.name
    return entry


def inexact_rtol(dtype: np.dtype[Any]) -> float:
    return 2e-5 if single_precision(dtype) else 1e-11


def compare_elementwise(result: np.ndarray, node: Node, label: str) -> None:
    ref = np.asarray(node.value)
    assert result.shape == ref.shape, f"{label}: shape {result.shape} != numpy {ref.shape}"
    assert result.dtype == ref.dtype, f"{label}: dtype {result.dtype} != numpy {ref.dtype}"
    if ref.dtype.kind in "biu" or node.exact:
        np.testing.assert_array_equal(result, ref, err_msg=label)
    else:
        rtol = max(node.rtol, inexact_rtol(ref.dtype))
        np.testing.assert_allclose(
            result, ref, rtol=rtol, atol=rtol * max(node.scale, 1.0), equal_nan=True, err_msg=label
        )


@PROPERTY_SETTINGS
@given(case=elementwise_cases())
def test_elementwise_matches_numpy(
    run_plan: RunPlan, case: tuple[list[InputArray], list[Node]]
) -> None:
    inputs, nodes = case
    assume(any(not n.const and n.used for n in nodes))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        used_all = sorted(set().union(*(n.used for n in nodes)))
        arrays = []
        for i in used_all:
            path = root / f"in{i}.zarr"
            inputs[i].write(path)
            arrays.append(array_entry(f"in{i}", path, inputs[i]))
            note(f"in{i}: {inputs[i].describe()}")
        ops: list[dict[str, Any]] = []
        params: dict[str, str] = {}
        for k, node in enumerate(nodes):
            used = sorted(node.used)
            expr = remap_inputs(node.expr, {old: new for new, old in enumerate(used)})
            ops.append(
                {
                    "id": f"e{k}",
                    "op": "elementwise",
                    "inputs": [f"in{i}" for i in used],
                    "expr": expr,
                }
            )
            ops.append({"id": f"w{k}", "op": "write", "input": f"e{k}", "target": f"${{out{k}}}"})
            params[f"out{k}"] = str(root / f"out{k}.zarr")
        plan = {
            "name": "hypothesis-elementwise",
            "params": {name: "output array" for name in params},
            "arrays": arrays,
            "ops": ops,
        }
        note(json.dumps(plan))
        run_plan(plan, params)
        for k, node in enumerate(nodes):
            result = read_zarr(params[f"out{k}"])
            compare_elementwise(result, node, f"output {k}: {json.dumps(node.expr)}")


# --------------------------------------------------------------------------------------------
# Type promotion, weak scalars, broadcasting: a fixed table in one plan
# --------------------------------------------------------------------------------------------

PROMOTION_CASES: list[tuple[str, str, dict[str, Any]]] = [
    # (left dtype, right dtype or "-", expression over input 0 and input 1)
    ("int8", "uint8", {"op": "add", "args": [{"input": 0}, {"input": 1}]}),
    ("int64", "uint64", {"op": "add", "args": [{"input": 0}, {"input": 1}]}),
    ("float32", "int64", {"op": "multiply", "args": [{"input": 0}, {"input": 1}]}),
    ("complex64", "float64", {"op": "subtract", "args": [{"input": 0}, {"input": 1}]}),
    ("bool", "bool", {"op": "add", "args": [{"input": 0}, {"input": 1}]}),
    ("int16", "int16", {"op": "divide", "args": [{"input": 0}, {"input": 1}]}),
    ("uint32", "int32", {"op": "maximum", "args": [{"input": 0}, {"input": 1}]}),
    ("float32", "-", {"op": "add", "args": [{"input": 0}, {"const": 1.0}]}),
    ("float32", "-", {"op": "add", "args": [{"input": 0}, {"const": 0.1}]}),
    ("int8", "-", {"op": "add", "args": [{"input": 0}, {"const": 1}]}),
    ("int8", "-", {"op": "add", "args": [{"input": 0}, {"const": 1.0}]}),
    ("int8", "-", {"op": "add", "args": [{"input": 0}, {"const": 1, "dtype": "int16"}]}),
    (
        "float32",
        "-",
        {"op": "multiply", "args": [{"input": 0}, {"const": 2.0, "dtype": "float64"}]},
    ),
    ("float32", "-", {"op": "add", "args": [{"input": 0}, {"const": [1.0, 2.0]}]}),
    ("uint8", "-", {"op": "add", "args": [{"input": 0}, {"const": True}]}),
    ("bool", "-", {"op": "add", "args": [{"input": 0}, {"const": 2}]}),
    ("uint8", "-", {"op": "add", "args": [{"input": 0}, {"const": 255}]}),
    ("int32", "-", {"op": "astype", "dtype": "float32", "args": [{"input": 0}]}),
    ("float64", "-", {"op": "astype", "dtype": "int16", "args": [{"input": 0}]}),
    ("int16", "-", {"op": "sqrt", "args": [{"input": 0}]}),
    ("int32", "-", {"op": "exp", "args": [{"input": 0}]}),
    ("int8", "-", {"op": "floor", "args": [{"input": 0}]}),
    ("uint8", "-", {"op": "negative", "args": [{"input": 0}]}),
    ("int8", "-", {"op": "abs", "args": [{"input": 0}]}),
    ("complex128", "-", {"op": "abs", "args": [{"input": 0}]}),
    (
        "float32",
        "float32",
        {
            "op": "where",
            "args": [
                {"op": "greater", "args": [{"input": 0}, {"input": 1}]},
                {"input": 0},
                {"const": 0.0},
            ],
        },
    ),
    ("int8", "-", {"op": "clip", "args": [{"input": 0}, {"const": -3}, {"const": 4}]}),
    ("float32", "-", {"op": "floor_divide", "args": [{"input": 0}, {"const": 0.1}]}),
    ("float64", "float64", {"op": "remainder", "args": [{"input": 0}, {"input": 1}]}),
    ("int8", "-", {"op": "power", "args": [{"input": 0}, {"const": 3}]}),
    ("float64", "-", {"op": "logical_not", "args": [{"input": 0}]}),
    ("int32", "float32", {"op": "logical_xor", "args": [{"input": 0}, {"input": 1}]}),
]


def sample_values(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -20), min(info.max, 20), shape, endpoint=True).astype(
            dtype
        )
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 10).astype(dtype)
    return (rng.standard_normal(shape) * 10 + 1j * rng.standard_normal(shape)).astype(dtype)


def test_promotion_and_broadcast_table(run_plan: RunPlan, tmp_path: Path) -> None:
    """numpy 2 promotion (NEP 50 weak scalars, typed scalars) and broadcasting, one plan."""
    arrays: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    refs: list[tuple[Path, np.ndarray, bool, str]] = []
    for k, (left, right, expr) in enumerate(PROMOTION_CASES):
        values = []
        inputs = []
        # left (4, 5, 6) chunked (3, 2, 4); right broadcasts as (5, 1)
        for j, (dt, shape, chunks) in enumerate(
            [(left, (4, 5, 6), (3, 2, 4)), (right, (5, 1), (2, 1))]
        ):
            if dt == "-":
                continue
            data = sample_values(np.dtype(dt), shape, seed=100 * k + j)
            path = tmp_path / f"a{k}_{j}.zarr"
            values.append(write_v3(path, data, chunks, fill_value=0))
            arrays.append({"id": f"a{k}_{j}", "zarr": str(path)})
            inputs.append(f"a{k}_{j}")
        nodes = [
            Node({"input": i}, v, False, True, frozenset([i]), magnitude(v))
            for i, v in enumerate(values)
        ]
        ref = numpy_eval(expr, nodes)
        ops.append({"id": f"e{k}", "op": "elementwise", "inputs": inputs, "expr": expr})
        target = tmp_path / f"out{k}.zarr"
        ops.append({"id": f"w{k}", "op": "write", "input": f"e{k}", "target": str(target)})
        label = json.dumps(expr)
        inexact = '"exp"' in label or (left.startswith("complex") and '"abs"' in label)
        refs.append((target, ref, not inexact, f"{left},{right}: {label}"))
    run_plan({"name": "promotion-table", "arrays": arrays, "ops": ops}, {})
    failures = []
    for target, ref, exact, label in refs:
        result = read_zarr(target)
        try:
            assert result.dtype == ref.dtype, f"dtype {result.dtype} != numpy {ref.dtype}"
            assert result.shape == ref.shape, f"shape {result.shape} != numpy {ref.shape}"
            if exact:
                np.testing.assert_array_equal(result, ref)
            else:
                np.testing.assert_allclose(
                    result, ref, rtol=1e-6 if ref.dtype.itemsize <= 8 else 1e-12
                )
        except AssertionError as exc:
            failures.append(f"{label}: {str(exc).strip()[:300]}")
    assert not failures, "\n".join(failures)


def numpy_eval(expr: dict[str, Any], inputs: list[Node]) -> np.ndarray:
    """Evaluate an IR expression with numpy (for the fixed table)."""
    if "input" in expr:
        return np.asarray(inputs[expr["input"]].value)
    op = str(expr["op"])
    args: list[Node] = []
    for a in expr["args"]:
        if "const" in a:
            v = a["const"]
            v = complex(v[0], v[1]) if isinstance(v, list) else v
            if "dtype" in a:
                v = np.dtype(a["dtype"]).type(v)
            args.append(Node(a, v, True, True, frozenset(), 0.0))
        else:
            val = numpy_eval(a, inputs)
            args.append(Node(a, val, False, True, frozenset([0]), magnitude(val)))
    with np.errstate(all="ignore"):
        result = apply_op(op, [a.value for a in args], expr.get("dtype"))
    return np.asarray(result)


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------

REDUCE_FUNCS = (
    "sum",
    "prod",
    "min",
    "max",
    "mean",
    "var",
    "std",
    "any",
    "all",
    "argmin",
    "argmax",
    "nansum",
    "nanmean",
    "nanmin",
    "nanmax",
    "nanvar",
    "nanstd",
    "nanprod",
    "nanargmin",
    "nanargmax",
)
ARG_FUNCS = {"argmin", "argmax", "nanargmin", "nanargmax"}
ORDER_FUNCS = ARG_FUNCS | {"min", "max", "nanmin", "nanmax"}
EXACT_FUNCS = ORDER_FUNCS | {"any", "all"}


@dataclass
class Reduction:
    func: str
    axes: list[int] | None
    keepdims: bool
    ddof: int | None
    dtype: str | None
    spell_keepdims: bool  # write "keepdims": false explicitly

    def op(self, k: int) -> dict[str, Any]:
        op: dict[str, Any] = {"id": f"r{k}", "op": "reduce", "input": "x", "func": self.func}
        if self.axes is not None:
            op["axes"] = self.axes
        if self.keepdims or self.spell_keepdims:
            op["keepdims"] = self.keepdims
        if self.ddof is not None:
            op["ddof"] = self.ddof
        if self.dtype is not None:
            op["dtype"] = self.dtype
        return op

    def numpy_axis(self) -> int | tuple[int, ...] | None:
        if self.axes is None:
            return None
        if self.func in ARG_FUNCS:
            return self.axes[0]
        return tuple(self.axes)

    def evaluate(self, x: np.ndarray) -> np.ndarray | None:
        if self.func in ORDER_FUNCS and x.dtype.kind == "c":
            return None
        kwargs: dict[str, Any] = {"axis": self.numpy_axis(), "keepdims": self.keepdims}
        if self.ddof is not None:
            kwargs["ddof"] = self.ddof
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            try:
                with np.errstate(all="ignore"):
                    result = np.asarray(getattr(np, self.func)(x, **kwargs))
            except (TypeError, ValueError, np.exceptions.ComplexWarning):
                return None
        if result.dtype.name not in ENGINE_DTYPES:
            return None
        return result


def reduced_count(shape: tuple[int, ...], axes: list[int] | None) -> int:
    if axes is None:
        return int(np.prod(shape))
    return int(np.prod([shape[a] for a in axes]))


@st.composite
def reductions(draw: st.DrawFn, shape: tuple[int, ...], kind: str) -> Reduction:
    rank = len(shape)
    func = draw(st.sampled_from(REDUCE_FUNCS))
    axes: list[int] | None
    if func in ARG_FUNCS:
        axes = None if draw(st.booleans()) else [draw(st.integers(0, rank - 1))]
    elif draw(st.integers(0, 3)) == 0:
        axes = None
    else:
        axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1)))
    ddof = None
    if func in ("var", "std"):
        ddof = draw(st.sampled_from([0, 1])) if reduced_count(shape, axes) >= 2 else 0
    elif func in ("nanvar", "nanstd"):
        # Lanes left with ddof or fewer values are NaN in numpy: any ddof is defined.
        ddof = draw(st.sampled_from([0, 1, 2]))
    dtype = None
    if func in ("sum", "prod", "nanprod", "mean") and draw(st.integers(0, 3)) == 0:
        if func == "mean":
            options = ["float64", "float32"] if kind != "c" else ["complex128"]
        elif kind in "biu":
            options = ["int64", "float64", "int32", "uint64"]
        elif kind == "f":
            options = ["float64", "float32"]
        else:
            options = ["complex128"]
        dtype = draw(st.sampled_from(options))
    return Reduction(func, axes, draw(st.booleans()), ddof, dtype, draw(st.booleans()))


@st.composite
def reduction_cases(
    draw: st.DrawFn, dtypes: Sequence[str] = ENGINE_DTYPES
) -> tuple[InputArray, list[Reduction]]:
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    reds = draw(st.lists(reductions(shape, dtype.kind), min_size=3, max_size=5))
    profile = "small" if any(r.func in ("prod", "nanprod") for r in reds) else "reduce"
    inp = draw(input_arrays(shape, dtype, profile))
    return inp, reds


def reduction_tolerance(red: Reduction, x: np.ndarray, result: np.ndarray) -> np.ndarray | None:
    """Absolute tolerance per output element; None means exact."""
    if red.func in EXACT_FUNCS or result.dtype.kind in "biu":
        return None
    n = reduced_count(x.shape, red.axes)
    rel = max(tolerance_floor(result.dtype), 4 * (n + 1) * dtype_eps(result.dtype))
    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    mag = np.abs(wide)
    mag = np.where(np.isnan(mag), 0.0, mag)
    axis = None if red.axes is None else tuple(red.axes)
    tiny = float(np.finfo(result.dtype).tiny)
    if red.func in ("sum", "nansum"):
        scale = mag.sum(axis=axis, keepdims=red.keepdims)
    elif red.func in ("mean", "nanmean"):
        scale = mag.max(axis=axis, keepdims=red.keepdims)
    elif red.func in ("prod", "nanprod"):
        with np.errstate(all="ignore"):
            scale = np.abs(np.nanprod(wide, axis=axis, keepdims=red.keepdims))
    else:  # var, std, nanvar, nanstd: compared as variances
        scale = 4 * (mag**2).mean(axis=axis, keepdims=red.keepdims)
    return rel * np.asarray(scale) + tiny


def compare_reduction(red: Reduction, x: np.ndarray, result: np.ndarray, ref: np.ndarray) -> None:
    label = json.dumps(red.op(0))
    assert result.shape == ref.shape, f"{label}: shape {result.shape} != numpy {ref.shape}"
    assert result.dtype == ref.dtype, f"{label}: dtype {result.dtype} != numpy {ref.dtype}"
    atol = reduction_tolerance(red, x, ref)
    if atol is None:
        np.testing.assert_array_equal(result, ref, err_msg=label)
        return
    got = result.astype(np.complex128 if result.dtype.kind == "c" else np.float64)
    want = ref.astype(got.dtype)
    if red.func in ("prod", "nanprod") and want.dtype.kind == "c":
        # Past the dtype's range numpy's complex64 multiply meets inf * 0 (NaN); the engine
        # multiplies in complex128 and overflows (to inf) only as it casts: both not finite.
        over = ~np.isfinite(want)
        assert np.array_equal(over, ~np.isfinite(got)), f"{label}: overflow\n{got}\n{want}"
        got, want, atol = got[~over], want[~over], np.broadcast_to(atol, over.shape)[~over]
    if red.func in ("std", "nanstd"):
        got, want = got**2, want**2
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{label}: NaN positions\n{got}\n{want}"
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]), label
    diff = np.abs(got - want)
    bad = finite & ~(diff <= np.broadcast_to(atol, diff.shape))
    assert not bad.any(), f"{label}: engine {got[bad]} numpy {want[bad]} tolerance {atol}"


@PROPERTY_SETTINGS
@given(case=reduction_cases())
def test_reductions_match_numpy(
    run_plan: RunPlan, case: tuple[InputArray, list[Reduction]]
) -> None:
    inp, reds = case
    x = inp.expected
    refs = [red.evaluate(x) for red in reds]
    keep = [(red, ref) for red, ref in zip(reds, refs, strict=True) if ref is not None]
    assume(keep)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = root / "x.zarr"
        inp.write(src)
        note(f"x: {inp.describe()}")
        ops: list[dict[str, Any]] = []
        targets = []
        for k, (red, ref) in enumerate(keep):
            ops.append(red.op(k))
            target = root / f"r{k}.zarr"
            write: dict[str, Any] = {"id": f"w{k}", "op": "write", "input": f"r{k}"}
            # Output chunks as the input's (the default), one chunk over several input chunks,
            # or chunks whose edges fall inside input chunks.
            shape = np.shape(ref)
            if k % 3 and shape and all(shape):
                whole = k % 3 == 1
                write["chunks"] = [n if whole else min(n, (n + 2) // 3 + 1) for n in shape]
            ops.append({**write, "target": str(target)})
            targets.append(target)
        plan = {
            "name": "hypothesis-reduce",
            "arrays": [array_entry("x", src, inp)],
            "ops": ops,
        }
        note(json.dumps(plan))
        run_plan(plan, {})
        for (red, ref), target in zip(keep, targets, strict=True):
            compare_reduction(red, x, read_zarr(target), ref)


@pytest.mark.parametrize("func", ["nanargmin", "nanargmax"])
def test_nanargmin_of_an_all_nan_lane_is_an_error(
    run_plan: RunPlan, tmp_path: Path, func: str
) -> None:
    """numpy raises ValueError for an all-NaN lane; the engine fails the run the same way
    (exit status 1, the function named), leaving no partial chunk, and along the other axis,
    where every lane has a value, it gives numpy's indices across chunks."""
    x = np.array([[np.nan, 1.0, np.nan], [np.nan, -2.0, 5.0], [np.nan, -2.0, np.nan]])
    src = tmp_path / "x.zarr"
    write_v3(src, x, (2, 2))
    with pytest.raises(ValueError, match="All-NaN slice"):
        getattr(np, func)(x, axis=0)

    def plan(axis: int, target: Path) -> dict[str, Any]:
        return {
            "name": func,
            "arrays": [{"id": "x", "zarr": str(src)}],
            "ops": [
                {"id": "r", "op": "reduce", "input": "x", "func": func, "axes": [axis]},
                {"id": "w", "op": "write", "input": "r", "target": str(target)},
            ],
        }

    failed = tmp_path / "failed.zarr"
    result = run_plan(plan(0, failed), {}, expect_rc=1)
    assert f"{func}: all-NaN slice encountered" in result["stderr"], result["stderr"]
    # Output chunks of lanes that have values may be written before the run fails; each
    # stored chunk is whole and right.
    assert_no_partial_files(failed)
    if (failed / "c" / "1").exists():
        assert zarr.open_array(str(failed), mode="r")[2] == getattr(np, func)(x[:, 2])
    done = tmp_path / "done.zarr"
    run_plan(plan(1, done), {})
    np.testing.assert_array_equal(read_zarr(done), getattr(np, func)(x, axis=1))


@PROPERTY_SETTINGS
@given(
    case=reduction_cases(("float32", "float64", "complex64")),
    scale=st.sampled_from([2.0, -3.0]),
)
def test_fused_elementwise_reduce_matches_numpy(
    run_plan: RunPlan, case: tuple[InputArray, list[Reduction]], scale: float
) -> None:
    """``reduce(elementwise(x))``: the fused path, as in plans/era5-sum.json."""
    inp, reds = case
    x = inp.expected
    with np.errstate(all="ignore"):
        y = np.multiply(np.add(x, 1), scale)
    refs = [red.evaluate(y) for red in reds]
    keep = [(red, ref) for red, ref in zip(reds, refs, strict=True) if ref is not None]
    assume(keep)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = root / "x.zarr"
        inp.write(src)
        expr = {
            "op": "multiply",
            "args": [{"op": "add", "args": [{"input": 0}, {"const": 1}]}, {"const": scale}],
        }
        ops: list[dict[str, Any]] = [
            {"id": "y", "op": "elementwise", "inputs": ["x"], "expr": expr}
        ]
        targets = []
        for k, (red, _) in enumerate(keep):
            op = red.op(k)
            op["input"] = "y"
            ops.append(op)
            target = root / f"r{k}.zarr"
            ops.append({"id": f"w{k}", "op": "write", "input": f"r{k}", "target": str(target)})
            targets.append(target)
        plan = {"name": "hypothesis-fused", "arrays": [{"id": "x", "zarr": str(src)}], "ops": ops}
        note(json.dumps(plan))
        run_plan(plan, {})
        for (red, ref), target in zip(keep, targets, strict=True):
            compare_reduction(red, y, read_zarr(target), ref)


@pytest.mark.parametrize("threads", [1, 2])
def test_reduction_independent_of_threads_and_chunking(
    run_plan: RunPlan, tmp_path: Path, threads: int
) -> None:
    """Integer sums are exact whatever the chunking and thread count."""
    data = np.arange(7 * 11 * 13, dtype=np.int32).reshape(7, 11, 13) - 400
    results = []
    for chunks in [(1, 11, 13), (3, 4, 5), (7, 11, 13)]:
        src = tmp_path / f"x{threads}_{'x'.join(map(str, chunks))}.zarr"
        write_v3(src, data, chunks)
        target = tmp_path / f"s{threads}_{'x'.join(map(str, chunks))}.zarr"
        plan = {
            "arrays": [{"id": "x", "zarr": str(src)}],
            "ops": [
                {"id": "s", "op": "reduce", "input": "x", "func": "sum", "axes": [0, 2]},
                {"id": "w", "op": "write", "input": "s", "target": str(target)},
            ],
        }
        run_plan(plan, {}, threads=threads)
        results.append(read_zarr(target))
    for result in results:
        np.testing.assert_array_equal(result, data.sum(axis=(0, 2)))
        assert result.dtype == data.sum(axis=(0, 2)).dtype


@pytest.mark.parametrize("threads", [1, 2])
def test_float32_sums_of_many_steps_restart_their_partial_sums(
    run_plan: RunPlan, tmp_path: Path, threads: int
) -> None:
    """Float32 sums add 16 values per element in float32 partial sums, then flush them into
    float64 sums. Partial sums are not zeroed between flushes: a step that covers every
    element starts them afresh, and steps that do not add to zeroed ones. 40 steps of a
    whole plane flush twice per group; quarter-plane chunks take the zeroing path; a leftover
    value of an earlier flush would be off by a whole partial sum."""
    rng = np.random.default_rng(7)
    data = (rng.standard_normal((40, 6, 7)) * 10 + 280).astype(np.float32)
    data[rng.random(data.shape) < 0.1] = np.nan
    wide = data.astype(np.float64)
    for chunks in [(1, 6, 7), (1, 3, 4), (5, 6, 7)]:
        src = tmp_path / f"x{threads}_{'x'.join(map(str, chunks))}.zarr"
        write_v3(src, data, chunks)
        funcs = ["sum", "mean", "nansum", "nanmean"]
        ops: list[dict[str, Any]] = []
        for func in funcs:
            ops.append({"id": func, "op": "reduce", "input": "x", "func": func, "axes": [0]})
            ops.append({"id": f"w{func}", "op": "write", "input": func, "target": str(src) + func})
        plan = {"arrays": [{"id": "x", "zarr": str(src)}], "ops": ops}
        run_plan(plan, {}, threads=threads)
        for func in funcs:
            want = getattr(np, func)(wide, axis=0)
            got = read_zarr(Path(str(src) + func))
            assert got.dtype == np.float32
            # 16 float32 additions per partial sum at most, each within half an ulp of it.
            scale = np.nansum(np.abs(wide), axis=0) / (40 if "mean" in func else 1)
            atol = 16 * float(np.finfo(np.float32).eps) * scale
            close = (np.abs(got - want) <= atol) | (np.isnan(got) & np.isnan(want))
            assert close.all(), (func, chunks, got[~close], want[~close])


@pytest.mark.parametrize(
    ("selection", "single_stage"),
    [
        ([0, None, None], True),  # drops exactly the kept axis: the reduction writes the target
        ([0, [0, 5, 1], None], False),  # also crops: an intermediate, then a copy
    ],
)
def test_reduction_written_through_cast_and_squeeze(
    run_plan: RunPlan, tmp_path: Path, selection: list[Any], single_stage: bool
) -> None:
    """Cubed ends reductions with a cast to the same dtype and an index that drops the kept
    axes; the reduction then writes the target itself, and the values are the same either way."""
    data = np.random.default_rng(5).standard_normal((9, 7, 11)).astype(np.float32)
    src = tmp_path / "x.zarr"
    write_v3(src, data, (2, 4, 5))
    target = tmp_path / "m.zarr"
    plan = {
        "arrays": [{"id": "x", "zarr": str(src)}],
        "ops": [
            {
                "id": "r",
                "op": "reduce",
                "input": "x",
                "func": "mean",
                "axes": [0],
                "keepdims": True,
            },
            {
                "id": "c",
                "op": "elementwise",
                "inputs": ["r"],
                "expr": {"op": "astype", "dtype": "float32", "args": [{"input": 0}]},
            },
            {"id": "s", "op": "slice", "input": "c", "selection": selection},
            {"id": "w", "op": "write", "input": "s", "target": str(target), "chunks": [3, 4]},
        ],
    }
    summary = run_plan(plan, {})
    assert (len(summary["stages"]) == 1) == single_stage, summary["stages"]
    expected = data.mean(axis=0, keepdims=True, dtype=np.float64).astype(np.float32)[0]
    if not single_stage:
        expected = expected[:5]
    np.testing.assert_allclose(read_zarr(target), expected, rtol=1e-6, atol=1e-6)


@st.composite
def selections(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[list[Any], tuple[Any, ...]]:
    """A plan IR selection of an array of `shape` and numpy's index for it: integers, whole
    axes, and ranges with any bounds and steps, backwards ones included."""
    plan: list[Any] = []
    index: list[Any] = []
    for n in shape:
        kinds = ["all", "range", "range"] + (["index"] if n else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "index":
            i = draw(st.integers(-n, n - 1))
            plan.append(i)
            index.append(i)
        elif kind == "all":
            plan.append(None)
            index.append(slice(None))
        else:
            bound = st.none() | st.integers(-n - 2, n + 2)
            start, stop = draw(bound), draw(bound)
            step = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
            plan.append([start, stop, step])
            index.append(slice(start, stop, step))
    return plan, tuple(index)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_slices_with_any_steps_match_numpy(run_plan: RunPlan, data: st.DataObject) -> None:
    """Selections with backward and strided ranges, a selection of a selection, a transpose,
    and elementwise ops and reductions over them (sum, argmax counting in the selection's
    order) equal numpy's, across chunk boundaries and irregular last chunks."""
    rank = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 8)) for _ in range(rank))
    dtype = np.dtype(data.draw(st.sampled_from(["float64", "int16", "uint8", "bool"])))
    inp = data.draw(input_arrays(shape, dtype, "reduce"))
    first, first_index = data.draw(selections(shape))
    x = inp.expected
    once = x[first_index]
    second, second_index = data.draw(selections(once.shape))
    twice = once[second_index]
    order = data.draw(st.permutations(range(once.ndim)))
    turned = once.transpose(order)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inp.write(root / "x.zarr")
        ops: list[dict[str, Any]] = [
            {"id": "a", "op": "slice", "input": "x", "selection": first},
            {"id": "b", "op": "slice", "input": "a", "selection": second},
            {
                "id": "e",
                "op": "elementwise",
                "inputs": ["a"],
                "expr": {"op": "multiply", "args": [{"input": 0}, {"const": 2}]},
            },
            {"id": "t", "op": "transpose", "input": "a", "axes": list(order)},
        ]
        expected = {"a": once, "b": twice, "e": once * 2, "t": turned}
        for name, values in (("a", once), ("b", twice), ("t", turned)):
            if values.ndim and values.shape[0] > 0:
                for func in ("sum", "argmax"):
                    ops.append(
                        {"id": f"{func}-{name}", "op": "reduce", "input": name, "func": func}
                        | {"axes": [0]}
                    )
                    expected[f"{func}-{name}"] = getattr(np, func)(values, axis=0)
        for name in list(expected):
            ops.append({"id": f"w-{name}", "op": "write", "input": name, "target": f"{tmp}/{name}"})
        plan = {"arrays": [array_entry("x", root / "x.zarr", inp)], "ops": ops}
        note(json.dumps(plan))
        run_plan(plan, {})
        for name, want in expected.items():
            got = read_zarr(root / name)
            assert got.shape == want.shape and got.dtype == want.dtype, (name, got, want)
            if want.dtype.kind == "f":  # sums may add in another order
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
            else:
                np.testing.assert_array_equal(got, want, err_msg=name)


def test_backward_views_of_shared_and_transformed_values(run_plan: RunPlan, tmp_path: Path) -> None:
    """A small array every task reads (the time mean, held in memory once for the stage)
    and an FFT's values, each read backwards, equal numpy's."""
    x = np.random.default_rng(2).standard_normal((12, 10, 7)).astype(np.float32)
    write_v3(tmp_path / "x.zarr", x, (1, 10, 7))
    ops: list[dict[str, Any]] = [
        {"id": "m", "op": "reduce", "input": "x", "func": "mean", "axes": [0]},
        {
            "id": "mr",
            "op": "slice",
            "input": "m",
            "selection": [[None, None, -1], [None, None, -2]],
        },
        {"id": "xs", "op": "slice", "input": "x", "selection": [None, None, [None, None, 2]]},
        {
            "id": "d",
            "op": "elementwise",
            "inputs": ["xs", "mr"],
            "expr": {"op": "subtract", "args": [{"input": 0}, {"input": 1}]},
        },
        {"id": "f", "op": "fft", "input": "x", "kind": "rfft", "axis": 0},
        {"id": "fr", "op": "slice", "input": "f", "selection": [[None, None, -1], [8, 1, -3]]},
        {"id": "wd", "op": "write", "input": "d", "target": str(tmp_path / "d.zarr")},
        {"id": "wf", "op": "write", "input": "fr", "target": str(tmp_path / "f.zarr")},
    ]
    run_plan({"arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}], "ops": ops}, {})
    mean = x.mean(axis=0, dtype=np.float64).astype(np.float32)
    np.testing.assert_allclose(
        read_zarr(tmp_path / "d.zarr"), x[:, :, ::2] - mean[::-1, ::-2], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(
        read_zarr(tmp_path / "f.zarr"),
        np.fft.rfft(x, axis=0)[::-1, 8:1:-3],
        rtol=1e-4,
        atol=1e-4,
    )


def test_signed_zeros_and_zero_bases_follow_numpy(run_plan: RunPlan, tmp_path: Path) -> None:
    """Edge cases Hypothesis found: of equal values (`-0.0` and `0.0`) `maximum` and
    `minimum` give the second, as numpy does; `0 ** z` is 0 for any exponent with a positive
    real part, imaginary part or not (numpy 2)."""
    xs = np.array([-0.0, 0.0, np.nan, 1.0, -0.0, 2.0], "f8")
    ys = np.array([0.0, -0.0, 1.0, np.nan, -0.0, 2.0], "f8")
    base = np.zeros(4, "c8")
    exps = np.array([1 + 1j, 0j, 0.5 + 3j, 1j], "c8")
    for name, values in (("xs", xs), ("ys", ys), ("b", base), ("e", exps)):
        write_v3(tmp_path / f"{name}.zarr", values, (4,))
    ops: list[dict[str, Any]] = []
    cases = {
        "max64": ("maximum", ["xs", "ys"], np.maximum(xs, ys)),
        "min64": ("minimum", ["xs", "ys"], np.minimum(xs, ys)),
        "max32": ("maximum", ["xs32", "ys32"], np.maximum(xs.astype("f4"), ys.astype("f4"))),
        "pow": ("power", ["b", "e"], np.power(base, exps)),
    }
    for name, cast in (("xs32", "xs"), ("ys32", "ys")):
        expr = {"op": "astype", "dtype": "float32", "args": [{"input": 0}]}
        ops.append({"id": name, "op": "elementwise", "inputs": [cast], "expr": expr})
    for name, (func, inputs, _) in cases.items():
        expr = {"op": func, "args": [{"input": 0}, {"input": 1}]}
        ops.append({"id": name, "op": "elementwise", "inputs": inputs, "expr": expr})
        ops.append(
            {
                "id": f"w{name}",
                "op": "write",
                "input": name,
                "target": str(tmp_path / f"{name}-out.zarr"),
            }
        )
    arrays = [{"id": n, "zarr": str(tmp_path / f"{n}.zarr")} for n in ("xs", "ys", "b", "e")]
    run_plan({"name": "edges", "arrays": arrays, "ops": ops}, {})
    for name, (_, _, want) in cases.items():
        got = read_zarr(tmp_path / f"{name}-out.zarr")
        # The sign of a zero counts, as does where NaNs are.
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        values = ~np.isnan(want.real)
        assert (np.signbit(got.real) == np.signbit(want.real))[values].all(), (name, got, want)
