"""chunkfuse.dask.get against Dask's get-function contract and dask.array results."""

from __future__ import annotations

import graphlib
import itertools
import operator
import os
from pathlib import Path
from typing import Any

import chunkfuse.dask
import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from chunkfuse.dask import get, last_stats
from chunkfuse.dask.graph import topological
from dask._task_spec import Task, TaskRef
from dask.core import flatten
from dask.diagnostics import ProgressBar
from dask.utils_test import GetFunctionTestMixin
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st


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


def test_a_value_later_steps_reuse_is_computed_once(tmp_path: Path) -> None:
    """`y = sin(y) + cos(y) + y`, thirty times: each step reads y three times, so a fused
    program that repeated what its inputs share would double each step (2**30 values per
    element); it holds each operation once and equals Dask's own result."""
    a = np.linspace(-2, 2, 4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    z = zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 6, 8))
    y = da.from_zarr(z)
    for _ in range(30):
        y = np.sin(y) + np.cos(y) + y
    want = y.mean(axis=0).compute(scheduler="sync")
    got = y.mean(axis=0).compute(scheduler=get)
    assert last_stats().python_tasks == 0, last_stats()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_scratch_goes_in_work_dir_or_dask_s_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's scratch (here the mean Python reads back) goes in `work_dir`, else in
    Dask's `temporary-directory` setting, else in the system temporary directory; it is
    created when missing and empty once the compute returns."""
    system = tmp_path / "system"
    system.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(system))
    a = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    x = da.from_zarr(zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 6, 8)))
    work = tmp_path / "work"
    got = x.mean(axis=0).compute(scheduler=get, work_dir=str(work))
    assert last_stats().engine_runs == 1, last_stats()
    np.testing.assert_allclose(got, a.mean(axis=0), rtol=1e-6)
    assert work.is_dir() and not list(work.iterdir())
    setting = tmp_path / "dask-temporary"
    with dask.config.set({"temporary-directory": str(setting)}):
        np.testing.assert_allclose(x.mean(axis=0).compute(scheduler=get), a.mean(axis=0))
    assert setting.is_dir() and not list(setting.iterdir())
    np.testing.assert_allclose(x.mean(axis=0).compute(scheduler=get), a.mean(axis=0))
    assert not list(system.iterdir())
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FileExistsError, match="a-file"):
        x.mean(axis=0).compute(scheduler=get, work_dir=str(tmp_path / "a-file"))


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


XARRAY_OPS = {
    "mean": lambda t: t.mean("time"),
    "std": lambda t: t.std("time", ddof=1),
    "sum": lambda t: t.sum("time"),
    "max": lambda t: t.max(["y", "x"]),
    "anomaly": lambda t: t - t.mean("time"),
    "isel": lambda t: t.isel(time=3),
    "flipped": lambda t: t.isel(y=slice(None, None, -1)).mean("time"),
    "sortby": lambda t: t.assign_coords(y=np.arange(6)[::-1]).sortby("y").max("time"),
    "argmax": lambda t: t.argmax("time"),
    "transpose": lambda t: t.transpose("x", "time", "y").max("time"),
}


@pytest.mark.parametrize("name", sorted(XARRAY_OPS))
def test_xarray_zarr_variables_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """Reductions of a Zarr variable opened with xarray (its lazy backend wrappers, NaN
    skipping through isnan/where/zeros, a mean broadcast back with a new axis) run natively."""
    xr = pytest.importorskip("xarray")
    data = np.random.default_rng(5).random((8, 6, 5)).astype("float32")
    data[0, 0, 0] = np.nan
    xr.Dataset({"t": (("time", "y", "x"), data)}).chunk({"time": 2}).to_zarr(
        tmp_path / "ds.zarr", zarr_format=3, consolidated=False
    )
    t = xr.open_zarr(tmp_path / "ds.zarr", consolidated=False).t
    expr = XARRAY_OPS[name](t)
    got = expr.compute(scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.engine_runs == 1, stats
    want = expr.compute(scheduler="sync")
    assert got.dtype == want.dtype and got.shape == want.shape
    # The engine adds float32 in float64: within float32 rounding of Dask's own sums.
    np.testing.assert_allclose(got.values, want.values, rtol=1e-5, atol=1e-6)


#: xarray encodings of a float variable: packed integers (float64 or float32 scale), a float
#: variable with a fill value, an offset alone.
ENCODINGS = {
    "int16 scaled": {
        "dtype": "int16",
        "scale_factor": 0.01,
        "add_offset": 280.0,
        "_FillValue": -32767,
    },
    "int16 float32 scale": {
        "dtype": "int16",
        "scale_factor": np.float32(0.05),
        "_FillValue": np.int16(-1),
    },
    "uint8 offset": {"dtype": "uint8", "add_offset": 270.0, "scale_factor": 0.5, "_FillValue": 255},
    "float fill": {"dtype": "float32", "_FillValue": -999.0},
}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_xarray_decoded_variables_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """A variable xarray decodes (packed integers with a scale factor and offset, fill values
    masked to NaN) runs natively: the engine reads the packed chunks and decodes them as
    xarray does, bit for bit."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(6)
    data = (280 + 20 * rng.random((6, 4, 5))).astype("float32")
    data[1, 2, 3] = np.nan
    xr.Dataset({"t": (("time", "y", "x"), data)}).chunk({"time": 2, "y": 3}).to_zarr(
        tmp_path / "ds.zarr", zarr_format=3, consolidated=False, encoding={"t": ENCODINGS[name]}
    )
    t = xr.open_zarr(tmp_path / "ds.zarr", consolidated=False).t
    values = t.compute(scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.native_tasks > 0, stats
    want = t.compute(scheduler="sync")
    assert values.dtype == want.dtype
    np.testing.assert_array_equal(values.values, want.values)
    for expr in (t.mean("time"), t.std("y"), abs(t - t.mean("time")).max("time")):
        got = expr.compute(scheduler=get)
        stats = last_stats()
        assert stats is not None and stats.python_tasks == 0, stats
        # Dask accumulates float32 in float32, the engine in float64.
        want = expr.compute(scheduler="sync").values
        np.testing.assert_allclose(got.values, want, rtol=2e-5, atol=1e-4)


def test_module_exports_get() -> None:
    assert chunkfuse.dask.get is get


def _zarr_source(tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...]) -> np.ndarray:
    data = np.random.default_rng(3).random(shape).astype("float32")
    z = zarr.create_array(tmp_path / "x.zarr", shape=shape, chunks=chunks, dtype="float32")
    z[:] = data
    return data


