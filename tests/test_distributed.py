"""chunkfuse jobs as batches on dask.distributed (a 2-worker LocalCluster on 127.0.0.1) and
on threads of this process: results equal the local engine's for every plan in plans/ and
for mean and var; a killed worker's batches rerun elsewhere and the result is exact; a batch
that fails for good raises one error naming its stage, batch and chunk; a budget the
workers cannot hold and a lost client are refused with clear errors."""
# ruff: noqa: F811  (the cluster fixture imported from cluster_fixtures and used as an argument)

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
from chunkfuse.distributed import BatchFailed, LocalRuntime, run_distributed
from chunkfuse.distributed.coordinator import ClusterTooSmall
from cluster_fixtures import client  # noqa: F401
from conftest import REPO, assert_no_partial_files

distributed = pytest.importorskip("distributed")
from chunkfuse.distributed.dask_runtime import DaskRuntime, LostCluster  # noqa: E402

PLANS = sorted((REPO / "plans").glob("*.json"))


def reduce_plan(func: str) -> str:
    return json.dumps(
        {
            "name": f"era5-{func}",
            "arrays": [{"id": "x", "zarr": "${source}"}],
            "ops": [
                {"id": "r", "op": "reduce", "input": "x", "func": func, "axes": [0]},
                {"id": "out", "op": "write", "input": "r", "target": "${target}"},
            ],
        }
    )


@pytest.fixture(scope="module")
def era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("era5") / "era5.zarr"
    args = ["--time", "24", "--lat", "91", "--lon", "180"]
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_era5.py"), str(out), *args],
        check=True,
        capture_output=True,
    )
    return out


def local_result(plan: str, era5: Path, target: Path) -> np.ndarray:
    chunkfuse.run_plan(plan, {"source": str(era5), "target": str(target)}, threads=2)
    return np.asarray(zarr.open_array(str(target), mode="r")[...])


def plan_text(plan: Path | str) -> str:
    return plan.read_text() if isinstance(plan, Path) else plan


CASES = [(p.stem, p) for p in PLANS] + [(f"era5-{f}", reduce_plan(f)) for f in ("mean", "var")]


@pytest.mark.parametrize("name,plan", CASES, ids=[c[0] for c in CASES])
def test_plans_on_a_local_cluster_equal_the_local_engine(
    client: Any, era5: Path, tmp_path: Path, name: str, plan: Path | str
) -> None:
    text = plan_text(plan)
    want = local_result(text, era5, tmp_path / "local.zarr")
    target = tmp_path / "dist.zarr"
    run = run_distributed(
        text,
        {"source": str(era5), "target": str(target)},
        runtime=DaskRuntime(client),
        work_dir=str(tmp_path / "work"),
        max_mem="256MB",
    )
    got = zarr.open_array(str(target), mode="r")
    assert "_chunkfuse_job" not in dict(got.attrs), "the job was not finished"
    if name == "era5-rechunk":
        np.testing.assert_array_equal(got[...], want)
    else:
        # Batches merge partial states in another association than one process's groups:
        # float32 rounding of values the size of the source's.
        scale = float(np.abs(zarr.open_array(str(era5), mode="r")[...]).max())
        np.testing.assert_allclose(got[...], want, rtol=2e-6, atol=4e-7 * scale)
    # Batches ran in both worker processes, each within its budget plus the interpreter.
    pids = {b["pid"] for b in run.batches}
    assert len(pids) == 2 or len(run.batches) == 1, run.batches
    assert sum(b["tasks"] for b in run.batches if b["merge"] is None) == sum(
        s["tasks"] for s in run.stages
    )
    work = tmp_path / "work"
    assert not work.exists() or not list(work.iterdir()), "the work directory was left behind"
    assert_no_partial_files(target)


def test_a_reduction_to_one_chunk_is_spread_over_the_workers_and_merged(
    client: Any, era5: Path, tmp_path: Path
) -> None:
    plan = (REPO / "plans" / "era5-sum.json").read_text()
    run = run_distributed(
        plan,
        {"source": str(era5), "target": str(tmp_path / "s.zarr")},
        runtime=DaskRuntime(client),
        work_dir=str(tmp_path),
        max_mem="64MB",
    )
    (stage,) = run.stages
    assert stage["batches"] >= 2 and stage["merges"] == 1, stage
    # The batch that finished last found every partial state and merged the chunk itself
    # (two that finish together may both do so): no merge round.
    assert stage["merged_by_batches"] == 1, stage
    assert {p for b in run.batches for p in b["merged"]} == {0}, run.batches
    assert all(b["merge"] is None for b in run.batches), run.batches
    assert len({b["pid"] for b in run.batches if b["merge"] is None}) == 2
    for (_, pid), peak in run.peak_rss().items():
        # The engine's budget plus the worker's own interpreter and Dask.
        assert peak < 64e6 + 400e6, (pid, peak)


