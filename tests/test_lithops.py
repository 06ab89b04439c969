"""Lithops as a chunkfuse runtime, on its localhost backend: plans run as batches in Lithops'
worker processes equal the local engine's runs; a batch that fails for good gives one error
naming its stage, batch and chunk; Lithops' retries rerun a call that raised or whose
worker process was killed, and results come back as calls finish.

Lithops runs in a child process (this file run as a script) whose TMPDIR and HOME are a
temporary directory: everything its localhost backend writes (jobs, results, the runner it
installs, its cache) lands there and is removed with it, and the pytest process never imports
lithops. No process may outlive the child."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr

REPO = Path(__file__).resolve().parents[1]
#: The localhost backend with two worker processes; its data cleaner (a detached process
#: that deletes job data at exit) off: the whole directory goes instead.
LOCALHOST: dict[str, Any] = {
    "lithops": {"backend": "localhost", "storage": "localhost", "data_cleaner": False},
    "localhost": {"worker_processes": 2},
}
#: An AWS Lambda config: only resolved by Lithops (offline), never used to invoke anything.
LAMBDA: dict[str, Any] = {
    "lithops": {"backend": "aws_lambda", "storage": "aws_s3"},
    "aws_lambda": {
        "region": "us-east-1",
        "execution_role": "arn:aws:iam::123456789012:role/lithops",
        "runtime_memory": 2048,
        "worker_processes": 2,
    },
}
#: Seconds one child may run.
TIMEOUT = 240

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lithops") is None, reason="lithops is not installed"
)


@pytest.fixture(scope="module")
def era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ERA5-like (time, lat, lon), one chunk per step: over 64 MiB, so a reduction of its
    one output chunk runs as two tasks that batches split (then merged)."""
    out = tmp_path_factory.mktemp("era5") / "era5.zarr"
    args = ["--time", "144", "--lat", "181", "--lon", "720"]
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_era5.py"), str(out), *args],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture
def lithops_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The directory the child's Lithops writes under; after the test no process started
    with it is left, and it is removed."""
    root = tmp_path_factory.mktemp("lithops")
    (root / "tmp").mkdir()
    (root / "home").mkdir()
    yield root
    left = _processes_of(root)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(root)
    assert not left, f"processes left running by the Lithops child: {left}"


def _processes_of(root: Path) -> list[int]:
    """Processes whose environment names `root` (the child's and its descendants')."""
    mark = f"TMPDIR={root / 'tmp'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def in_child(root: Path, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs `steps` (see `_child`) in a child process with Lithops under `root`."""
    request = root / "request.json"
    answer = root / "answer.json"
    request.write_text(json.dumps({"steps": steps, "answer": str(answer)}))
    env = {**os.environ, "TMPDIR": str(root / "tmp"), "HOME": str(root / "home")}
    proc = subprocess.run(
        [sys.executable, __file__, str(request)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    # Everything Lithops wrote is under root: its temp dir was made there.
    assert (root / "tmp" / f"lithops-{os.environ.get('USER', 'root')}").is_dir()
    answers: list[dict[str, Any]] = json.loads(answer.read_text())
    return answers


def plan_step(plan: Path, params: dict[str, str], work_dir: Path) -> dict[str, Any]:
    return {
        "kind": "plan",
        "plan": str(plan),
        "params": params,
        "work_dir": str(work_dir),
        "max_mem": "256MB",
        # Two batches a stage (one per worker): few Lithops calls, each a new process.
        "batches_per_worker": 1,
    }


@pytest.mark.parametrize("name", ["era5-sum", "era5-anomaly"])
def test_lithops_run_equals_the_local_engine(
    era5: Path, lithops_root: Path, tmp_path: Path, name: str
) -> None:
    plan = REPO / "plans" / f"{name}.json"
    step = plan_step(plan, {"source": str(era5), "target": str(tmp_path / "l.zarr")}, tmp_path)
    (ran,) = in_child(lithops_root, [step])
    assert "error" not in ran, ran["error"]
    # Every batch ran in a Lithops worker process, not in the coordinator.
    assert ran["pids"] and ran["pid"] not in ran["pids"], ran
    # The reduction's one output chunk was split across batches and merged.
    assert any(s["merges"] for s in ran["stages"]), ran["stages"]
    assert ran["tasks"] == sum(s["tasks"] for s in ran["stages"])
    chunkfuse.run_plan(plan.read_text(), {"source": str(era5), "target": str(tmp_path / "r.zarr")})
    got = zarr.open_array(str(tmp_path / "l.zarr"), mode="r")[...]
    want = zarr.open_array(str(tmp_path / "r.zarr"), mode="r")[...]
    assert got.shape == want.shape and got.dtype == want.dtype
    # The merge adds the partial sums in another association: the results differ by float32
    # rounding at the scale of the values summed (an anomaly inherits its mean's, so near
    # zero it is no smaller).
    scale = float(np.abs(zarr.open_array(str(era5), mode="r")[...]).max())
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale)


def test_a_batch_that_fails_for_good_names_its_stage_batch_and_chunk(
    era5: Path, lithops_root: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src.zarr"
    shutil.copytree(era5, source)
    # Planning reads metadata only: the garbage is met by the batch that reads step 5.
    (source / "c" / "5" / "0" / "0").write_bytes(b"not a zstd frame" * 64)
    plan = REPO / "plans" / "era5-sum.json"
    params = {"source": str(source), "target": str(tmp_path / "out.zarr")}
    (ran,) = in_child(lithops_root, [plan_step(plan, params, tmp_path / "work")])
    error = ran.get("error")
    assert error is not None, ran
    assert error["type"] == "chunkfuse.distributed.batch.BatchFailed", error
    message = error["message"]
    assert message.startswith("job era5-sum: stage 0 (sum of y), batch "), message
    assert '"c/5/0/0"' in message and str(source) in message, message
    assert "tasks " in message, message


def test_retries_rerun_a_failed_or_killed_call_and_results_come_as_calls_finish(
    lithops_root: Path,
) -> None:
    marks = lithops_root / "marks"
    marks.mkdir()
    # Call 0 returns only once the others (call 2 on its second try) have: the order it comes
    # back in is the order calls finish, not the order they were given in.
    items = [
        {"value": 0, "marks": str(marks), "fail": "never", "after": [1, 2, 3]},
        {"value": 1, "marks": str(marks), "fail": "never", "after": []},
        {"value": 2, "marks": str(marks), "fail": "once", "after": []},
        {"value": 3, "marks": str(marks), "fail": "killed once", "after": []},
    ]
    always = {"value": 4, "marks": str(marks), "fail": "always", "after": []}
    retried, failed = in_child(
        lithops_root,
        [
            {"kind": "map", "items": items, "retries": 1},
            {"kind": "map", "items": [always], "retries": 2},
        ],
    )
    assert "error" not in retried, retried
    values = [r["value"] for r in retried["results"]]
    assert sorted(values) == [0, 1, 4, 9], values
    assert values[-1] == 0, values
    assert (marks / "2.attempts").read_text() == "xx"
    assert (marks / "1.attempts").read_text() == "x"
    # A worker process killed mid-call: Lithops reports the call failed, and it reruns.
    assert (marks / "3.attempts").read_text() == "xx"
    # Failed on every try: the function's error, named as the item that raised it.
    assert failed["error"]["type"] == "chunkfuse.distributed.batch.BatchFailed", failed
    assert "ValueError: item 4 fails" in failed["error"]["message"], failed
    assert "test-map" in failed["error"]["message"], failed
    assert (marks / "4.attempts").read_text() == "xxx"


def test_the_shape_comes_from_the_lithops_config(lithops_root: Path) -> None:
    memory = {**LOCALHOST, "localhost": {"worker_processes": 3, "runtime_memory": 512}}
    plain, sized, overridden, cloud = in_child(
        lithops_root,
        [
            {"kind": "shape", "config": LOCALHOST},
            {"kind": "shape", "config": memory},
            {"kind": "shape", "config": memory, "workers": 5, "memory_limit": 1 << 30},
            {"kind": "shape", "cloud": LAMBDA},
        ],
    )
    assert (plain["workers"], plain["threads"], plain["memory_limit"]) == (2, 1, None)
    assert (sized["workers"], sized["threads"], sized["memory_limit"]) == (3, 1, 512 << 20)
    assert (overridden["workers"], overridden["memory_limit"]) == (5, 1 << 30)
    # A cloud backend: its function concurrency (Lithops' default for Lambda), the calls
    # each function runs at once, and each function's memory.
    assert (cloud["workers"], cloud["threads"], cloud["memory_limit"]) == (1000, 2, 2048 << 20)


# --------------------------------------------------------------------------------------------
# The child: runs the steps of a request with Lithops, writes one answer per step.
# --------------------------------------------------------------------------------------------


def _flaky(item: dict[str, Any]) -> dict[str, Any]:
    """A map function for the retry test (pickled by value: it lives in `__main__`)."""
    marks = Path(item["marks"])
    value = int(item["value"])
    with open(marks / f"{value}.attempts", "a") as f:
        f.write("x")
    failed_once = marks / f"{value}.failed"
    if item["fail"] == "killed once" and not failed_once.exists():
        failed_once.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    if item["fail"] == "always" or (item["fail"] == "once" and not failed_once.exists()):
        failed_once.touch()
        raise ValueError(f"item {value} fails")
    deadline = time.monotonic() + 60
    while not all((marks / f"{other}.done").exists() for other in item["after"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"item {value}: items {item['after']} did not finish")
        time.sleep(0.05)
    if item["after"]:
        # The others' results reach the caller a moment after their marks: let them first.
        time.sleep(1.5)
    (marks / f"{value}.done").touch()
    return {"value": value * value, "pid": os.getpid()}


def _error(e: BaseException) -> dict[str, Any]:
    return {"error": {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)}}


def _step(step: dict[str, Any]) -> dict[str, Any]:
    from chunkfuse.distributed import run_distributed
    from chunkfuse.distributed.lithops_runtime import LithopsRuntime

    if step["kind"] == "shape" and "cloud" in step:
        from lithops.config import default_config

        # The config a FunctionExecutor for that backend would hold, without its clients.
        config = default_config(config_data=step["cloud"], load_storage_config=False)
        return asdict(LithopsRuntime(SimpleNamespace(config=config)).shape())
    if step["kind"] == "shape":
        options = {k: step[k] for k in ("workers", "memory_limit") if k in step}
        with LithopsRuntime(config=step["config"], **options) as runtime:
            return asdict(runtime.shape())
    with LithopsRuntime(config=LOCALHOST, retries=step.get("retries", 2)) as runtime:
        try:
            if step["kind"] == "map":
                return {"results": list(runtime.map(_flaky, step["items"], label="test-map"))}
            run = run_distributed(
                Path(step["plan"]).read_text(),
                step["params"],
                runtime=runtime,
                work_dir=step["work_dir"],
                max_mem=step["max_mem"],
                batches_per_worker=step["batches_per_worker"],
            )
        except Exception as e:
            return _error(e)
    return {
        "pid": os.getpid(),
        "pids": sorted({int(b["pid"]) for b in run.batches}),
        "stages": run.stages,
        "tasks": sum(int(b["tasks"]) for b in run.batches if b["merge"] is None),
    }


def _child(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    answers = [_step(step) for step in request["steps"]]
    Path(request["answer"]).write_text(json.dumps(answers))


if __name__ == "__main__":
    _child(sys.argv[1])