def assert_native_as_dask(expr: da.Array, rtol: float) -> None:
    """`expr` computes in one engine run, no task in Python, with Dask's own values."""
    got = expr.compute(scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.engine_runs == 1, stats
    want = expr.compute(scheduler="sync")
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol)


def _ufunc_mix(x: Any) -> Any:
    return (
        np.hypot(x, x - 0.5)
        + np.arctan2(x - 0.5, x) * np.sign(x - 0.3)
        + np.log1p(x) * np.tanh(x)
        - np.square(x)
        + np.fmax(x, 0.5)
        + np.isfinite(x)
        + np.clip(x, 0.2, 0.7)
        + x.clip(min=0.5)
        + np.round(x * 37.3, 1)
        - np.round(x * 37.3, -1)
        + np.round(x * 37.3)
    )


NATIVE_CASES = {
    "sum": (lambda x: ((x + 1) * 2).sum(axis=0), lambda v: ((v + 1) * 2).sum(axis=0)),
    "elementwise": (lambda x: np.sqrt(x) * 3 - x, lambda v: np.sqrt(v) * 3 - v),
    "mean": (lambda x: x.mean(axis=(0, 2)), lambda v: v.mean(axis=(0, 2))),
    "max": (lambda x: x.max(), lambda v: v.max()),
    "anomaly": (lambda x: x - x.mean(axis=0), lambda v: v - v.mean(axis=0)),
    "std": (lambda x: x.std(axis=0), lambda v: v.std(axis=0)),
    "var-ddof1": (lambda x: x.var(axis=(1, 2), ddof=1), lambda v: v.var(axis=(1, 2), ddof=1)),
    "mean-f8": (lambda x: x.mean(axis=0, dtype="f8"), lambda v: v.mean(axis=0, dtype="f8")),
    "nanmean": (lambda x: da.nanmean(x, axis=2), lambda v: np.nanmean(v, axis=2)),
    "argmax": (lambda x: x.argmax(axis=0), lambda v: v.argmax(axis=0)),
    "any": (lambda x: (x > 0.99).any(axis=1), lambda v: (v > 0.99).any(axis=1)),
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
    # Wind speed and direction style math, masks and rounding-free float functions: numpy's
    # functions dispatch to Dask's on Dask arrays, so one expression serves both.
    "ufuncs": (lambda x: _ufunc_mix(x), lambda v: _ufunc_mix(v)),
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
    # Dask's own scheduler on the same graph agrees, dtype included.
    dask_value = build(x).compute(scheduler="sync")
    assert got.dtype == dask_value.dtype
    np.testing.assert_allclose(got, dask_value, rtol=2e-6, atol=tol)


REDUCTIONS = {
    "sum": lambda x, axis, kd: x.sum(axis=axis, keepdims=kd),
    "sum-f8": lambda x, axis, kd: x.sum(axis=axis, keepdims=kd, dtype="f8"),
    "prod": lambda x, axis, kd: (x / 60 + 0.5).prod(axis=axis, keepdims=kd),
    "mean": lambda x, axis, kd: x.mean(axis=axis, keepdims=kd),
    "mean-f8": lambda x, axis, kd: x.mean(axis=axis, keepdims=kd, dtype="f8"),
    "var": lambda x, axis, kd: x.var(axis=axis, keepdims=kd),
    "var-ddof1": lambda x, axis, kd: x.var(axis=axis, keepdims=kd, ddof=1),
    "std-f4": lambda x, axis, kd: x.std(axis=axis, keepdims=kd, dtype="f4"),
    "nansum": lambda x, axis, kd: da.nansum(x, axis=axis, keepdims=kd),
    "nanmean": lambda x, axis, kd: da.nanmean(x, axis=axis, keepdims=kd),
    "nanmin": lambda x, axis, kd: da.nanmin(x, axis=axis, keepdims=kd),
    "nanmax": lambda x, axis, kd: da.nanmax(x, axis=axis, keepdims=kd),
    "nanvar-ddof1": lambda x, axis, kd: da.nanvar(x, axis=axis, keepdims=kd, ddof=1),
    "nanstd": lambda x, axis, kd: da.nanstd(x, axis=axis, keepdims=kd),
    "nanprod": lambda x, axis, kd: da.nanprod(x / 60 + 0.5, axis=axis, keepdims=kd),
    "any": lambda x, axis, kd: (x > 90).any(axis=axis, keepdims=kd),
    "all": lambda x, axis, kd: (x > 1).all(axis=axis, keepdims=kd),
    "argmin": lambda x, axis, kd: x.argmin(axis=axis, keepdims=kd),
    "argmax": lambda x, axis, kd: x.argmax(axis=axis, keepdims=kd),
    "nanargmin": lambda x, axis, kd: da.nanargmin(x, axis=axis, keepdims=kd),
    "nanargmax": lambda x, axis, kd: da.nanargmax(x, axis=axis, keepdims=kd),
}


@pytest.fixture(scope="module")
def reduction_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, da.Array]:
    """Arrays with irregular last chunks: float32 with NaNs (one lane all NaN), int16."""
    rng = np.random.default_rng(11)
    root = tmp_path_factory.mktemp("reductions")
    sources = {}
    for dtype in ("float32", "int16"):
        values = (rng.random((9, 7, 5)) * 100).astype(dtype)
        if dtype == "float32":
            values[rng.random(values.shape) < 0.1] = np.nan
            values[:, 2, 3] = np.nan
        z = zarr.create_array(
            root / f"{dtype}.zarr", shape=values.shape, chunks=(2, 3, 5), dtype=dtype
        )
        z[:] = values
        sources[dtype] = da.from_zarr(z)
    return sources


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_run_in_the_engine_as_dask_computes_them(
    reduction_sources: dict[str, da.Array], name: str
) -> None:
    """Dask's reduction steps (chunk, combine, aggregate; mean's and var's sums, counts and
    moments; arg-reductions' values and indices) become one engine reduction: no Python task,
    and Dask's own values and dtype, over axes, keepdims, dtypes and tree depths. Where Dask
    refuses (nanargmin of the all-NaN lane), the engine refuses too, with a ValueError."""
    build = REDUCTIONS[name]
    for dtype, x in reduction_sources.items():
        for axis in (0, 1, (0, 2), None):
            if "arg" in name and isinstance(axis, tuple):
                continue  # arg-reductions take one axis or all (None: the ravelled index)
            for keepdims in (False, True):
                for split_every in (2, 8):
                    case = (dtype, axis, keepdims, split_every)
                    with dask.config.set(split_every=split_every):
                        expr = build(x, axis, keepdims)
                        try:
                            want = expr.compute(scheduler="sync")
                        except ValueError as e:
                            assert "All NaN slice" in str(e) and axis in (0, None), case
                            with pytest.raises(ValueError, match="invalid value: nanarg"):
                                expr.compute(scheduler=get)
                            continue
                        got = expr.compute(scheduler=get)
                    stats = last_stats()
                    assert stats is not None and stats.python_tasks == 0, (case, stats)
                    assert got.dtype == want.dtype and got.shape == want.shape, case
                    rtol = 1e-4 if want.dtype == np.float32 else 1e-9
                    np.testing.assert_allclose(
                        got, want, rtol=rtol, equal_nan=True, err_msg=str(case)
                    )


