"""The window loader over two sources: an ERA5-like dataset as ARCO-ERA5 stores it (Zarr v2,
packed int16 with scale/offset/_FillValue, NaNs, missing chunks, descending latitude, CF
times) and a second one on a coarser grid every hour (Zarr v3). Windows equal xarray's
`.isel` at each anchor's labels (matched by `.sel`), metadata equals those labels, batches are
a function of (seed, epoch, step), resuming from a saved state gives the same next batch, an
epoch visits every anchor once, and bad input is refused by source and dimension."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from chunkfuse.loader import Shuffle, Source, SourceError, Split, WindowLoader
from era5_dataset import SHAPE, write_era5_v2

A_WINDOW = {"time": (-1, 2), "latitude": 5, "longitude": (-2, 6)}
B_WINDOW = {"time": (-5, 6), "latitude": 3, "longitude": 3}
B_ALIGN = {"latitude": "nearest", "longitude": "nearest"}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loader")
    a = write_era5_v2(root / "era5.zarr")
    nt = SHAPE[0] * 6
    rng = np.random.default_rng(5)
    b = xr.Dataset(
        {"tp": (("time", "latitude", "longitude"), rng.random((nt, 10, 18), dtype="float32"))},
        coords={
            "time": pd.date_range("1959-01-01", periods=nt, freq="1h"),
            "latitude": np.linspace(90.0, -90.0, 10),
            "longitude": np.linspace(0.0, 360.0, 18, endpoint=False),
        },
    )
    b.to_zarr(root / "coarse.zarr", zarr_format=3, encoding={"tp": {"chunks": (6, 5, 9)}})
    return a, root / "coarse.zarr"


def make_loader(stores: tuple[Path, Path], **kw: Any) -> WindowLoader:
    a, b = stores
    sources = [
        Source("era5", a, ["t2m", "sp"], A_WINDOW),
        Source("coarse", b, ["tp"], B_WINDOW, align=B_ALIGN),
    ]
    opts: dict[str, Any] = {"seed": 11, "shuffle": Shuffle(4, 2), "prefetch": 2}
    opts.update(kw)
    return WindowLoader(sources, ["time", "latitude", "longitude"], 8, **opts)


def reference(
    ds: xr.Dataset, var: str, labels: dict[str, Any], window: dict[str, Any], align: dict[str, str]
) -> np.ndarray:
    """xarray's window at one anchor: the index of each label by `.sel`, then `.isel`."""
    sel = {}
    for dim, spec in window.items():
        offset, length = (0, spec) if isinstance(spec, int) else spec
        method = align.get(dim)
        i = (
            ds.indexes[dim].get_loc(labels[dim])
            if method is None
            else int(ds.indexes[dim].get_indexer([labels[dim]], method=method)[0])
        )
        sel[dim] = slice(i + offset, i + offset + length)
    return np.asarray(ds[var].isel(sel).values)


def test_windows_of_two_sources_equal_xarray_at_each_anchor(stores: tuple[Path, Path]) -> None:
    a, b = (xr.open_zarr(p, chunks=None) for p in stores)
    loader = make_loader(stores)
    checked = 0
    for step in (0, 3, len(loader) - 1):
        batch = loader.batch(0, step)
        n = batch.ids.shape[0]
        assert batch.data["era5"]["sp"].shape == (n, 2, 5, 6)
        assert batch.data["coarse"]["tp"].shape == (n, 6, 3, 3)
        for k in range(n):
            labels = {d: batch.anchors[d][k] for d in ("time", "latitude", "longitude")}
            for var in ("t2m", "sp"):
                want = reference(a, var, labels, A_WINDOW, {})
                np.testing.assert_array_equal(batch.data["era5"][var][k], want)
            want = reference(b, "tp", labels, B_WINDOW, B_ALIGN)
            np.testing.assert_array_equal(batch.data["coarse"]["tp"][k], want)
            # The anchor's labels are the first source's coordinate values.
            assert labels["latitude"] in a.latitude.values
            checked += 1
    assert checked > 10
    # The packed variable decodes as xarray does: NaN where the stored value is the fill.
    assert any(np.isnan(loader.batch(0, s).data["era5"]["sp"]).any() for s in range(len(loader)))


