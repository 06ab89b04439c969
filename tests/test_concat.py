"""The plan IR's `concat` op against `numpy.concatenate`: joined arrays written, reduced,
sliced and combined elementwise, parts stored with their own chunks or computed first, and
one clear error per kind of bad input."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import read_zarr, write_v3
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

RunPlan = Callable[..., dict[str, Any]]

SETTINGS = settings(
    max_examples=int(os.environ.get("CHUNKFUSE_HYPOTHESIS_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


@st.composite
def joins(draw: st.DrawFn) -> dict[str, Any]:
    """Parts that join along one axis: their values, chunks, the axis and what consumes it."""
    rank = draw(st.integers(1, 3))
    axis = draw(st.integers(-rank, rank - 1))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    dtype = draw(st.sampled_from(["float32", "float64", "int16", "uint8", "bool"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        s = list(shape)
        s[axis] = draw(st.integers(0, 7))
        values = (rng.standard_normal(s) * 50).astype(dtype)
        chunks = [max(1, draw(st.integers(1, max(n, 1)))) for n in s]
        # A part given as `x * 1` (not stored as it is) is computed into an intermediate; a
        # cropped one (an index and a crop of a larger array) is read where it is stored.
        kind = draw(st.sampled_from(["stored", "computed", "cropped"]))
        parts.append({"values": values, "chunks": chunks, "kind": kind})
    consumer = draw(st.sampled_from(["write", "sum", "slice", "add"]))
    reduce_axis = draw(st.integers(0, rank - 1))
    write_chunks = [draw(st.integers(1, 8)) for _ in range(rank)]
    return {
        "axis": axis,
        "parts": parts,
        "consumer": consumer,
        "reduce_axis": reduce_axis,
        "write_chunks": write_chunks,
    }


def join_plan(case: dict[str, Any], root: Path) -> tuple[dict[str, Any], Path]:
    """The plan joining `case`'s parts (stored under `root`) and consuming the result."""
    arrays, ops, names = [], [], []
    for k, part in enumerate(case["parts"]):
        path = root / f"p{k}.zarr"
        values = part["values"]
        if part["kind"] == "cropped":
            padded = np.zeros((2, *(n + 2 for n in values.shape)), values.dtype)
            padded[(1, *(slice(1, 1 + n) for n in values.shape))] = values
            write_v3(path, padded, [2, *(c + 1 for c in part["chunks"])])
        else:
            write_v3(path, values, part["chunks"])
        arrays.append({"id": f"p{k}", "zarr": str(path)})
        name = f"p{k}"
        if part["kind"] == "cropped":
            name = f"q{k}"
            selection = [1, *([1, 1 + n] for n in values.shape)]
            ops.append({"id": name, "op": "slice", "input": f"p{k}", "selection": selection})
        if part["kind"] == "computed":
            name = f"q{k}"
            expr = {"op": "multiply", "args": [{"input": 0}, {"const": 1}]}
            if part["values"].dtype == bool:
                expr = {"op": "logical_and", "args": [{"input": 0}, {"const": True}]}
            ops.append({"id": name, "op": "elementwise", "inputs": [f"p{k}"], "expr": expr})
        names.append(name)
    ops.append({"id": "c", "op": "concat", "inputs": names, "axis": case["axis"]})
    last = "c"
    consumer = case["consumer"]
    if consumer == "sum":
        ops.append(
            {"id": "r", "op": "reduce", "input": "c", "func": "sum", "axes": [case["reduce_axis"]]}
        )
        last = "r"
    elif consumer == "slice":
        sel = [[1, None, 2]] + [None] * (len(case["write_chunks"]) - 1)
        ops.append({"id": "s", "op": "slice", "input": "c", "selection": sel})
        last = "s"
    elif consumer == "add":
        ops.append(
            {
                "id": "a",
                "op": "elementwise",
                "inputs": ["c", "c"],
                "expr": {"op": "add", "args": [{"input": 0}, {"input": 1}]},
            }
        )
        last = "a"
    target = root / "out.zarr"
    write: dict[str, Any] = {"id": "w", "op": "write", "input": last, "target": str(target)}
    if consumer == "write":
        write["chunks"] = case["write_chunks"]
    ops.append(write)
    return {"name": "hypothesis-concat", "arrays": arrays, "ops": ops}, target


