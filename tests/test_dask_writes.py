"""Zarr writes through chunkfuse.dask.get: xarray's ``to_zarr`` and Dask's ``store`` under
every way of choosing the scheduler, the ERA5-like xarray workflows against Dask's threaded
scheduler, failed writes, and Dask's diagnostics callbacks."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from chunkfuse.dask import get, last_stats
from chunkfuse.dask.symbols import store_box
from conftest import assert_no_partial_files
from dask.diagnostics import CacheProfiler, Profiler, ProgressBar, ResourceProfiler
from hypothesis import given, settings
from hypothesis import strategies as st

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

pytestmark = pytest.mark.filterwarnings(
    # xarray's consolidated metadata on Zarr v3, and its NaN-only groups.
    "ignore::UserWarning",
    "ignore::RuntimeWarning",
)

#: float32's machine epsilon: the tolerances below are a few units in the last place of the
#: largest input value (sums and means of float32 values may round differently in the
#: engine, which adds in float64, and in Dask, which adds in float32).
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ERA5-like Zarr v3 dataset: three float32 variables (time 48 half-days from
    2000-01-20, so two months; latitude 7, descending; longitude 12), one time step per chunk,
    with coordinates, attributes and one missing value."""
    root = tmp_path_factory.mktemp("era5") / "era5.zarr"
    nt, ny, nx = 48, 7, 12
    rng = np.random.default_rng(34)
    t2m = (250 + 3 * rng.standard_normal((nt, ny, nx))).astype("f4")
    t2m[5, 2, 3] = np.nan
    dims = ("time", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "t2m": (dims, t2m, {"units": "K", "long_name": "2 metre temperature"}),
            "u10": (dims, (5 * rng.standard_normal((nt, ny, nx))).astype("f4"), {"units": "m/s"}),
            "sp": (dims, (1000 + 10 * rng.standard_normal((nt, ny, nx))).astype("f4")),
        },
        coords={
            "time": pd.date_range("2000-01-20", periods=nt, freq="12h"),
            "latitude": np.linspace(90, -90, ny),
            "longitude": np.arange(nx) * 30.0,
        },
    ).chunk({"time": 1})
    with dask.config.set(scheduler="threads"):
        ds.to_zarr(root, mode="w", zarr_format=3, consolidated=False)
    return root


def _open(path: Path) -> Any:
    return xr.open_zarr(path, consolidated=False)


def _atol(*inputs: Any) -> float:
    """Sixteen units in the last place of the largest float32 input value."""
    return 16 * EPS32 * max(float(np.nanmax(np.abs(x.values))) for x in inputs)


def _assert_written(path: Path, want: Any, atol: float) -> None:
    """`path` holds `want` (an xarray Dataset): read back with xarray and with zarr-python,
    every chunk whole."""
    got = _open(path).compute()
    xr.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)
    group = zarr.open_group(str(path), mode="r")
    for name, var in want.data_vars.items():
        np.testing.assert_allclose(group[name][:], var.values, rtol=1e-5, atol=atol)
        assert_no_partial_files(path / name)


def _anomaly_mean_std(ds: Any) -> Any:
    """The ERA5 anomaly, mean and standard deviation of t2m, and the 10 m wind's square: four
    variables from reductions and elementwise steps."""
    t = ds.t2m
    return xr.Dataset(
        {
            "anomaly": t - t.mean("time"),
            "mean": t.mean("time"),
            "std": t.std("time"),
            "u2": ds.u10**2,
        }
    )


def _config(out: Any, path: Path) -> int:
    with dask.config.set(scheduler=get):
        out.to_zarr(path, mode="w")
    return 0


def _store_kwargs(out: Any, path: Path) -> int:
    out.to_zarr(path, mode="w", chunkmanager_store_kwargs={"scheduler": get})
    return 0


def _delayed_compute(out: Any, path: Path) -> int:
    out.to_zarr(path, mode="w", compute=False).compute(scheduler=get)
    # xarray's delayed `_finalize_store` (it closes the store) is the one Python task.
    return 1


def _delayed_under_config(out: Any, path: Path) -> int:
    with dask.config.set(scheduler=get):
        out.to_zarr(path, mode="w", compute=False).compute()
    return 1


