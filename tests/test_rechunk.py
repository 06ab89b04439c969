"""Rechunking jobs: `chunkfuse.rechunk` against zarr-python (random shapes, chunks, dtypes,
Zarr v2 and v3 sources, sharded targets), whole datasets against xarray (attributes,
dimension names, fill values, coordinates and CF encodings kept), bad input, targets that are
not the job's to replace, and killed jobs that leave no corrupt target, are marked unfinished
and resume when run again. Peak RSS under --max-mem is asserted in test_memory.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import Cli, assert_no_partial_files, read_zarr
from era5_dataset import FLOATS, MISSING, write_era5_v2
from era5_dataset import SHAPE as ERA5_SHAPE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DTYPES = ("bool", "int8", "uint16", "int32", "int64", "float32", "float64", "complex64")


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@st.composite
def rechunk_cases(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 30), min_size=rank, max_size=rank)))
    src = tuple(draw(st.integers(1, n)) for n in shape)
    dst = tuple(draw(st.integers(1, n)) for n in shape)
    shards = None
    if draw(st.booleans()):
        shards = [c * draw(st.integers(1, 3)) for c in dst]
    return {
        "shape": shape,
        "src": src,
        "dst": dst,
        "shards": shards,
        "dtype": draw(st.sampled_from(DTYPES)),
        "seed": draw(st.integers(0, 2**16)),
        "max_mem": draw(st.sampled_from([None, "2MB"])),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rechunk_cases())
def test_rechunk_equals_source_and_reads_back_in_zarr_python(
    tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]
) -> None:
    tmp = tmp_path_factory.mktemp("rechunk")
    a = values(np.random.default_rng(case["seed"]), case["shape"], case["dtype"])
    source = zarr.create_array(str(tmp / "src.zarr"), data=a, chunks=case["src"])
    # The source may be given opened or as a path.
    chunkfuse.rechunk(
        source, tmp / "dst.zarr", case["dst"], max_mem=case["max_mem"], shards=case["shards"]
    )
    out = zarr.open_array(str(tmp / "dst.zarr"), mode="r")
    assert tuple(out.chunks) == case["dst"]
    if case["shards"]:
        assert tuple(out.shards) == tuple(case["shards"])
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out[...], a)


def test_rechunk_of_a_zarr_v2_source_with_a_mapping_and_codecs(tmp_path: Path) -> None:
    a = np.arange(40 * 30, dtype="int32").reshape(40, 30)
    zarr.create_array(str(tmp_path / "v2.zarr"), data=a, chunks=(7, 30), zarr_format=2)
    summary = chunkfuse.rechunk(
        str(tmp_path / "v2.zarr"),
        str(tmp_path / "out.zarr"),
        {0: 40, 1: 5},
        max_mem="64MB",
        codecs={"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle"},
    )
    assert summary["outputs"] == [str(tmp_path / "out.zarr")]
    out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    assert tuple(out.chunks) == (40, 5)
    assert out.metadata.zarr_format == 3
    np.testing.assert_array_equal(out[...], a)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ((5,), 'have 1 entries but "source" has rank 2'),
        ((5, 0), "must be positive"),
        ((-2, 5), "must be positive"),
        ({2: 5}, "axis 2 is out of range"),
    ],
)
def test_bad_target_chunks_are_one_clear_error_and_write_nothing(
    tmp_path: Path, chunks: Any, message: str
) -> None:
    zarr.create_array(str(tmp_path / "src.zarr"), data=np.ones((10, 10), "float32"))
    with pytest.raises(ValueError, match=message):
        chunkfuse.rechunk(tmp_path / "src.zarr", tmp_path / "dst.zarr", chunks)
    assert not (tmp_path / "dst.zarr").exists()


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ((2.5, 5), r"axis 0 must be an integer .* got 2.5"),
        ((True, 5), r"axis 0 must be an integer .* got True"),
        ((5, None), r"axis 1 must be an integer .* got None"),
        ({"y": "4"}, r"dimension 'y' must be an integer .* got '4'"),
        ({0: 1.0}, r"axis 0 must be an integer"),
        ("55", r"give one size per axis"),
    ],
)
def test_sizes_that_are_not_integers_are_refused_not_rounded(
    tmp_path: Path, chunks: Any, message: str
) -> None:
    arr = zarr.create_array(str(tmp_path / "src.zarr"), shape=(10, 10), dtype="float32")
    arr.attrs["_ARRAY_DIMENSIONS"] = ["x", "y"]
    with pytest.raises(TypeError, match=message):
        chunkfuse.rechunk(tmp_path / "src.zarr", tmp_path / "dst.zarr", chunks)
    with pytest.raises(TypeError, match=message):
        chunkfuse.rechunk(tmp_path / "src.zarr", tmp_path / "dst.zarr", (5, 5), shards=chunks)
    assert not (tmp_path / "dst.zarr").exists()


def test_group_sizes_given_as_text_are_refused_for_every_variable(tmp_path: Path) -> None:
    """`{"time": "4"}` once read as sizes for a variable named time (a string is a
    sequence): the time coordinate was rechunked and the data kept its chunks."""
    ds = xr.Dataset(
        {"v": (("time", "x"), np.zeros((8, 3), "float32"))},
        coords={"time": np.arange(8)},
    ).chunk({"time": 1})
    ds.to_zarr(tmp_path / "src.zarr", zarr_format=3, consolidated=False)
    with pytest.raises(TypeError, match=r"dimension 'time' of '\w+' must be an integer"):
        chunkfuse.rechunk(tmp_path / "src.zarr", tmp_path / "dst.zarr", {"time": "4"})
    with pytest.raises(ValueError, match=r"dimension 'time' of '\w+' must be positive"):
        chunkfuse.rechunk(tmp_path / "src.zarr", tmp_path / "dst.zarr", {"time": 0})
    assert not (tmp_path / "dst.zarr").exists()


def test_source_that_is_not_an_array_names_it(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="nothing.zarr"):
        chunkfuse.rechunk(tmp_path / "nothing.zarr", tmp_path / "dst.zarr", (1,))
    with pytest.raises(TypeError, match="source must be a path or a zarr.Array"):
        chunkfuse.rechunk(42, tmp_path / "dst.zarr", (1,))


@pytest.mark.parametrize("names", [2, [0, 1], "xy"])
def test_dimension_names_that_are_not_one_name_per_axis_name_none(
    tmp_path: Path, names: Any
) -> None:
    """An `_ARRAY_DIMENSIONS` attribute that is not one name per axis (a number, numbers, one
    string) names no dimension, as one of another length does: the group rechunks by
    variable, and sizes by a dimension name are refused as naming none of its arrays."""
    source = tmp_path / "src.zarr"
    values = np.arange(24.0).reshape(4, 6)
    arr = zarr.open_group(str(source), mode="w").create_array(
        "a", shape=values.shape, chunks=(2, 3), dtype=values.dtype
    )
    arr[:] = values
    arr.attrs["_ARRAY_DIMENSIONS"] = names
    chunkfuse.rechunk(source, tmp_path / "dst.zarr", {"a": (4, 6)})
    out = zarr.open_array(str(tmp_path / "dst.zarr" / "a"), mode="r")
    assert out.chunks == (4, 6)
    np.testing.assert_array_equal(out[:], values)
    with pytest.raises(ValueError, match="no array of the group has a dimension 'x'"):
        chunkfuse.rechunk(source, tmp_path / "other.zarr", {"x": 2})
    assert not (tmp_path / "other.zarr").exists()


# ---------------------------------------------------------------------------------------------
# Whole datasets, as xarray sees them
# ---------------------------------------------------------------------------------------------

ERA5_CHUNKS = {"time": -1, "latitude": 10, "longitude": 20}


@pytest.fixture
def era5(tmp_path: Path) -> Path:
    return write_era5_v2(tmp_path / "era5.zarr")


def open_quietly(path: Path) -> xr.Dataset:
    """``xr.open_zarr(path)``, failing on any warning (a target without consolidated
    metadata, where its source had some, makes xarray warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_zarr(path).load()


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("given", ["path", "zarr.Group", "xarray.Dataset"])
def test_rechunked_era5_dataset_opens_in_xarray_as_its_source(
    tmp_path: Path, era5: Path, given: str, zarr_format: int
) -> None:
    source: Any = {
        "path": era5,
        "zarr.Group": zarr.open_group(str(era5), mode="r"),
        "xarray.Dataset": xr.open_zarr(era5),
    }[given]
    target = tmp_path / "era5-ts.zarr"
    chunkfuse.rechunk(source, target, ERA5_CHUNKS, max_mem="64MB", zarr_format=zarr_format)
    want = xr.open_zarr(era5).load()
    got = open_quietly(target)
    # Values (NaN where they were NaN, and where a source chunk was missing), dimensions,
    # coordinates (the time axis decoded from its CF units and calendar), attributes, and
    # the packed variable decoded with its scale, offset and _FillValue.
    xr.testing.assert_identical(got, want)
    for name, _, step in MISSING:
        assert got[name].isel(time=step).isnull().all(), name
    assert int(got["t2m"].isnull().sum()) > got["t2m"].isel(time=5).size
    nt, _, _ = ERA5_SHAPE
    for name in (*FLOATS, "sp"):
        assert got[name].encoding["chunks"] == (nt, 10, 20), name
    assert got["time"].encoding["chunks"] == (nt,)
    assert got["latitude"].encoding["chunks"] == (10,)
    assert got["sp"].encoding["dtype"] == np.int16  # still packed on disk
    # As stored: the format asked for, the fill value, the dimension names, no job marker.
    group = zarr.open_group(str(target), mode="r")
    assert group.metadata.zarr_format == zarr_format
    t2m = group["t2m"]
    assert np.isnan(t2m.fill_value)
    dims = ["time", "latitude", "longitude"]
    if zarr_format == 3:
        assert list(t2m.metadata.dimension_names) == dims
    else:
        assert t2m.attrs["_ARRAY_DIMENSIONS"] == dims
    assert "chunkfuse" not in group.attrs and "chunkfuse" not in t2m.attrs


def test_a_v3_dataset_rechunks_back_to_v2(tmp_path: Path, era5: Path) -> None:
    """Dimension names and the values xarray masks map from v3 back to v2: the v3
    `_FillValue` attribute becomes the v2 fill value again (null where there was none, as for
    the integer time axis, so that xarray masks nothing there)."""
    v3 = tmp_path / "v3.zarr"
    chunkfuse.rechunk(era5, v3, ERA5_CHUNKS)
    v2 = tmp_path / "v2.zarr"
    chunkfuse.rechunk(v3, v2, {"time": 1}, zarr_format=2)
    xr.testing.assert_identical(open_quietly(v2), xr.open_zarr(era5).load())
    group = zarr.open_group(str(v2), mode="r")
    assert group["time"].fill_value is None
    assert group["sp"].fill_value == -32767 and "_FillValue" not in group["sp"].attrs
    assert group["t2m"].attrs["_ARRAY_DIMENSIONS"] == ["time", "latitude", "longitude"]


def test_a_missing_source_chunk_stays_missing(tmp_path: Path, era5: Path) -> None:
    target = tmp_path / "out.zarr"
    chunkfuse.rechunk(era5, target, {"time": 1, "latitude": 10, "longitude": 20})
    got = open_quietly(target)
    xr.testing.assert_identical(got, xr.open_zarr(era5).load())
    for name, _, step in MISSING:
        # The target chunks of the missing source chunk hold only the fill value: absent.
        stored = {p.parts[-3] for p in (target / name / "c").rglob("*") if p.is_file()}
        assert str(step) not in stored and str(step - 1) in stored, (name, sorted(stored))
        assert got[name].isel(time=step).isnull().all()


def test_per_variable_chunks(tmp_path: Path, era5: Path) -> None:
    target = tmp_path / "out.zarr"
    chunks = {"t2m": {"time": 6}, "u10": (12, 19, 36), "latitude": None}
    chunkfuse.rechunk(xr.open_zarr(era5), target, chunks)
    got = open_quietly(target)
    xr.testing.assert_identical(got, xr.open_zarr(era5).load())
    assert got["t2m"].encoding["chunks"] == (6, 19, 36)
    assert got["u10"].encoding["chunks"] == (12, 19, 36)
    assert got["v10"].encoding["chunks"] == (1, 19, 36)  # not named: kept


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ({"time": -1, "lat": 10}, "no array of the group has a dimension 'lat'"),
        ({"t2m": {"time": 2}, "t3m": {"time": 2}}, "no variable 't3m' in the group"),
        ({"t2m": {"lat": 2}}, "'t2m' has no dimension 'lat'"),
        ({"t2m": {"time": 2}, "time": 4}, "not both"),
        ((12, 10, 20), "the source is a group"),
    ],
)
def test_bad_dataset_chunks_are_one_clear_error_and_write_nothing(
    tmp_path: Path, era5: Path, chunks: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        chunkfuse.rechunk(era5, tmp_path / "out.zarr", chunks)
    assert not (tmp_path / "out.zarr").exists()


def test_a_dataset_variable_that_is_not_stored_is_refused(tmp_path: Path, era5: Path) -> None:
    ds = xr.open_zarr(era5)
    ds["wind"] = np.hypot(ds.u10, ds.v10)
    with pytest.raises(ValueError, match="variable\\(s\\) wind of the dataset are not stored"):
        chunkfuse.rechunk(ds, tmp_path / "out.zarr", ERA5_CHUNKS)
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    "how",
    ["open_zarr", "open_dataset", "chunk", "load"],
)
def test_a_dataset_as_opened_rechunks(tmp_path: Path, era5: Path, how: str) -> None:
    """Opened lazily or with Dask, rechunked with `Dataset.chunk`, or loaded: the variables
    are still the stored arrays (time decoded, int16 packed), and the copy is the source."""
    opened = {
        "open_zarr": lambda: xr.open_zarr(era5),
        "open_dataset": lambda: xr.open_dataset(era5, engine="zarr"),
        "chunk": lambda: xr.open_zarr(era5).chunk(time=5),
        "load": lambda: xr.open_zarr(era5).load(),
    }[how]()
    chunkfuse.rechunk(opened, tmp_path / "out.zarr", ERA5_CHUNKS)
    xr.testing.assert_identical(open_quietly(tmp_path / "out.zarr"), xr.open_zarr(era5).load())


