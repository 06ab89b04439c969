"""The front ends on a cluster: Cubed's `RustExecutor(runtime=DaskRuntime(client))`, and
Dask's own `compute()` and `to_zarr` with `chunkfuse.dask.enabled()`, on a 2-worker
LocalCluster and on Dask's local scheduler: results equal the local engine's and Dask's,
the engine's work runs as batches in the workers, callbacks' task counts add up, and a
budget the workers cannot hold is refused before anything runs."""
# ruff: noqa: F811  (the cluster fixture imported from cluster_fixtures and used as an argument)

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import chunkfuse.dask
import cubed
import cubed.array_api as xp
import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from chunkfuse.cubed import RustExecutor
from cluster_fixtures import client, remote_client  # noqa: F401
from cubed.runtime.types import Callback
from dask.callbacks import Callback as DaskCallback

distributed = pytest.importorskip("distributed")
from chunkfuse.distributed.dask_runtime import DaskRuntime  # noqa: E402

SHAPE = (24, 60, 90)
CHUNKS = (2, 60, 90)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(36)
    data = (rng.standard_normal(SHAPE) * 5 + 280).astype("float32")
    url = str(tmp_path_factory.mktemp("src") / "x.zarr")
    zarr.create_array(url, shape=SHAPE, chunks=CHUNKS, dtype="float32")[...] = data
    return url, data


class Tasks(Callback):
    """Task counts Cubed's callbacks see, per op."""

    def __init__(self) -> None:
        self.ended: dict[str, int] = {}
        self.planned: dict[str, int] = {}

    def on_compute_start(self, event: Any) -> None:
        for name, node in event.dag.nodes(data=True):
            if "primitive_op" in node:
                self.planned[name] = node["primitive_op"].num_tasks

    def on_task_end(self, event: Any) -> None:
        self.ended[event.name] = self.ended.get(event.name, 0) + event.num_tasks


def test_cubed_on_a_cluster_equals_the_local_engine(
    client: Any, source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    url, data = source
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="200MB")
    x = cubed.from_zarr(url, spec=spec)
    on_cluster = RustExecutor(runtime=DaskRuntime(client))
    local = RustExecutor()
    for expr in (xp.sum(x, axis=0), xp.mean(x, axis=0), x - xp.mean(x, axis=0)):
        tasks = Tasks()
        got = expr.compute(executor=on_cluster, callbacks=[tasks])
        want = expr.compute(executor=local)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-4)
        stats = on_cluster.last_stats
        assert stats.runtime == "dask" and stats.batches >= 2, stats
        assert len(stats.worker_peak_rss) == 2, stats.worker_peak_rss
        # Progress bars advance to the end: every op's tasks end, no more.
        for name in stats.native_ops:
            assert tasks.ended.get(name) == tasks.planned[name], (name, tasks.ended)
    np.testing.assert_allclose(got, data - data.mean(axis=0), atol=1e-3)


def test_cubed_refuses_an_allowance_the_workers_cannot_hold(
    client: Any, source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="6GB")
    x = cubed.from_zarr(source[0], spec=spec)
    with pytest.raises(ValueError, match="does not fit its workers"):
        xp.sum(x, axis=0).compute(executor=RustExecutor(runtime=DaskRuntime(client)))