def test_local_runtime_and_results_independent_of_the_worker_count(
    era5: Path, tmp_path: Path
) -> None:
    plan = reduce_plan("var")
    out = []
    for workers in (1, 3):
        target = tmp_path / f"w{workers}.zarr"
        run_distributed(
            plan,
            {"source": str(era5), "target": str(target)},
            runtime=LocalRuntime(workers),
            work_dir=str(tmp_path),
            max_mem="64MB",
            batches_per_worker=2,
        )
        out.append(zarr.open_array(str(target), mode="r")[...])
    want = local_result(plan, era5, tmp_path / "local.zarr")
    for got in out:
        np.testing.assert_allclose(got, want, rtol=1e-5)


class KillingRuntime:
    """DaskRuntime that kills (SIGKILL) the worker process that returned the `after`-th
    result of the run (counted over its rounds), while other batches run or wait."""

    def __init__(self, runtime: DaskRuntime, after: int) -> None:
        self.runtime, self.after, self.name = runtime, after, "dask"
        self.killed: list[int] = []
        self.seen = 0

    def shape(self) -> Any:
        return self.runtime.shape()

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], *, label: str) -> Iterator[Any]:
        for result in self.runtime.map(fn, items, label=label):
            if not self.killed and self.seen == self.after:
                os.kill(int(result["pid"]), signal.SIGKILL)
                self.killed.append(int(result["pid"]))
            self.seen += 1
            yield result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_worker_killed_mid_stage_changes_nothing(
    client: Any, era5: Path, tmp_path: Path, seed: int
) -> None:
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    opts = {"work_dir": str(tmp_path / "work"), "max_mem": "64MB", "batches_per_worker": 6}
    client.wait_for_workers(2)
    calm = tmp_path / "calm.zarr"
    params = {"source": str(era5)}
    run_distributed(plan, {**params, "target": str(calm)}, runtime=DaskRuntime(client), **opts)
    killer = KillingRuntime(DaskRuntime(client, retries=3), after=seed)
    killed = tmp_path / "killed.zarr"
    run = run_distributed(plan, {**params, "target": str(killed)}, runtime=killer, **opts)
    assert killer.killed, "no worker was killed"
    assert run.summary["outputs"], run.summary
    # Exact: the same batches, merged in the same order, whoever ran them.
    np.testing.assert_array_equal(
        zarr.open_array(str(killed), mode="r")[...], zarr.open_array(str(calm), mode="r")[...]
    )
    assert_no_partial_files(killed)
    client.wait_for_workers(2)


def test_a_backup_copy_that_lost_is_waited_for_before_the_job_finishes(
    client: Any, tmp_path: Path
) -> None:
    """A straggler's backup copy finishes first and ends the round; the original keeps
    running (Dask cannot stop it), and `settle` waits for it: the job must not finish, and
    remove the intermediates, under a copy still reading them."""
    marker = str(tmp_path / "slow-once")

    def slow_once(item: int) -> int:
        import os
        import time

        if item == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(4.0)
        else:
            time.sleep(0.05)
        return item

    client.wait_for_workers(2)
    runtime = DaskRuntime(client)
    assert sorted(runtime.map(slow_once, list(range(6)), label="slow")) == list(range(6))
    # The slow original, and any batch queued behind it on its worker, whose copies won.
    left = {f.key.rsplit("-", 2)[1] for f in runtime._stragglers}
    assert "0" in left, "the round ended without the copy that lost"
    assert not runtime.settle(0.1)
    assert runtime.settle(30.0)
    assert runtime._stragglers == [] and runtime.settle(0.1)