def _values_changed_in_memory(ds: xr.Dataset) -> xr.Dataset:
    ds = ds.load()
    ds["t2m"].values[0, 0, 0] += 1
    return ds


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda ds: ds.isel(time=slice(0, 4)), "its shape .* is not the stored"),
        (lambda ds: ds.isel(latitude=slice(None, None, -1)), "computed after opening"),
        (lambda ds: ds.assign(t2m=ds.t2m * 2), "computed after opening \\(by mul\\)"),
        (
            lambda ds: xr.open_dataset(ds.encoding["source"], engine="zarr").isel(
                latitude=slice(None, None, -1)
            ),
            "selected after opening",
        ),
        (_values_changed_in_memory, "values in memory are not the stored ones"),
    ],
    ids=["isel", "reversed", "assign", "lazy-reversed", "changed-in-memory"],
)
def test_a_dataset_changed_after_opening_is_refused(
    tmp_path: Path, era5: Path, change: Any, why: str
) -> None:
    """The store's arrays are what a Dataset rechunk copies: a Dataset no longer equal to
    them would be silently replaced by them, so it is refused, naming the variable."""
    with pytest.raises(ValueError, match=f"variable \\w+ of the dataset is not the array .*{why}"):
        chunkfuse.rechunk(change(xr.open_zarr(era5)), tmp_path / "out.zarr", ERA5_CHUNKS)
    assert not (tmp_path / "out.zarr").exists()