def _dask_compute_of_two(out: Any, path: Path) -> int:
    first = out[["anomaly", "mean"]].to_zarr(path, mode="w", compute=False)
    second = out[["std", "u2"]].to_zarr(path, mode="a", compute=False)
    dask.compute(first, second, scheduler=get)
    return 2


WAYS: dict[str, Callable[[Any, Path], int]] = {
    "config": _config,
    "store_kwargs": _store_kwargs,
    "compute_false_then_compute": _delayed_compute,
    "compute_false_under_config": _delayed_under_config,
    "dask_compute_of_two_delayed": _dask_compute_of_two,
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_to_zarr_under_each_way_of_choosing_the_scheduler(
    era5: Path, tmp_path: Path, way: str
) -> None:
    """Several variables built from reductions written with `to_zarr`: Dask's values, and
    every array task in the engine (the only Python tasks are xarray's delayed closings)."""
    ds = _open(era5)
    out = _anomaly_mean_std(ds)
    path = tmp_path / "out.zarr"
    finalizers = WAYS[way](out, path)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    assert stats.python_tasks == finalizers and stats.native_tasks > 4 * 48, stats
    want = out.compute(scheduler="threads")
    _assert_written(path, want, _atol(ds.t2m, ds.u10**2))


#: The ERA5-like workflows, each with whether the README says all its ops are native.
WORKFLOWS: dict[str, tuple[Callable[[Any], Any], bool]] = {
    "anomaly_mean_std": (_anomaly_mean_std, True),
    "climatology_month": (lambda ds: ds.groupby("time.month").mean(), True),
    "climatology_dayofyear": (lambda ds: ds[["t2m"]].groupby("time.dayofyear").mean(), True),
    "resample_daily": (lambda ds: ds.resample(time="1D").mean(), True),
    # xarray's weighted mean is an einsum (`xr.dot`), which runs in Python.
    "weighted_mean": (
        lambda ds: (
            ds[["t2m"]].weighted(np.cos(np.deg2rad(ds.latitude))).mean(("latitude", "longitude"))
        ),
        False,
    ),
    # Rolling windows (overlaps, sliding window views) run in Python; xarray's result has
    # irregular chunks, which Zarr refuses, so it is rechunked as the source first.
    "rolling": (
        lambda ds: ds[["t2m"]].rolling(time=4).mean().chunk(time=1, latitude=-1, longitude=-1),
        False,
    ),
    # Quantiles run numpy's nanquantile per block in Python; the rechunk before them is native.
    "quantile": (lambda ds: ds[["u10"]].chunk(time=-1).quantile(0.9, dim="time"), False),
}


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_xarray_workflows_written_with_to_zarr_match_dask(
    era5: Path, tmp_path: Path, name: str
) -> None:
    """Each workflow written with `to_zarr` under the configured scheduler, and with
    `compute=False` then `compute(scheduler=...)` (of one variable, Dask renames every key of
    the graph a delayed object holds and wraps each task in an identity): Dask's values, in
    the engine where the README says every op is."""
    ds = _open(era5)
    make, native = WORKFLOWS[name]
    out = make(ds)
    want = out.compute(scheduler="threads")
    inputs = [ds[v] for v in ds.data_vars if any(v in str(k) for k in want.data_vars)]
    atol = _atol(*(inputs or [ds.u10**2, ds.sp]))
    for way in (_config, _delayed_compute):
        path = tmp_path / f"{name}-{way.__name__}.zarr"
        finalizers = way(out, path)
        stats = last_stats()
        assert stats is not None and stats.engine_runs == 1, (way, stats)
        if native:
            assert stats.python_tasks == finalizers and stats.native_tasks > 0, (way, stats)
        _assert_written(path, want, atol)


def test_zarr_v2_blosc_source_and_target(era5: Path, tmp_path: Path) -> None:
    """As ARCO-ERA5 is stored: Zarr v2 with Blosc lz4 chunks, read and written in the engine."""
    import numcodecs

    source = tmp_path / "era5-v2.zarr"
    ds = _open(era5)
    for var in ds.variables.values():
        var.encoding = {}
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    with dask.config.set(scheduler="threads"):
        ds.to_zarr(
            source,
            mode="w",
            zarr_format=2,
            consolidated=True,
            encoding={v: {"compressors": (blosc,)} for v in ds.data_vars},
        )
    assert "lz4" in str(zarr.open_array(str(source / "t2m")).compressors)
    ds = xr.open_zarr(source)
    out = _anomaly_mean_std(ds)
    path = tmp_path / "out-v2.zarr"
    with dask.config.set(scheduler=get):
        out.to_zarr(path, mode="w", zarr_format=2)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1 and stats.python_tasks == 0, stats
    assert zarr.open_array(str(path / "anomaly")).metadata.zarr_format == 2
    _assert_written(path, out.compute(scheduler="threads"), _atol(ds.t2m, ds.u10**2))


def test_appends_and_region_writes(era5: Path, tmp_path: Path) -> None:
    """`mode="a"` with `append_dim` and `region=` write part of their targets: the engine
    computes what they store and Dask's stores write it; values as Dask's."""
    ds = _open(era5)[["t2m", "u10"]]
    path = tmp_path / "appended.zarr"
    with dask.config.set(scheduler=get):
        (ds.isel(time=slice(0, 20)) * 2).to_zarr(path, mode="w")
        assert last_stats() is not None and last_stats().python_tasks == 0  # type: ignore[union-attr]
        (ds.isel(time=slice(20, None)) * 2).to_zarr(path, mode="a", append_dim="time")
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    _assert_written(path, (ds * 2).compute(scheduler="threads"), _atol(ds.t2m * 2))

    path = tmp_path / "regions.zarr"
    anomaly = (ds - ds.mean("time")).drop_vars(["latitude", "longitude"])
    anomaly.to_zarr(path, mode="w", compute=False)
    with dask.config.set(scheduler=get):
        anomaly.isel(time=slice(10, 30)).to_zarr(path, region={"time": slice(10, 30)})
        stats = last_stats()
        assert stats is not None and stats.engine_runs == 1, stats
        anomaly.isel(time=slice(0, 10)).to_zarr(path, region={"time": slice(0, 10)})
        anomaly.isel(time=slice(30, None)).to_zarr(path, region={"time": slice(30, None)})
    want = anomaly.compute(scheduler="threads")
    got = _open(path).compute()
    xr.testing.assert_allclose(got, want, rtol=1e-5, atol=_atol(ds.t2m))


def test_store_of_several_arrays(era5: Path, tmp_path: Path) -> None:
    """`da.store` of several arrays at once, one into a region of a larger target, and
    `dask.compute` of several `da.to_zarr(compute=False)`."""
    t = da.from_zarr(str(era5), component="t2m")
    u = da.from_zarr(str(era5), component="u10")
    want_t = np.asarray(t.compute(scheduler="threads"))
    want_u = np.asarray(u.compute(scheduler="threads"))
    anomaly, speed = t - t.mean(axis=0), abs(u) + 1
    whole = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=t.shape, chunks=(1, 7, 12), dtype="f4"
    )
    bigger = zarr.create_array(
        str(tmp_path / "b.zarr"), shape=(60, 7, 12), chunks=(1, 7, 12), dtype="f4", fill_value=-1
    )
    da.store(
        [anomaly, speed],
        [whole, bigger],
        regions=[None, (slice(5, 53), slice(None), slice(None))],
        scheduler=get,
    )
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, stats
    atol = _atol(xr.DataArray(want_t))
    np.testing.assert_allclose(whole[:], want_t - want_t.mean(axis=0), atol=atol)
    np.testing.assert_allclose(bigger[5:53], np.abs(want_u) + 1, rtol=1e-6)
    assert (bigger[:5] == -1).all() and (bigger[53:] == -1).all()

    # Two arrays into the two halves of one target: the engine writes it whole.
    halves = zarr.create_array(
        str(tmp_path / "halves.zarr"), shape=t.shape, chunks=(2, 7, 12), dtype="f4"
    )
    top, bottom = (
        (slice(0, 24), slice(None), slice(None)),
        (slice(24, 48), slice(None), slice(None)),
    )
    da.store([t[:24] * 2, u[24:] + 1], [halves, halves], regions=[top, bottom], scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1 and stats.python_tasks == 0, stats
    np.testing.assert_allclose(halves[:24], want_t[:24] * 2, rtol=1e-6)
    np.testing.assert_allclose(halves[24:], want_u[24:] + 1, rtol=1e-6)
    assert_no_partial_files(tmp_path / "halves.zarr")

    first = da.to_zarr(anomaly, str(tmp_path / "c.zarr"), compute=False)
    second = da.to_zarr(speed.rechunk((12, 7, 12)), str(tmp_path / "d.zarr"), compute=False)
    dask.compute(first, second, scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1 and stats.python_tasks == 0, stats
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "c.zarr"))[:], whole[:])
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "d.zarr"))[:], bigger[5:53])


