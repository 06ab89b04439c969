"""Worker processes: the engine keeps working in a child forked after the parent used it
(Linux's default start method, PyTorch DataLoader's and multiprocessing.Pool's), and what a user
holds (`ArrayReader`) pickles for spawned and forkserver children.

Every pool call has a timeout: a child that waits for the parent's threads (the failure these
tests guard against) fails the test instead of hanging the suite."""

# ruff: noqa: F811  (pytest fixtures imported from s3_fixtures and used as arguments)
from __future__ import annotations

import multiprocessing as mp
import pickle
from pathlib import Path
from typing import Any

import chunkfuse
import chunkfuse.dask
import dask.array as da
import numpy as np
import pytest
import zarr
from s3_fixtures import s3_bucket, s3_env, s3_server  # noqa: F401
from s3_server import S3Server
from test_s3 import upload

SHAPE = (8, 20, 24)
CHUNKS = (1, 10, 12)
#: Seconds a child may take before the test calls it hung.
TIMEOUT = 60


def sample() -> np.ndarray:
    return np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE) / 7


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, np.ndarray]:
    data = sample()
    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=SHAPE, chunks=CHUNKS, dtype="float32")[...] = data
    return str(path), data


def _window(source: Any, step: int) -> np.ndarray:
    return chunkfuse.read_windows(source, [[step, 3, 5]], [1, 9, 11])[0]


def _window_sum(args: tuple[Any, int]) -> float:
    source, step = args
    return float(_window(source, step).sum(dtype="float64"))


def _engine_sum(url: str) -> float:
    x = da.from_zarr(url)
    return float(x.sum(dtype="float64").compute(scheduler=chunkfuse.dask.get))


def _use_engine_fully(url: str) -> None:
    """Everything that starts threads of the engine: direct reads (decode pool, IO pool, the
    io_uring ring where the kernel allows it), and a plan run (compute pool, writes)."""
    chunkfuse.read(url)
    chunkfuse.read(url, io="pread")
    try:
        chunkfuse.read(url, io="uring")
    except OSError:
        pass  # io_uring refused here (seccomp); the pread pool serves every read
    finally:
        chunkfuse.set_io("auto")
    _engine_sum(url)


def _expected(data: np.ndarray, step: int) -> float:
    return float(data[step, 3:12, 5:16].sum(dtype="float64"))


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_children_read_after_the_parent_used_the_engine(
    stored: tuple[str, np.ndarray], method: str
) -> None:
    url, data = stored
    _use_engine_fully(url)
    reader = chunkfuse.ArrayReader(url)
    _window(reader, 0)
    ctx = mp.get_context(method)
    with ctx.Pool(2) as pool:
        by_url = pool.map_async(_window_sum, [(url, s) for s in range(4)]).get(TIMEOUT)
        by_reader = pool.map_async(_window_sum, [(reader, s) for s in range(4)]).get(TIMEOUT)
        sums = pool.map_async(_engine_sum, [url, url]).get(TIMEOUT)
    expected = [_expected(data, s) for s in range(4)]
    assert by_url == pytest.approx(expected, rel=1e-6)
    assert by_reader == pytest.approx(expected, rel=1e-6)
    assert sums == pytest.approx([float(data.sum(dtype="float64"))] * 2, rel=1e-6)
    # The parent still works after its children did.
    assert _window_sum((reader, 5)) == pytest.approx(_expected(data, 5), rel=1e-6)


def _grandchild_sum(url: str) -> float:
    """Forks again from a forked child that used the engine."""
    _window(url, 1)
    with mp.get_context("fork").Pool(1) as pool:
        return float(pool.map_async(_window_sum, [(url, 2)]).get(TIMEOUT)[0])


def _middle(url: str, queue: Any) -> None:
    queue.put(_grandchild_sum(url))


