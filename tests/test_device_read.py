"""Reads onto the GPU: `chunkfuse.read(..., device="cuda")` and `read_windows(...,
device="cuda")` give a `DeviceArray` (zstd chunks decoded on the device by nvCOMP, other
chunks on the CPU) equal to the host read, handed to PyTorch and CuPy through DLPack.

Everywhere: the choice of device is checked, and arguments that only host reads take are
refused before anything is read. With an NVIDIA GPU (CHUNKFUSE_REQUIRE_GPU=1 makes a missing
one fail): values, dtypes, selections, windows, sharded and uncompressed arrays, a corrupt
chunk named, and reads without nvCOMP. Arrays are written by the engine (no zarr-python), so
this file runs on GPU machines that lack it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
from test_device import GPU_ERROR, _write_array

needs_gpu = pytest.mark.skipif(
    GPU_ERROR is not None and not os.environ.get("CHUNKFUSE_REQUIRE_GPU"),
    reason=f"no usable GPU: {GPU_ERROR}",
)


def _array(
    tmp: Path,
    values: np.ndarray,
    chunks: tuple[int, ...],
    codec: str = "zstd",
    shards: tuple[int, ...] | None = None,
) -> str:
    """`values` as a Zarr v3 array of `chunks` with `codec`, written by the engine."""
    raw = _write_array(tmp / f"raw-{codec}-{shards}", values, chunks)
    if codec == "none" and shards is None:
        return raw
    target = str(tmp / f"{codec}-{shards}.zarr")
    write: dict[str, Any] = {
        "id": "out",
        "op": "write",
        "input": "x",
        "target": "${target}",
        "chunks": list(chunks),
        "codec": {"name": codec, "level": 3} if codec == "zstd" else {"name": codec},
    }
    if shards is not None:
        write["shards"] = list(shards)
    plan = {"name": "copy", "arrays": [{"id": "x", "zarr": "${source}"}], "ops": [write]}
    chunkfuse.run_plan(plan, {"source": raw, "target": target}, threads=2)
    return target


@pytest.fixture
def zstd_array(tmp_path: Path) -> tuple[str, np.ndarray]:
    values = np.random.default_rng(0).normal(size=(5, 13, 17)).astype(np.float32)
    return _array(tmp_path, values, (2, 4, 8)), values


def test_an_unknown_device_is_named(zstd_array: tuple[str, np.ndarray]) -> None:
    url, _ = zstd_array
    with pytest.raises(ValueError, match="unknown device 'tpu': expected 'cpu', 'cuda' or 'auto'"):
        chunkfuse.read(url, device="tpu")
    with pytest.raises(ValueError, match="unknown device"):
        chunkfuse.read_windows(url, [[0, 0, 0]], (1, 2, 2), device="npu")


def test_host_only_arguments_are_refused_before_anything_is_read(
    zstd_array: tuple[str, np.ndarray],
) -> None:
    url, values = zstd_array
    with pytest.raises(ValueError, match="out is a host array"):
        chunkfuse.read(url, out=np.empty_like(values), device="cuda")
    with pytest.raises(ValueError, match="without steps"):
        chunkfuse.read(url, np.s_[::2], device="cuda")
    with pytest.raises(ValueError, match="out and cache are for host reads"):
        chunkfuse.read_windows(
            url, [[0, 0, 0]], (1, 2, 2), cache=chunkfuse.ChunkCache(1 << 20), device="cuda"
        )


@pytest.mark.skipif(GPU_ERROR is None, reason="this machine has a usable GPU")
def test_without_a_gpu_cuda_says_why_and_auto_reads_to_numpy(
    zstd_array: tuple[str, np.ndarray],
) -> None:
    url, values = zstd_array
    with pytest.raises(RuntimeError, match="device 'cuda' is not available: "):
        chunkfuse.read(url, device="cuda")
    got = chunkfuse.read(url, np.s_[1:4, 2], device="auto")
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, values[1:4, 2])


def _host_and_device(url: str, selection: Any = None) -> tuple[np.ndarray, Any]:
    return chunkfuse.read(url, selection), chunkfuse.read(url, selection, device="cuda")


@needs_gpu
@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "int16", "uint8", "bool", "complex64", "int64"]
)
def test_device_reads_equal_host_reads(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(1)
    values = (rng.normal(size=(9, 11, 7)) * 50).astype(dtype)
    url = _array(tmp_path, values, (4, 4, 3))
    selections = [None, np.s_[2:7, 3:11, 1:5], np.s_[3, :, 2:6], np.s_[..., 6], np.s_[8, 10, 6]]
    for selection in selections:
        host, dev = _host_and_device(url, selection)
        assert isinstance(dev, chunkfuse.DeviceArray)
        assert dev.shape == host.shape and dev.dtype == host.dtype.name, selection
        np.testing.assert_array_equal(dev.numpy(), host)
    assert dev.stats["device_decoded"] == dev.stats["chunks"] > 0, dev.stats


@needs_gpu
def test_windows_sharded_and_uncompressed_arrays_go_through_the_cpu_where_they_must(
    tmp_path: Path,
) -> None:
    values = np.arange(12 * 16 * 10, dtype=np.float32).reshape(12, 16, 10)
    starts = np.array([[0, 0, 0], [5, 7, 3], [9, 12, 6], [5, 7, 3]])
    for codec, shards, framed in [
        ("zstd", None, True),
        ("none", None, False),
        ("zstd", (8, 8, 10), False),
        ("gzip", None, False),
    ]:
        url = _array(tmp_path, values, (4, 4, 5), codec, shards)
        host = chunkfuse.read_windows(url, starts, (3, 4, 4))
        dev = chunkfuse.read_windows(url, starts, (3, 4, 4), device="cuda")
        np.testing.assert_array_equal(dev.numpy(), host)
        stats = dev.stats
        assert (stats["device_decoded"] > 0) == framed, (codec, shards, stats)
        if not framed:
            assert stats["cpu_note"], stats


@needs_gpu
def test_torch_and_cupy_take_the_array_without_a_copy(zstd_array: tuple[str, np.ndarray]) -> None:
    url, values = zstd_array
    dev = chunkfuse.read(url, device="cuda")
    assert dev.__dlpack_device__()[0] == 2 and dev.device.startswith("cuda:")
    taken = 0
    try:
        import torch
    except ImportError:
        pass
    else:
        t = torch.from_dlpack(dev)
        assert t.is_cuda and tuple(t.shape) == values.shape
        np.testing.assert_array_equal(t.cpu().numpy(), values)
        t += 1  # shares the memory: the device array sees the write
        np.testing.assert_array_equal(dev.numpy(), values + np.float32(1))
        taken += 1
    try:
        import cupy
    except ImportError:
        pass
    else:
        c = cupy.from_dlpack(dev)
        np.testing.assert_array_equal(cupy.asnumpy(c), dev.numpy())
        taken += 1
    if os.environ.get("CHUNKFUSE_REQUIRE_GPU"):
        assert taken > 0, "no DLPack consumer (torch, cupy) to check with"


@needs_gpu
def test_a_truncated_chunk_is_named_and_the_device_still_reads(tmp_path: Path) -> None:
    values = np.ones((8, 8), np.float32)
    url = _array(tmp_path, values, (4, 4))
    chunk = Path(url) / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    with pytest.raises(RuntimeError, match=r"c/1/0"):
        chunkfuse.read(url, device="cuda")
    np.testing.assert_array_equal(chunkfuse.read(url, np.s_[:4], device="cuda").numpy(), values[:4])


@needs_gpu
def test_without_nvcomp_chunks_are_decoded_on_the_cpu(zstd_array: tuple[str, np.ndarray]) -> None:
    url, values = zstd_array
    code = (
        "import chunkfuse, numpy as np, sys\n"
        f"d = chunkfuse.read({url!r}, device='cuda')\n"
        f"v = chunkfuse.read({url!r})\n"
        "assert (d.numpy() == v).all()\n"
        "print(d.stats['device_decoded'], d.stats['cpu_note'])\n"
    )
    env = {**os.environ, "CHUNKFUSE_NVCOMP": "/nonexistent/libnvcomp.so.6"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 nvCOMP not found"), done.stdout


def _read_in_a_forked_child(url: str) -> tuple[Any, str]:
    """What `device="auto"` reads in this (forked) process, and what `device="cuda"` raises."""
    got = chunkfuse.read(url, device="auto")
    try:
        chunkfuse.read(url, device="cuda")
    except RuntimeError as e:
        return got, str(e)
    return got, ""


@needs_gpu
@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_process_forked_after_the_gpu_opened_reads_on_the_cpu_and_says_why_not_cuda(
    zstd_array: tuple[str, np.ndarray],
) -> None:
    """CUDA does not survive fork: a DataLoader's forked worker whose parent read onto the GPU
    gets host arrays from `device="auto"` and, from `device="cuda"`, an error naming the
    remedy (spawned workers), rather than a hang or a crash."""
    import multiprocessing

    url, values = zstd_array
    assert isinstance(chunkfuse.read(url, device="cuda"), chunkfuse.DeviceArray)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got, why = pool.apply_async(_read_in_a_forked_child, (url,)).get(timeout=120)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, values)
    assert "forked from process" in why and '"spawn"' in why, why


@needs_gpu
def test_nvcomp_encodes_chunks_into_frames_libzstd_decodes(
    zstd_array: tuple[str, np.ndarray],
) -> None:
    """`chunkfuse bench encode --device cuda`: nvCOMP's frames of every chunk decode back to
    the chunk's bytes (checked by libzstd in the engine)."""
    import json

    root = Path(__file__).resolve().parent.parent
    binary = os.environ.get("CHUNKFUSE_BIN") or str(root / "target" / "release" / "chunkfuse")
    if not os.path.exists(binary):
        pytest.skip(f"no chunkfuse CLI at {binary} (set CHUNKFUSE_BIN)")
    url, values = zstd_array
    done = subprocess.run(
        [binary, "bench", "encode", url, "--device", "cuda", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["decoded_bytes"] == values.nbytes and out["chunks"] == 3 * 4 * 3, out
    device = out["device"]
    assert device["frames_verified"] == out["chunks"], device
    assert 0 < device["compressed_bytes"] and device["encode_seconds"] > 0, device