def test_a_nan_arg_reduction_of_a_slice_ignores_all_nan_lanes_outside_it(
    reduction_sources: dict[str, da.Array],
) -> None:
    """The lane (.., 2, 3) is all NaN: a NaN-skipping arg-reduction of a slice that leaves it
    out gives Dask's indices (the engine reduces the slice, not the whole array and then the
    slice, which would fail on that lane)."""
    x = reduction_sources["float32"]
    for name in ("nanargmax", "nanargmin"):
        for sel in (np.s_[:, :2], np.s_[:, 3:], np.s_[:, 2, :3], np.s_[1:8, 1:5, 4]):
            expr = REDUCTIONS[name](x[sel], 0, False)
            want = expr.compute(scheduler="sync")
            got = expr.compute(scheduler=get)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} of {sel}")
            stats = last_stats()
            assert stats is not None and stats.python_tasks == 0, (name, sel, stats)
        with pytest.raises(ValueError, match="invalid value: nanarg"):
            REDUCTIONS[name](x[:, 1:4], 0, False).compute(scheduler=get)


SELECTIONS = {
    "time-step": np.s_[5],
    "from-the-end": np.s_[-1],
    "one-latitude": np.s_[:, 3],
    "mixed": np.s_[4, 1:6, ::2],
    "ellipsis": np.s_[..., 2],
    "slice-of-a-slice": np.s_[2:8, 1:6],
    "reversed": np.s_[::-1],
    "latitude-flipped": np.s_[:, ::-1],
    "backwards-by-steps": np.s_[-2::-3, 5:0:-2, ::-1],
    "flipped-crop": np.s_[7:1:-1, 2],
}


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_selections_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """Integer, strided and backward selections of a stored array, and reductions over the
    selected part (`x[2:8].sum(axis=0)` reduces rows 2 to 7 only; `x[::-1].argmax(axis=0)`
    counts from the last row), run natively with Dask's values."""
    data = _zarr_source(tmp_path, (9, 7, 5), (2, 3, 5))
    x = da.from_zarr(str(tmp_path / "x.zarr"))[SELECTIONS[name]]
    for expr in (x, x + 1, x.sum(axis=0), x.max(), x.argmax(axis=0), da.argmin(x)):
        assert_native_as_dask(expr, rtol=1e-6)
    np.testing.assert_array_equal(x.compute(scheduler=get), data[SELECTIONS[name]])