def expected_of(case: dict[str, Any]) -> np.ndarray:
    joined = np.concatenate([p["values"] for p in case["parts"]], axis=case["axis"])
    match case["consumer"]:
        case "sum":
            return joined.sum(axis=case["reduce_axis"])
        case "slice":
            return joined[1::2]
        case "add":
            return joined + joined
    return joined


@SETTINGS
@given(case=joins())
def test_concat_matches_numpy(run_plan: RunPlan, case: dict[str, Any]) -> None:
    expected = expected_of(case)
    with tempfile.TemporaryDirectory() as tmp:
        plan, target = join_plan(case, Path(tmp))
        note(json.dumps(plan))
        run_plan(plan, {})
        got = read_zarr(target)
    assert got.dtype == expected.dtype
    if expected.dtype.kind == "f" and case["consumer"] == "sum":
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)
    else:
        np.testing.assert_array_equal(got, expected)


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    count=st.integers(1, 3),
    data=st.data(),
)
def test_stack_through_new_axes_matches_numpy(
    run_plan: RunPlan, shape: list[int], count: int, data: st.DataObject
) -> None:
    """numpy's `stack`: each input given a new axis by a `slice` with "newaxis", then joined."""
    axis = data.draw(st.integers(0, len(shape)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    parts = [rng.standard_normal(shape).astype("f4") for _ in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        arrays, ops = [], []
        for k, values in enumerate(parts):
            chunks = [data.draw(st.integers(1, n)) for n in shape]
            write_v3(root / f"p{k}.zarr", values, chunks)
            arrays.append({"id": f"p{k}", "zarr": str(root / f"p{k}.zarr")})
            selection: list[Any] = [None] * axis + ["newaxis"]
            ops.append({"id": f"e{k}", "op": "slice", "input": f"p{k}", "selection": selection})
        ops.append(
            {"id": "c", "op": "concat", "inputs": [f"e{k}" for k in range(count)], "axis": axis}
        )
        ops.append({"id": "w", "op": "write", "input": "c", "target": str(root / "out.zarr")})
        plan = {"name": "hypothesis-stack", "arrays": arrays, "ops": ops}
        note(json.dumps(plan))
        run_plan(plan, {})
        got = read_zarr(root / "out.zarr")
    np.testing.assert_array_equal(got, np.stack(parts, axis=axis))


def test_joined_parts_are_read_where_they_are(run_plan: RunPlan, tmp_path: Path) -> None:
    """Stored parts, also cropped or given a new axis, are read in place: the max of a join
    runs as one stage, no copy first."""
    a = np.arange(60, dtype="f4").reshape(6, 10)
    b = -np.arange(40, dtype="f4").reshape(4, 10)
    write_v3(tmp_path / "a.zarr", a, (4, 3))
    write_v3(tmp_path / "b.zarr", b, (3, 10))
    plan = {
        "arrays": [
            {"id": "a", "zarr": str(tmp_path / "a.zarr")},
            {"id": "b", "zarr": str(tmp_path / "b.zarr")},
        ],
        "ops": [
            {"id": "s", "op": "slice", "input": "a", "selection": [[2, 5]]},
            {"id": "c", "op": "concat", "inputs": ["a", "b", "s"]},
            {"id": "m", "op": "reduce", "input": "c", "func": "max", "axes": [0]},
            {"id": "e", "op": "slice", "input": "b", "selection": [2, "newaxis"]},
            {"id": "r", "op": "slice", "input": "a", "selection": [[3, 4]]},
            {"id": "t", "op": "concat", "inputs": ["e", "r", "e"]},
            {"id": "w", "op": "write", "input": "m", "target": str(tmp_path / "m.zarr")},
            {"id": "v", "op": "write", "input": "t", "target": str(tmp_path / "t.zarr")},
        ],
    }
    summary = run_plan(plan, {})
    assert len(summary["stages"]) == 2, summary["stages"]
    want = np.concatenate([a, b, a[2:5]]).max(axis=0)
    np.testing.assert_array_equal(read_zarr(tmp_path / "m.zarr"), want)
    rows = np.concatenate([b[2][None], a[3:4], b[2][None]])
    np.testing.assert_array_equal(read_zarr(tmp_path / "t.zarr"), rows)


@pytest.mark.parametrize("selection", [[[0, 1]], [[0, 1], [0, 2]], [[None, 2]]])
def test_crops_from_the_start_join_only_their_rows(
    run_plan: RunPlan, tmp_path: Path, selection: list[Any]
) -> None:
    """A crop from index 0 maps coordinates like the identity, yet its array's chunks hold
    rows past the crop: joined before that array (Cubed's `pad`), only its own rows are
    placed, in copies and in reductions. Found by Cubed's test_pad."""
    x = np.arange(1, 13, dtype="i8").reshape(4, 3)
    write_v3(tmp_path / "x.zarr", x, (3, 2))
    index = tuple(slice(*s) for s in selection)
    cropped = x[index]
    rest = x[:, : cropped.shape[1]]
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}],
        "ops": [
            {"id": "s", "op": "slice", "input": "x", "selection": selection},
            {"id": "r", "op": "slice", "input": "x", "selection": [None, [0, cropped.shape[1]]]},
            {"id": "c", "op": "concat", "inputs": ["s", "r", "s"]},
            {"id": "m", "op": "reduce", "input": "c", "func": "sum", "axes": [1]},
            {"id": "w", "op": "write", "input": "c", "target": str(tmp_path / "c.zarr")},
            {"id": "v", "op": "write", "input": "m", "target": str(tmp_path / "m.zarr")},
        ],
    }
    run_plan(plan, {})
    joined = np.concatenate([cropped, rest, cropped])
    np.testing.assert_array_equal(read_zarr(tmp_path / "c.zarr"), joined)
    np.testing.assert_array_equal(read_zarr(tmp_path / "m.zarr"), joined.sum(axis=1))