def _era5_v2_floats(tmp_path: Path) -> Any:
    """The float variables of the ERA5-like dataset of `era5_dataset` (stored as Zarr v2,
    Blosc lz4, one time step per chunk, NaNs and a missing chunk), opened lazily with
    xarray."""
    from era5_dataset import FLOATS, write_era5_v2

    source = write_era5_v2(tmp_path / "era5-v2.zarr")
    ds = xr.open_zarr(source)[list(FLOATS)]
    for var in ds.variables.values():
        var.encoding = {}  # written as the targets' defaults (Zarr v3), not as the source
    return ds


def _assert_native_stores(what: str) -> None:
    """The last `get` ran its stores (and everything else) in one engine run: no Python task."""
    stats = last_stats()
    assert stats is not None and stats.engine_runs == 1, (what, stats)
    assert stats.python_tasks == 0 and stats.native_tasks > 0, (what, stats)


def test_appends_run_in_the_engine(tmp_path: Path) -> None:
    """`to_zarr(append_dim="time")` twice onto the ERA5-like dataset's first steps, written in
    chunks of 4 steps: the first append (3 steps onto 5) fills the second half of a stored
    chunk, which the engine merges; the second is aligned. No Python task; the result opens
    with xarray and zarr-python equal to the whole dataset's."""
    ds = _era5_v2_floats(tmp_path) * 2
    path = tmp_path / "appended.zarr"
    encoding = {name: {"chunks": (4, 19, 36)} for name in ds.data_vars}
    with dask.config.set(scheduler=get):
        ds.isel(time=slice(0, 5)).chunk({"time": 4}).to_zarr(
            path, mode="w", encoding=encoding, consolidated=False
        )
        _assert_native_stores("first write")
        ds.isel(time=slice(5, 8)).chunk({"time": 3}).to_zarr(
            path, append_dim="time", consolidated=False
        )
        _assert_native_stores("unaligned append")
        ds.isel(time=slice(8, None)).chunk({"time": 4}).to_zarr(
            path, append_dim="time", consolidated=False
        )
        _assert_native_stores("aligned append")
    want = ds.compute(scheduler="threads")
    got = xr.open_zarr(path, consolidated=False).compute()
    xr.testing.assert_identical(got, want)
    group = zarr.open_group(str(path), mode="r")
    for name, var in want.data_vars.items():
        assert group[name].chunks == (4, 19, 36)
        np.testing.assert_array_equal(group[name][:], var.values)
        assert_no_partial_files(path / name)


