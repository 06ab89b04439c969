"""chunkfuse.dask.get against Dask's get-function contract and dask.array results."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import chunkfuse.dask
import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from chunkfuse.dask import get, last_stats
from dask.core import flatten
from dask.diagnostics import ProgressBar
from dask.utils_test import GetFunctionTestMixin


class TestGetFunction(GetFunctionTestMixin):  # type: ignore[misc]
    """Dask's own conformance tests for get functions."""

    get = staticmethod(get)


def test_compute_persist_and_config() -> None:
    x = da.arange(60, chunks=7).reshape(6, 10).rechunk((4, 3))
    want = np.arange(60).reshape(6, 10)
    np.testing.assert_array_equal(x.compute(scheduler=get), want)
    (a, b) = dask.compute(x.sum(), x.mean(axis=0), scheduler=get)
    assert a == want.sum()
    np.testing.assert_allclose(b, want.mean(axis=0))
    with dask.config.set(scheduler=get):
        (p,) = dask.persist(x * 2)
        np.testing.assert_array_equal(p.compute(), want * 2)
    assert last_stats() is not None


class Boom(RuntimeError):
    pass


def fail(x: object) -> object:
    raise Boom("no")


def test_a_task_exception_reaches_the_caller_unchanged_with_its_key() -> None:
    dsk = {"x": 1, "y": (operator.add, "x", 1), "z": (fail, "y"), "w": (operator.add, "z", 1)}
    with pytest.raises(Boom) as info:
        get(dsk, "w")
    assert any("'z'" in note for note in getattr(info.value, "__notes__", [])), info.value
    x = da.ones(10, chunks=5).map_blocks(fail, dtype=float)
    with pytest.raises(Boom) as info:
        x.compute(scheduler=get)
    assert any("map-blocks" in n or "fail" in n for n in info.value.__notes__), info.value.__notes__


def test_progress_bar_and_callbacks_fire(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[object] = []

    class Record(dask.callbacks.Callback):  # type: ignore[misc]
        def _posttask(
            self, key: object, result: object, dsk: object, state: object, id: object
        ) -> None:
            seen.append(key)

    x = da.ones((40, 40), chunks=10)
    with ProgressBar(out=None), Record():
        assert (x + 1).sum().compute(scheduler=get) == 3200
    assert len(seen) >= 16


def test_intermediates_are_freed_as_their_dependents_finish() -> None:
    held: list[int] = []

    class Watch(dask.callbacks.Callback):  # type: ignore[misc]
        def _posttask(
            self, key: object, result: object, dsk: object, state: dict, id: object
        ) -> None:
            held.append(len(state["cache"]))

    x = da.ones(1000, chunks=1)
    with Watch():
        assert x.sum(split_every=2).compute(scheduler=get) == 1000
    # A binary tree over 1000 leaves: results are released level by level, not kept.
    assert max(held) < 100, max(held)


def test_xarray_dask_dataset(tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray")
    data = np.random.default_rng(0).random((8, 6, 5)).astype("float32")
    ds = xr.Dataset({"t": (("time", "y", "x"), data)}).chunk({"time": 2})
    anomaly = ds.t - ds.t.mean("time")
    # Dask's own synchronous scheduler is the reference: the same tasks, bit for bit.
    np.testing.assert_array_equal(
        anomaly.compute(scheduler=get).values, anomaly.compute(scheduler="sync").values
    )
    ds.to_zarr(tmp_path / "ds.zarr", compute=False).compute(scheduler=get)
    back = xr.open_zarr(tmp_path / "ds.zarr")
    np.testing.assert_array_equal(back.t.values, data)


def test_module_exports_get() -> None:
    assert chunkfuse.dask.get is get


def _zarr_source(tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...]) -> np.ndarray:
    data = np.random.default_rng(3).random(shape).astype("float32")
    z = zarr.create_array(tmp_path / "x.zarr", shape=shape, chunks=chunks, dtype="float32")
    z[:] = data
    return data


NATIVE_CASES = {
    "sum": (lambda x: ((x + 1) * 2).sum(axis=0), lambda v: ((v + 1) * 2).sum(axis=0)),
    "elementwise": (lambda x: np.sqrt(x) * 3 - x, lambda v: np.sqrt(v) * 3 - v),
    "mean": (lambda x: x.mean(axis=(0, 2)), lambda v: v.mean(axis=(0, 2))),
    "max": (lambda x: x.max(), lambda v: v.max()),
    "anomaly": (lambda x: x - x.mean(axis=0), lambda v: v - v.mean(axis=0)),
    "slice-min": (lambda x: x[3:9].min(axis=1), lambda v: v[3:9].min(axis=1)),
    "fft-lat": (
        lambda x: abs(da.fft.rfft(x.rechunk({1: -1}), axis=1)).mean(axis=0),
        lambda v: np.abs(np.fft.rfft(v, axis=1)).mean(axis=0),
    ),
    "power-spectrum": (
        lambda x: abs(da.fft.rfft(x.rechunk({0: -1}), axis=0)) ** 2,
        lambda v: np.abs(np.fft.rfft(v, axis=0)) ** 2,
    ),
    "fft2-irfft": (
        lambda x: da.fft.irfft(
            da.fft.fft2(x.rechunk({1: -1}), axes=(1, 2), norm="ortho"), n=8, axis=2
        ),
        lambda v: np.fft.irfft(np.fft.fft2(v, axes=(1, 2), norm="ortho"), n=8, axis=2),
    ),
}


@pytest.mark.parametrize("case", sorted(NATIVE_CASES))
def test_zarr_array_ops_run_in_the_engine(tmp_path: Path, case: str) -> None:
    """from_zarr → elementwise → reduction runs natively: no Python task computes a chunk."""
    data = _zarr_source(tmp_path, (12, 10, 8), (1, 5, 8))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    build, reference = NATIVE_CASES[case]
    got = build(x).compute(scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    assert stats.python_tasks == 0 and stats.native_tasks > 10, stats
    want = reference(data)
    tol = 1e-5 * max(1.0, float(np.abs(want).max()))  # FFTs: float32 rounding of sums
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=tol)
    # Dask's own scheduler on the same graph agrees.
    np.testing.assert_allclose(got, build(x).compute(scheduler="sync"), rtol=2e-6, atol=tol)


def test_to_zarr_and_rechunk_run_in_the_engine(tmp_path: Path) -> None:
    data = _zarr_source(tmp_path, (12, 10, 8), (1, 10, 8))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    (x * 2 + 1).to_zarr(str(tmp_path / "out.zarr"), compute=False).compute(scheduler=get)
    stats = last_stats()
    # One store task per chunk, all native; only Dask's final gathering of Nones is Python.
    assert stats is not None and stats.engine_runs == 1 and stats.native_tasks >= 12, stats
    assert stats.python_tasks <= 1, stats
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "out.zarr")[:], data * 2 + 1)
    # Rechunk splits and merges, then a write in the new chunks: all in the engine.
    x.rechunk((12, 5, 4)).to_zarr(str(tmp_path / "rechunked.zarr"), compute=False).compute(
        scheduler=get
    )
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.native_tasks > 24, stats
    out = zarr.open_array(tmp_path / "rechunked.zarr")
    assert out.chunks == (12, 5, 4)
    np.testing.assert_array_equal(out[:], data)
    y = x.rechunk((12, 5, 4)).sum(axis=0)
    np.testing.assert_allclose(y.compute(scheduler=get), data.sum(axis=0), rtol=2e-6)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


