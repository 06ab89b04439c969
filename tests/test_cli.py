"""The CLI contract: `info`, `rechunk` (arrays and groups), `bench decode`, `bench encode`,
`bench codec`, the `run --json` summary and its parameters."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import (
    Cli,
    assert_same_array,
    check_summary,
    list_files,
    open_zarr,
    read_zarr,
    write_v2,
    write_v3,
)
from era5_dataset import write_era5_v2

RunPlan = Callable[..., dict[str, Any]]

INFO_KEYS = (
    "zarr_format",
    "shape",
    "dtype",
    "chunks",
    "shards",
    "codecs",
    "fill_value",
    "stored_bytes",
    "nbytes",
    "compression_ratio",
)


def smooth(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    grid = np.indices(shape).sum(axis=0).astype(np.float64)
    return (np.sin(grid / 7.0) * 100).astype(dtype)


def chunk_bytes(path: Path) -> int:
    """Bytes of stored chunk objects (everything but metadata)."""
    meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup"}
    return sum(p.stat().st_size for p in list_files(path) if p.name not in meta)


def check_info(info: dict[str, Any], path: Path, data: np.ndarray) -> None:
    for key in INFO_KEYS:
        assert key in info, f"info --json lacks {key!r}: {info}"
    assert list(info["shape"]) == list(data.shape)
    assert np.dtype(info["dtype"]) == data.dtype, info["dtype"]
    assert info["nbytes"] == data.nbytes
    assert isinstance(info["codecs"], list)
    total = sum(p.stat().st_size for p in list_files(path))
    assert chunk_bytes(path) <= info["stored_bytes"] <= total, (info["stored_bytes"], total)
    assert info["compression_ratio"] == pytest.approx(
        info["nbytes"] / info["stored_bytes"], rel=1e-2
    )


def test_info_v3(cli: Cli, tmp_path: Path) -> None:
    data = smooth((20, 30, 16))
    path = tmp_path / "v3.zarr"
    write_v3(path, data, (5, 10, 16), codec="zstd", fill_value=0.0)
    info = cli("info", path, "--json").json()
    check_info(info, path, data)
    assert info["zarr_format"] == 3
    assert list(info["chunks"]) == [5, 10, 16]
    assert info["shards"] is None
    assert "zstd" in json.dumps(info["codecs"]).lower()
    assert info["fill_value"] == 0
    assert info["compression_ratio"] > 1.0
    text = cli("info", path).stdout
    for needle in ("20", "30", "16", "float32", "zstd"):
        assert needle in text, f"`chunkfuse info` (text) lacks {needle!r}:\n{text}"


def test_info_v3_sharded(cli: Cli, tmp_path: Path) -> None:
    data = smooth((16, 16), "int32")
    path = tmp_path / "sharded.zarr"
    write_v3(path, data, (4, 4), shards=(8, 16), codec="zstd")
    info = cli("info", path, "--json").json()
    check_info(info, path, data)
    assert list(info["chunks"]) == [4, 4]
    assert list(info["shards"]) == [8, 16]


def test_info_v2(cli: Cli, tmp_path: Path) -> None:
    data = smooth((12, 9), "float64")
    path = tmp_path / "v2.zarr"
    write_v2(path, data, (5, 9), compressor="blosc", order="F", fill_value=-1.0)
    info = cli("info", path, "--json").json()
    check_info(info, path, data)
    assert info["zarr_format"] == 2
    assert list(info["chunks"]) == [5, 9]
    assert info["shards"] is None
    assert "blosc" in json.dumps(info["codecs"]).lower()
    assert info["fill_value"] == -1


def test_info_of_a_group_describes_each_array(cli: Cli, tmp_path: Path) -> None:
    t2m = smooth((6, 5, 4), "float32")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m), "expver": (("time",), np.array(["1"] * 6))}
    )
    ds.to_zarr(tmp_path / "ds.zarr", zarr_format=2, encoding={"t2m": {"chunks": (2, 5, 4)}})
    group = cli("info", tmp_path / "ds.zarr", "--json").json()
    assert group["zarr_format"] == 2
    arrays = {a["name"]: a for a in group["arrays"]}
    assert set(arrays) == {"t2m", "expver"}, arrays
    assert list(arrays["t2m"]["info"]["chunks"]) == [2, 5, 4]
    assert arrays["expver"]["info"] is None and "strings" in arrays["expver"]["note"]
    text = cli("info", tmp_path / "ds.zarr").stdout
    assert "a Zarr v2 group of 2 array(s)" in text and "t2m" in text, text


def test_a_group_with_nested_groups_is_described_and_its_rechunk_names_the_group(
    cli: Cli, tmp_path: Path
) -> None:
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    root.create_array("top", shape=(10,), chunks=(5,), dtype="f4")[:] = 1
    root.create_group("sub").create_array("inner", shape=(4,), chunks=(2,), dtype="i4")[:] = 1
    group = cli("info", tmp_path / "g.zarr", "--json").json()
    assert [a["name"] for a in group["arrays"]] == ["top"] and group["groups"] == ["sub"]
    text = cli("info", tmp_path / "g.zarr").stdout
    assert "group of 1 array(s) and 1 nested group(s)" in text and "sub" in text, text
    refused = cli(
        "rechunk", tmp_path / "g.zarr", tmp_path / "out.zarr", "--chunks", "dim_0=2", expect_rc=2
    )
    assert 'nested group "sub";' in refused.stderr, refused.stderr
    assert not (tmp_path / "out.zarr").exists()


RECHUNK_CASES: list[tuple[list[str], dict[str, Any]]] = [
    ([], {"codec": "zstd", "level": 3}),
    (["--codec", "zstd:1"], {"codec": "zstd", "level": 1}),
    (["--codec", "blosc:lz4:5"], {"codec": "blosc"}),
    (["--codec", "none"], {"codec": None}),
    (["--shards", "20,14,18"], {"codec": "zstd", "level": 3, "shards": (20, 14, 18)}),
    (["--threads", "1", "--max-mem", "8MB"], {"codec": "zstd", "level": 3}),
]


@pytest.mark.parametrize("case", range(len(RECHUNK_CASES)))
def test_rechunk_cli(cli: Cli, tmp_path: Path, case: int) -> None:
    args, want = RECHUNK_CASES[case]
    data = smooth((20, 30, 40))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (1, 30, 40))
    target = tmp_path / "out.zarr"
    result = cli("rechunk", src, target, "--chunks", "20,7,9", *args, "--json")
    summary = result.json()
    check_summary(summary)
    assert summary["bytes_written"] > 0 and summary["decoded_bytes"] >= data.nbytes
    out = open_zarr(target)
    assert out.metadata.zarr_format == 3
    assert tuple(out.chunks) == (20, 7, 9)
    if "shards" in want:
        assert out.shards == want["shards"]
    meta = json.loads((target / "zarr.json").read_text())
    text = json.dumps(meta["codecs"])
    if want["codec"] is None:
        assert "zstd" not in text and "blosc" not in text and "gzip" not in text, text
    else:
        assert want["codec"] in text, text
        if "level" in want:
            assert f'"level": {want["level"]}' in text, text
    assert_same_array(read_zarr(target), data)


def test_rechunk_cli_from_v2_and_sharded(cli: Cli, tmp_path: Path) -> None:
    data = smooth((10, 12, 14), "int16")
    v2 = tmp_path / "v2.zarr"
    write_v2(v2, data, (3, 12, 5), compressor="blosc", order="F")
    sharded = tmp_path / "sharded.zarr"
    cli("rechunk", v2, sharded, "--chunks", "5,4,7", "--shards", "10,12,14", "--json")
    assert open_zarr(sharded).shards == (10, 12, 14)
    back = tmp_path / "back.zarr"
    cli("rechunk", sharded, back, "--chunks", "1,12,14", "--json")
    assert_same_array(read_zarr(back), data)


@pytest.mark.parametrize("spelling", ["separate", "equals"])
def test_rechunk_cli_takes_minus_one_for_whole_axes(
    cli: Cli, tmp_path: Path, spelling: str
) -> None:
    data = smooth((20, 26, 36))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (1, 26, 36))

    def flag(name: str, value: str) -> list[str]:
        return [name, value] if spelling == "separate" else [f"{name}={value}"]

    chunked = tmp_path / "chunked.zarr"
    cli("rechunk", src, chunked, *flag("--chunks", "-1,13,36"), "--json")
    assert open_zarr(chunked).chunks == (20, 13, 36)
    sharded = tmp_path / "sharded.zarr"
    args = [*flag("--chunks", "-1,13,12"), *flag("--shards", "-1,26,-1")]
    cli("rechunk", src, sharded, *args, "--json")
    out = open_zarr(sharded)
    assert (out.chunks, out.shards) == ((20, 13, 12), (20, 26, 36))
    assert_same_array(read_zarr(sharded), data)
    bad = cli("rechunk", src, tmp_path / "bad.zarr", *flag("--chunks", "-1,x,36"), expect_rc=2)
    assert 'at --chunks: "x" in "-1,x,36": not an integer' in bad.stderr, bad.stderr
    # Another negative size was once taken as the whole axis.
    neg = cli("rechunk", src, tmp_path / "neg.zarr", *flag("--chunks", "-7,13,36"), expect_rc=2)
    assert '"-7" in "-7,13,36": sizes are positive' in neg.stderr, neg.stderr
    assert not (tmp_path / "neg.zarr").exists()
    fmt = cli("rechunk", src, tmp_path / "f4.zarr", "--chunks=-1,13,36", "--zarr-format", "4",
              expect_rc=2)  # fmt: skip
    assert "--zarr-format" in fmt.stderr and "memory://" not in fmt.stderr, fmt.stderr


def test_rechunk_cli_of_a_group_by_dimension_name(cli: Cli, tmp_path: Path) -> None:
    era5 = write_era5_v2(tmp_path / "era5.zarr")
    target = tmp_path / "era5-ts.zarr"
    args = ["rechunk", era5, target, "--chunks", "time=-1,latitude=10,longitude=20"]
    summary = cli(*args, "--max-mem", "64MB", "--json").json()
    names = sorted(Path(o).name for o in summary["outputs"])
    assert names == ["latitude", "longitude", "sp", "t2m", "time", "u10", "v10"], names
    got = xr.open_zarr(target).load()
    xr.testing.assert_identical(got, xr.open_zarr(era5).load())
    assert got["t2m"].encoding["chunks"] == (12, 10, 20)
    # Whatever is at the target is not replaced unless asked to.
    refused = cli(*args, expect_rc=2)
    assert f'in store "{target}": the target already holds a Zarr group' in refused.stderr
    assert "--overwrite" in refused.stderr
    cli(*args, "--overwrite", "--json")
    typo = cli("rechunk", era5, tmp_path / "typo.zarr", "--chunks", "time=-1,lat=10", expect_rc=2)
    assert 'no array of the group has a dimension "lat"' in typo.stderr, typo.stderr
    assert "latitude, longitude, time" in typo.stderr
    assert not (tmp_path / "typo.zarr").exists()
    axes = cli("rechunk", era5, tmp_path / "axes.zarr", "--chunks", "-1,10,20", expect_rc=2)
    assert "give chunks by dimension name" in axes.stderr, axes.stderr


def one_op_plan(name: str, src: Path, target: Path, op: str, const: float) -> dict[str, Any]:
    """The plan writing ``op(x, const)`` of the array at ``src`` to ``target``."""
    return {
        "name": name,
        "arrays": [{"id": "x", "zarr": str(src)}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {"op": op, "args": [{"input": 0}, {"const": const}]},
            },
            {"id": "out", "op": "write", "input": "y", "target": str(target)},
        ],
    }


def test_run_summary(run_plan: RunPlan, tmp_path: Path) -> None:
    data = smooth((8, 10, 12))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (2, 5, 12))
    target = tmp_path / "out.zarr"
    plan = one_op_plan("summary-check", src, target, "multiply", 3)
    summary = run_plan(plan, {}, max_mem="64MB", threads=2)
    assert summary["plan"], summary
    assert summary["max_mem"] in (64 * 10**6, 64 * 1024**2), summary["max_mem"]
    assert summary["tasks"] >= 1
    assert summary["bytes_read"] > 0
    assert summary["decoded_bytes"] >= data.nbytes
    assert summary["bytes_written"] > 0
    assert summary["peak_rss"] > 0
    assert any(str(target) in o for o in summary["outputs"]), summary["outputs"]
    assert_same_array(read_zarr(target), data * 3)


def test_run_refuses_unknown_parameters(run_plan: RunPlan, tmp_path: Path) -> None:
    data = smooth((4, 6))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (2, 6))
    plan = one_op_plan("params-check", Path("${source}"), Path("${target}"), "add", 1)
    target = tmp_path / "out.zarr"
    params = {"source": src, "target": target, "tagret": tmp_path / "typo.zarr"}
    bad = run_plan(plan, params, expect_rc=2)
    assert 'at --param: unknown parameter "tagret"' in bad["stderr"], bad["stderr"]
    assert "the plan's parameters are source, target" in bad["stderr"]
    assert not target.exists()
    del params["tagret"]
    run_plan(plan, params)
    assert_same_array(read_zarr(target), data + 1)


def test_run_twice_same_result_any_threads(run_plan: RunPlan, tmp_path: Path) -> None:
    data = smooth((6, 50, 7), "float64")
    src = tmp_path / "src.zarr"
    write_v3(src, data, (4, 9, 7))
    outs = []
    for threads in (1, 2):
        target = tmp_path / f"out{threads}.zarr"
        plan = {
            "arrays": [{"id": "x", "zarr": str(src)}],
            "ops": [
                {"id": "m", "op": "reduce", "input": "x", "func": "mean", "axes": [1]},
                {"id": "out", "op": "write", "input": "m", "target": str(target)},
            ],
        }
        run_plan(plan, {}, threads=threads)
        outs.append(read_zarr(target))
    np.testing.assert_allclose(outs[0], data.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(outs[1], data.mean(axis=1), rtol=1e-12)


def test_bench_decode(cli: Cli, tmp_path: Path) -> None:
    data = smooth((16, 32, 32))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (4, 32, 32))
    out = cli("bench", "decode", src, "--threads", "2", "--json").json()
    assert {"seconds", "decoded_bytes"} <= set(out), out
    assert out["decoded_bytes"] == data.nbytes
    assert out["seconds"] >= 0


def test_bench_encode(cli: Cli, tmp_path: Path) -> None:
    """libzstd's encode of every chunk; nvCOMP's too where a GPU is, each frame checked, and
    without one `--device cuda` says why."""
    import chunkfuse

    data = smooth((16, 32, 32))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (4, 32, 32))
    out = cli("bench", "encode", src, "--threads", "2", "--level", "5", "--json").json()
    assert (out["chunks"], out["decoded_bytes"], out["level"]) == (4, data.nbytes, 5), out
    assert 0 < out["cpu_compressed_bytes"] < data.nbytes and out["cpu_seconds"] >= 0, out
    assert out["device"] is None, out
    text = cli("bench", "encode", src).stdout
    assert "libzstd level 3: encoded" in text and "ratio" in text, text
    wrong = cli("bench", "encode", src, "--device", "tpu", expect_rc=2)
    assert 'unknown device "tpu"' in wrong.stderr, wrong.stderr
    if chunkfuse.device_info("auto").startswith("cuda"):
        gpu = cli("bench", "encode", src, "--device", "cuda", "--json").json()["device"]
        assert gpu["frames_verified"] == 4 and gpu["compressed_bytes"] > 0, gpu
    else:
        missing = cli("bench", "encode", src, "--device", "cuda", expect_rc=2)
        assert "device 'cuda' is not available" in missing.stderr, missing.stderr


def test_bench_codec(cli: Cli, tmp_path: Path) -> None:
    data = smooth((16, 32, 32))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (4, 32, 32))
    before = list_files(tmp_path)
    out = cli("bench", "codec", src, "--chunks", "16,8,8", "--codec", "zstd:3", "--json").json()
    assert {"seconds", "decode_seconds", "encode_seconds"} <= set(out), out
    assert all(out[k] >= 0 for k in ("seconds", "decode_seconds", "encode_seconds"))
    assert list_files(tmp_path) == before, "bench codec must not write anything"
    # Chunks as rechunk takes them: -1 for a whole axis.
    cli("bench", "codec", src, "--chunks=-1,8,8", "--json")
    short = cli("bench", "codec", src, "--chunks", "8,8", expect_rc=2)
    assert "2 sizes for an array of rank 3" in short.stderr, short.stderr
    assert "memory://" not in short.stderr, short.stderr


def test_output_readable_while_source_is_v2_group_sibling(
    run_plan: RunPlan, tmp_path: Path
) -> None:
    """Writing next to the source inside one directory leaves the source untouched."""
    data = smooth((5, 6), "uint8")
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    arr = group.create_array(name="a", shape=data.shape, dtype=data.dtype, chunks=(2, 3))
    arr[...] = data
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "g.zarr" / "a")}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {"op": "add", "args": [{"input": 0}, {"const": 1}]},
            },
            {"id": "out", "op": "write", "input": "y", "target": str(tmp_path / "g.zarr" / "b")},
        ],
    }
    run_plan(plan, {})
    assert_same_array(read_zarr(tmp_path / "g.zarr" / "b"), data + 1)
    assert_same_array(read_zarr(tmp_path / "g.zarr" / "a"), data)


@pytest.mark.parametrize("func", ["mean", "nanmean"])
def test_a_small_array_every_task_reads_is_decoded_once(
    run_plan: RunPlan, tmp_path: Path, func: str
) -> None:
    """The anomaly's time mean is read by every time step's task: it is loaded once and
    shared. The source's chunks, decoded for the mean, are kept for the anomaly: the run
    decodes the source once and the mean once."""
    data = smooth((24, 10, 12))
    data[3, 2, 5] = np.nan
    src = tmp_path / "src.zarr"
    write_v3(src, data, (1, 5, 12))
    target = tmp_path / "out.zarr"
    plan = {
        "name": "shared-mean",
        "arrays": [{"id": "x", "zarr": str(src)}],
        "ops": [
            {"id": "m", "op": "reduce", "input": "x", "func": func, "axes": [0], "keepdims": True},
            {
                "id": "a",
                "op": "elementwise",
                "inputs": ["x", "m"],
                "expr": {"op": "subtract", "args": [{"input": 0}, {"input": 1}]},
            },
            {"id": "out", "op": "write", "input": "a", "target": str(target)},
        ],
    }
    summary = run_plan(plan, {}, max_mem="64MB", threads=2)
    mean_bytes = data[:1].nbytes
    assert summary["decoded_bytes"] == data.nbytes + mean_bytes, summary
    reference = getattr(np, func)(data.astype(np.float64), axis=0, keepdims=True)
    want = data - reference.astype(np.float32)
    result = read_zarr(target)
    assert result.dtype == np.float32
    # A float32 mean adds its values in float32 partial sums first (as numpy's pairwise sum
    # does), so it may differ from the float64 mean by an ulp of the mean.
    ulp = np.spacing(np.abs(reference).astype(np.float32))
    np.testing.assert_allclose(result, want, rtol=0, atol=2 * float(np.nanmax(ulp)))


def test_run_device_flag(run_plan: RunPlan, tmp_path: Path) -> None:
    data = smooth((4, 6, 8))
    src = tmp_path / "src.zarr"
    write_v3(src, data, (2, 6, 8))
    target = tmp_path / "out.zarr"
    plan = one_op_plan("device-check", src, target, "add", 1)
    bad = run_plan(plan, {}, expect_rc=2, extra_args=["--device", "tpu"])
    assert 'at --device: unknown device "tpu": expected cpu, cuda or auto' in bad["stderr"]
    assert not target.exists()
    # auto: the GPU when one can be used, else the CPU; the same values either way.
    auto = run_plan(plan, {}, threads=2, extra_args=["--device", "auto"])
    assert_same_array(read_zarr(target), data + np.float32(1))
    if auto["device"] == "cpu":
        assert auto["gpu_blocks"] == 0
        shutil.rmtree(target)
        cuda = run_plan(plan, {}, expect_rc=2, extra_args=["--device", "cuda"])
        assert "device 'cuda' is not available: " in cuda["stderr"], cuda["stderr"]
        assert not target.exists()
    else:
        assert auto["device"].startswith("cuda: ") and auto["gpu_blocks"] > 0, auto


def test_bad_max_mem_text_names_the_flag(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=(4, 4), chunks=(2, 2), dtype="float32")[...] = 1
    result = cli(
        "rechunk",
        str(path),
        str(tmp_path / "b.zarr"),
        "--chunks",
        "4,4",
        "--max-mem",
        "lots",
        expect_rc=2,
    )
    assert "--max-mem" in result.stderr and "lots" in result.stderr, result.stderr
    assert not (tmp_path / "b.zarr").exists()