def test_region_writes_run_in_the_engine(tmp_path: Path) -> None:
    """`to_zarr(region={"time": slice(...)})` of parts of a target made with
    `compute=False`, the parts' edges inside stored chunks (of 4 steps): no Python task, and
    the steps no region wrote stay missing (NaN, the fill value)."""
    ds = _era5_v2_floats(tmp_path)
    anomaly = (ds - ds.mean("time")).drop_vars(["latitude", "longitude"])
    path = tmp_path / "regions.zarr"
    encoding = {name: {"chunks": (4, 19, 36)} for name in anomaly.data_vars}
    anomaly.chunk({"time": 4}).to_zarr(
        path, mode="w", compute=False, encoding=encoding, consolidated=False
    )
    with dask.config.set(scheduler=get):
        # Steps 2..9 in dask chunks that meet the stored chunks' edges (xarray's safe_chunks;
        # mode="a" lets a region's edge chunks be written in part).
        anomaly.isel(time=slice(2, 9)).chunk({"time": (2, 4, 1)}).to_zarr(
            path, mode="a", region={"time": slice(2, 9)}, consolidated=False
        )
        _assert_native_stores("region 2..9")
        anomaly.isel(time=slice(9, 12)).chunk({"time": (3,)}).to_zarr(
            path, mode="a", region={"time": slice(9, 12)}, consolidated=False
        )
        _assert_native_stores("region 9..12")
    want = anomaly.compute(scheduler="threads")
    got = xr.open_zarr(path, consolidated=False).compute()
    written = got.isel(time=slice(2, None))
    xr.testing.assert_allclose(written, want.isel(time=slice(2, None)), rtol=1e-5, atol=1e-4)
    for name in want.data_vars:
        assert np.isnan(got[name].values[:2]).all(), name
        stored = zarr.open_array(str(path / name), mode="r")[:]
        np.testing.assert_allclose(stored[2:], want[name].values[2:], rtol=1e-5, atol=1e-4)
        assert_no_partial_files(path / name)


