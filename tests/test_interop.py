"""Zarr interoperability: what zarr-python 2 and 3 write, chunkfuse reads exactly; what chunkfuse
writes (v3, v3 sharded, v2), zarr-python 3 (and 2) read back exactly.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.codecs
from conftest import (
    ENGINE_DTYPES,
    ZARR2_PYTHON,
    assert_same_array,
    open_zarr,
    read_zarr,
    write_v2,
    write_v3,
)

RunPlan = Callable[..., dict[str, Any]]


def sample(dtype: str | np.dtype[Any], shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values that exercise the whole dtype (extremes, negative zero, NaN, inf)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        flat[:2] = [info.min, info.max][: min(2, n)]
    elif dt.kind == "f":
        flat = (rng.standard_normal(n) * 1e3).astype(dt)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dt).max, np.finfo(dt).tiny])
        flat[: min(n, specials.size)] = specials[: min(n, specials.size)]
    else:
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt) * 100
        flat[0] = complex(np.nan, 1.0)
        if n > 1:
            flat[1] = complex(-0.0, np.inf)
    return flat.reshape(shape)


def fill_for(dtype: np.dtype[Any]) -> Any:
    if dtype.kind == "b":
        return True
    if dtype.kind == "u":
        return 7
    if dtype.kind == "i":
        return -7
    if dtype.kind == "f":
        return float("nan")
    return complex(1.5, -2.0)


def copy_plan(src: Path | str, target: Path, **write: Any) -> dict[str, Any]:
    """Read ``src`` and write it unchanged to ``target``."""
    return {
        "name": "copy",
        "arrays": [{"id": "x", "zarr": str(src)}],
        "ops": [{"id": "out", "op": "write", "input": "x", "target": str(target), **write}],
    }


def check_copy(run_plan: RunPlan, src: Path | str, expected: np.ndarray, tmp_path: Path) -> None:
    target = tmp_path / "copy.zarr"
    summary = run_plan(copy_plan(src, target), {})
    assert any(str(target) in o for o in summary["outputs"]), summary["outputs"]
    result = read_zarr(target)
    assert_same_array(result, expected.astype(expected.dtype.newbyteorder("=")))


# --------------------------------------------------------------------------------------------
# Reading zarr-python 2 output
# --------------------------------------------------------------------------------------------

V2_COMPRESSORS = ["blosc", "zstd", "zlib", "none"]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("compressor", V2_COMPRESSORS)
def test_read_zarr_python2(run_plan: RunPlan, tmp_path: Path, compressor: str, order: str) -> None:
    dtype = {"blosc": "float32", "zstd": "int16", "zlib": "float64", "none": "uint32"}[compressor]
    data = sample(dtype, (9, 7, 5), seed=len(compressor))
    src = tmp_path / "v2.zarr"
    expected = write_v2(src, data, (4, 3, 5), compressor=compressor, order=order)
    assert json.loads((src / ".zarray").read_text())["order"] == order
    check_copy(run_plan, src, expected, tmp_path)


@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
def test_read_zarr_python2_dtypes(run_plan: RunPlan, tmp_path: Path, dtype: str) -> None:
    data = sample(dtype, (13, 6), seed=3)
    src = tmp_path / "v2.zarr"
    expected = write_v2(src, data, (5, 4), compressor="blosc")
    check_copy(run_plan, src, expected, tmp_path)


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">c8", ">u2"])
def test_read_zarr_python2_big_endian(run_plan: RunPlan, tmp_path: Path, dtype: str) -> None:
    native = np.dtype(dtype).newbyteorder("=")
    data = sample(native, (6, 5), seed=4)
    src = tmp_path / "v2be.zarr"
    write_v2(src, data, (4, 2), compressor="zlib", dtype=dtype)
    check_copy(run_plan, src, data, tmp_path)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["int32", "float32", "complex128", "bool"])
def test_read_zarr_python2_fill_and_missing(
    run_plan: RunPlan, tmp_path: Path, dtype: str, order: str
) -> None:
    dt = np.dtype(dtype)
    data = sample(dt, (7, 6, 4), seed=5)
    src = tmp_path / "v2.zarr"
    expected = write_v2(
        src,
        data,
        (3, 4, 3),
        compressor="blosc-zstd-bitshuffle",
        order=order,
        fill_value=fill_for(dt),
        missing=[(0, 0, 0), (2, 1, 1), (1, 0, 1)],
    )
    assert not (src / "0.0.0").exists()
    check_copy(run_plan, src, expected, tmp_path)


def test_read_zarr_python2_nested_keys(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("int64", (5, 8), seed=6)
    src = tmp_path / "nested.zarr"
    expected = write_v2(
        src,
        data,
        (2, 3),
        compressor="zstd",
        dimension_separator="/",
        fill_value=0,
        missing=[(1, 1)],
    )
    assert (src / "0" / "0").is_file()
    check_copy(run_plan, src, expected, tmp_path)


# --------------------------------------------------------------------------------------------
# Reading zarr-python 3 output
# --------------------------------------------------------------------------------------------

V3_CODECS = ["zstd", "gzip", "blosc", "zstd+crc32c", "crc32c", "none"]


@pytest.mark.parametrize("codec", V3_CODECS)
def test_read_zarr_python3_codecs(run_plan: RunPlan, tmp_path: Path, codec: str) -> None:
    data = sample("float32", (11, 6, 7), seed=7)
    src = tmp_path / "v3.zarr"
    expected = write_v3(src, data, (4, 6, 3), codec=codec, fill_value=0.0, missing=[(1, 0, 1)])
    check_copy(run_plan, src, expected, tmp_path)


@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
def test_read_zarr_python3_dtypes(run_plan: RunPlan, tmp_path: Path, dtype: str) -> None:
    dt = np.dtype(dtype)
    data = sample(dt, (13, 6), seed=8)
    src = tmp_path / "v3.zarr"
    expected = write_v3(src, data, (5, 4), fill_value=fill_for(dt), missing=[(1, 1)])
    check_copy(run_plan, src, expected, tmp_path)


@pytest.mark.parametrize("codec", ["zstd", "gzip+crc32c"])
def test_read_zarr_python3_sharded(run_plan: RunPlan, tmp_path: Path, codec: str) -> None:
    data = sample("int32", (10, 12, 5), seed=9)
    src = tmp_path / "sharded.zarr"
    compressors: list[Any] = (
        [zarr.codecs.ZstdCodec(level=1)]
        if codec == "zstd"
        else [zarr.codecs.GzipCodec(level=3), zarr.codecs.Crc32cCodec()]
    )
    arr = zarr.create_array(
        store=str(src),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(2, 3, 5),
        shards=(4, 6, 5),
        compressors=compressors,
        fill_value=-1,
        zarr_format=3,
    )
    # leave the last shard row empty and some inner chunks unwritten: fill value there
    expected = np.full(data.shape, -1, dtype=data.dtype)
    arr[0:8, 0:12] = data[0:8, 0:12]
    expected[0:8, 0:12] = data[0:8, 0:12]
    arr[0:2, 0:3] = -1  # an inner chunk equal to the fill value is not stored
    expected[0:2, 0:3] = -1
    arr[8:10, 6:9] = data[8:10, 6:9]  # one inner chunk of the partial last shard row
    expected[8:10, 6:9] = data[8:10, 6:9]
    assert not (src / "c" / "2" / "0" / "0").exists()
    check_copy(run_plan, src, expected, tmp_path)
    # Reductions read the shards inner chunk by inner chunk too (across shards, along and
    # across the inner chunks).
    for axes, target in [([0], "sum0.zarr"), ([1, 2], "sum12.zarr")]:
        plan = {
            "name": "sharded-sum",
            "arrays": [{"id": "x", "zarr": str(src)}],
            "ops": [
                {"id": "s", "op": "reduce", "input": "x", "func": "sum", "axes": axes},
                {"id": "out", "op": "write", "input": "s", "target": str(tmp_path / target)},
            ],
        }
        run_plan(plan, {})
        want = expected.sum(axis=tuple(axes))
        assert_same_array(read_zarr(tmp_path / target), want.astype(want.dtype.newbyteorder("=")))


def test_read_zarr_python3_transpose(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("float64", (6, 9, 4), seed=10)
    src = tmp_path / "transposed.zarr"
    expected = write_v3(
        src,
        data,
        (4, 5, 3),
        filters=[zarr.codecs.TransposeCodec(order=(2, 0, 1))],
        missing=[(0, 1, 1)],
        fill_value=0.5,
    )
    meta = json.loads((src / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "transpose"
    check_copy(run_plan, src, expected, tmp_path)


def test_read_zarr_python3_big_endian(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("int64", (7, 5), seed=11)
    src = tmp_path / "be.zarr"
    expected = write_v3(src, data, (3, 5), serializer=zarr.codecs.BytesCodec(endian="big"))
    check_copy(run_plan, src, expected, tmp_path)


def test_read_zarr_python3_sharded_transpose_crc(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("complex64", (8, 8), seed=12)
    src = tmp_path / "st.zarr"
    expected = write_v3(
        src,
        data,
        (2, 4),
        shards=(4, 8),
        codec="zstd+crc32c",
        filters=[zarr.codecs.TransposeCodec(order=(1, 0))],
        missing=[(1, 0)],
        fill_value=complex(0, 1),
    )
    check_copy(run_plan, src, expected, tmp_path)


def test_read_array_inside_group_and_file_url(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("uint16", (5, 9), seed=13)
    store = tmp_path / "store.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    sub = group.create_group("grp")
    arr = sub.create_array(name="arr", shape=data.shape, dtype=data.dtype, chunks=(2, 4))
    arr[...] = data
    check_copy(run_plan, f"{store}/grp/arr", data, tmp_path)
    target = tmp_path / "from-url.zarr"
    run_plan(copy_plan(f"file://{store}/grp/arr", target), {})
    assert_same_array(read_zarr(target), data)


def test_zero_dimensional_array(run_plan: RunPlan, tmp_path: Path) -> None:
    src = tmp_path / "scalar.zarr"
    arr = zarr.create_array(store=str(src), shape=(), dtype="float64", chunks=(), zarr_format=3)
    arr[...] = 2.5
    check_copy(run_plan, src, np.asarray(2.5), tmp_path)


# --------------------------------------------------------------------------------------------
# Slicing
# --------------------------------------------------------------------------------------------

SELECTIONS: list[tuple[list[Any], tuple[Any, ...]]] = [
    ([1, None, [None, None, 2]], (1, slice(None), slice(None, None, 2))),
    ([[-3, None, 1], [1, -1, 2]], (slice(-3, None, 1), slice(1, -1, 2))),
    ([[2, 7, 3]], (slice(2, 7, 3),)),
    ([-1], (-1,)),
    ([None, 4, [5, None, None]], (slice(None), 4, slice(5, None))),
    ([[None, 100, None]], (slice(None, 100),)),
    ([[None, None, -1], [None, None, -2], [-3, 1, -1]], np.s_[::-1, ::-2, -3:1:-1]),
    ([[100, -100, -4], 2], np.s_[100:-100:-4, 2]),
    ([[0, None, -1], [5, 5, -1]], np.s_[0::-1, 5:5:-1]),
]


@pytest.mark.parametrize("fmt", ["v2", "v3"])
def test_slices(run_plan: RunPlan, tmp_path: Path, fmt: str) -> None:
    data = sample("int16", (9, 7, 8), seed=14)
    src = tmp_path / "src.zarr"
    if fmt == "v2":
        expected = write_v2(
            src, data, (4, 3, 3), compressor="blosc", order="F", fill_value=0, missing=[(1, 1, 1)]
        )
    else:
        expected = write_v3(src, data, (4, 3, 3), fill_value=0, missing=[(1, 1, 1)])
    ops: list[dict[str, Any]] = []
    for k, (selection, _) in enumerate(SELECTIONS):
        ops.append({"id": f"s{k}", "op": "slice", "input": "x", "selection": selection})
        ops.append(
            {"id": f"w{k}", "op": "write", "input": f"s{k}", "target": str(tmp_path / f"s{k}.zarr")}
        )
    run_plan({"arrays": [{"id": "x", "zarr": str(src)}], "ops": ops}, {})
    failures = []
    for k, (selection, index) in enumerate(SELECTIONS):
        try:
            assert_same_array(read_zarr(tmp_path / f"s{k}.zarr"), expected[index])
        except AssertionError as exc:
            failures.append(f"selection {selection}: {str(exc).strip()[:300]}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------------------------
# What chunkfuse writes
# --------------------------------------------------------------------------------------------

WRITE_FORMATS: dict[str, dict[str, Any]] = {
    "v3": {},
    "v3-chunks": {"chunks": [3, 2]},
    "v3-sharded": {"chunks": [3, 2], "shards": [6, 4]},
    "v3-blosc": {"codec": {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"}},
    "v3-gzip": {"codec": {"name": "gzip", "level": 5}},
    "v3-none": {"codec": {"name": "none"}},
    "v3-zstd1": {"codec": {"name": "zstd", "level": 1}},
    "v2": {"zarr_format": 2},
    "v2-blosc": {
        "zarr_format": 2,
        "codec": {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
    },
    "v2-none": {"zarr_format": 2, "codec": {"name": "none"}},
}


@pytest.mark.parametrize("fmt", list(WRITE_FORMATS))
def test_engine_output_readable_by_zarr_python3(
    run_plan: RunPlan, tmp_path: Path, fmt: str
) -> None:
    """One plan writes every dtype in the given format; zarr-python 3 reads each back exactly."""
    write = WRITE_FORMATS[fmt]
    arrays: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    expected: dict[str, np.ndarray] = {}
    for dtype in ENGINE_DTYPES:
        data = sample(dtype, (11, 7), seed=len(dtype))
        src = tmp_path / f"in-{dtype}.zarr"
        expected[dtype] = write_v3(
            src, data, (4, 3), fill_value=fill_for(np.dtype(dtype)), missing=[(1, 1)]
        )
        arrays.append({"id": f"x_{dtype}", "zarr": str(src)})
        ops.append(
            {
                "id": f"w_{dtype}",
                "op": "write",
                "input": f"x_{dtype}",
                "target": str(tmp_path / f"out-{dtype}.zarr"),
                **write,
            }
        )
    summary = run_plan({"name": f"write-{fmt}", "arrays": arrays, "ops": ops}, {})
    assert len(summary["outputs"]) == len(ENGINE_DTYPES), summary["outputs"]
    failures = []
    for dtype in ENGINE_DTYPES:
        target = tmp_path / f"out-{dtype}.zarr"
        try:
            check_written_metadata(target, write, (4, 3))
            assert_same_array(read_zarr(target), expected[dtype])
        except AssertionError as exc:
            failures.append(f"{dtype}: {str(exc).strip()[:400]}")
    assert not failures, "\n".join(failures)


def check_written_metadata(
    target: Path, write: dict[str, Any], input_chunks: tuple[int, ...]
) -> None:
    fmt = write.get("zarr_format", 3)
    arr = open_zarr(target)
    assert arr.metadata.zarr_format == fmt, f"zarr_format {arr.metadata.zarr_format} != {fmt}"
    assert (target / ("zarr.json" if fmt == 3 else ".zarray")).is_file()
    chunks = tuple(write.get("chunks", input_chunks))
    assert tuple(arr.chunks) == chunks, f"chunks {arr.chunks} != {chunks}"
    if "shards" in write:
        assert arr.shards == tuple(write["shards"]), f"shards {arr.shards} != {write['shards']}"
    codec = write.get("codec", {"name": "zstd", "level": 3})
    if fmt == 3:
        meta = json.loads((target / "zarr.json").read_text())
        codecs = meta["codecs"]
        if "shards" in write:
            assert codecs[-1]["name"] == "sharding_indexed", codecs
            codecs = codecs[-1]["configuration"]["codecs"]
        names = [c["name"] for c in codecs]
        if codec["name"] == "none":
            assert names == ["bytes"], names
        else:
            assert names[-1] == codec["name"] or codec["name"] in names, names
            config = next(c.get("configuration", {}) for c in codecs if c["name"] == codec["name"])
            if codec["name"] in ("zstd", "gzip"):
                assert config.get("level") == codec["level"], config
    else:
        meta = json.loads((target / ".zarray").read_text())
        compressor = meta["compressor"]
        if codec["name"] == "none":
            assert compressor is None, compressor
        else:
            assert compressor is not None and compressor["id"] == codec["name"], compressor


@pytest.mark.parametrize("dtype", ["int16", "float64", "complex64", "bool", "uint64"])
def test_engine_v2_output_readable_by_zarr_python2(
    run_plan: RunPlan, tmp_path: Path, dtype: str
) -> None:
    data = sample(dtype, (9, 5), seed=15)
    src = tmp_path / "in.zarr"
    expected = write_v3(src, data, (4, 2))
    target = tmp_path / "out-v2.zarr"
    run_plan(copy_plan(src, target, zarr_format=2), {})
    npy = tmp_path / "read.npy"
    code = (
        "import sys, numpy, zarr; "
        "a = zarr.open_array(sys.argv[1], mode='r'); numpy.save(sys.argv[2], a[...])"
    )
    proc = subprocess.run(
        [str(ZARR2_PYTHON), "-c", code, str(target), str(npy)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert_same_array(np.load(npy), expected)


def test_engine_sharded_output_has_whole_shards(run_plan: RunPlan, tmp_path: Path) -> None:
    data = sample("float32", (12, 10), seed=16)
    src = tmp_path / "in.zarr"
    write_v3(src, data, (12, 10))
    target = tmp_path / "sharded.zarr"
    run_plan(copy_plan(src, target, chunks=[3, 5], shards=[6, 10]), {})
    shard_files = sorted(
        p.relative_to(target).as_posix() for p in (target / "c").rglob("*") if p.is_file()
    )
    assert shard_files == ["c/0/0", "c/1/0"], shard_files
    arr = open_zarr(target)
    assert arr.shards == (6, 10) and arr.chunks == (3, 5)
    assert_same_array(read_zarr(target), data)


def test_write_overwrites_existing_target(run_plan: RunPlan, tmp_path: Path) -> None:
    """``overwrite`` defaults to true: a previous, differently shaped array is replaced."""
    target = tmp_path / "out.zarr"
    write_v3(target, np.zeros((30, 30), dtype="int8"), (7, 7))
    data = sample("float64", (4, 3), seed=17)
    src = tmp_path / "in.zarr"
    write_v3(src, data, (2, 2))
    run_plan(copy_plan(src, target), {})
    assert_same_array(read_zarr(target), data)


def test_overwrite_removes_previous_array(run_plan: RunPlan, tmp_path: Path) -> None:
    """``overwrite`` replaces the whole previous array, whatever its format, rank or chunking:
    no stale chunk objects remain and a 0-d result can replace an N-d array."""
    target = tmp_path / "out.zarr"
    first = sample("int32", (6, 6), seed=18)
    src = tmp_path / "first.zarr"
    write_v3(src, first, (3, 3))
    run_plan(copy_plan(src, target), {})
    assert (target / "c").is_dir()

    second = sample("int32", (6, 6), seed=19)
    src2 = tmp_path / "second.zarr"
    expected = write_v3(src2, second, (3, 3))
    run_plan(copy_plan(src2, target, zarr_format=2), {})
    names = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert names == [".zarray", "0.0", "0.1", "1.0", "1.1"] or set(names) <= {
        ".zarray",
        ".zattrs",
        "0.0",
        "0.1",
        "1.0",
        "1.1",
    }, f"stale files after overwriting a v3 array with a v2 one: {names}"
    assert_same_array(read_zarr(target), expected)

    run_plan(copy_plan(src, target), {})  # back to v3, 2-D
    scalar = tmp_path / "scalar.zarr"
    arr = zarr.create_array(store=str(scalar), shape=(), dtype="int32", chunks=(), zarr_format=3)
    arr[...] = 11
    run_plan(copy_plan(scalar, target), {})
    assert_same_array(read_zarr(target), np.asarray(11, dtype=np.int32))
