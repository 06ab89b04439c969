"""dask.distributed clusters on 127.0.0.1 for the distributed tests: `client`, a 2-worker
LocalCluster (worker processes, one thread each, 2 GiB each), and `remote_client`, the same
with the scheduler in a process of its own. Import a fixture into a test module::

    from cluster_fixtures import client  # noqa: F401
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    import dask

    # Dask's scratch spaces (the workers', the client's) in the test's temporary folder.
    scratch = str(tmp_path_factory.mktemp("dask-scratch"))
    with dask.config.set({"temporary-directory": scratch}):
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            memory_limit="2GiB",
        )
        with cluster, distributed.Client(cluster) as c:
            yield c


@pytest.fixture(scope="module")
def remote_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A client of a cluster whose scheduler and two workers are processes of their own
    (`dask scheduler`, `dask worker`), as on a deployed cluster: the scheduler has none of
    the client's Dask config."""
    distributed = pytest.importorskip("distributed")
    folder = tmp_path_factory.mktemp("remote-cluster")
    scheduler_file = folder / "scheduler.json"
    dask_cli = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    worker_cli = [sys.executable, "-m", "distributed.cli.dask_worker"]
    logs = open(folder / "cluster.log", "wb")  # noqa: SIM115 (closed below)
    # Dask's scratch spaces (the workers') in the test's temporary folder.
    env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(folder / "dask-scratch")}
    started = [
        subprocess.Popen(
            [
                *dask_cli,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(scheduler_file),
            ],
            stdout=logs,
            stderr=logs,
            env=env,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline or started[0].poll() is not None:
                raise RuntimeError(f"dask scheduler did not start; see {folder / 'cluster.log'}")
            time.sleep(0.1)
        for _ in range(2):
            started.append(
                subprocess.Popen(
                    [
                        *worker_cli,
                        "--scheduler-file",
                        str(scheduler_file),
                        "--nthreads",
                        "1",
                        "--memory-limit",
                        "2GiB",
                        "--no-dashboard",
                        "--host",
                        "127.0.0.1",
                    ],
                    stdout=logs,
                    stderr=logs,
                    env=env,
                )
            )
        with distributed.Client(scheduler_file=str(scheduler_file)) as c:
            c.wait_for_workers(2, timeout=60)
            yield c
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        logs.close()