def test_store_into_regions_runs_in_the_engine(era5: Path, tmp_path: Path) -> None:
    """`da.store(..., regions=...)` into boxes whose edges fall inside stored chunks, of a v2
    and of a sharded v3 target, and two stores into boxes apart of one target: written by
    the engine (no Python task), values as zarr-python reads them, nothing outside the boxes
    changed. Stores into overlapping boxes stay in Python."""
    t = da.from_zarr(str(era5), component="t2m")
    u = da.from_zarr(str(era5), component="u10")
    want_t = np.asarray(t.compute(scheduler="threads"))
    want_u = np.asarray(u.compute(scheduler="threads"))
    v2 = zarr.create_array(
        str(tmp_path / "v2.zarr"),
        shape=(60, 7, 12),
        chunks=(10, 4, 12),
        dtype="f4",
        fill_value=-1,
        zarr_format=2,
    )
    sharded = zarr.create_array(
        str(tmp_path / "sharded.zarr"),
        shape=(60, 7, 12),
        chunks=(5, 7, 6),
        shards=(10, 7, 12),
        dtype="f4",
        fill_value=-1,
    )
    sharded[:] = np.full((60, 7, 12), 3, dtype="f4")
    da.store(
        [t * 2, u + 1],
        [v2, sharded],
        regions=[
            (slice(5, 53), slice(None), slice(None)),
            (slice(7, 55), slice(None), slice(None)),
        ],
        scheduler=get,
    )
    _assert_native_stores("da.store with regions")
    got = v2[:]
    np.testing.assert_allclose(got[5:53], want_t * 2, rtol=1e-6)
    assert (got[:5] == -1).all() and (got[53:] == -1).all()
    got = sharded[:]
    np.testing.assert_allclose(got[7:55], want_u + 1, rtol=1e-6)
    assert (got[:7] == 3).all() and (got[55:] == 3).all()
    for name in ("v2.zarr", "sharded.zarr"):
        assert_no_partial_files(tmp_path / name)

    # Two boxes of one target, apart: one engine write each, no chunk shared.
    two = zarr.create_array(
        str(tmp_path / "two.zarr"), shape=(100, 7, 12), chunks=(10, 7, 12), dtype="f4"
    )
    da.store(
        [t[:8], u[:8]],
        [two, two],
        regions=[(slice(1, 9),), (slice(41, 49),)],
        scheduler=get,
    )
    _assert_native_stores("two boxes of one target")
    got = two[:]
    np.testing.assert_allclose(got[1:9], want_t[:8], rtol=1e-6)
    np.testing.assert_allclose(got[41:49], want_u[:8], rtol=1e-6)
    assert (got[:1] == 0).all() and (got[9:41] == 0).all() and (got[49:] == 0).all()

    # Stores into overlapping boxes are Dask's to order: they run in Python, with the values
    # the engine computed.
    target = zarr.create_array(
        str(tmp_path / "o.zarr"), shape=(48, 7, 12), chunks=(10, 7, 12), dtype="f4"
    )
    da.store(
        [t[:20], t[:20] + 1],
        [target, target],
        regions=[(slice(0, 20),), (slice(10, 30),)],
        scheduler=get,
    )
    stats = last_stats()
    assert stats is not None and stats.python_tasks > 0, stats
    np.testing.assert_allclose(target[20:30], want_t[10:20] + 1, rtol=1e-6)