def test_a_forked_child_can_fork_again(stored: tuple[str, np.ndarray]) -> None:
    url, data = stored
    _window(url, 0)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    middle = ctx.Process(target=_middle, args=(url, queue))
    middle.start()
    try:
        got = queue.get(timeout=TIMEOUT)
    finally:
        middle.join(TIMEOUT)
        if middle.is_alive():
            middle.kill()
    assert got == pytest.approx(_expected(data, 2), rel=1e-6)


def test_array_reader_pickles_by_url(stored: tuple[str, np.ndarray]) -> None:
    url, data = stored
    reader = chunkfuse.ArrayReader(url)
    copy = pickle.loads(pickle.dumps(reader))
    assert isinstance(copy, chunkfuse.ArrayReader)
    assert (copy.url, copy.shape, copy.dtype) == (reader.url, reader.shape, reader.dtype)
    np.testing.assert_array_equal(chunkfuse.read(copy), data)
    assert url in repr(reader)


def test_forked_children_read_object_storage(
    s3_server: S3Server,
    s3_bucket: str,
    s3_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The parent's object-store client (its runtime, its pooled connections) is not used
    by the children: each makes its own."""
    data = sample()
    local = tmp_path / "a.zarr"
    zarr.create_array(local, shape=SHAPE, chunks=CHUNKS, dtype="float32")[...] = data
    upload(s3_server, s3_bucket, local, "a.zarr")
    url = f"s3://{s3_bucket}/a.zarr"
    reader = chunkfuse.ArrayReader(url)
    assert _window_sum((reader, 0)) == pytest.approx(_expected(data, 0), rel=1e-6)
    with mp.get_context("fork").Pool(2) as pool:
        got = pool.map_async(_window_sum, [(reader, s) for s in range(6)]).get(TIMEOUT)
    assert got == pytest.approx([_expected(data, s) for s in range(6)], rel=1e-6)
    assert _window_sum((reader, 7)) == pytest.approx(_expected(data, 7), rel=1e-6)


def _xarray_anomaly_to_zarr(args: tuple[str, str]) -> list[float]:
    """A user's worker: open a dataset with xarray, compute anomalies, write them with
    `to_zarr` and read them back, all through chunkfuse.dask.get."""
    import dask
    import xarray as xr

    source, target = args
    with dask.config.set(scheduler=chunkfuse.dask.get):
        ds = xr.open_zarr(source, chunks={"time": 4})
        (ds - ds.mean("time")).to_zarr(target, mode="w")
        back = xr.open_zarr(target)
        return [float(v) for v in back.t2m.isel(lat=3, lon=5).values]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_xarray_writes_in_children_after_the_parent_wrote(tmp_path: Path, method: str) -> None:
    """The path a user walks first: the parent writes with xarray's `to_zarr` through the
    engine, then a pool of forked (or spawned) workers does the same to targets of their own."""
    import xarray as xr

    rng = np.random.default_rng(3)
    data = rng.random((12, 18, 24), dtype="float32")
    source = str(tmp_path / "era5.zarr")
    xr.Dataset(
        {"t2m": (("time", "lat", "lon"), data)},
        coords={"time": np.arange(12), "lat": np.linspace(-85, 85, 18), "lon": np.arange(24.0)},
    ).chunk({"time": 1}).to_zarr(source, mode="w")
    want = data[:, 3, 5] - data.mean(axis=0)[3, 5]
    parent = _xarray_anomaly_to_zarr((source, str(tmp_path / "parent.zarr")))
    np.testing.assert_allclose(parent, want, rtol=1e-5, atol=1e-6)
    jobs = [(source, str(tmp_path / f"child{i}.zarr")) for i in range(3)]
    with mp.get_context(method).Pool(2) as pool:
        children = pool.map_async(_xarray_anomaly_to_zarr, jobs).get(TIMEOUT)
    for got in children:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for _, target in jobs:
        assert zarr.open_group(target, mode="r")["t2m"].shape == data.shape