def test_dask_compute_and_to_zarr_on_a_cluster_run_engine_batches(
    client: Any, source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    url, data = source
    x = da.from_zarr(url)
    want_sum = ((x + 1) * 2).sum(axis=0).compute()
    anomaly = x - x.mean(axis=0)
    with chunkfuse.dask.enabled(work_dir=str(tmp_path / "work")):
        with distributed.get_task_stream(client) as ts:
            got_sum = ((x + 1) * 2).sum(axis=0).compute()
            anomaly.to_zarr(str(tmp_path / "anomaly.zarr"))
            x.rechunk((24, 20, 30)).to_zarr(str(tmp_path / "rechunked.zarr"))
    np.testing.assert_allclose(got_sum, want_sum, rtol=1e-6)
    got = zarr.open_array(str(tmp_path / "anomaly.zarr"), mode="r")[...]
    np.testing.assert_allclose(got, data - data.mean(axis=0), atol=1e-3)
    rechunked = zarr.open_array(str(tmp_path / "rechunked.zarr"), mode="r")
    assert rechunked.chunks == (24, 20, 30)
    np.testing.assert_array_equal(rechunked[...], data)
    ran = {w for t in ts.data if "chunkfuse-batch" in str(t["key"]) for w in [t["worker"]]}
    assert len(ran) == 2, "the batches did not spread over both workers"
    assert not any((tmp_path / "work").iterdir()), "scratch or work left behind"
    assert "chunkfuse" not in zarr.open_array(str(tmp_path / "anomaly.zarr"), mode="r").attrs


@pytest.mark.parametrize("cluster", ["client", "remote_client"])
def test_xarray_to_zarr_with_the_setting_reopens_equal(
    cluster: str, source: tuple[str, np.ndarray], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On a LocalCluster, and with the scheduler in a process of its own."""
    on = request.getfixturevalue(cluster)
    url, data = source
    ds = xr.Dataset({"t": (("time", "lat", "lon"), da.from_zarr(url))})
    with (
        on.as_current(),
        chunkfuse.dask.enabled(work_dir=str(tmp_path / "work")),
        distributed.get_task_stream(on) as ts,
    ):
        out = (ds - ds.mean("time")).rename({"t": "anomaly"})
        out.to_zarr(str(tmp_path / "out.zarr"), mode="w")
    assert any("chunkfuse-batch" in str(t["key"]) for t in ts.data), "no engine batch ran"
    back = xr.open_zarr(str(tmp_path / "out.zarr"))
    np.testing.assert_allclose(back["anomaly"].values, data - data.mean(axis=0), atol=1e-3)
    assert "chunkfuse" not in back["anomaly"].attrs, "the job's marker was left on the target"


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_a_finished_to_zarr_leaves_no_marker(
    source: tuple[str, np.ndarray], tmp_path: Path, zarr_format: int, scheduler: str
) -> None:
    """xarray creates the arrays, the engine's job marks them while it writes them, and the
    job's end (in a task, attached afresh) takes the marker off: the target's attributes
    are xarray's alone."""
    url, data = source
    ds = xr.Dataset({"t": (("time", "lat", "lon"), da.from_zarr(url), {"units": "K"})})
    with (
        chunkfuse.dask.enabled(work_dir=str(tmp_path / "work")),
        dask.config.set(scheduler=scheduler),
    ):
        (ds - ds.mean("time")).to_zarr(str(tmp_path / "out.zarr"), zarr_format=zarr_format)
    stored = zarr.open_array(str(tmp_path / "out.zarr" / "t"), mode="r")
    assert "chunkfuse" not in stored.attrs, dict(stored.attrs)
    back = xr.open_zarr(str(tmp_path / "out.zarr"))
    assert "chunkfuse" not in back["t"].attrs, back["t"].attrs
    np.testing.assert_allclose(back["t"].values, data - data.mean(axis=0), atol=1e-3)


class Keys(DaskCallback):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    def _start_state(self, dsk: Any, state: Any) -> None:
        self.keys.extend(str(k) for k in dsk)


def test_the_setting_works_with_the_local_schedulers(
    source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    url, data = source
    x = da.from_zarr(url)
    for scheduler in ("threads", "sync"):
        with chunkfuse.dask.enabled(work_dir=str(tmp_path)), Keys() as keys:
            got = x.var(axis=0).compute(scheduler=scheduler)
        np.testing.assert_allclose(got, data.astype("float64").var(axis=0), rtol=1e-4)
        assert any("chunkfuse-batch" in k for k in keys.keys), scheduler
    # Outside the block Dask is Dask again.
    with Keys() as keys:
        x.sum().compute(scheduler="sync")
    assert not any("chunkfuse" in k for k in keys.keys)
    assert dask.config.get("array_optimize", None) is None


def test_delayed_objects_compute_with_the_setting(
    source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    """Delayed objects go through Dask's delayed optimisation, then the rewrite: a function
    of an array, and one of plain values, compute as without the setting."""
    url, data = source
    x = da.from_zarr(url)
    total = dask.delayed(lambda a: float(a.sum()))(x)
    with chunkfuse.dask.enabled(work_dir=str(tmp_path)):
        assert total.compute(scheduler="sync") == pytest.approx(float(data.sum()), rel=1e-5)
        assert dask.delayed(sum)([1, 2, 3]).compute(scheduler="threads") == 6
    with pytest.raises(ValueError, match="max_mem: invalid size"):
        with chunkfuse.dask.enabled(max_mem="banana"):
            pass


def test_a_value_error_in_a_batch_is_a_value_error_as_in_dask(tmp_path: Path) -> None:
    """`nanargmax` over an all-NaN lane raises ValueError in Dask; with the setting the
    batch's error is a ValueError too (and a BatchFailed naming the batch)."""
    from chunkfuse.distributed import BatchFailed

    a = np.ones((4, 3, 6), np.float32)
    a[1, 2, :] = np.nan
    z = zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 3, 3))
    x = da.from_zarr(z)
    with pytest.raises(ValueError):
        da.nanargmax(x, axis=2).compute(scheduler="sync")
    work = tmp_path / "work"
    with chunkfuse.dask.enabled(work_dir=str(work)):
        with pytest.raises(ValueError, match="(?i)all-NaN slice") as raised:
            da.nanargmax(x, axis=2).compute(scheduler="sync")
    assert isinstance(raised.value, BatchFailed), type(raised.value).__mro__
    assert list(work.iterdir()) == [], "a failed compute's scratch was left"


def test_disable_gives_dask_back_its_own_settings(tmp_path: Path) -> None:
    """`disable()` puts Dask's settings back as `enable()` found them: it used to leave
    `array_optimize` set to None, which turns Dask's own array optimisation off (no fusion,
    no culling) for the rest of the process."""
    x = da.from_zarr(
        zarr.create_array(str(tmp_path / "x.zarr"), data=np.ones((4, 6)), chunks=(2, 2))
    )

    def python_steps() -> list[str]:
        z = x.map_blocks(lambda b: np.sort(b, axis=1)).mean(axis=0)
        return sorted(s.op for s in chunkfuse.dask.explain(z).python_steps)

    before, fused = dict(dask.config.config), python_steps()
    with dask.config.set({"array.rechunk.method": "p2p"}):
        chunkfuse.dask.enable(work_dir=str(tmp_path))
        chunkfuse.dask.enable(work_dir=str(tmp_path), batches_per_worker=2)
        assert x.sum().compute() == 24
        chunkfuse.dask.disable()
        assert dask.config.get("array.rechunk.method") == "p2p"
    assert dict(dask.config.config) == before
    assert python_steps() == fused and "lambda" not in fused, fused
    chunkfuse.dask.disable()  # without enable(): nothing to undo
    assert dict(dask.config.config) == before


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_a_failed_compute_leaves_no_scratch(tmp_path: Path, scheduler: str) -> None:
    """A batch fails while others still run in the pool: the graph's scratch (its
    intermediates and the job's work directory) goes once they have returned."""
    a = np.ones((16, 30, 40), np.float32)
    a[9, 2, :] = np.nan
    z = zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(1, 30, 20))
    work = tmp_path / "work"
    chunkfuse.dask.enable(work_dir=str(work))
    try:
        y = da.nanargmax(da.sin(da.from_zarr(z)).rechunk((16, 5, 40)) + 1, axis=2)
        with pytest.raises(ValueError, match="(?i)all-NaN slice"):
            y.compute(scheduler=scheduler)
    finally:
        chunkfuse.dask.disable()
    deadline = time.monotonic() + 30
    while list(work.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(work.iterdir()) == []


def test_a_graph_optimised_but_never_computed_leaves_no_scratch_at_exit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    script = f"""
import dask, dask.array as da, numpy as np, os, zarr, chunkfuse.dask
z = zarr.create_array({str(tmp_path / "x.zarr")!r}, data=np.ones((40, 100)), chunks=(10, 100))
x = da.from_zarr(z)
with chunkfuse.dask.enabled(work_dir={str(work)!r}):
    (kept,) = dask.optimize(da.sin(x).rechunk((40, 10)) + 1)
print(len(os.listdir({str(work)!r})))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1", "the rewrite made no scratch: nothing is tested"
    assert list(work.iterdir()) == []


def test_a_cluster_without_workers_is_named_and_local_schedulers_ignore_it(
    source: tuple[str, np.ndarray], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default client whose cluster has no workers: `compute(scheduler="threads")` runs
    on this machine's threads as asked, and a compute on the cluster says it has none."""
    import chunkfuse.distributed.dask_runtime as dask_runtime

    monkeypatch.setattr(dask_runtime, "WAIT_FOR_WORKERS_S", 0.5)
    url, data = source
    x = da.from_zarr(url)
    empty = distributed.LocalCluster(
        n_workers=0,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        local_directory=str(tmp_path / "dask"),
    )
    work = tmp_path / "work"
    with empty, distributed.Client(empty), chunkfuse.dask.enabled(work_dir=str(work)):
        with Keys() as keys:
            got = x.mean(axis=0).compute(scheduler="threads")
        np.testing.assert_allclose(got, data.mean(axis=0), rtol=1e-5)
        assert any("chunkfuse-batch" in k for k in keys.keys)
        with pytest.raises(RuntimeError, match="has no workers"):
            x.mean(axis=0).compute()
    assert not any(work.iterdir()), "scratch left behind"


def test_a_scheduler_in_its_own_process_rewrites_with_the_clients_options(
    remote_client: Any, source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    """dask.distributed materialises graphs on the scheduler; one in a process of its own
    (as deployed) has none of the client's config, yet the batches use `enabled()`'s work
    directory and spread over both workers."""
    url, data = source
    x = da.from_zarr(url)
    work = tmp_path / "work"
    with (
        remote_client.as_current(),
        chunkfuse.dask.enabled(work_dir=str(work)),
        distributed.get_task_stream(remote_client) as ts,
    ):
        got = (x - x.mean(axis=0)).std(axis=0).compute()
    np.testing.assert_allclose(got, data.astype("float64").std(axis=0), rtol=1e-4)
    ran = {t["worker"] for t in ts.data if "chunkfuse-batch" in str(t["key"])}
    assert len(ran) == 2, "the batches did not spread over both workers"
    assert work.is_dir(), "the scheduler did not use enabled()'s work directory"
    assert not any(work.iterdir()), "scratch or work left behind"