class Boom(RuntimeError):
    pass


def _fails_at_block_7(block: np.ndarray, block_info: Any = None) -> np.ndarray:
    if block_info[0]["chunk-location"][0] == 7:
        raise Boom("block 7 cannot be computed")
    return block * 2


@pytest.mark.parametrize("watched", [False, True], ids=["lean", "with_callbacks"])
def test_a_failed_write_raises_one_error_and_leaves_whole_chunks(
    era5: Path, tmp_path: Path, watched: bool
) -> None:
    ds = _open(era5)
    t = ds.t2m
    failing = t.copy(data=t.data.map_blocks(_fails_at_block_7, dtype=t.dtype))
    out = xr.Dataset({"failing": failing, "anomaly": t - t.mean("time"), "mean": t.mean("time")})
    path = tmp_path / "failed.zarr"
    with dask.config.set(scheduler=get), pytest.raises(Boom) as info:
        if watched:
            with ProgressBar(out=None):
                out.to_zarr(path, mode="w")
        else:
            out.to_zarr(path, mode="w")
    notes = [n for n in getattr(info.value, "__notes__", []) if "chunkfuse.dask" in n]
    assert len(notes) == 1 and "store-map" in notes[0], notes
    stats = last_stats()
    assert stats is not None and len(stats.failed) == 1, stats
    for name in ("failing", "anomaly", "mean"):
        assert_no_partial_files(path / name)
    assert not (path / "failing" / "c" / "7").exists()
    # The engine wrote the native variables whole before the Python tasks ran.
    want = (t - t.mean("time")).compute(scheduler="threads")
    xr.testing.assert_allclose(_open(path).anomaly.compute(), want, rtol=1e-5, atol=_atol(t))


def test_an_engine_failure_raises_one_error_naming_the_run(era5: Path, tmp_path: Path) -> None:
    source = tmp_path / "corrupt.zarr"
    shutil.copytree(era5, source)
    (source / "t2m" / "c" / "20" / "0" / "0").write_bytes(b"not zstd")
    ds = _open(source)
    out = xr.Dataset({"anomaly": ds.t2m - ds.t2m.mean("time"), "u2": ds.u10**2})
    path = tmp_path / "out.zarr"
    with dask.config.set(scheduler=get), pytest.raises(Exception) as info:
        out.to_zarr(path, mode="w")
    assert "c/20/0/0" in str(info.value), info.value
    notes = [n for n in getattr(info.value, "__notes__", []) if "chunkfuse.dask" in n]
    assert len(notes) == 1 and "engine" in notes[0], notes
    for name in ("anomaly", "u2"):
        assert_no_partial_files(path / name)
        # xarray made the arrays; the engine marked them unfinished while it wrote them.
        marker = zarr.open_array(str(path / name), mode="r").attrs["chunkfuse"]
        assert marker["incomplete"] is True, marker


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_store_into_an_array_marks_it_only_while_it_runs(
    tmp_path: Path, zarr_format: int
) -> None:
    """`da.store` into an array zarr-python made: its metadata is put back byte for byte once
    the run ends, less a marker a killed run had left."""
    path = tmp_path / "out.zarr"
    z = zarr.create_array(
        str(path), shape=(8, 6), chunks=(2, 3), dtype="f4", zarr_format=zarr_format
    )
    z.attrs["title"] = "kept"
    key = path / ("zarr.json" if zarr_format == 3 else ".zattrs")
    made = key.read_bytes()
    source = zarr.create_array(
        str(tmp_path / "src.zarr"), data=np.arange(48, dtype="f4").reshape(8, 6), chunks=(2, 3)
    )
    x = da.from_zarr(source)
    da.store(x + 1, z, scheduler=get)
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.native_tasks > 0, stats
    assert key.read_bytes() == made
    np.testing.assert_array_equal(
        zarr.open_array(str(path), mode="r")[...], np.arange(48).reshape(8, 6) + 1
    )

    z.attrs["chunkfuse"] = {"incomplete": True, "job": "a killed run"}
    da.store(x * 2, z, scheduler=get)
    attrs = zarr.open_array(str(path), mode="r").attrs.asdict()
    assert attrs == {"title": "kept"}, attrs
    stats = last_stats()
    assert stats is not None and stats.python_tasks == 0 and stats.native_tasks > 0, stats


