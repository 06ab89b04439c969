"""Error behaviour: exit statuses, messages that name what failed and where, nothing half-written.

Contract (docs/plan-ir.md, CLI): invalid plans and bad arguments exit 2 with the JSON path of the
bad field on stderr and write nothing; runtime errors exit 1 naming array, chunk key and store;
Ctrl-C exits 130; a failed run never leaves a partially written chunk visible.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import (
    Cli,
    assert_no_partial_files,
    list_files,
    read_zarr,
    v2_chunk_key,
    v3_chunk_key,
    write_v2,
    write_v3,
)

RunPlan = Callable[..., dict[str, Any]]

ARRAY_ID = "temperature_in"


def make_source(
    tmp_path: Path, fmt: str, name: str = "src.zarr", codec: str = "zstd"
) -> tuple[Path, np.ndarray]:
    data = np.arange(16 * 8 * 6, dtype=np.float32).reshape(16, 8, 6) * 0.5
    src = tmp_path / name
    if fmt == "v2":
        write_v2(src, data, (1, 8, 6), compressor=codec)
    else:
        write_v3(src, data, (1, 8, 6), codec=codec)
    return src, data


def add_one_plan(src: Path, target: Path | str) -> dict[str, Any]:
    return {
        "name": "add-one",
        "arrays": [{"id": ARRAY_ID, "zarr": str(src)}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": [ARRAY_ID],
                "expr": {"op": "add", "args": [{"input": 0}, {"const": 1}]},
            },
            {"id": "out", "op": "write", "input": "y", "target": str(target)},
        ],
    }


def chunk_path(src: Path, fmt: str, index: tuple[int, ...]) -> tuple[Path, str]:
    key = v2_chunk_key(index) if fmt == "v2" else v3_chunk_key(index)
    return src / key, key


def damage(path: Path, how: str) -> None:
    if how == "garbage":
        rng = np.random.default_rng(1)
        path.write_bytes(rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    else:  # truncated
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])


def assert_names_chunk(stderr: str, src: Path, key: str) -> None:
    assert ARRAY_ID in stderr, f"stderr does not name the array {ARRAY_ID!r}:\n{stderr}"
    assert key in stderr, f"stderr does not name the chunk key {key!r}:\n{stderr}"
    assert str(src) in stderr, f"stderr does not name the store {src}:\n{stderr}"


@pytest.mark.parametrize("codec", ["zstd", "none"])
@pytest.mark.parametrize("fmt", ["v3", "v2"])
@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_corrupt_chunk_elementwise(
    run_plan: RunPlan, tmp_path: Path, how: str, fmt: str, codec: str
) -> None:
    src, _ = make_source(tmp_path, fmt, codec=codec)
    path, key = chunk_path(src, fmt, (13, 0, 0))
    damage(path, how)
    target = tmp_path / "out.zarr"
    result = run_plan(add_one_plan(src, target), {}, expect_rc=1)
    assert_names_chunk(result["stderr"], src, key)
    assert_no_partial_files(target)


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_corrupt_chunk_reduction(run_plan: RunPlan, tmp_path: Path, how: str) -> None:
    src, _ = make_source(tmp_path, "v3")
    path, key = chunk_path(src, "v3", (5, 0, 0))
    damage(path, how)
    target = tmp_path / "sum.zarr"
    plan = {
        "arrays": [{"id": ARRAY_ID, "zarr": str(src)}],
        "ops": [
            {"id": "s", "op": "reduce", "input": ARRAY_ID, "func": "sum", "axes": [0]},
            {"id": "out", "op": "write", "input": "s", "target": str(target)},
        ],
    }
    result = run_plan(plan, {}, expect_rc=1)
    assert_names_chunk(result["stderr"], src, key)
    assert_no_partial_files(target)


def test_corrupt_chunk_rechunk_cli(cli: Cli, tmp_path: Path) -> None:
    src, _ = make_source(tmp_path, "v3")
    path, key = chunk_path(src, "v3", (9, 0, 0))
    damage(path, "garbage")
    target = tmp_path / "rechunked.zarr"
    result = cli("rechunk", src, target, "--chunks", "16,4,3", expect_rc=1)
    assert key in result.stderr and str(src) in result.stderr, result.stderr
    assert_no_partial_files(target)


def test_missing_store(cli: Cli, tmp_path: Path) -> None:
    """A store that does not exist: a clear error naming the path (status 2 when found during
    validation, 1 when found at run time), and no output."""
    missing = tmp_path / "does-not-exist" / "era5.zarr"
    target = tmp_path / "out.zarr"
    plan = cli.write_plan(add_one_plan(missing, target))
    result = cli("run", plan, "--json", expect_rc=None)
    assert result.returncode in (1, 2), result.describe()
    assert str(missing) in result.stderr, result.stderr
    assert not target.exists()


def test_missing_store_info(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.zarr"
    result = cli("info", missing, "--json", expect_rc=None)
    assert result.returncode in (1, 2), result.describe()
    assert str(missing) in result.stderr, result.stderr


# --------------------------------------------------------------------------------------------
# Invalid plans: exit 2, the JSON path of the bad field on stderr, nothing written
# --------------------------------------------------------------------------------------------


def invalid_plans(
    src: Path, src_small: Path, target: Path
) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """name -> (plan, substrings stderr must contain)."""
    x = {"id": "x", "zarr": str(src)}
    small = {"id": "z", "zarr": str(src_small)}
    write = {"id": "out", "op": "write", "input": "y", "target": str(target)}
    plans: dict[str, tuple[dict[str, Any], list[str]]] = {
        "unknown-op": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "a",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "negative", "args": [{"input": 0}]},
                    },
                    {"id": "y", "op": "fourier_magic", "input": "a"},
                    write,
                ],
            },
            ["ops[1].op", "fourier_magic"],
        ),
        "unknown-function": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {
                            "op": "add",
                            "args": [
                                {"op": "ad", "args": [{"input": 0}, {"const": 1}]},
                                {"const": 2},
                            ],
                        },
                    },
                    write,
                ],
            },
            ["ops[0].expr.args[0].op", "ad"],
        ),
        "unknown-function-top": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "tanhh", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["ops[0].expr.op", "tanhh"],
        ),
        "shape-mismatch": (
            {
                "arrays": [x, small],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x", "z"],
                        "expr": {"op": "add", "args": [{"input": 0}, {"input": 1}]},
                    },
                    write,
                ],
            },
            ["ops[0]"],
        ),
        "bad-astype-dtype": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "astype", "dtype": "float128", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["ops[0].expr.dtype", "float128"],
        ),
        "bad-reduce-dtype": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "reduce", "input": "x", "func": "sum", "dtype": "int3"},
                    write,
                ],
            },
            ["ops[0].dtype", "int3"],
        ),
        "bad-axis": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "reduce", "input": "x", "func": "sum", "axes": [3]},
                    write,
                ],
            },
            ["ops[0].axes"],
        ),
        "argmin-two-axes": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "reduce", "input": "x", "func": "argmin", "axes": [0, 1]},
                    write,
                ],
            },
            ["ops[0].axes"],
        ),
        "unknown-reduce-func": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "reduce", "input": "x", "func": "median"},
                    write,
                ],
            },
            ["ops[0].func", "median"],
        ),
        "unknown-input-id": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["nope"],
                        "expr": {"op": "negative", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["ops[0].inputs[0]", "nope"],
        ),
        "input-index-out-of-range": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "add", "args": [{"input": 0}, {"input": 1}]},
                    },
                    write,
                ],
            },
            ["ops[0].expr.args[1]"],
        ),
        "wrong-arity": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "add", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["ops[0].expr"],
        ),
        "duplicate-id": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "negative", "args": [{"input": 0}]},
                    },
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "abs", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["ops[1].id"],
        ),
        "declared-shape-mismatch": (
            {
                "arrays": [{"id": "x", "zarr": str(src), "shape": [16, 8, 7]}],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "negative", "args": [{"input": 0}]},
                    },
                    write,
                ],
            },
            ["arrays[0].shape"],
        ),
        "bad-slice-step": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "slice", "input": "x", "selection": [[None, None, 0]]},
                    write,
                ],
            },
            ["ops[0].selection"],
        ),
        "bad-transpose-axes": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "transpose", "input": "x", "axes": [0, 0, 1]},
                    write,
                ],
            },
            ["ops[0].axes", "appears twice"],
        ),
        "bad-rechunk": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "rechunk", "input": "x", "chunks": [4, 0, 2]},
                    write,
                ],
            },
            ["ops[0].chunks"],
        ),
        "shards-not-multiple": (
            {
                "arrays": [x],
                "ops": [
                    {
                        "id": "y",
                        "op": "elementwise",
                        "inputs": ["x"],
                        "expr": {"op": "negative", "args": [{"input": 0}]},
                    },
                    {
                        "id": "out",
                        "op": "write",
                        "input": "y",
                        "target": str(target),
                        "chunks": [4, 4, 3],
                        "shards": [6, 8, 6],
                    },
                ],
            },
            ["ops[1].shards", 'shard size 6 of "y"'],
        ),
        "missing-field": (
            {
                "arrays": [x],
                "ops": [
                    {"id": "y", "op": "elementwise", "inputs": ["x"]},
                    write,
                ],
            },
            ["ops[0]", "expr"],
        ),
    }
    return plans


INVALID = [
    "unknown-op",
    "unknown-function",
    "unknown-function-top",
    "shape-mismatch",
    "bad-astype-dtype",
    "bad-reduce-dtype",
    "bad-axis",
    "argmin-two-axes",
    "unknown-reduce-func",
    "unknown-input-id",
    "input-index-out-of-range",
    "wrong-arity",
    "duplicate-id",
    "declared-shape-mismatch",
    "bad-slice-step",
    "bad-transpose-axes",
    "bad-rechunk",
    "shards-not-multiple",
    "missing-field",
]


@pytest.mark.parametrize("case", INVALID)
def test_invalid_plan(run_plan: RunPlan, tmp_path: Path, case: str) -> None:
    src, _ = make_source(tmp_path, "v3")
    small = tmp_path / "small.zarr"
    write_v3(small, np.zeros((5, 6), dtype=np.float32), (5, 6))  # (16, 8, 6) vs (5, 6): no
    target = tmp_path / "out.zarr"
    plan, needles = invalid_plans(src, small, target)[case]
    before = list_files(src)
    result = run_plan(plan, {}, expect_rc=2)
    for needle in needles:
        assert needle in result["stderr"], f"stderr lacks {needle!r}:\n{result['stderr']}"
    assert not target.exists(), f"{target} was created by an invalid plan"
    assert list_files(src) == before


def test_missing_parameter(run_plan: RunPlan, tmp_path: Path) -> None:
    src, _ = make_source(tmp_path, "v3")
    plan = add_one_plan(Path("${source}"), "${target}")
    plan["params"] = {"source": "input", "target": "output"}
    result = run_plan(plan, {"source": src}, expect_rc=2)
    assert "ops[1].target" in result["stderr"], result["stderr"]
    assert "target" in result["stderr"]
    assert not list(tmp_path.glob("*target*")) and not Path("${target}").exists()


def test_params_are_substituted(run_plan: RunPlan, tmp_path: Path) -> None:
    _, data = make_source(tmp_path, "v3")
    plan = add_one_plan(Path("${dir}/src.zarr"), "${dir}/${name}.zarr")
    plan["params"] = {"dir": "a directory", "name": "output name"}
    run_plan(plan, {"dir": tmp_path, "name": "sub"})
    np.testing.assert_array_equal(read_zarr(tmp_path / "sub.zarr"), data + 1)


def test_malformed_json(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"arrays": [], "ops": [')
    result = cli("run", path, "--json", expect_rc=2)
    assert str(path) in result.stderr or "JSON" in result.stderr.upper(), result.stderr


def test_missing_plan_file(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    result = cli("run", path, expect_rc=None)
    assert result.returncode in (1, 2), result.describe()
    assert str(path) in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--param", "no-equals-sign"],
        ["--max-mem", "lots"],
        ["--max-mem", "99999999999999999999"],
        ["--threads", "zero"],
        ["--no-such-flag"],
    ],
)
def test_bad_arguments(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    src, _ = make_source(tmp_path, "v3")
    target = tmp_path / "out.zarr"
    plan = cli.write_plan(add_one_plan(src, target))
    result = cli("run", plan, *args, "--json", expect_rc=2)
    assert result.stderr.strip(), "no message on stderr"
    assert not target.exists()


@pytest.mark.parametrize(
    ("max_mem", "error", "message"),
    [
        ("lots", ValueError, "max_mem: invalid size"),
        ("99999999999999999999", ValueError, "too large"),
        (2**64, ValueError, "too large"),
        (0, ValueError, "at least one byte"),
        (True, TypeError, "number of bytes"),
        (1.5e9, TypeError, "number of bytes"),
    ],
)
def test_bad_memory_budgets_in_python_name_the_argument(
    tmp_path: Path, max_mem: object, error: type[Exception], message: str
) -> None:
    src, _ = make_source(tmp_path, "v3")
    target = tmp_path / "out.zarr"
    with pytest.raises(error, match=message):
        chunkfuse.rechunk(src, target, (4, 4, 2), max_mem=max_mem)  # type: ignore[arg-type]
    assert not target.exists()


def test_rechunk_bad_chunks_argument(cli: Cli, tmp_path: Path) -> None:
    src, _ = make_source(tmp_path, "v3")
    target = tmp_path / "out.zarr"
    cli("rechunk", src, target, "--chunks", "4,x,2", expect_rc=2)
    cli("rechunk", src, target, "--chunks", "4,4", expect_rc=2)  # wrong rank
    cli("rechunk", src, target, "--chunks", "4,4,2", "--codec", "lzma:9", expect_rc=2)
    rank = cli("rechunk", src, target, "--chunks", "4,4", expect_rc=2).stderr
    assert "at --chunks:" in rank and "--chunks.chunks" not in rank, rank
    v2_shards = cli(
        "rechunk",
        src,
        target,
        "--chunks",
        "4,4,2",
        "--shards",
        "8,8,2",
        "--zarr-format",
        "2",
        expect_rc=2,
    ).stderr
    assert "at --shards: shards need Zarr v3" in v2_shards and "memory://" not in v2_shards
    assert not target.exists()


# --------------------------------------------------------------------------------------------
# Ctrl-C
# --------------------------------------------------------------------------------------------


def test_ctrl_c_exits_130_without_partial_chunks(chunkfuse_bin: Path, tmp_path: Path) -> None:
    """SIGINT during a rechunk: exit 130 and no partial chunk visible in the target."""
    rng = np.random.default_rng(2)
    src = tmp_path / "big.zarr"
    data = rng.standard_normal((64, 256, 256), dtype=np.float32)  # 16 MiB
    write_v3(src, data, (1, 256, 256), codec="zstd", level=1)
    target = tmp_path / "out.zarr"
    args = [
        str(chunkfuse_bin),
        "rechunk",
        str(src),
        str(target),
        "--chunks",
        "64,16,16",
        "--codec",
        "zstd:19",
        "--threads",
        "1",
        "--max-mem",
        "32MB",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        chunks = [p for p in list_files(target) if p.name not in ("zarr.json", ".zarray")]
        if chunks:
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        proc.communicate()
        pytest.skip(f"rechunk finished (status {proc.returncode}) before it could be interrupted")
    os.kill(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("chunkfuse did not stop within 30 s of SIGINT")
    if proc.returncode == 0:
        pytest.skip("rechunk completed before SIGINT took effect")
    assert proc.returncode == 130, f"exit status {proc.returncode}, stderr:\n{err.decode()}"
    assert_no_partial_files(target)


@pytest.mark.parametrize(
    "threads, error, message",
    [(-1, ValueError, "got -1"), (1.5, TypeError, "got 1.5"), (True, TypeError, "got True")],
)
def test_a_bad_thread_count_is_named_before_anything_runs(
    tmp_path: Path, threads: Any, error: type[Exception], message: str
) -> None:
    src = tmp_path / "a.zarr"
    zarr.create_array(str(src), data=np.ones((4, 4), "f4"), chunks=(2, 2))
    for call in (
        lambda: chunkfuse.read(str(src), threads=threads),
        lambda: chunkfuse.rechunk(src, tmp_path / "out.zarr", (4, 4), threads=threads),
    ):
        with pytest.raises(error, match=f"threads: .*{message}"):
            call()
    assert not (tmp_path / "out.zarr").exists()