def test_batches_are_a_function_of_seed_epoch_and_step(stores: tuple[Path, Path]) -> None:
    one = make_loader(stores, prefetch=0)
    two = make_loader(stores, prefetch=3)
    streamed = list(two)
    assert len(streamed) == len(one)
    for step, got in enumerate(streamed):
        want = one.batch(0, step)
        assert got.step == step and got.epoch == 0
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.data["coarse"]["tp"], want.data["coarse"]["tp"])
    # The next iteration is the next epoch, in another order.
    nxt = next(iter(two))
    assert nxt.epoch == 1 and not np.array_equal(nxt.ids, streamed[0].ids)
    # Every anchor once per epoch.
    ids = np.concatenate([b.ids for b in streamed])
    assert np.array_equal(np.sort(ids), np.arange(one.anchors.count))
    other_seed = make_loader(stores, seed=12).batch(0, 0)
    assert not np.array_equal(other_seed.ids, streamed[0].ids)


def test_resuming_from_a_state_saved_mid_epoch_gives_the_same_next_batch(
    stores: tuple[Path, Path],
) -> None:
    whole = list(make_loader(stores))
    first = make_loader(stores)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert (state["epoch"], state["step"]) == (0, 3)
    resumed = make_loader(stores)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 3
    for got, want in zip(rest, whole[3:], strict=True):
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.data["era5"]["t2m"], want.data["era5"]["t2m"])
    with pytest.raises(ValueError, match="saved with seed 11"):
        make_loader(stores, seed=3).load_state_dict(state)


def test_workers_and_ranks_share_an_epoch_exactly_once(stores: tuple[Path, Path]) -> None:
    ids = []
    for rank in range(2):
        for worker in range(2):
            loader = make_loader(stores, split=Split(rank, 2, worker, 2))
            ids.extend(b.ids for b in loader)
    flat = np.concatenate(ids)
    assert np.array_equal(np.sort(flat), np.arange(make_loader(stores).anchors.count))