def test_an_existing_target_is_refused_unless_overwrite(tmp_path: Path, era5: Path) -> None:
    other = np.arange(12.0).reshape(3, 4)
    target = tmp_path / "taken.zarr"
    zarr.create_array(str(target), data=other, chunks=(3, 4))
    a = np.ones((6, 8), "float32")
    zarr.create_array(str(tmp_path / "src.zarr"), data=a, chunks=(1, 8))
    with pytest.raises(ValueError, match=f'in store "{target}": the target already holds a Zarr'):
        chunkfuse.rechunk(tmp_path / "src.zarr", target, (6, 4))
    np.testing.assert_array_equal(zarr.open_array(str(target), mode="r")[...], other)
    with pytest.raises(ValueError, match=f'in store "{target}": the target already holds a Zarr'):
        chunkfuse.rechunk(era5, target, ERA5_CHUNKS)
    np.testing.assert_array_equal(zarr.open_array(str(target), mode="r")[...], other)
    # A group is refused as well, and an overwrite replaces either, group by array.
    chunkfuse.rechunk(era5, target, ERA5_CHUNKS, overwrite=True)
    xr.testing.assert_identical(open_quietly(target), xr.open_zarr(era5).load())
    with pytest.raises(ValueError, match="the target already holds a Zarr group"):
        chunkfuse.rechunk(tmp_path / "src.zarr", target, (6, 4))
    chunkfuse.rechunk(tmp_path / "src.zarr", target, (6, 4), overwrite=True)
    out = zarr.open_array(str(target), mode="r")
    np.testing.assert_array_equal(out[...], a)
    assert not (target / "t2m").exists()


