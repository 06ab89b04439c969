"""Where fused elementwise programs run: `device="cpu" | "cuda" | "auto"`.

On a machine with an NVIDIA GPU (set CHUNKFUSE_REQUIRE_GPU=1 there, so a missing device
fails instead of skipping) the GPU's results are compared with numpy's; everywhere the
choice of device is checked: unknown devices are named, `cuda` without a GPU says why and
writes nothing, `auto` falls back to the CPU. Inputs are written here as uncompressed Zarr v3
and outputs read back with `chunkfuse.read`, so this file needs neither zarr-python nor cubed
(it runs on GPU machines that lack them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _zero(dtype: np.dtype) -> Any:
    """Zarr v3's JSON for a zero fill value of `dtype`."""
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return 0
    return [0.0, 0.0] if dtype.kind == "c" else 0.0


def _write_array(path: Path, values: np.ndarray, chunks: tuple[int, ...]) -> str:
    """`values` as a Zarr v3 array with the `bytes` codec alone, chunk by chunk."""
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(values.shape),
        "data_type": values.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _zero(values.dtype),
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps(meta))
    grid = [-(-s // c) for s, c in zip(values.shape, chunks, strict=True)]
    for index in np.ndindex(*grid):
        block = np.zeros(chunks, dtype=values.dtype)
        bounds = zip(index, chunks, values.shape, strict=True)
        sel = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in bounds)
        part = values[sel]
        block[tuple(slice(0, n) for n in part.shape)] = part
        key = path / "c" / "/".join(str(i) for i in index)
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(block.astype(block.dtype.newbyteorder("<")).tobytes())
    return str(path)


def _plan(expr: dict[str, Any], inputs: list[str]) -> dict[str, Any]:
    return {
        "name": "device-check",
        "arrays": [{"id": f"in{i}", "zarr": f"${{in{i}}}"} for i in range(len(inputs))],
        "ops": [
            {
                "id": "e",
                "op": "elementwise",
                "inputs": [f"in{i}" for i in range(len(inputs))],
                "expr": expr,
            },
            {
                "id": "out",
                "op": "write",
                "input": "e",
                "target": "${target}",
                "codec": {"name": "none"},
            },
        ],
    }


def _run(
    tmp: Path,
    expr: dict[str, Any],
    arrays: list[tuple[np.ndarray, tuple[int, ...]]],
    device: str,
    tag: str,
) -> tuple[np.ndarray, dict[str, Any]]:
    params = {
        f"in{i}": _write_array(tmp / f"{tag}-in{i}.zarr", a, c) for i, (a, c) in enumerate(arrays)
    }
    params["target"] = str(tmp / f"{tag}-out.zarr")
    summary = chunkfuse.run_plan(_plan(expr, list(params)[:-1]), params, device=device, threads=2)
    return chunkfuse.read(params["target"]), summary


def _gpu_error() -> str | None:
    """Why device 'cuda' cannot be used here, or None when it can."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        try:
            _run(Path(d), {"input": 0}, [(np.zeros(2, np.float32), (2,))], "cuda", "probe")
        except RuntimeError as e:
            return str(e)
    return None


GPU_ERROR = _gpu_error()
needs_gpu = pytest.mark.skipif(
    GPU_ERROR is not None and not os.environ.get("CHUNKFUSE_REQUIRE_GPU"),
    reason=f"no usable GPU: {GPU_ERROR}",
)

X = {"input": 0}
Y = {"input": 1}


def _call(op: str, *args: Any) -> dict[str, Any]:
    return {"op": op, "args": [a if isinstance(a, dict) else {"const": a} for a in args]}


def test_an_unknown_device_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'unknown device "tpu": expected cpu, cuda or auto'):
        _run(tmp_path, X, [(np.ones(4, np.float32), (2,))], "tpu", "t")
    assert not (tmp_path / "t-out.zarr").exists()


@pytest.mark.skipif(GPU_ERROR is None, reason="this machine has a usable GPU")
def test_cuda_without_a_gpu_says_why_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="device 'cuda' is not available: "):
        _run(tmp_path, _call("add", X, 1), [(np.ones(4, np.float32), (2,))], "cuda", "c")
    assert not (tmp_path / "c-out.zarr").exists()


def test_auto_gives_the_cpu_results_and_says_where_it_ran(tmp_path: Path) -> None:
    x = np.linspace(-3, 3, 120, dtype=np.float32).reshape(6, 20)
    expr = _call("multiply", _call("add", X, 1.5), _call("sqrt", _call("abs", X)))
    cpu, s_cpu = _run(tmp_path, expr, [(x, (4, 8))], "cpu", "cpu")
    auto, s_auto = _run(tmp_path, expr, [(x, (4, 8))], "auto", "auto")
    np.testing.assert_array_equal(auto, cpu)
    np.testing.assert_array_equal(cpu, ((x + np.float32(1.5)) * np.sqrt(np.abs(x))))
    assert s_cpu["device"] == "cpu" and s_cpu["gpu_blocks"] == 0
    if GPU_ERROR is None:
        assert s_auto["device"].startswith("cuda: ") and s_auto["gpu_blocks"] > 0
    else:
        assert s_auto["device"] == "cpu" and s_auto["gpu_blocks"] == 0


# Expressions with numpy's result for inputs x and y (y broadcast along axis 0).
CASES = {
    "affine": (_call("add", _call("multiply", X, 2), Y), lambda x, y: x * x.dtype.type(2) + y),
    "where": (_call("where", _call("greater", X, Y), X, Y), lambda x, y: np.where(x > y, x, y)),
    "clip": (_call("clip", X, 1, 5), lambda x, y: np.clip(x, x.dtype.type(1), x.dtype.type(5))),
    "floor_divide": (_call("floor_divide", X, 3), lambda x, y: x // x.dtype.type(3)),
    "remainder": (_call("remainder", X, Y), lambda x, y: np.remainder(x, y)),
    "maximum": (_call("maximum", X, Y), np.maximum),
    "compare": (
        _call("logical_and", _call("less", X, Y), _call("not_equal", X, 0)),
        lambda x, y: (x < y) & (x != 0),
    ),
}
DTYPES = ["float32", "float64", "int16", "int32", "int64", "uint8", "uint64"]


@needs_gpu
@settings(max_examples=60, deadline=None)
@given(
    case=st.sampled_from(sorted(CASES)),
    dtype=st.sampled_from(DTYPES),
    shape=st.tuples(st.integers(1, 9), st.integers(1, 40)),
    chunk0=st.integers(1, 4),
    chunk1=st.integers(1, 16),
    seed=st.integers(0, 2**31),
)
def test_cuda_matches_numpy(
    case: str,
    dtype: str,
    shape: tuple[int, int],
    chunk0: int,
    chunk1: int,
    seed: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.standard_normal(shape) * 10).astype(dt)
        y = (rng.standard_normal((1, shape[1])) * 10).astype(dt)
        x.flat[:: max(1, x.size // 3)] = np.nan
    else:
        info = np.iinfo(dt)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        x = rng.integers(lo, hi, shape, endpoint=True).astype(dt)
        y = rng.integers(lo, hi, (1, shape[1]), endpoint=True).astype(dt)
    expr, reference = CASES[case]
    tmp = tmp_path_factory.mktemp("gpu")
    with np.errstate(all="ignore"):
        want = reference(x, y)
    got, summary = _run(tmp, expr, [(x, (chunk0, chunk1)), (y, (1, chunk1))], "cuda", "g")
    assert summary["gpu_blocks"] > 0, summary
    np.testing.assert_array_equal(got, want.astype(got.dtype))


@needs_gpu
def test_cuda_transcendentals_match_numpy(tmp_path: Path) -> None:
    x = np.linspace(-20, 20, 40_000, dtype=np.float64).reshape(200, 200)
    expr = _call(
        "add",
        _call("sin", X),
        _call("multiply", _call("exp", _call("multiply", X, 0.1)), _call("cos", X)),
    )
    got, summary = _run(tmp_path, expr, [(x, (64, 64))], "cuda", "t")
    assert summary["gpu_blocks"] > 0
    np.testing.assert_allclose(got, np.sin(x) + np.exp(x * 0.1) * np.cos(x), rtol=1e-13, atol=1e-13)


def test_rust_executor_checks_the_device(tmp_path: Path) -> None:
    cubed = pytest.importorskip("cubed")
    import cubed.array_api as xp
    from chunkfuse import RustExecutor

    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="100MB")
    a = xp.ones((4, 4), chunks=(2, 2), spec=spec)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        (a + 1).compute(executor=RustExecutor(device="tpu"))
    ex = RustExecutor(device="auto")
    np.testing.assert_array_equal((a + 1).compute(executor=ex), np.full((4, 4), 2.0))
    assert ex.last_stats.device.startswith("cpu" if GPU_ERROR else "cuda: ")
    if GPU_ERROR is not None:
        with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
            (a + 1).compute(executor=RustExecutor(device="cuda"))


def test_dask_get_checks_the_device(tmp_path: Path) -> None:
    da = pytest.importorskip("dask.array")
    import zarr
    from chunkfuse.dask import get, last_stats

    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=(6, 8), chunks=(3, 4), dtype="f4")
    z[:] = np.arange(48, dtype="f4").reshape(6, 8)
    x = da.from_zarr(z)
    with pytest.raises(ValueError, match='unknown device "tpu"'):
        (x + 1).compute(scheduler=get, device="tpu")
    np.testing.assert_array_equal((x * 2 + 1).compute(scheduler=get, device="auto"), z[:] * 2 + 1)
    stats = last_stats()
    assert stats is not None and stats.native_tasks > 0
    assert (stats.gpu_blocks > 0) == (GPU_ERROR is None)
    if GPU_ERROR is not None:
        with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
            (x + 1).compute(scheduler=get, device="cuda")


def _resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@needs_gpu
def test_cuda_keeps_peak_memory_under_the_budget(tmp_path: Path) -> None:
    # 1 GiB in, 1 GiB out, under a 640 MB budget that also holds the driver and the pinned
    # transfer buffers.
    steps, rows, cols = 64, 2048, 2048
    src = tmp_path / "big.zarr"
    _write_array(src, np.zeros((1, rows, cols), np.float32), (1, rows, cols))
    meta = json.loads((src / "zarr.json").read_text())
    meta["shape"][0] = steps
    (src / "zarr.json").write_text(json.dumps(meta))
    block = np.arange(rows * cols, dtype="<f4").reshape(rows, cols)
    for t in range(steps):
        (src / "c" / str(t) / "0").mkdir(parents=True, exist_ok=True)
        (src / "c" / str(t) / "0" / "0").write_bytes((block + t).tobytes())
    budget = 640_000_000
    before = _resident_bytes()
    summary = chunkfuse.run_plan(
        _plan(_call("add", _call("multiply", X, 2), 1), ["in0"]),
        {"in0": str(src), "target": str(tmp_path / "out.zarr")},
        device="cuda",
        max_mem=budget,
        threads=4,
    )
    assert summary["gpu_blocks"] == steps
    assert summary["peak_rss"] <= before + budget, (summary["peak_rss"], before)
    got = chunkfuse.read(str(tmp_path / "out.zarr"), (slice(steps - 1, steps),))
    np.testing.assert_array_equal(got[0], (block + (steps - 1)) * 2 + 1)


def test_explain_says_where_each_stage_runs_on_a_gpu_and_why(tmp_path: Path) -> None:
    """Planning for a GPU needs none: asked for `cuda`, explain places each stage as a run on
    a GPU would (on this machine's GPU, or on none, saying so), each stage that stays on the
    CPU with the reason; a CPU run's stages say nothing of devices."""
    x = _write_array(tmp_path / "x.zarr", np.ones((4, 6), np.float32), (2, 3))
    n = _write_array(tmp_path / "n.zarr", np.arange(24, dtype=np.int32).reshape(4, 6), (2, 3))
    write = {"op": "write", "codec": {"name": "none"}}
    plan = {
        "name": "placing",
        "arrays": [{"id": "x", "zarr": x}, {"id": "n", "zarr": n}],
        "ops": [
            {"id": "a", "op": "elementwise", "inputs": ["x"], "expr": _call("add", X, 1)},
            {"id": "p", "op": "elementwise", "inputs": ["n"], "expr": _call("power", X, X)},
            {"id": "s", "op": "reduce", "input": "x", "func": "sum", "axes": [0]},
            {"id": "m", "op": "reduce", "input": "x", "func": "prod", "axes": [0]},
            {"id": "v", "op": "reduce", "input": "x", "func": "var", "axes": [0], "ddof": 1},
            {"id": "i", "op": "reduce", "input": "x", "func": "argmax", "axes": [1]},
            {"id": "wa", "input": "a", "target": str(tmp_path / "a.zarr"), **write},
            {"id": "wp", "input": "p", "target": str(tmp_path / "p.zarr"), **write},
            {"id": "ws", "input": "s", "target": str(tmp_path / "s.zarr"), **write},
            {"id": "wm", "input": "m", "target": str(tmp_path / "m.zarr"), **write},
            {"id": "wv", "input": "v", "target": str(tmp_path / "v.zarr"), **write},
            {"id": "wi", "input": "i", "target": str(tmp_path / "i.zarr"), **write},
        ],
    }
    explained = chunkfuse.explain_plan(plan, device="cuda")
    if GPU_ERROR is None:
        assert explained["device"].startswith("cuda: "), explained["device"]
    else:
        assert explained["device"].startswith("cuda, not on this machine ("), explained["device"]
    placed = {s["output"]: (s["device"], s["device_note"]) for s in explained["stages"]}
    assert placed == {
        "wa": ("gpu", None),
        "wp": ("cpu", "power of int, int values has no GPU form"),
        "ws": ("gpu", None),
        "wm": ("cpu", "the reduction runs on the CPU: prod has no device form yet"),
        "wv": ("gpu", None),
        "wi": ("gpu", None),
    }, placed
    # The reduction placed on the GPU still shows the tasks that write its output.
    ws = next(s for s in explained["stages"] if s["output"] == "ws")
    assert ws["tasks"] == 1 and ws["largest_task_bytes"] > 0, ws
    on_cpu = chunkfuse.explain_plan(plan, device="cpu")
    assert {(s["device"], s["device_note"]) for s in on_cpu["stages"]} == {("cpu", None)}
    assert not any((tmp_path / t).exists() for t in ["a.zarr", "p.zarr", "s.zarr", "m.zarr"])
