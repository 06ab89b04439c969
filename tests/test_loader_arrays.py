"""Bare Zarr arrays by URL as loader sources: dimensions named by their metadata (Zarr v3
`dimension_names`, v2 `_ARRAY_DIMENSIONS`, else `dim_0`, ...), labelled by position, windows
equal to numpy's slices of what zarr-python reads; and what cannot be aligned is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from chunkfuse.loader import Shuffle, Source, SourceError, WindowLoader

SHAPE = (12, 20, 30)


def _values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE, dtype="float32")


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arrays")
    v3 = zarr.create_array(
        root / "v3.zarr",
        shape=SHAPE,
        chunks=(3, 7, 8),
        dtype="float32",
        dimension_names=("time", "y", "x"),
    )
    v3[...] = _values(0)
    v2 = zarr.create_array(
        root / "v2.zarr", shape=SHAPE, chunks=(4, 5, 11), dtype="float32", zarr_format=2
    )
    v2.attrs["_ARRAY_DIMENSIONS"] = ["time", "y", "x"]
    v2[...] = _values(1)
    bare = zarr.create_array(root / "unnamed.zarr", shape=SHAPE, chunks=(5, 5, 5), dtype="f4")
    bare[...] = _values(2)
    # A group whose variable has no coordinates: positions label every dimension.
    xr.Dataset({"z": (("time", "y", "x"), _values(3))}).to_zarr(root / "group.zarr")
    # A group with a time coordinate: labels that are not positions.
    xr.Dataset(
        {"z": (("time", "y", "x"), _values(4))}, coords={"time": np.arange(SHAPE[0]) * 10}
    ).to_zarr(root / "labelled.zarr")
    return {
        "v3": root / "v3.zarr",
        "v2": root / "v2.zarr",
        "unnamed": root / "unnamed.zarr",
        "group": root / "group.zarr",
        "labelled": root / "labelled.zarr",
    }


WINDOW = {"time": (-2, 3), "y": 4, "x": (-1, 5)}


def test_bare_arrays_and_positional_groups_give_numpy_windows_at_anchor_positions(
    arrays: dict[str, Path],
) -> None:
    sources = [
        Source("v3", arrays["v3"], None, WINDOW),
        Source("v2", str(arrays["v2"]), None, WINDOW),
        Source("group", arrays["group"], ["z"], WINDOW),
    ]
    assert sources[0].variables == ("v3",)
    assert sources[0].dims == sources[1].dims == ("time", "y", "x")
    loader = WindowLoader(sources, ["time", "y", "x"], 8, seed=3, shuffle=Shuffle(2, 3))
    # Every source's window fits: time from 2, y up to 16, x from 1 to 26.
    assert loader.anchors.count == 10 * 17 * 26
    references = {
        "v3": zarr.open_array(arrays["v3"], mode="r")[...],
        "v2": zarr.open_array(arrays["v2"], mode="r")[...],
        "group": xr.open_zarr(arrays["group"])["z"].values,
    }
    seen = 0
    for step in range(len(loader)):
        batch = loader.batch(0, step)
        for i in range(batch.ids.shape[0]):
            t, y, x = (int(batch.anchors[d][i]) for d in ("time", "y", "x"))
            for name, ref in references.items():
                (got,) = batch.data[name].values()
                np.testing.assert_array_equal(got[i], ref[t - 2 : t + 1, y : y + 4, x - 1 : x + 4])
            seen += 1
        if step == 3:
            break
    assert seen == 32


def test_an_unnamed_array_has_dims_named_as_xarray_names_them(arrays: dict[str, Path]) -> None:
    source = Source("a", arrays["unnamed"], None, {"dim_0": 2, "dim_2": (-3, 7)})
    assert source.dims == ("dim_0", "dim_1", "dim_2")
    loader = WindowLoader([source], ["dim_0", "dim_2"], 4, seed=1)
    assert loader.anchors.count == 11 * 24
    ref = zarr.open_array(arrays["unnamed"], mode="r")[...]
    batch = loader.batch(0, 0)
    for i in range(4):
        t, x = int(batch.anchors["dim_0"][i]), int(batch.anchors["dim_2"][i])
        got = batch.data["a"]["unnamed"][i]
        np.testing.assert_array_equal(got, ref[t : t + 2, :, x - 3 : x + 4])


def test_nan_windows_of_a_bare_array_are_dropped(tmp_path: Path) -> None:
    values = _values(5)
    values[4, 10:13, 6] = np.nan
    a = zarr.create_array(
        tmp_path / "a.zarr",
        shape=SHAPE,
        chunks=(4, 8, 8),
        dtype="float32",
        dimension_names=("time", "y", "x"),
    )
    a[...] = values
    source = Source("a", tmp_path / "a.zarr", None, {"time": 2, "y": 3, "x": 3}, max_missing=0)
    loader = WindowLoader([source], ["time", "y", "x"], 16, seed=0)
    expected = 0
    for t in range(SHAPE[0] - 1):
        for y in range(SHAPE[1] - 2):
            for x in range(SHAPE[2] - 2):
                expected += not np.isnan(values[t : t + 2, y : y + 3, x : x + 3]).any()
    assert loader.anchors.count == expected < 11 * 18 * 28


def test_sources_that_cannot_be_aligned_or_opened_are_refused(
    arrays: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(SourceError, match=r"'v3'.*is a Zarr array, not a group.*variables=None"):
        Source("v3", arrays["v3"], ["t2m"], WINDOW)
    with pytest.raises(SourceError, match=r"'g'.*is a Zarr group: name the variables"):
        Source("g", arrays["group"], None, WINDOW)
    with pytest.raises(SourceError, match=r"'gone': cannot open .*nowhere\.zarr"):
        Source("gone", tmp_path / "nowhere.zarr", None, WINDOW)
    with pytest.raises(SourceError, match=r"'v2' has no dimension 'latitude'"):
        Source("v2", arrays["v2"], None, {"latitude": 3})
    labelled = Source("labelled", arrays["labelled"], ["z"], {"time": 2})
    bare = Source("v3", arrays["v3"], None, {"time": 2})
    with pytest.raises(
        SourceError, match=r"'time': source 'labelled' labels it by its coordinate, source 'v3'"
    ):
        WindowLoader([bare, labelled], ["time"], 4)