# ---------------------------------------------------------------------------------------------
# Killed midway, then run again
# ---------------------------------------------------------------------------------------------

SHAPE = (64, 256, 256)  # 16 MiB of float32


@pytest.fixture
def source(tmp_path: Path) -> tuple[np.ndarray, Path]:
    a = np.random.default_rng(9).standard_normal(SHAPE).astype("float32")
    path = tmp_path / "src.zarr"
    zarr.create_array(str(path), data=a, chunks=(1, 256, 256))
    return a, path


def target_chunk_files(target: Path) -> list[Path]:
    """The chunk files of a target (a killed writer's temporaries are not chunks: they are
    never read, and a resumed run removes them)."""
    if not (target / "c").exists():
        return []
    return [p for p in (target / "c").rglob("*") if p.is_file() and ".partial-" not in p.name]


def kill_midway(cli: Cli, args: list[str], target: Path, at_least: int = 3) -> None:
    """Starts the CLI on one thread and SIGKILLs it once `at_least` target chunks exist."""
    proc = subprocess.Popen(
        [str(cli.binary), *args, "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(target_chunk_files(target)) >= at_least:
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"


# 256MB: one stage of blocks; 16MB: the source held in two bands (each band's output chunks
# encoded at once); 6MB: through an intermediate array.
@pytest.mark.parametrize(
    ("max_mem", "stage"),
    [
        ("256MB", {"strategy": "blocks", "unit": [1, 16, 16]}),
        ("16MB", {"strategy": "bands", "bands": 2}),
        ("6MB", {"label": "write rechunked (stage 2 of 2)"}),
    ],
    ids=["one-stage", "bands", "two-stage"],
)
def test_killed_rechunk_leaves_whole_chunks_and_resumes(
    cli: Cli,
    tmp_path: Path,
    source: tuple[np.ndarray, Path],
    max_mem: str,
    stage: dict[str, Any],
) -> None:
    a, src = source
    target = tmp_path / "dst.zarr"
    work = tmp_path / "work"
    args = [
        "rechunk",
        str(src),
        str(target),
        "--chunks",
        "64,16,16",
        "--codec",
        "zstd:1",
        "--max-mem",
        max_mem,
        "--work-dir",
        str(work),
    ]
    kill_midway(cli, args, target)
    written = target_chunk_files(target)
    assert 0 < len(written) < 256
    # Every visible chunk is whole: it decodes (abandoned temporaries are never keys).
    arr = zarr.open_array(str(target), mode="r")
    for p in written:
        i, j, k = (int(v) for v in p.relative_to(target / "c").parts)
        region = arr[i * 64 : (i + 1) * 64, j * 16 : (j + 1) * 16, k * 16 : (k + 1) * 16]
        np.testing.assert_array_equal(region, a[:, j * 16 : (j + 1) * 16, k * 16 : (k + 1) * 16])
    before = {p: p.stat().st_mtime_ns for p in written}

    summary = cli(*args, "--json").json()
    assert any(stage.items() <= s.items() for s in summary["stages"]), summary["stages"]
    resumed = [s for s in summary["stages"] if s["resumed"]]
    assert resumed, summary["stages"]
    # Chunks written before the kill were kept, not rewritten.
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    np.testing.assert_array_equal(read_zarr(target), a)
    assert_no_partial_files(target)
    assert "chunkfuse" not in zarr.open_array(str(target), mode="r").attrs
    assert not work.exists() or not any(work.iterdir()), list(work.iterdir())

    # A finished job's target is not replaced when the job runs again, unless asked to; it
    # then starts over.
    refused = cli(*args, "--json", expect_rc=2)
    assert f'in store "{target}": the target already holds a Zarr array' in refused.stderr
    summary = cli(*args, "--overwrite", "--json").json()
    assert not any(s["resumed"] for s in summary["stages"])


def test_rechunk_api_resumes_a_killed_cli_job(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path]
) -> None:
    a, src = source
    target = tmp_path / "dst.zarr"
    kill_midway(
        cli,
        ["rechunk", str(src), str(target), "--chunks", "64,16,16", "--max-mem", "256MB"],
        target,
    )
    summary = chunkfuse.rechunk(
        src, target, (64, 16, 16), max_mem="256MB", codecs={"name": "zstd", "level": 3}
    )
    assert any(s["resumed"] for s in summary["stages"]), summary["stages"]
    np.testing.assert_array_equal(read_zarr(target), a)
    summary = chunkfuse.rechunk(src, target, (64, 16, 16), resume=False, overwrite=True)
    assert not any(s["resumed"] for s in summary["stages"])
    np.testing.assert_array_equal(read_zarr(target), a)


def test_a_different_job_on_the_same_target_is_refused_or_starts_over(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path]
) -> None:
    a, src = source
    target = tmp_path / "dst.zarr"
    kill_midway(
        cli,
        ["rechunk", str(src), str(target), "--chunks", "64,16,16", "--max-mem", "256MB"],
        target,
    )
    written = target_chunk_files(target)
    with pytest.raises(ValueError, match="that another job left unfinished; pass overwrite"):
        chunkfuse.rechunk(src, target, (32, 32, 32), max_mem="256MB")
    assert target_chunk_files(target) == written
    summary = chunkfuse.rechunk(src, target, (32, 32, 32), max_mem="256MB", overwrite=True)
    assert not any(s["resumed"] for s in summary["stages"])
    out = zarr.open_array(str(target), mode="r")
    assert tuple(out.chunks) == (32, 32, 32)
    np.testing.assert_array_equal(out[...], a)