def test_native_false_runs_everything_in_python(tmp_path: Path) -> None:
    data = _zarr_source(tmp_path, (6, 4), (2, 4))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    np.testing.assert_allclose(
        (x + 1).sum().compute(scheduler=get, native=False), (data + 1).sum(), rtol=1e-6
    )
    stats = last_stats()
    assert stats is not None and stats.native_tasks == 0 and stats.python_tasks > 0


def _total(*blocks: np.ndarray) -> float:
    return float(sum(b.astype("float64").sum() for b in blocks))


def test_python_tasks_consume_engine_results(tmp_path: Path) -> None:
    """A Python task reading blocks the engine computed gets exactly those blocks."""
    data = _zarr_source(tmp_path, (8, 6), (2, 3))
    y = da.from_zarr(str(tmp_path / "x.zarr")) * 2
    graph = dict(y.__dask_graph__())
    graph["total"] = (_total, *flatten(y.__dask_keys__()))
    got = get(graph, "total")
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    assert stats.python_tasks == 1 and stats.native_tasks >= 8, stats
    assert got == pytest.approx(_total(data * 2), rel=1e-9)


def test_python_scalars_are_weak_as_in_numpy(tmp_path: Path) -> None:
    """`x + 1.5` on float32 computes in float32 (NEP 50), bit for bit numpy's result."""
    data = _zarr_source(tmp_path, (6, 5), (2, 5))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    got = ((x + 1.5) * 2 - 0.1).compute(scheduler=get)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (data + 1.5) * 2 - 0.1)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


class Blob:
    """Counts live instances, so a test can see how many intermediates a run held."""

    live = 0
    peak = 0

    def __init__(self, value: int) -> None:
        self.value = value
        Blob.live += 1
        Blob.peak = max(Blob.peak, Blob.live)

    def __del__(self) -> None:
        Blob.live -= 1


def _leaf(i: int) -> Blob:
    return Blob(i)


def _merge(a: Blob, b: Blob) -> Blob:
    return Blob(a.value + b.value)


@pytest.mark.parametrize("workers", [1, 2])
def test_lean_runs_free_intermediates_in_depth_first_order(workers: int) -> None:
    """A binary tree over 1024 leaves (a legacy dict graph, no callbacks): the result is
    right and only a few intermediates are alive at any time, not the 1024 leaves."""
    dsk: dict[Any, Any] = {("l", 0, i): (_leaf, i) for i in range(1024)}
    width, level = 1024, 0
    while width > 1:
        for i in range(width // 2):
            dsk[("l", level + 1, i)] = (_merge, ("l", level, 2 * i), ("l", level, 2 * i + 1))
        width //= 2
        level += 1
    Blob.live = Blob.peak = 0
    result = get(dsk, ("l", level, 0), num_workers=workers)
    assert result.value == sum(range(1024))
    # Without freeing, all 2047 values would be alive at the end. Workers take up to 64
    # ready tasks at once, so a few batches of leaves are (134 with one worker, up to about
    # 260 with two in our runs).
    assert Blob.peak < 512, Blob.peak
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 2047, stats