def test_a_batch_that_fails_for_good_names_its_stage_batch_and_chunk(
    client: Any, era5: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src.zarr"
    subprocess.run(["cp", "-r", str(era5), str(source)], check=True)
    chunk = sorted((source / "c").rglob("*"))[-1]
    chunk.write_bytes(b"not a zstd frame")
    plan = (REPO / "plans" / "era5-sum.json").read_text()
    target = tmp_path / "out.zarr"
    with pytest.raises(BatchFailed) as info:
        run_distributed(
            plan,
            {"source": str(source), "target": str(target)},
            runtime=DaskRuntime(client, retries=0),
            work_dir=str(tmp_path / "work"),
            max_mem="64MB",
        )
    text = str(info.value)
    key = "/".join(chunk.relative_to(source).parts)
    assert "job era5-sum: stage 0 (sum of y), batch " in text, text
    assert key in text, text
    assert not (target / "c").exists() or not any((target / "c").rglob("*"))


def test_a_budget_the_workers_cannot_hold_is_refused_before_anything_runs(
    client: Any, era5: Path, tmp_path: Path
) -> None:
    target = tmp_path / "out.zarr"
    with pytest.raises(ClusterTooSmall, match="does not fit its workers"):
        run_distributed(
            (REPO / "plans" / "era5-sum.json").read_text(),
            {"source": str(era5), "target": str(target)},
            runtime=DaskRuntime(client),
            work_dir=str(tmp_path),
            max_mem="8GB",
        )
    assert not target.exists()


def test_a_lost_client_is_a_clear_error(era5: Path, tmp_path: Path) -> None:
    cluster = distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        dashboard_address=":0",
        local_directory=str(tmp_path / "dask"),
    )
    c = distributed.Client(cluster)
    runtime = DaskRuntime(c)
    runtime.shape()
    c.close()
    cluster.close()
    with pytest.raises(LostCluster, match="dask:"):
        run_distributed(
            (REPO / "plans" / "era5-sum.json").read_text(),
            {"source": str(era5), "target": str(tmp_path / "out.zarr")},
            runtime=runtime,
            work_dir=str(tmp_path),
            max_mem="64MB",
        )


def test_a_run_interrupted_by_a_failure_resumes(client: Any, era5: Path, tmp_path: Path) -> None:
    """A batch that failed leaves the job unfinished; the rerun keeps what was written."""
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    target = tmp_path / "out.zarr"
    params = {"source": str(era5), "target": str(target)}
    calls = {"n": 0}
    lock = threading.Lock()

    class FailingOnce(LocalRuntime):
        def map(self, fn: Callable[[Any], Any], items: Sequence[Any], *, label: str) -> Any:
            with lock:
                calls["n"] += 1
                n = calls["n"]
            if n == 2:
                raise RuntimeError("the cluster went away")
            return super().map(fn, items, label=label)

    with pytest.raises(RuntimeError, match="went away"):
        run_distributed(
            plan, params, runtime=FailingOnce(2), work_dir=str(tmp_path), max_mem="64MB"
        )
    run_distributed(plan, params, runtime=LocalRuntime(2), work_dir=str(tmp_path), max_mem="64MB")
    want = local_result(plan, era5, tmp_path / "local.zarr")
    np.testing.assert_allclose(zarr.open_array(str(target), mode="r")[...], want, rtol=1e-5)