@pytest.mark.parametrize(("codec", "banded"), [("zstd:3", True), ("zstd:1", True), ("none", False)])
def test_rechunk_in_bands_encodes_each_chunk_at_once(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path], codec: str, banded: bool
) -> None:
    """Output chunks that each gather a slice of every input chunk, with room neither for
    them all nor for zstd streams: rather than through an intermediate array, the source is
    held in memory in two bands (each input chunk decoded through the first band's rows,
    then whole for the second: 1.5 decodes) and each output chunk encoded at once. Values
    stored as they are stream (each input chunk decoded once, nothing to encode)."""
    a, src = source
    target = tmp_path / "dst.zarr"
    args = ["rechunk", str(src), str(target), "--chunks", "64,64,64", "--max-mem", "24MB"]
    summary = cli(*args, "--codec", codec, "--threads", "2", "--json").json()
    stages = summary["stages"]
    assert len(stages) == 1, stages
    assert stages[0]["strategy"] == ("bands" if banded else "streams"), stages
    assert stages[0]["bands"] == (2 if banded else 0), stages
    assert summary["decoded_bytes"] == (a.nbytes * 3 // 2 if banded else a.nbytes), summary
    np.testing.assert_array_equal(read_zarr(target), a)
    assert tuple(zarr.open_array(str(target), mode="r").chunks) == (64, 64, 64)
    assert_no_partial_files(target)


def test_killed_streamed_rechunk_leaves_whole_chunks_and_resumes(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path]
) -> None:
    """Output chunks each gathering a slice of every input chunk are encoded as streams
    (no intermediate array), one task per row of them along the first axis: a kill leaves
    each chunk whole or absent, and the rerun completes the rows left."""
    a, src = source

    def args(target: Path) -> list[str]:
        return [
            "rechunk",
            str(src),
            str(target),
            "--chunks",
            "32,64,256",
            "--codec",
            "zstd:1",
            "--max-mem",
            "12MB",
        ]

    probe = tmp_path / "probe.zarr"
    summary = cli(*args(probe), "--threads", "1", "--json").json()
    assert [s["strategy"] for s in summary["stages"]] == ["streams"], summary
    assert summary["tasks"] == 2, summary  # two rows of four streams
    np.testing.assert_array_equal(zarr.open_array(str(probe), mode="r")[...], a)
    assert_no_partial_files(probe)

    target = tmp_path / "dst.zarr"
    # A row's four chunks are renamed one after another as its task ends: wait for the whole
    # first row, so the kill lands in the second (with 3, it could land between renames).
    kill_midway(cli, args(target), target, at_least=4)
    written = target_chunk_files(target)
    assert 0 < len(written) < 8
    arr = zarr.open_array(str(target), mode="r")
    for p in written:
        i, j, k = (int(v) for v in p.relative_to(target / "c").parts)
        box = (
            slice(i * 32, (i + 1) * 32),
            slice(j * 64, (j + 1) * 64),
            slice(k * 256, (k + 1) * 256),
        )
        np.testing.assert_array_equal(arr[box], a[box])
    summary = cli(*args(target), "--json").json()
    done = [(s["tasks_done_before"], s["tasks"]) for s in summary["stages"] if s["resumed"]]
    assert done == [(1, 2)], summary["stages"]
    np.testing.assert_array_equal(read_zarr(target), a)
    assert_no_partial_files(target)


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")
def test_a_killed_job_leaves_its_targets_marked_and_the_rerun_unmarks_them(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path]
) -> None:
    """What a killed job left is marked unfinished where zarr-python and xarray users see it:
    the `chunkfuse` attribute of each target array and of the target group. The rerun
    resumes and removes the marks."""
    a, _ = source
    src = tmp_path / "ds.zarr"
    ds = xr.Dataset(
        {"x": (("time", "latitude", "longitude"), a, {"units": "K"})},
        coords={"time": np.arange(a.shape[0]), "latitude": np.arange(a.shape[1])},
        attrs={"title": "killed"},
    )
    ds.to_zarr(src, encoding={"x": {"chunks": (1, 256, 256)}}, zarr_format=3, consolidated=True)
    target = tmp_path / "dst.zarr"
    args = ["rechunk", str(src), str(target), "--chunks", "time=-1,latitude=16,longitude=16"]
    kill_midway(cli, [*args, "--max-mem", "256MB"], target / "x")
    marker = zarr.open_array(str(target / "x"), mode="r").attrs["chunkfuse"]
    assert marker["incomplete"] is True and isinstance(marker["job"], str), marker
    left = xr.open_zarr(target, consolidated=False)
    assert left.attrs["chunkfuse"] == marker and left.attrs["title"] == "killed"
    assert left["x"].attrs["chunkfuse"] == marker

    summary = cli(*args, "--json").json()
    assert any(s["resumed"] for s in summary["stages"]), summary["stages"]
    got = open_quietly(target)
    xr.testing.assert_identical(got, xr.open_zarr(src).load())
    assert "chunkfuse" not in got.attrs and "chunkfuse" not in got["x"].attrs
    assert got["x"].encoding["chunks"] == (a.shape[0], 16, 16)


