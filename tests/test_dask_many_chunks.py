"""Dask graphs over many small chunks under `chunkfuse.dask.get`: `da.roll`, `da.concatenate`
of slices and `fftshift` give Dask's values and run in an engine plan whose stages do not grow
with the number of chunks; a small selection of a stored array is read without a plan run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import chunkfuse
import chunkfuse.dask
import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from chunkfuse.dask import runner
from conftest import Cli, read_zarr
from hypothesis import given, settings
from hypothesis import strategies as st

Graph = Callable[[da.Array], da.Array]

GRAPHS: dict[str, Graph] = {
    "roll": lambda x: da.roll(x, 5, axis=2),
    "roll_mean": lambda x: da.roll(x, -7, axis=2).mean(axis=0),
    "concat_of_slices": lambda x: da.concatenate([x[:, :, 6:], x[:, :, :6]], axis=2),
    "concat_of_slices_sum": lambda x: da.concatenate([x[:, :, 4:], x[:, :, :4]], axis=2).sum(
        axis=0
    ),
    "fftshift": lambda x: da.fft.fftshift(x, axes=2),
    "ifftshift_mean": lambda x: da.fft.ifftshift(x, axes=(2,)).mean(axis=0),
    "roll_lat": lambda x: da.roll(x, 3, axis=1) * 2.0,
    "concat_along_time": lambda x: da.concatenate([x[3:], x[:3]], axis=0),
    # xrft's power spectrum along longitude: a ufunc applied per block of a shifted transform.
    "xrft_spectrum_mean": lambda x: abs(da.fft.fftshift(da.fft.fft(x, axis=2), axes=2)).mean(0),
    "fftshift_all_axes": lambda x: da.fft.fftshift(x),
    "fftshift_all_axes_mean": lambda x: da.fft.fftshift(x).mean(axis=0),
    "ufunc_per_slice_then_join": lambda x: da.concatenate(
        [np.sqrt(abs(x[:, :, 6:])), np.sqrt(abs(x[:, :, :6]))], axis=2
    ),
}


def _stored(path: Path, steps: int) -> da.Array:
    """An ERA5-like array of `steps` one-step chunks (7 × 12 each), opened with from_zarr."""
    rng = np.random.default_rng(steps)
    values = rng.standard_normal((steps, 7, 12)).astype("float32")
    arr = zarr.create_array(str(path), shape=values.shape, chunks=(1, 7, 12), dtype="float32")
    arr[...] = values
    return da.from_zarr(str(path))


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The run summaries of every engine plan run from now on."""
    runs: list[dict[str, Any]] = []
    run_plan = runner.run_plan

    def recorded(*args: Any, **kwargs: Any) -> dict[str, Any]:
        summary = run_plan(*args, **kwargs)
        runs.append(summary)
        return summary

    monkeypatch.setattr(runner, "run_plan", recorded)
    return runs


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_many_chunk_graphs_give_dasks_values_in_stages_that_do_not_grow(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs(monkeypatch)
    stages = []
    for steps in (12, 48):
        x = _stored(tmp_path / f"t{steps}.zarr", steps)
        y = GRAPHS[name](x)
        expected = y.compute(scheduler="threads")
        runs.clear()
        got = y.compute(scheduler=chunkfuse.dask.get)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
        stats = chunkfuse.dask.last_stats()
        assert stats is not None and stats.python_tasks == 0, stats
        assert len(runs) == 1
        stages.append(runs[0]["stages"])
    # The same stages (no intermediate per block) for 12 and for 48 chunks.
    assert len(stages[0]) == len(stages[1]) <= 2, stages


def test_a_small_selection_of_a_stored_array_needs_no_plan_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _stored(tmp_path / "t.zarr", 20)
    values = zarr.open_array(str(tmp_path / "t.zarr"))[...]
    runs = _runs(monkeypatch)
    selections: list[Any] = [
        np.s_[5, :3, :4],
        np.s_[2:9, 1:6:2],
        np.s_[::-3, -2:, 10:1:-4],
        np.s_[:, 4, 7],
        np.s_[7, 6, 11],
    ]
    for sel in selections:
        got = x[sel].compute(scheduler=chunkfuse.dask.get)
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, values[sel])
        stats = chunkfuse.dask.last_stats()
        assert stats is not None and stats.python_tasks == 0, stats
    assert runs == []
    with dask.config.set(scheduler=chunkfuse.dask.get):
        # Anything computed still runs a plan.
        np.testing.assert_allclose((x[5, :3, :4] + 1).compute(), values[5, :3, :4] + 1, rtol=1e-6)
    assert len(runs) == 1


