"""Gathers of arbitrary position lists (`x[:, [5, 2, 9]]`, xarray's `isel` with a list, a
groupby's takes) run in the engine through Dask and Cubed: their positions split into runs that
step evenly, each a slice, joined in order. Values against numpy and xarray."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import chunkfuse.dask
import cubed
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from chunkfuse import RustExecutor
from chunkfuse.common.selection import MAX_RUNS, even_runs
from chunkfuse.common.symbols import NotNative
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SHAPE = (40, 6, 7)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    data = np.random.default_rng(3).standard_normal(SHAPE).astype("float32")
    path = tmp_path_factory.mktemp("gathers") / "a.zarr"
    zarr.create_array(path, shape=SHAPE, chunks=(1, 6, 7), dtype="float32")[...] = data
    return str(path), data


@given(st.lists(st.integers(0, 60), min_size=1, max_size=40))
def test_runs_take_the_positions_in_order(positions: list[int]) -> None:
    runs = even_runs(np.array(positions))
    axis = np.arange(61)
    assert np.concatenate([axis[r] for r in runs]).tolist() == positions
    # Runs are maximal: two neighbours never continue one progression.
    assert len(runs) <= len(positions)


def test_runs_refuse_what_is_no_list_of_positions() -> None:
    with pytest.raises(NotNative):
        even_runs(np.array([3, -1]))
    with pytest.raises(NotNative):
        even_runs(np.array([1.0, 2.0]))
    with pytest.raises(NotNative):
        even_runs(np.arange(4 * MAX_RUNS) ** 2 % 1000)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    positions=st.lists(st.integers(0, SHAPE[0] - 1), min_size=1, max_size=25),
    time_chunk=st.sampled_from([1, 4, 10, 40]),
    axis=st.sampled_from([0, 2]),
)
def test_dask_takes_run_in_the_engine(
    stored: tuple[str, np.ndarray], positions: list[int], time_chunk: int, axis: int
) -> None:
    url, data = stored
    x = da.from_zarr(url).rechunk((time_chunk, 6, 7))
    index: list[Any] = [slice(None)] * 3
    index[axis] = [p % SHAPE[axis] for p in positions]
    got = x[tuple(index)].compute(scheduler=chunkfuse.dask.get)
    np.testing.assert_array_equal(got, data[tuple(index)])
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


def _dataset(path: Path, steps: int = 240) -> xr.Dataset:
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), rng.standard_normal((steps, 3, 4)).astype("float32"))},
        coords={"time": pd.date_range("2000-01-20", periods=steps, freq="6h")},
    )
    ds.chunk({"time": 8}).to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    return ds


def test_xarray_groupby_and_isel_lists_through_dask(tmp_path: Path) -> None:
    ref = _dataset(tmp_path / "ds.zarr")
    ds = xr.open_zarr(tmp_path / "ds.zarr", consolidated=False)
    monthly = ds.t2m.groupby("time.month").mean().compute(scheduler=chunkfuse.dask.get)
    xr.testing.assert_allclose(monthly, ref.t2m.groupby("time.month").mean())
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0, stats
    picked = ds.t2m.isel(time=[17, 3, 4, 5, 100, 9]).compute(scheduler=chunkfuse.dask.get)
    xr.testing.assert_identical(picked, ref.t2m.isel(time=[17, 3, 4, 5, 100, 9]))
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


def test_a_groupby_decodes_its_source_once(tmp_path: Path) -> None:
    """`groupby("time.hour").mean()` of hourly data in day chunks: each hour's mean is a
    stage reading a join of one slice per chunk, every stage all of the source's chunks.
    The first stage keeps the chunks it decodes for the others: the source is decoded once,
    not once per hour (24 times)."""
    rng = np.random.default_rng(1)
    steps = 24 * 6
    data = rng.standard_normal((steps, 5, 6)).astype("float32")
    ref = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), data)},
        coords={"time": pd.date_range("2000-01-01", periods=steps, freq="h")},
    )
    ref.chunk({"time": 24}).to_zarr(tmp_path / "h.zarr", zarr_format=3, consolidated=False)
    ds = xr.open_zarr(tmp_path / "h.zarr", consolidated=False)
    hourly = ds.t2m.groupby("time.hour").mean().compute(scheduler=chunkfuse.dask.get)
    want = ref.t2m.groupby("time.hour").mean()
    # float32 means of six values near zero: an ulp apart from Dask's where the values cancel.
    xr.testing.assert_allclose(hourly, want, rtol=1e-5, atol=1e-6)
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0, stats
    groups = [s for s in stats.stages if s["kind"] == "reduce"]
    assert len(groups) == 24, [s["label"] for s in stats.stages]
    decoded = sum(s["decoded_bytes"] for s in groups)
    assert decoded == data.nbytes, (decoded, data.nbytes, [s["caches"] for s in groups])


def test_cubed_takes_and_groupby_run_in_the_engine(tmp_path: Path) -> None:
    ref = _dataset(tmp_path / "ds.zarr")
    spec = cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="200MB")
    executor = RustExecutor()
    x = cubed.from_zarr(str(tmp_path / "ds.zarr" / "t2m"), spec=spec)
    positions = [30, 2, 3, 4, 200, 7, 7, 0]
    np.testing.assert_array_equal(
        x[positions].compute(executor=executor), ref.t2m.values[positions]
    )
    assert executor.last_stats.python_tasks == 0, executor.last_stats
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(
            tmp_path / "ds.zarr",
            chunked_array_type="cubed",
            from_array_kwargs={"spec": spec},
            consolidated=False,
        )
        monthly = ds.t2m.groupby("time.month").mean().compute(executor=executor)
    xr.testing.assert_allclose(monthly, ref.t2m.groupby("time.month").mean())
    assert executor.last_stats.python_tasks == 0, executor.last_stats