def _halve(block: np.ndarray) -> np.ndarray:
    return block / 2


def test_diagnostics_callbacks_see_the_engine_tasks(era5: Path, tmp_path: Path) -> None:
    """Profiler and CacheProfiler get an entry per task the engine ran (its start and end
    those of the engine run) beside the Python tasks' own; a registered ResourceProfiler
    samples while the graph runs."""
    ds = _open(era5)
    t = ds.t2m
    out = xr.Dataset(
        {
            "anomaly": t - t.mean("time"),
            "halved": t.copy(data=t.data.map_blocks(_halve, dtype=t.dtype)),
        }
    )
    resources = ResourceProfiler(dt=0.01)
    resources.register()
    try:
        with Profiler() as prof, CacheProfiler() as cache, dask.config.set(scheduler=get):
            out.to_zarr(tmp_path / "out.zarr", mode="w")
    finally:
        resources.unregister()
        resources.close()
    stats = last_stats()
    assert stats is not None and stats.native_tasks > 0 and stats.python_tasks > 0, stats
    keys = [r.key for r in prof.results]
    assert len(keys) == len(set(keys)) == stats.native_tasks + stats.python_tasks
    assert {r.key for r in cache.results} == set(keys)
    assert all(r.start_time <= r.end_time for r in prof.results)
    # The engine's tasks all started before any of them ended (one engine run), and the
    # Python tasks ran after it.
    by_end = sorted(prof.results, key=lambda r: r.end_time)
    native, python = by_end[: stats.native_tasks], by_end[stats.native_tasks :]
    engine_end = min(r.end_time for r in native)
    assert max(r.start_time for r in native) <= engine_end
    assert all(r.start_time >= max(r.end_time for r in native) for r in python)
    assert resources.results, "no resource samples"
    _assert_written(tmp_path / "out.zarr", out.compute(scheduler="threads"), _atol(t))