def test_a_rerun_skips_the_tasks_a_failed_run_wrote(era5: Path, tmp_path: Path) -> None:
    """A run that fails halfway through the stage that writes its target leaves half the
    target's chunks; the rerun's batches skip the tasks that wrote them (and only those) and
    the result equals the local engine's. A first run skips nothing."""
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    target = tmp_path / "out.zarr"
    params = {"source": str(era5), "target": str(target)}
    work = str(tmp_path / "work")

    class FailingInTheLastStage(LocalRuntime):
        def map(self, fn: Callable[[Any], Any], items: Sequence[Any], *, label: str) -> Any:
            if label.endswith(f"stage{last}"):
                list(super().map(fn, list(items)[: len(items) // 2], label=label))
                raise RuntimeError("the cluster went away")
            return super().map(fn, items, label=label)

    first = run_distributed(plan, params, runtime=LocalRuntime(2), work_dir=work, max_mem="64MB")
    assert not any(s["resumed"] or s["tasks_done_before"] for s in first.stages), first.stages
    last = len(first.stages) - 1
    target_tasks = int(first.stages[last]["tasks"])
    import shutil

    shutil.rmtree(target)
    with pytest.raises(RuntimeError, match="went away"):
        run_distributed(
            plan, params, runtime=FailingInTheLastStage(2), work_dir=work, max_mem="64MB"
        )
    rerun = run_distributed(plan, params, runtime=LocalRuntime(2), work_dir=work, max_mem="64MB")
    stage = rerun.stages[last]
    assert stage["resumed"] and 0 < stage["tasks_done_before"] < target_tasks, rerun.stages
    assert stage["tasks"] == target_tasks
    want = local_result(plan, era5, tmp_path / "local.zarr")
    np.testing.assert_allclose(zarr.open_array(str(target), mode="r")[...], want, rtol=1e-5)


CTRL_C_CHILD = """
import sys
import distributed
from chunkfuse.distributed import run_distributed
from chunkfuse.distributed.dask_runtime import DaskRuntime

plan, source, target, work = sys.argv[1:5]
said = []


def progress(done, total):
    if not said:
        said.append(1)
        print("mid-run", flush=True)


if __name__ == "__main__":
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0",
        local_directory=work + "-dask",
    ) as cluster, distributed.Client(cluster) as c:
        try:
            run_distributed(plan, {"source": source, "target": target}, runtime=DaskRuntime(c),
                            work_dir=work, max_mem="64MB", batches_per_worker=64,
                            progress=progress)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
        print("finished", flush=True)
"""


def test_ctrl_c_stops_a_distributed_run_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    """SIGINT while batches run on a cluster: the coordinator stops at once (its pending
    batches cancelled, the cluster closed), and a rerun finishes the job exactly."""
    data = np.random.default_rng(5).standard_normal((256, 91, 180)).astype("float32")
    source = str(tmp_path / "x.zarr")
    zarr.create_array(source, shape=data.shape, chunks=(1, 91, 180), dtype="float32")[...] = data
    plan = reduce_plan("var")
    target, work = str(tmp_path / "out.zarr"), str(tmp_path / "work")
    script = tmp_path / "child.py"
    script.write_text(CTRL_C_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), plan, source, target, work],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if line.startswith("mid-run"):
            child.send_signal(signal.SIGINT)
            break
    try:
        rest, _ = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the run did not stop within 60 s of Ctrl-C")
    said = "".join(lines) + rest
    assert "interrupted" in said and "finished" not in said, said[-3000:]
    assert child.returncode != 0
    run_distributed(
        plan,
        {"source": source, "target": target},
        runtime=LocalRuntime(2),
        work_dir=work,
        max_mem="64MB",
    )
    got = zarr.open_array(target, mode="r")[...]
    np.testing.assert_allclose(got, data.astype("float64").var(axis=0), rtol=1e-4, atol=1e-6)
    assert not any(Path(work).iterdir()), "the interrupted job's work was left behind"


def test_a_rechunk_read_in_bands_runs_a_batch_per_band_group(tmp_path: Path) -> None:
    """At a budget where the local engine reads the ERA5 rechunk in bands (the source held a
    band of rows at a time for all the tasks that read it), each batch is whole band groups
    and holds their bands as the whole run does; a range that cuts a group is refused."""
    source = tmp_path / "era5-16.zarr"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_era5.py"), str(source), "--time", "16"],
        check=True,
        capture_output=True,
    )
    plan = (REPO / "plans" / "era5-rechunk.json").read_text()
    local = chunkfuse.run_plan(
        plan,
        {"source": str(source), "target": str(tmp_path / "local.zarr")},
        max_mem="64MB",
        threads=1,
    )
    assert [s["strategy"] for s in local["stages"]] == ["bands"], local["stages"]
    target = tmp_path / "dist.zarr"
    run = run_distributed(
        plan,
        {"source": str(source), "target": str(target)},
        runtime=LocalRuntime(2),
        work_dir=str(tmp_path / "work"),
        max_mem="64MB",
        threads=1,
    )
    (stage,) = run.stages
    assert stage["batches"] >= 2 and stage["merges"] == 0, stage
    got = zarr.open_array(str(target), mode="r")
    assert got.chunks == zarr.open_array(str(tmp_path / "local.zarr"), mode="r").chunks
    np.testing.assert_array_equal(got[...], zarr.open_array(str(source), mode="r")[...])
    job = chunkfuse._engine.Job.prepare(
        plan,
        {"source": str(source), "target": str(tmp_path / "cut.zarr")},
        64_000_000,
        1,
        str(tmp_path / "work"),
    )
    first = json.loads(job.cut(0, 8))["batches"][0]
    with pytest.raises(ValueError, match="whole band groups"):
        job.run_batch(0, first[0], first[1] - 1)