def _blockwise_roll_plan(src: Path, steps: int, shift: int, out: Path) -> dict[str, Any]:
    """The plan Dask's `roll` of a one-step-chunked array along its last axis becomes: per
    step, the two slices joined, then the steps joined along time."""
    ops: list[dict[str, Any]] = []
    for t in range(steps):
        step = [t, t + 1, 1]
        right = {"op": "slice", "input": "x", "selection": [step, None, [shift, None, 1]]}
        left = {"op": "slice", "input": "x", "selection": [step, None, [0, shift, 1]]}
        ops += [
            {"id": f"a{t}", **right},
            {"id": f"b{t}", **left},
            {"id": f"c{t}", "op": "concat", "inputs": [f"a{t}", f"b{t}"], "axis": 2},
        ]
    ops.append({"id": "all", "op": "concat", "inputs": [f"c{t}" for t in range(steps)]})
    ops.append({"id": "w", "op": "write", "input": "all", "target": str(out)})
    return {"arrays": [{"id": "x", "zarr": str(src)}], "ops": ops}


def test_a_join_of_the_first_rows_of_a_join_reads_those_rows_only(cli: Cli, tmp_path: Path) -> None:
    """`x[[0, 0, 4, 0]]` as Dask builds it: a join of the sorted takes, then of its first two
    rows and of two rows of it backwards. The first rows are read through the identity onto
    the join's start, which must not read as the whole join."""
    values = np.random.default_rng(3).standard_normal((8, 3, 4)).astype("float32")
    src = tmp_path / "x.zarr"
    zarr.create_array(str(src), data=values, chunks=(1, 3, 4))
    step = lambda t: {"op": "slice", "input": "x", "selection": [[t, t + 1, 1], None, None]}  # noqa: E731
    ops = [
        {"id": "a", **step(0)},
        {"id": "b", **step(4)},
        {"id": "sorted", "op": "concat", "inputs": ["a", "a", "a", "b"], "axis": 0},
        {"id": "back", "op": "slice", "input": "sorted", "selection": [[3, None, -1], None, None]},
        {"id": "head", "op": "slice", "input": "sorted", "selection": [[0, 2, 1], None, None]},
        {"id": "tail", "op": "slice", "input": "back", "selection": [[0, 2, 1], None, None]},
        {"id": "taken", "op": "concat", "inputs": ["head", "tail"], "axis": 0},
        {"id": "w", "op": "write", "input": "taken", "target": str(tmp_path / "out.zarr")},
    ]
    cli.run_plan({"arrays": [{"id": "x", "zarr": str(src)}], "ops": ops}, threads=2)
    np.testing.assert_array_equal(read_zarr(tmp_path / "out.zarr"), values[[0, 0, 4, 0]])