#: Dask's `take` (integer arrays along one axis, as xarray's `sortby` uses): positions in an
#: even progression, over one chunk or several (Dask then merges pieces of blocks).
TAKES = {
    "reversed rows": lambda x: x[np.arange(8, -1, -1)],
    "every other column": lambda x: x[:, [0, 2, 4, 6]],
    "backwards by two": lambda x: x[:, np.arange(6, -1, -2), 1:4],
}


@pytest.mark.parametrize("name", sorted(TAKES))
def test_takes_in_an_even_progression_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """A take whose positions step evenly is the slice that takes them in order: it runs
    natively with Dask's values, also under reductions counting positions."""
    _zarr_source(tmp_path, (9, 7, 5), (2, 3, 5))
    x = TAKES[name](da.from_zarr(str(tmp_path / "x.zarr")))
    for expr in (x, x * 2, x.sum(axis=0), x.argmax(axis=1)):
        assert_native_as_dask(expr, rtol=1e-6)


def test_takes_in_any_order_stay_correct(tmp_path: Path) -> None:
    """Positions in no even progression within a block (`x[:, [0, 2, 1]]`, the axis in one
    chunk) are the runs they are made of, joined: native, with Dask's values."""
    data = _zarr_source(tmp_path, (9, 7, 5), (2, 7, 5))
    x = da.from_zarr(str(tmp_path / "x.zarr"))[:, [0, 2, 1]]
    np.testing.assert_array_equal(x.max(axis=0).compute(scheduler=get), data[:, [0, 2, 1]].max(0))
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


TRANSPOSES = {
    "T": lambda x: x.T,
    "cycled": lambda x: x.transpose(2, 0, 1) * 2,
    "moveaxis": lambda x: da.moveaxis(x, 0, -1)[::-2],
}


@pytest.mark.parametrize("name", sorted(TRANSPOSES))
def test_transposes_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """`np.transpose` of blocks (`x.T`, `transpose`, `moveaxis`, xarray's `transpose`) is
    the engine's transpose: native, with Dask's values, also under reductions."""
    _zarr_source(tmp_path, (9, 7, 5), (2, 3, 5))
    x = TRANSPOSES[name](da.from_zarr(str(tmp_path / "x.zarr")))
    for expr in (x, x.sum(axis=0), x.argmax(axis=1), x - x.max(axis=2, keepdims=True)):
        assert_native_as_dask(expr, rtol=1e-5)