@st.composite
def _regions_and_indices(draw: st.DrawFn) -> tuple[tuple[int, ...], Any, tuple[slice, ...]]:
    """A shape, a region of unit-step slices (perhaps for the leading axes only, perhaps
    None) and an index of unit-step slices within that region."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))

    def span(n: int) -> slice:
        a = draw(st.integers(0, n))
        return slice(a, draw(st.integers(a, n)))

    region = None
    if draw(st.booleans()):
        region = tuple(span(n) for n in shape[: draw(st.integers(1, len(shape)))])
    inner = np.empty(shape)[region if region is not None else ()].shape
    return shape, region, tuple(span(n) for n in inner)


@settings(max_examples=50, deadline=None)
@given(case=_regions_and_indices())
def test_store_boxes_are_what_numpy_writes(case: tuple[tuple[int, ...], Any, Any]) -> None:
    """The box a store writes (`out[region][index] = x`, as Dask's `load_store_chunk`) is where
    numpy's assignment lands."""
    shape, region, index = case
    out = np.zeros(shape)
    (out[region] if region is not None else out)[index] = 1
    box = store_box(index, region, shape)
    want = np.zeros(shape)
    want[tuple(slice(a, b) for a, b in box)] = 1
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_unaligned_append_with_a_fill_value_encoding_runs_in_the_engine(
    tmp_path: Path, zarr_format: int
) -> None:
    """A `_FillValue` encoding makes xarray fill NaN through `~isnull(x)` (numpy's `invert` of
    booleans), which once had no native form: the stores ran Dask's `load_store_chunk` in
    Python, four at once into one stored chunk, and lost each other's values."""
    values = np.arange(20 * 19 * 36, dtype="float32").reshape(20, 19, 36) + 1
    values[3, 4, 5] = np.nan
    ds = xr.Dataset(
        {"t2m": (("time", "y", "x"), values)},
        coords={"time": pd.date_range("2020-01-01", periods=20, freq="6h")},
    )
    ds.chunk({"time": 12}).to_zarr(tmp_path / "src.zarr", zarr_format=zarr_format)
    ds = xr.open_zarr(tmp_path / "src.zarr")
    path = tmp_path / "appended.zarr"
    with dask.config.set(scheduler=get):
        ds.isel(time=slice(0, 12)).chunk({"time": 12}).to_zarr(
            path, mode="w", zarr_format=zarr_format,
            encoding={"t2m": {"_FillValue": -9999.0}},
        )  # fmt: skip
        ds.isel(time=slice(12, 17)).chunk({"time": 5, "y": 10, "x": 18}).to_zarr(
            path, append_dim="time", safe_chunks=False
        )
        _assert_native_stores("unaligned append with a _FillValue")
    got = xr.open_zarr(path).compute(scheduler="sync")
    want = ds.isel(time=slice(0, 17)).compute(scheduler="sync")
    np.testing.assert_array_equal(got.t2m.values, want.t2m.values)
    assert np.isnan(got.t2m.values[3, 4, 5])


def test_arrays_with_filters_the_engine_cannot_match_stay_in_python(tmp_path: Path) -> None:
    """numcodecs' Delta and Quantize filters (zarrs has no codec for them) and
    FixedScaleOffset writes (zarrs rounds halves away from zero, numcodecs to even) run in
    Python, writing what Dask's own scheduler writes."""
    numcodecs = pytest.importorskip("numcodecs")
    # (x - 280) * 100 is a half for each value: numcodecs stores the even neighbour.
    values = np.array([269.875, 280.125, 280.375, 279.625] * 6, dtype="float32").reshape(4, 6)
    ds = xr.Dataset({"v": (("t", "x"), values)}).chunk({"t": 2})
    filters = {
        "fixedscaleoffset": numcodecs.FixedScaleOffset(offset=280, scale=100, dtype="f4",
                                                       astype="i4"),
        "quantize": numcodecs.Quantize(digits=2, dtype="f4"),
        "delta": numcodecs.Delta(dtype="f4"),
    }  # fmt: skip
    for name, codec in filters.items():
        paths = {s: tmp_path / f"{name}-{s}.zarr" for s in ("sync", "chunkfuse")}
        for scheduler, path in zip(("sync", get), paths.values(), strict=True):
            ds.to_zarr(
                path, zarr_format=2, encoding={"v": {"filters": [codec]}}, compute=False
            ).compute(scheduler=scheduler)
        stats = last_stats()
        assert stats is not None and stats.python_tasks > 0, name
        want = zarr.open_array(str(paths["sync"] / "v"), mode="r")[...]
        got = zarr.open_array(str(paths["chunkfuse"] / "v"), mode="r")[...]
        np.testing.assert_array_equal(got, want, err_msg=name)
        # Reading them back through the scheduler runs in Python too, and agrees.
        back = xr.open_zarr(paths["chunkfuse"]).v.compute(scheduler=get)
        np.testing.assert_array_equal(back.values, want, err_msg=name)


def test_v2_complex_arrays_without_a_fill_value_read_and_write(tmp_path: Path) -> None:
    """zarr-python writes `fill_value: null` for v2 complex arrays, which the engine once
    reported as corrupt metadata."""
    values = (np.arange(24) + 1j * np.arange(24)[::-1]).astype("complex64").reshape(4, 6)
    src = zarr.create_array(
        str(tmp_path / "c.zarr"), shape=values.shape, chunks=(2, 3), dtype="complex64",
        fill_value=None, zarr_format=2,
    )  # fmt: skip
    src[...] = values
    x = da.from_zarr(str(tmp_path / "c.zarr"))
    np.testing.assert_array_equal((x * 2).compute(scheduler=get), values * 2)
    (x + 1).to_zarr(str(tmp_path / "out.zarr"), compute=False).compute(scheduler=get)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"))[...], values + 1)