def test_a_join_of_per_step_joins_runs_in_one_stage(cli: Cli, tmp_path: Path) -> None:
    stages = []
    for steps in (10, 40):
        values = np.random.default_rng(steps).standard_normal((steps, 4, 6)).astype("float32")
        src = tmp_path / f"x{steps}.zarr"
        zarr.create_array(str(src), data=values, chunks=(1, 4, 6))
        out = tmp_path / f"out{steps}.zarr"
        summary = cli.run_plan(_blockwise_roll_plan(src, steps, 4, out), threads=2)
        np.testing.assert_array_equal(read_zarr(out), np.roll(values, -4, axis=2))
        stages.append(summary["stages"])
    # No intermediate per step: the write is the only stage, whatever the number of steps.
    assert len(stages[0]) == len(stages[1]) == 1, stages


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_joins_of_slices_along_several_axes_give_numpys_values(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Rolls, fftshifts and joins of slices along random axes and chunkings, stacked on each
    other and ended by a ufunc or a reduction, against numpy."""
    shape = tuple(data.draw(st.integers(2, 7), label=f"n{d}") for d in range(3))
    chunks = tuple(data.draw(st.integers(1, n), label=f"c{d}") for d, n in enumerate(shape))
    path = tmp_path_factory.mktemp("joins") / "x.zarr"
    values = np.random.default_rng(len(str(path))).standard_normal(shape).astype("float32")
    zarr.create_array(str(path), data=values, chunks=chunks)
    x, ref = da.from_zarr(str(path)), values
    for _ in range(data.draw(st.integers(1, 4), label="steps")):
        kinds = ["roll", "fftshift", "concat", "reverse", "head", "abs"]
        kind = data.draw(st.sampled_from(kinds), label="kind")
        axis = data.draw(st.integers(0, 2), label="axis")
        if kind == "roll":
            by = data.draw(st.integers(-8, 8), label="by")
            x, ref = da.roll(x, by, axis=axis), np.roll(ref, by, axis=axis)
        elif kind == "fftshift":
            axes = data.draw(st.sampled_from([None, (axis,), (0, 2)]), label="axes")
            x, ref = da.fft.fftshift(x, axes=axes), np.fft.fftshift(ref, axes=axes)
        elif kind == "concat":
            cut = data.draw(st.integers(0, shape[axis]), label="cut")
            lo, hi = [slice(None)] * 3, [slice(None)] * 3
            lo[axis], hi[axis] = slice(cut, None), slice(None, cut)
            x = da.concatenate([x[tuple(lo)], x[tuple(hi)]], axis=axis)
            ref = np.concatenate([ref[tuple(lo)], ref[tuple(hi)]], axis=axis)
        elif kind in ("reverse", "head"):
            # Backwards, or the first rows only: slices of the joins made so far.
            n = x.shape[axis]
            cut = [slice(None)] * 3
            cut[axis] = slice(None, None, -1) if kind == "reverse" else slice(0, max(1, n // 2))
            x, ref = x[tuple(cut)], ref[tuple(cut)]
        else:
            x, ref = abs(x) + 1, np.abs(ref) + 1
    if data.draw(st.booleans(), label="mean"):
        x, ref = x.mean(axis=0), ref.mean(axis=0)
    got = x.compute(scheduler=chunkfuse.dask.get)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    stats = chunkfuse.dask.last_stats()
    assert stats is not None and stats.python_tasks == 0, stats


def test_a_join_along_one_axis_of_a_join_of_joins_along_another(tmp_path: Path) -> None:
    """A roll along axis 0, then fftshift over axes 0 and 1: the axis-0 join is a join of the
    roll's join, met before the roll's was built; its boxes must be rebuilt in the roll's
    array, or every row reads the first (found by the property test below)."""
    values = np.arange(8, dtype="float32").reshape(2, 2, 2)
    zarr.create_array(str(tmp_path / "x.zarr"), data=values, chunks=(1, 2, 2))
    x = da.from_zarr(str(tmp_path / "x.zarr"))
    y = da.fft.fftshift(da.roll(x, 1, axis=0), axes=(0, 1))
    want = np.fft.fftshift(np.roll(values, 1, axis=0), axes=(0, 1))
    np.testing.assert_array_equal(y.compute(scheduler=chunkfuse.dask.get), want)