def _joined_sources(tmp_path: Path) -> tuple[da.Array, da.Array, da.Array]:
    """Three stored arrays that join along either axis of (rows, 6), each chunked its own way."""
    rng = np.random.default_rng(11)
    out = []
    for name, rows, chunks, dtype in (
        ("a", 7, (3, 4), "f4"),
        ("b", 5, (2, 6), "f4"),
        ("i", 6, (6, 2), "i2"),
    ):
        z = zarr.create_array(
            tmp_path / f"{name}.zarr", shape=(rows, 6), chunks=chunks, dtype=dtype
        )
        z[:] = (rng.standard_normal((rows, 6)) * 10).astype(dtype)
        out.append(da.from_zarr(str(tmp_path / f"{name}.zarr")))
    return out[0], out[1], out[2]


JOINS = {
    "rows": lambda a, b, i: da.concatenate([a, b], axis=0),
    "columns": lambda a, b, i: da.concatenate([a[:5], b, a[2:]], axis=1),
    "same twice": lambda a, b, i: da.concatenate([a, a + 1], axis=0),
    "dtypes": lambda a, b, i: da.concatenate([b, i], axis=0),
    # Dask's optimisation inlines these joins' aliases into the next step's tasks.
    "nested": lambda a, b, i: da.concatenate([da.concatenate([a, b]), a * 2], axis=0),
    "cut": lambda a, b, i: da.concatenate([a, b, a], axis=0)[4:15:2],
    # A crop from index 0 before its whole array (the engine once placed it as that array).
    "padded": lambda a, b, i: da.concatenate([a[:1], a, b[:2]]),
    "padded columns": lambda a, b, i: da.concatenate([a[:, :1], a, a[:, :2]], axis=1),
    "stack": lambda a, b, i: da.stack([a[:5], b, a[2:]], axis=0),
    "stack last": lambda a, b, i: da.stack([a[:5], b * 2], axis=2),
}


def _join_exprs(x: da.Array) -> list[da.Array]:
    return [
        x,
        x.sum(axis=0),
        x.mean(axis=1),
        x.max(),
        (x * 2).std(axis=0),
        x.argmax(axis=0),
        x.argmin(axis=1),
    ]


@pytest.mark.parametrize("name", sorted(JOINS))
def test_concatenations_run_in_the_engine(tmp_path: Path, name: str) -> None:
    """`da.concatenate` has no tasks of its own (its blocks alias the inputs' blocks, often
    fused into, or inlined in, the next step), `da.stack` gives each input a new axis: their
    values and reductions over them run natively, as one IR `concat` of the inputs."""
    x = JOINS[name](*_joined_sources(tmp_path))
    for expr in _join_exprs(x):
        assert_native_as_dask(expr, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(JOINS))
def test_concatenations_are_written_by_the_engine(tmp_path: Path, name: str) -> None:
    """`to_zarr` of a join: Dask rechunks irregular chunks first, merging blocks of several
    arrays; the stores then write the target joined as their boxes lie."""
    x = JOINS[name](*_joined_sources(tmp_path))
    with dask.config.set(scheduler=get):
        x.to_zarr(str(tmp_path / "out.zarr"))
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.engine_runs == 1, stats
    np.testing.assert_array_equal(
        zarr.open_array(tmp_path / "out.zarr")[:], x.compute(scheduler="sync")
    )


def test_part_of_a_concatenation_stays_correct(tmp_path: Path) -> None:
    """Blocks of a concatenation culled to some of its inputs keep their inputs' values."""
    a, b, _ = _joined_sources(tmp_path)
    x = da.concatenate([a, b, a], axis=0)
    for expr in (x[8:11], x[8:11].sum(axis=0), x.blocks[1:3].mean(axis=0)):
        np.testing.assert_allclose(
            expr.compute(scheduler=get), expr.compute(scheduler="sync"), rtol=1e-5
        )