def test_a_killed_fresh_job_is_marked_and_its_rerun_is_not_refused(
    cli: Cli, tmp_path: Path, source: tuple[np.ndarray, Path]
) -> None:
    """A job run with --fresh (which starts over rather than resume) still marks a target it
    may not overwrite, so that running it again is not refused as someone else's array."""
    a, src = source
    target = tmp_path / "dst.zarr"
    args = ["rechunk", str(src), str(target), "--chunks", "64,16,16", "--fresh"]
    kill_midway(cli, [*args, "--max-mem", "256MB"], target)
    assert zarr.open_array(str(target), mode="r").attrs["chunkfuse"]["incomplete"] is True
    summary = cli(*args, "--json").json()
    assert not any(s["resumed"] for s in summary["stages"]), summary["stages"]
    np.testing.assert_array_equal(read_zarr(target), a)
    assert "chunkfuse" not in zarr.open_array(str(target), mode="r").attrs


def test_a_v2_array_without_a_fill_value_keeps_none(tmp_path: Path) -> None:
    """A plain v2 array (no dimension names) with `fill_value: null` came out with 0."""
    src = zarr.create_array(
        str(tmp_path / "src.zarr"), shape=(6, 4), chunks=(2, 4), dtype="int32",
        fill_value=None, zarr_format=2,
    )  # fmt: skip
    src[...] = np.arange(24, dtype="int32").reshape(6, 4)
    assert json.loads((tmp_path / "src.zarr" / ".zarray").read_text())["fill_value"] is None
    chunkfuse.rechunk(str(tmp_path / "src.zarr"), tmp_path / "v2.zarr", (3, 2), zarr_format=2)
    assert json.loads((tmp_path / "v2.zarr" / ".zarray").read_text())["fill_value"] is None
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "v2.zarr"))[...], src[...])
    # v3 has no null fill value: the reader's default, 0.
    chunkfuse.rechunk(str(tmp_path / "src.zarr"), tmp_path / "v3.zarr", (3, 2))
    assert zarr.open_array(str(tmp_path / "v3.zarr")).fill_value == 0