def test_bad_input_is_refused_naming_the_source_and_dimension(
    stores: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = stores
    with pytest.raises(SourceError, match=r"source 'era5', dimension 'latitude': a window of 50"):
        Source("era5", a, ["t2m"], {"latitude": 50})
    with pytest.raises(SourceError, match=r"source 'era5' has no dimension 'level'"):
        Source("era5", a, ["t2m"], {"level": 1})
    with pytest.raises(SourceError, match=r"source 'era5'.* has no variable 'q'"):
        Source("era5", a, ["q"], {"time": 1})
    with pytest.raises(SourceError, match=r"source 'x': cannot open"):
        Source("x", tmp_path / "nothing.zarr", ["t2m"], {"time": 1})
    # Coordinates that cannot be aligned: the coarse times are half an hour off.
    shifted = tmp_path / "shifted.zarr"
    ds = xr.open_zarr(b, chunks=None).load()
    ds = ds.assign_coords(time=ds.time + np.timedelta64(30, "m"))
    ds.to_zarr(shifted, zarr_format=3)
    era5 = Source("era5", a, ["t2m"], {"time": 1})
    off = Source("coarse", shifted, ["tp"], {"time": 1})
    with pytest.raises(SourceError, match=r"source 'coarse', dimension 'time': no anchor label"):
        WindowLoader([era5, off], ["time"], 4)
    # Windows that fit each source alone but at no common anchor.
    # (era5 fits only at its last step, the coarse source only at the first.)
    late = Source("era5", a, ["t2m"], {"time": (-(SHAPE[0] - 1), 1)})
    early = Source("coarse", b, ["tp"], {"time": (SHAPE[0] * 6 - 6, 1)})
    with pytest.raises(SourceError, match=r"anchor dimension 'time': no label where every"):
        WindowLoader([late, early], ["time"], 4)
    with pytest.raises(SourceError, match=r"window along 'latitude', which is not an anchor"):
        WindowLoader([Source("era5", a, ["t2m"], {"latitude": 2})], ["time"], 4)


def _worker_stream(args: tuple[tuple[Path, Path], int, int]) -> list[tuple[Any, ...]]:
    """The batches worker `k` of `workers` yields in a child process, as (ids, t2m, tp)."""
    stores, k, workers = args
    loader = make_loader(stores, split=Split(0, 1, k, workers))
    return [(b.step, b.ids, b.data["era5"]["t2m"], b.data["coarse"]["tp"]) for b in loader]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_processes_yield_the_batches_of_one_process(
    stores: tuple[Path, Path], method: str
) -> None:
    import multiprocessing

    # The parent has used the engine before it forks.
    whole = list(make_loader(stores))
    with multiprocessing.get_context(method).Pool(2) as pool:
        streams = pool.map(_worker_stream, [(stores, k, 2) for k in range(2)])
    merged = [streams[i % 2][i // 2] for i in range(len(whole))]
    for want, (step, ids, t2m, tp) in zip(whole, merged, strict=True):
        assert step == want.step
        np.testing.assert_array_equal(ids, want.ids)
        np.testing.assert_array_equal(t2m, want.data["era5"]["t2m"])
        np.testing.assert_array_equal(tp, want.data["coarse"]["tp"])


def test_anchors_restricted_by_labels_and_by_a_mask(stores: tuple[Path, Path]) -> None:
    cutoff = np.datetime64("1959-01-02T12:00")

    def land(labels: dict[str, np.ndarray]) -> np.ndarray:
        return (labels["latitude"] > 0) & (labels["longitude"] < 180)

    full = make_loader(stores)
    loader = make_loader(stores, where={"time": lambda t: t < cutoff}, keep=land)
    assert 0 < loader.anchors.count < full.anchors.count
    seen = []
    for batch in loader:
        assert (batch.anchors["time"] < cutoff).all()
        assert land(batch.anchors).all()
        seen.append(batch.ids)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(loader.anchors.count))
    # Exactly the anchors of the full grid that pass both.
    grid = full.anchors.labels_of(np.arange(full.anchors.count))
    assert loader.anchors.count == int(((grid["time"] < cutoff) & land(grid)).sum())
    with pytest.raises(SourceError, match="keep= leaves no anchor"):
        make_loader(stores, keep=lambda labels: np.zeros(len(labels["time"]), bool))
    with pytest.raises(SourceError, match="where= names 'level'"):
        make_loader(stores, where={"level": lambda x: x > 0})


def test_the_chunk_cache_serves_later_batches_and_changes_no_value(
    stores: tuple[Path, Path],
) -> None:
    plain = make_loader(stores, cache_bytes=0)
    cached = make_loader(stores, cache_bytes=8 << 20)
    assert plain.cache is None and cached.cache is not None
    for step in range(len(plain)):
        a, b = plain.batch(0, step), cached.batch(0, step)
        for name, variables in a.data.items():
            for var, values in variables.items():
                np.testing.assert_array_equal(values, b.data[name][var], err_msg=f"{name}.{var}")
    # Neighbouring anchors share chunks (blocks of 4 in the chunk-aware order): later
    # batches find chunks earlier ones decoded, and the cache holds no more than its budget.
    assert cached.cache.hits > 0
    assert 0 < cached.cache.bytes <= 8 << 20
    tiny = make_loader(stores, cache_bytes=4096)
    tiny.batch(0, 0)
    assert tiny.cache is not None and tiny.cache.bytes <= 4096


def test_anchors_whose_windows_miss_too_many_values_are_dropped(
    stores: tuple[Path, Path],
) -> None:
    a, _ = stores
    dims = ["time", "latitude", "longitude"]
    ds = xr.open_zarr(a, chunks=None).load()  # NaN where missing, as xarray decodes
    variables = ["t2m", "sp"]  # float32 with NaNs; packed int16 with a _FillValue
    plain = WindowLoader([Source("era5", a, variables, A_WINDOW)], dims, 8)
    share = 0.04
    checked = WindowLoader([Source("era5", a, variables, A_WINDOW, max_missing=share)], dims, 8)
    # The reference: every anchor's window share of NaNs, over the variables, by numpy.
    grid = np.arange(plain.anchors.count)
    pos = plain.anchors.at(grid)
    starts = []
    for k, d in enumerate(dims):
        offset = A_WINDOW[d][0] if isinstance(A_WINDOW[d], tuple) else 0
        starts.append(plain.anchors.index[0][d][pos[k]] + offset)
    sizes = [A_WINDOW[d][1] if isinstance(A_WINDOW[d], tuple) else A_WINDOW[d] for d in dims]
    values = [ds[v].values for v in variables]
    missing = np.array(
        [
            sum(
                int(np.isnan(x[t : t + sizes[0], y : y + sizes[1], z : z + sizes[2]]).sum())
                for x in values
            )  # fmt: skip
            for t, y, z in zip(*starts, strict=True)
        ]
    )
    want = grid[missing <= share * np.prod(sizes) * len(variables)]
    assert 0 < want.size < grid.size, "the data must have windows on both sides"
    assert checked.anchors.kept is not None
    np.testing.assert_array_equal(checked.anchors.kept, want)
    # The batches hold only those anchors' windows.
    batch = checked.batch(0, 0)
    for var in variables:
        per_window = np.isnan(batch.data["era5"][var]).reshape(batch.ids.shape[0], -1).sum(1)
        assert per_window.max() <= share * np.prod(sizes) * len(variables)
    # A threshold no window meets, and one out of range, are refused before any batch.
    whole = {"time": 1, "latitude": SHAPE[1], "longitude": SHAPE[2]}
    with pytest.raises(SourceError, match="source 'era5': every anchor's window holds more"):
        WindowLoader([Source("era5", a, ["t2m"], whole, max_missing=0.0)], dims, 2)
    with pytest.raises(SourceError, match="max_missing must be a fraction"):
        Source("era5", a, ["t2m"], whole, max_missing=1.5)


def test_sources_from_datasets_xarray_opened(
    stores: tuple[Path, Path],
) -> None:
    a, _ = stores
    ds = xr.open_zarr(a)
    dims = ["time", "latitude", "longitude"]
    by_url = WindowLoader([Source("era5", a, ["t2m", "sp"], A_WINDOW)], dims, 8).batch(0, 2)
    by_ds = WindowLoader([Source("era5", ds, ["t2m", "sp"], A_WINDOW)], dims, 8).batch(0, 2)
    # A DataArray taken from a Dataset forgets its store: given the store, it reads by name.
    sp = ds["sp"]
    with pytest.raises(SourceError, match="DataArray does not say which store"):
        Source("era5", sp, None, A_WINDOW)
    sp.encoding["source"] = ds.encoding["source"]
    by_da = WindowLoader([Source("era5", sp, None, A_WINDOW)], dims, 8).batch(0, 2)
    for var in ("t2m", "sp"):
        np.testing.assert_array_equal(by_ds.data["era5"][var], by_url.data["era5"][var])
    np.testing.assert_array_equal(by_da.data["era5"]["sp"], by_url.data["era5"]["sp"])
    assert list(by_da.data["era5"]) == ["sp"]
    # A selection would be ignored (the store is read), so it is refused.
    with pytest.raises(SourceError, match="dimension 'time': the Dataset holds 5 of the store"):
        Source("era5", ds.isel(time=slice(0, 5)), ["t2m"], A_WINDOW)
    made = xr.Dataset({"t2m": (("time",), np.zeros(3))})
    with pytest.raises(SourceError, match="does not say which store it was opened from"):
        Source("mem", made, ["t2m"], {"time": 1})


def test_jittered_anchors_move_within_reach_and_still_equal_xarray(
    stores: tuple[Path, Path],
) -> None:
    a, b = (xr.open_zarr(p, chunks=None) for p in stores)
    reach = {"latitude": 2, "longitude": 3}
    stride = {"latitude": 4, "longitude": 6}
    loader = make_loader(stores, stride=stride, jitter=reach)
    fixed = make_loader(stores, stride=stride)
    assert loader.anchors.count == fixed.anchors.count
    moved = 0
    for epoch in (0, 1):
        batch, grid = loader.batch(epoch, 1), fixed.batch(epoch, 1)
        np.testing.assert_array_equal(batch.ids, grid.ids)
        for k in range(batch.ids.shape[0]):
            labels = {d: batch.anchors[d][k] for d in ("time", "latitude", "longitude")}
            for var in ("t2m", "sp"):
                want = reference(a, var, labels, A_WINDOW, {})
                np.testing.assert_array_equal(batch.data["era5"][var][k], want)
            np.testing.assert_array_equal(
                batch.data["coarse"]["tp"][k], reference(b, "tp", labels, B_WINDOW, B_ALIGN)
            )
            for d, steps in reach.items():
                here = a.indexes[d].get_loc(labels[d])
                there = a.indexes[d].get_loc(grid.anchors[d][k])
                assert abs(here - there) <= steps
                moved += here != there
        # The same (seed, epoch, step) gives the same jitter.
        again = make_loader(stores, stride=stride, jitter=reach).batch(epoch, 1)
        for d in reach:
            np.testing.assert_array_equal(again.anchors[d], batch.anchors[d])
    assert moved > 0
    with pytest.raises(SourceError, match="jitter= names 'level'"):
        make_loader(stores, jitter={"level": 1})
    with pytest.raises(SourceError, match="jitter must be at least 0"):
        make_loader(stores, jitter={"latitude": -1})


def test_masked_integers_decode_to_float32_as_xarray_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    values = np.round(2000 * rng.standard_normal((6, 12, 16))).astype("float32")
    values[rng.random(values.shape) < 0.1] = np.nan
    ds = xr.Dataset(
        {"q": (("time", "latitude", "longitude"), values)},
        coords={
            "time": pd.date_range("2000-01-01", periods=6, freq="1h"),
            "latitude": np.linspace(60, 0, 12),
            "longitude": np.linspace(0, 30, 16),
        },
    )
    # Integers with a fill value only: xarray masks them to float32.
    encoding = {"dtype": "int16", "_FillValue": np.int16(-32767), "chunks": (2, 5, 7)}
    ds.to_zarr(tmp_path / "packed.zarr", zarr_format=3, encoding={"q": encoding})
    ref = xr.open_zarr(tmp_path / "packed.zarr", chunks=None)
    assert ref["q"].dtype == np.float32, "the float32 decode path is what this test is for"
    window = {"time": 2, "latitude": 4, "longitude": 5}
    loader = WindowLoader(
        [Source("p", tmp_path / "packed.zarr", ["q"], window)],
        ["time", "latitude", "longitude"],
        16,
    )
    batch = loader.batch(0, 0)
    assert batch.data["p"]["q"].dtype == np.float32
    for k in range(batch.ids.shape[0]):
        labels = {d: batch.anchors[d][k] for d in window}
        want = reference(ref, "q", labels, window, {})
        np.testing.assert_array_equal(batch.data["p"]["q"][k], want)
    assert any(np.isnan(loader.batch(0, s).data["p"]["q"]).any() for s in range(len(loader)))