def test_reduction_states_consumed_in_python_stay_in_python(tmp_path: Path) -> None:
    """A Python task reading mean's per-block sums and counts gets Dask's own dict, not the
    engine's mean; a var whose ddof exceeds the count runs Dask's steps (NaN, not numpy's inf)."""
    data = _zarr_source(tmp_path, (8, 6), (2, 3))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    m = x.mean(axis=0)
    graph = dict(m.__dask_graph__())
    chunk_keys = [k for k in graph if isinstance(k, tuple) and "mean_chunk" in str(k[0])]
    assert chunk_keys
    graph["count"] = (lambda pair: int(np.sum(pair["n"])), chunk_keys[0])
    count, blocks = get(graph, ["count", m.__dask_keys__()])
    assert count == 2 * 3
    np.testing.assert_allclose(np.concatenate(blocks), data.mean(axis=0), rtol=1e-6)
    stats = last_stats()
    # The peeked block's mean_chunk runs in Python (its dict is wanted), and so does "count".
    assert stats is not None and stats.python_tasks == 2 and stats.native_tasks > 0, stats
    with np.errstate(all="ignore"):
        var = x.var(axis=0, ddof=9)
        got, want = var.compute(scheduler=get), var.compute(scheduler="sync")
    assert np.isnan(want).all()
    np.testing.assert_array_equal(got, want)


def test_intermediates_of_fill_values_read_back(tmp_path: Path) -> None:
    """An intermediate whose chunks all equal its fill value (argmax over one element: zeros)
    is stored chunk by chunk, so the next stage reads it rather than taking it for a chunk
    something removed while the job ran (hypothesis found this)."""
    _zarr_source(tmp_path, (1, 4, 2), (1, 1, 1))
    x = da.from_zarr(str(tmp_path / "x.zarr"))[::-3, ::-3, np.array([1])].argmax(axis=2)
    np.testing.assert_array_equal(x.compute(scheduler=get), x.compute(scheduler="sync"))
    stats = last_stats()
    assert stats is not None and stats.native_tasks > 0, stats


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