@pytest.mark.parametrize(
    ("op", "field", "message"),
    [
        ({"inputs": ["a", "b"], "axis": 2}, "ops[0].axis", "out of range"),
        ({"inputs": ["a", "i"]}, "ops[0].inputs[1]", "dtype"),
        ({"inputs": ["a", "b"], "axis": 1}, "ops[0].inputs[1]", "cannot join"),
        ({"inputs": []}, "ops[0].inputs", "at least one input"),
        ({"inputs": ["a", "nope"]}, "ops[0].inputs[1]", "no array or op"),
    ],
)
def test_bad_concat_is_refused_before_anything_runs(
    run_plan: RunPlan, tmp_path: Path, op: dict[str, Any], field: str, message: str
) -> None:
    write_v3(tmp_path / "a.zarr", np.zeros((4, 5), "f4"), (2, 5))
    write_v3(tmp_path / "b.zarr", np.zeros((3, 4), "f4"), (2, 4))
    write_v3(tmp_path / "i.zarr", np.zeros((4, 5), "i4"), (2, 5))
    target = tmp_path / "out.zarr"
    plan = {
        "arrays": [{"id": n, "zarr": str(tmp_path / f"{n}.zarr")} for n in ("a", "b", "i")],
        "ops": [
            {"id": "c", "op": "concat", **op},
            {"id": "w", "op": "write", "input": "c", "target": str(target)},
        ],
    }
    result = run_plan(plan, {}, expect_rc=2)
    assert field in result["stderr"] and message in result["stderr"], result["stderr"]
    assert not target.exists()
