"""chunkfuse.dask.get against Dask's get-function contract and dask.array results."""

from __future__ import annotations

import operator
from pathlib import Path

import chunkfuse.dask
import dask
import dask.array as da
import numpy as np
import pytest
from chunkfuse.dask import get, last_stats
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
