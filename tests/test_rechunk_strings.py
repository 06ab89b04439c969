"""Rechunking arrays of strings (Zarr v3 `string`, v2 `|O` with `vlen-utf8`; fixed-width v3
`fixed_length_utf32`, v2 `<U`n), which the engine copies value by value rather than
computing on: single arrays against zarr-python
(random shapes, chunks, values, missing chunks, both formats each way), a dataset with a
string coordinate (ERA5's `expver`) against xarray through `chunkfuse.rechunk` and the CLI,
and what stays refused (computing on strings)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import assert_no_partial_files, chunkfuse_bin_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WORDS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)


@st.composite
def string_cases(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    n = int(np.prod(shape))
    return {
        "shape": shape,
        "src": tuple(draw(st.integers(1, s)) for s in shape),
        "dst": tuple(draw(st.integers(1, s)) for s in shape),
        "values": draw(st.lists(WORDS, min_size=n, max_size=n)),
        "source_format": draw(st.sampled_from([2, 3])),
        "target_format": draw(st.sampled_from([2, 3])),
        "drop_first_chunk": draw(st.booleans()),
        "dtype": draw(st.sampled_from([str, "<U12"])),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=string_cases())
def test_string_arrays_rechunk_as_zarr_python_reads_them(
    tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]
) -> None:
    tmp = tmp_path_factory.mktemp("strings")
    data = np.array(case["values"], dtype=object).reshape(case["shape"])
    fmt = case["source_format"]
    source = zarr.create_array(
        str(tmp / "src.zarr"), shape=data.shape, chunks=case["src"], dtype=case["dtype"],
        zarr_format=fmt, fill_value="",
    )  # fmt: skip
    source[...] = data.astype(case["dtype"])
    want = source[...]
    if case["drop_first_chunk"]:
        key = ".".join("0" * data.ndim) if fmt == 2 else "c/" + "/".join("0" * data.ndim)
        (tmp / "src.zarr" / key).unlink(missing_ok=True)  # not stored when all fill
        want = source[...]  # zarr-python's reading of the missing chunk: the fill value
    summary = chunkfuse.rechunk(
        str(tmp / "src.zarr"), tmp / "dst.zarr", case["dst"], zarr_format=case["target_format"]
    )
    out = zarr.open_array(str(tmp / "dst.zarr"), mode="r")
    assert out.metadata.zarr_format == case["target_format"]
    assert tuple(out.chunks) == case["dst"]
    assert out.dtype == source.dtype
    np.testing.assert_array_equal(out[...], want)
    grid = int(np.prod([-(-s // c) for s, c in zip(data.shape, case["dst"], strict=True)]))
    assert summary["tasks"] == grid
    assert_no_partial_files(tmp / "dst.zarr")


def dataset_with_labels() -> xr.Dataset:
    """An ERA5-like dataset as the CDS delivers it: an `expver` string per time step, and a
    string label per station."""
    rng = np.random.default_rng(5)
    time = pd.date_range("2024-01-01", periods=40, freq="6h")
    expver = np.array(["0001"] * 30 + ["0005"] * 10, dtype=object)
    return xr.Dataset(
        {
            "t2m": (("valid_time", "latitude", "longitude"),
                    rng.standard_normal((40, 19, 36)).astype("float32"), {"units": "K"}),
            "station": (("latitude",), np.array([f"st-{i}-ß" for i in range(19)], dtype=object)),
            # numpy unicode: xarray stores it fixed-width (<U5, fixed_length_utf32)
            "zone": (("longitude",), np.array([f"z{i % 4}-ü" for i in range(36)])),
        },
        coords={
            "valid_time": time,
            "latitude": np.linspace(90, -90, 19),
            "longitude": np.arange(0, 360, 10.0),
            "expver": (("valid_time",), expver),
        },
        attrs={"source": "test"},
    )  # fmt: skip


@pytest.mark.parametrize(("source_format", "target_format"), [(2, 3), (3, 2), (3, 3)])
def test_a_dataset_with_string_coordinates_rechunks_whole(
    tmp_path: Path, source_format: int, target_format: int
) -> None:
    ds = dataset_with_labels()
    src = tmp_path / "src.zarr"
    ds = ds.chunk({"valid_time": 8, "latitude": 7, "longitude": -1})
    ds["station"] = ds["station"].compute()  # xarray writes object arrays from numpy
    ds.coords["expver"] = ds["expver"].compute()
    ds.to_zarr(src, zarr_format=source_format)
    target = tmp_path / "dst.zarr"
    chunks = {"valid_time": -1, "latitude": 10, "longitude": 12}
    chunkfuse.rechunk(xr.open_zarr(src), target, chunks, zarr_format=target_format)
    got = xr.open_zarr(target).load()
    xr.testing.assert_identical(got, xr.open_zarr(src).load())
    assert got["expver"].encoding["chunks"] == (40,)
    assert got["station"].encoding["chunks"] == (10,)
    assert got["zone"].encoding["chunks"] == (12,)
    group = zarr.open_group(str(target), mode="r")
    assert group["zone"].dtype == np.dtype("<U4")  # still fixed-width on disk
    assert "chunkfuse" not in group.attrs and "chunkfuse" not in group["expver"].attrs
    assert "expver" in group.array_keys()


def test_the_cli_rechunks_a_dataset_with_string_coordinates(tmp_path: Path) -> None:
    src, target = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    dataset_with_labels().to_zarr(src)
    run = subprocess.run(
        [str(chunkfuse_bin_path()), "rechunk", str(src), str(target),
         "--chunks", "valid_time=-1,latitude=5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert f"wrote {target}/expver" in run.stdout
    got = xr.open_zarr(target).load()
    xr.testing.assert_identical(got, xr.open_zarr(src).load())
    assert got["station"].encoding["chunks"] == (5,)


def test_string_targets_are_checked_as_others_and_overwrite_replaces_them(tmp_path: Path) -> None:
    src = tmp_path / "src.zarr"
    a = zarr.create_array(str(src), shape=(10,), chunks=(3,), dtype=str)
    a[...] = np.array([f"v{i}" for i in range(10)])
    target = tmp_path / "dst.zarr"
    chunkfuse.rechunk(str(src), target, (4,))
    with pytest.raises(ValueError, match="dst.zarr"):
        chunkfuse.rechunk(str(src), target, (4,))
    # What a run of another job left: marked unfinished by it.
    doc = json.loads((target / "zarr.json").read_text())
    doc["attributes"] = {"chunkfuse": {"incomplete": True, "job": "another"}}
    (target / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="another job left unfinished"):
        chunkfuse.rechunk(str(src), target, (4,))
    chunkfuse.rechunk(str(src), target, (5,), overwrite=True)
    out = zarr.open_array(str(target), mode="r")
    assert out.chunks == (5,) and "chunkfuse" not in out.attrs
    assert sorted(p.name for p in (target / "c").iterdir()) == ["0", "1"]
    np.testing.assert_array_equal(out[...], a[...])


def test_computing_on_strings_stays_an_error_naming_the_array(tmp_path: Path) -> None:
    src = tmp_path / "labels.zarr"
    zarr.create_array(str(src), shape=(4,), chunks=(2,), dtype=str)[...] = np.array(list("abcd"))
    plan = {
        "name": "upper",
        "arrays": [{"id": "labels", "zarr": str(src)}],
        "ops": [
            {"id": "twice", "op": "concat", "inputs": ["labels", "labels"], "axis": 0},
            {"id": "out", "op": "write", "input": "twice", "target": str(tmp_path / "o.zarr")},
        ],
    }
    with pytest.raises(Exception, match=r"labels.*string|string.*labels"):
        chunkfuse.run_plan(plan)
    assert not (tmp_path / "o.zarr").exists()


def test_v2_to_v2_keeps_a_null_fill_value_as_xarray_wrote_it(tmp_path: Path) -> None:
    """xarray writes `<U`n coordinates to v2 with a null fill value; the copy once had the
    empty string, which xarray reads back as a `_FillValue` attribute."""
    src, target = tmp_path / "src.zarr", tmp_path / "dst.zarr"
    dataset_with_labels().to_zarr(src, zarr_format=2)
    assert json.loads((src / "zone" / ".zarray").read_text())["fill_value"] is None
    chunkfuse.rechunk(str(src), target, {"valid_time": -1}, zarr_format=2)
    assert json.loads((target / "zone" / ".zarray").read_text())["fill_value"] is None
    raw = {"decode_cf": False, "consolidated": False}
    xr.testing.assert_identical(xr.open_zarr(target, **raw).load(), xr.open_zarr(src, **raw).load())


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_reading_an_array_of_strings_says_what_the_engine_does_with_them(
    tmp_path: Path, zarr_format: int
) -> None:
    src = tmp_path / "src.zarr"
    dataset_with_labels().to_zarr(src, zarr_format=zarr_format)
    for name in ("zone", "station"):
        with pytest.raises(Exception, match="an array of strings.*copies these"):
            chunkfuse.read(str(src / name))
        run = subprocess.run(
            [str(chunkfuse_bin_path()), "info", str(src / name)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # Exit status 2: what was asked is not supported (as for other data types).
        assert run.returncode == 2 and "an array of strings" in run.stderr, run.stderr
        assert "corrupt" not in run.stderr, run.stderr