def test_elementwise_steps_that_differ_only_in_a_scalar_stay_apart(tmp_path: Path) -> None:
    """Every block of one elementwise step names the same whole array (the interpreter
    reuses it), but a step with another scalar (1 against True, 0.0 against -0.0) or over
    another array is another array."""
    data = _zarr_source(tmp_path, (6, 5), (2, 5))
    data[0, 0] = 0.0  # -0.0 once negated: + 0.0 gives 0.0, + -0.0 keeps -0.0
    zarr.open_array(tmp_path / "x.zarr", mode="r+")[:] = data
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    zeros = [(x * -1.0) + 0.0, (x * -1.0) + -0.0, x + 1, x + True, (x + 1) * 2, x * 2 + 1]
    got = dask.compute(*zeros, scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0, stats
    want = dask.compute(*zeros, scheduler="sync")
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
    assert np.signbit(got[1][0, 0]) != np.signbit(got[0][0, 0])


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


WITHOUT_CUBED = """
import sys
sys.modules["cubed"] = None  # as if Cubed were not installed
import numpy as np, zarr, dask.array as da
import chunkfuse.dask
z = zarr.create_array(sys.argv[1], shape=(6, 8), chunks=(2, 8), dtype="float32")
z[:] = np.arange(48, dtype="float32").reshape(6, 8)
x = da.from_zarr(sys.argv[1])
total = (x * 2).sum(axis=0).compute(scheduler=chunkfuse.dask.get)
spectrum = abs(da.fft.rfft(x, axis=1)).compute(scheduler=chunkfuse.dask.get)
stats = chunkfuse.dask.last_stats()
assert stats.python_tasks == 0 and stats.native_tasks > 0, stats
np.testing.assert_allclose(total, (z[:] * 2).sum(axis=0))
np.testing.assert_allclose(spectrum, abs(np.fft.rfft(z[:], axis=1)), rtol=1e-5)
"""


def test_the_dask_scheduler_needs_no_cubed(tmp_path: Path) -> None:
    """chunkfuse.dask (FFTs included) runs natively with Cubed absent."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_CUBED, str(tmp_path / "x.zarr")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _halve(block: np.ndarray) -> np.ndarray:
    return block / 2


def test_fused_tasks_run_their_native_steps_in_the_engine(tmp_path: Path) -> None:
    """A task Dask fused from native steps and a Python function (a reduction's last step and
    a map_blocks, xarray's finalize of dask.compute) gets the native steps' values from the
    engine: only the Python function runs in Python."""
    xr = pytest.importorskip("xarray")
    data = _zarr_source(tmp_path, (8, 6, 5), (1, 6, 5))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    got = (x.std(axis=0).map_blocks(_halve) + 1).compute(scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    assert stats.python_tasks <= 2 and stats.native_tasks >= 8, stats
    np.testing.assert_allclose(got, data.std(axis=0) / 2 + 1, rtol=1e-5)
    t = xr.DataArray(x, dims=("time", "y", "x"), name="t")
    (spread, extreme) = dask.compute(
        t.std("time"), abs(t - t.mean("time")).max("time"), scheduler=get
    )
    stats = last_stats()
    # Per DataArray: its finalize, fused into the last reduction step, and Dask's own.
    assert stats is not None and stats.python_tasks <= 4 and stats.native_tasks >= 16, stats
    np.testing.assert_allclose(spread.values, data.std(axis=0), rtol=1e-5)
    np.testing.assert_allclose(
        extreme.values, np.abs(data - data.mean(axis=0)).max(axis=0), rtol=1e-5, atol=1e-6
    )


#: Settings of the property tests (``CHUNKFUSE_HYPOTHESIS_EXAMPLES`` examples, default 25).
PROPERTY = settings(
    max_examples=int(os.environ.get("CHUNKFUSE_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def _joins(draw: st.DrawFn) -> dict[str, Any]:
    """Stored arrays of one shape but their own chunks, joined or stacked along an axis,
    perhaps cut with a step, then reduced along some axis."""
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    stack = draw(st.booleans())
    axis = draw(st.integers(0, rank if stack else rank - 1))
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        s = list(shape)
        if not stack:
            s[axis] = draw(st.integers(1, 6))
        parts.append((s, [draw(st.integers(1, n)) for n in s]))
    out_rank = rank + (1 if stack else 0)
    reduce_axis = draw(st.one_of(st.none(), st.integers(0, out_rank - 1)))
    func = draw(st.sampled_from(["sum", "mean", "max", "std", "argmax", "argmin", "none", "write"]))
    return {
        "stack": stack,
        "axis": axis,
        "parts": parts,
        "step": draw(st.sampled_from([1, 2])),
        "func": func,
        "reduce_axis": reduce_axis,
        "seed": draw(st.integers(0, 2**16)),
    }


@PROPERTY
@given(case=_joins())
def test_joins_match_dask(tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]) -> None:
    root = tmp_path_factory.mktemp("joins")
    rng = np.random.default_rng(case["seed"])
    arrays = []
    for k, (shape, chunks) in enumerate(case["parts"]):
        z = zarr.create_array(root / f"p{k}.zarr", shape=shape, chunks=chunks, dtype="f4")
        z[:] = rng.standard_normal(shape).astype("f4")
        arrays.append(da.from_zarr(str(root / f"p{k}.zarr")))
    join = da.stack if case["stack"] else da.concatenate
    x = join(arrays, axis=case["axis"])[:: case["step"]]
    if case["func"] == "write":
        with dask.config.set(scheduler=get):
            x.to_zarr(str(root / "out.zarr"))
        want = x.compute(scheduler="sync")
        np.testing.assert_array_equal(zarr.open_array(root / "out.zarr")[:], want)
        return
    if case["func"] != "none":
        axis = case["reduce_axis"]
        if case["func"].startswith("arg") and axis is None and x.ndim > 1:
            axis = 0
        x = getattr(x, case["func"])(axis=axis)
    want = x.compute(scheduler="sync")
    got = x.compute(scheduler=get)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@st.composite
def _selections(draw: st.DrawFn) -> dict[str, Any]:
    """A stored array, a selection of it with integers, steps (backward ones too) or a take of
    evenly stepping positions per axis, then perhaps a reduction."""
    rank = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 9)) for _ in range(rank)]
    chunks = [draw(st.integers(1, n)) for n in shape]
    index: list[Any] = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "slice", "take"]))
        if kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 1, n + 1)
            step = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
            index.append(slice(draw(bound), draw(bound), step))
        else:
            first = draw(st.integers(0, n - 1))
            step = draw(st.sampled_from([-2, -1, 1, 2]))
            count = draw(st.integers(1, 1 + (first if step < 0 else n - 1 - first) // abs(step)))
            index.append(np.arange(count) * step + first)
    # Dask takes one integer array at a time.
    takes = [k for k, item in enumerate(index) if isinstance(item, np.ndarray)]
    for k in takes[1:]:
        index[k] = slice(None)
    func = draw(st.sampled_from(["none", "sum", "max", "argmax", "argmin"]))
    return {
        "shape": shape,
        "chunks": chunks,
        "index": tuple(index),
        "func": func,
        "axis": draw(st.one_of(st.none(), st.integers(0, rank - 1))),
        "seed": draw(st.integers(0, 2**16)),
    }


@PROPERTY
@given(case=_selections())
def test_selections_match_dask(
    tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]
) -> None:
    """Selections of every kind the engine takes (backward steps, evenly stepping takes), under
    reductions, give Dask's values, and run natively (an arg-reduction of a take, whose
    pieces Dask may list out of order or join across blocks, may stay in Python)."""
    root = tmp_path_factory.mktemp("selections")
    data = np.random.default_rng(case["seed"]).standard_normal(case["shape"]).astype("f4")
    z = zarr.create_array(root / "x.zarr", shape=data.shape, chunks=case["chunks"], dtype="f4")
    z[:] = data
    x = da.from_zarr(str(root / "x.zarr"))[case["index"]]
    assume(x.size > 0)
    if case["func"] != "none" and x.ndim > 0:
        axis = case["axis"] if case["axis"] is None or case["axis"] < x.ndim else 0
        x = getattr(x, case["func"])(axis=axis)
    try:
        want = x.compute(scheduler="sync")
    except ValueError:
        # Dask's own arg-reduction fails where one of its blocks holds no value.
        assume(False)
    got = x.compute(scheduler=get)
    stats = last_stats()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    take = any(isinstance(i, np.ndarray) and len(i) > 1 for i in case["index"])
    if not (take and case["func"].startswith("arg")):
        assert stats is not None and stats.python_tasks == 0, (case["index"], stats)


def test_a_cyclic_graph_over_a_stored_array_is_an_error_naming_its_keys(tmp_path: Path) -> None:
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4,), chunks=(2,), dtype="f4")
    z[...] = 1
    from dask.array.core import getter

    dsk = {
        "src": z,
        "a": (getter, "src", (slice(0, 2),)),
        "b": (operator.add, "a", "c"),
        "c": (operator.add, "b", 1),
    }
    with pytest.raises(graphlib.CycleError) as err:
        get(dsk, "b")
    assert set(err.value.args[1]) == {"b", "c"}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=12))
def test_topological_puts_every_key_after_its_dependencies(deps: list[list[int]]) -> None:
    # Key i depends on keys below it only (an acyclic graph); keys out of the graph are skipped.
    graph = {
        f"k{i}": Task(f"k{i}", tuple, [TaskRef(f"k{d}") for d in ds if d < i or d >= len(deps)])
        for i, ds in enumerate(deps)
    }
    order = topological(graph)
    assert sorted(order) == sorted(graph)
    at = {k: n for n, k in enumerate(order)}
    for k, node in graph.items():
        assert all(at[d] < at[k] for d in node.dependencies if d in graph)


def test_a_stored_block_given_a_new_axis_is_read_through_the_plan(tmp_path: Path) -> None:
    """A block of a stored array with an axis added (`stack` of one array) is not a plain
    selection of the store: it is computed by a plan, not read directly."""
    a = np.arange(6.0, dtype="float32").reshape(1, 2, 3)
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(1, 1, 3))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    for y, want in [(da.stack([x], axis=3), np.stack([a], axis=3)), (x[..., None], a[..., None])]:
        np.testing.assert_array_equal(y.compute(scheduler=chunkfuse.dask.get), want)


@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
)
def test_scratch_chunks_are_the_blocks_python_reads_back(shape: list[int], data: Any) -> None:
    """Blocks on a regular grid (Dask's chunks) make the scratch array's chunks, so reading
    one back reads its own chunk only; blocks on no regular grid are refused."""
    from chunkfuse.dask.runner import _block_grid

    chunks = [data.draw(st.integers(1, n)) for n in shape]
    grid = [range(0, n, c) for n, c in zip(shape, chunks, strict=True)]
    blocks = [
        tuple((a, min(a + c, n)) for a, c, n in zip(starts, chunks, shape, strict=True))
        for starts in itertools.product(*grid)
    ]
    want = tuple(min(c, n) for c, n in zip(chunks, shape, strict=True))
    assert _block_grid(tuple(shape), blocks) == want
    # A block that starts off the grid.
    if shape[0] > 2 and chunks[0] > 1:
        first = blocks[0]
        odd = ((1, min(1 + chunks[0], shape[0])), *first[1:])
        assert _block_grid(tuple(shape), [*blocks, odd]) is None


def test_transposed_blocks_python_reads_back_equal_dask_s(tmp_path: Path) -> None:
    """A Python function over the transpose of stored blocks (flox's groupby reductions over
    xarray's transposed variables): the engine computes the transposed blocks, Python reads
    each back from its own scratch chunk; the values are Dask's."""
    a = np.arange(8 * 6 * 10, dtype=np.float32).reshape(8, 6, 10)
    x = da.from_zarr(zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 6, 5)))
    y = (x.transpose(1, 2, 0) * 2).map_blocks(lambda b: b.cumsum(axis=-1), dtype=x.dtype)
    np.testing.assert_array_equal(y.compute(scheduler=get), y.compute(scheduler="sync"))
    stats = last_stats()
    assert stats.engine_runs == 1 and stats.python_tasks > 0, stats
