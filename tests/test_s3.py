"""Object storage: the engine reads and writes Zarr on a loopback S3 server (moto behind a
fault-injecting proxy, tests/s3_server.py) through the same URLs everywhere: direct reads,
`chunkfuse info`, plans and rechunks. Results are checked against numpy and against
zarr-python reading what was written (downloaded from the server)."""

# ruff: noqa: F811  (pytest fixtures imported from s3_fixtures and used as arguments)
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import Cli, chunkfuse_bin_path
from s3_fixtures import s3_bucket, s3_env, s3_server  # noqa: F401
from s3_server import S3Server

SHAPE = (12, 30, 40)
CHUNKS = (1, 30, 40)


def sample(shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10 + 280).astype("float32")


def upload(server: S3Server, bucket: str, local: Path, prefix: str) -> int:
    """Copies every file under `local` to `prefix/...` in `bucket` (no faults); returns the
    number of objects."""
    client = server.client()
    n = 0
    for path in sorted(local.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            n += 1
    return n


def download(server: S3Server, bucket: str, prefix: str, local: Path) -> list[str]:
    """Copies every object under `prefix/` to `local`; returns the keys (relative)."""
    client = server.client()
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/"
    ):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix) + 1 :]
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
            keys.append(rel)
    return sorted(keys)


@pytest.fixture
def source(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_env: dict[str, str]
) -> tuple[str, np.ndarray]:
    """A zstd Zarr v3 array on the server, and its values."""
    data = sample()
    zarr.create_array(str(tmp_path / "src.zarr"), data=data, chunks=CHUNKS)
    upload(s3_server, s3_bucket, tmp_path / "src.zarr", "data/src.zarr")
    s3_server.reset_stats()
    return f"s3://{s3_bucket}/data/src.zarr", data


def test_direct_reads_from_s3(source: tuple[str, np.ndarray], s3_server: S3Server) -> None:
    url, data = source
    np.testing.assert_array_equal(chunkfuse.read(url), data)
    # Whole chunks come in plain GETs, one per chunk, and no HEAD per read (the metadata
    # documents of v3 and v2 are asked for at once: one round trip).
    log = s3_server.request_log
    chunk_gets = sorted(p for m, p, _ in log if m == "GET" and "/c/" in p)
    assert len(chunk_gets) == len(set(chunk_gets)) == SHAPE[0], log
    assert all(m == "GET" for m, _, _ in log), log
    sel = (slice(2, 9, 3), 7, slice(None, None, -5))
    np.testing.assert_array_equal(chunkfuse.read(url, sel), data[sel])
    starts = np.array([[0, 0, 0], [8, 20, 30], [3, 5, 7]])
    windows = chunkfuse.read_windows(url, starts, (4, 10, 10))
    for w, (a, b, c) in zip(windows, starts, strict=True):
        np.testing.assert_array_equal(w, data[a : a + 4, b : b + 10, c : c + 10])


def test_info_and_plans_over_s3(
    source: tuple[str, np.ndarray], s3_server: S3Server, s3_bucket: str, cli: Cli, tmp_path: Path
) -> None:
    url, data = source
    info = cli("info", url, "--json").json()
    assert info["shape"] == list(SHAPE), info
    # A plan reading from S3 and writing to S3: sum((x + 1) * 2, axis=0).
    target = f"s3://{s3_bucket}/out/sum.zarr"
    cli.run_plan(
        Path(__file__).resolve().parents[1] / "plans" / "era5-sum.json",
        {"source": url, "target": target},
        max_mem="256MB",
    )
    download(s3_server, s3_bucket, "out/sum.zarr", tmp_path / "sum.zarr")
    got = zarr.open_array(str(tmp_path / "sum.zarr"))[:]
    want = ((data.astype("float64") + 1) * 2).sum(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_s3_array_two_stages_read_is_fetched_once(
    source: tuple[str, np.ndarray], s3_server: S3Server, cli: Cli, tmp_path: Path
) -> None:
    """The anomaly reads x for its time mean, then again to subtract it: the first stage
    keeps the chunks it decodes for the second, so each is fetched once. Under a budget too
    small to keep them all, those it cannot keep are fetched twice, none more often."""
    url, data = source
    plan = Path(__file__).resolve().parents[1] / "plans" / "era5-anomaly.json"
    want = data - data.astype("float64").mean(axis=0, keepdims=True)

    def chunk_gets(max_mem: str, name: str) -> list[str]:
        s3_server.reset_stats()
        target = tmp_path / name
        cli.run_plan(plan, {"source": url, "target": str(target)}, max_mem=max_mem)
        np.testing.assert_allclose(zarr.open_array(str(target))[:], want, rtol=0, atol=1e-4)
        return [p for m, p, _ in s3_server.request_log if m == "GET" and "/c/" in p]

    held = chunk_gets("256MB", "held.zarr")
    assert len(held) == len(set(held)) == SHAPE[0], held
    # x is 57,600 bytes: a quarter of a 200 kB budget cannot keep its chunks.
    twice = chunk_gets("200kB", "twice.zarr")
    assert SHAPE[0] < len(twice) <= 2 * SHAPE[0] and len(set(twice)) == SHAPE[0], twice
    assert max(twice.count(p) for p in twice) == 2, twice


def test_rechunk_s3_to_s3_under_faults(
    source: tuple[str, np.ndarray], s3_server: S3Server, s3_bucket: str, cli: Cli, tmp_path: Path
) -> None:
    """A fifth of all requests answer 500 or drop the connection: retries keep the result
    exact."""
    url, data = source
    target = f"s3://{s3_bucket}/out/rechunked.zarr"
    s3_server.set_faults(0.2, seed=7)
    cli("rechunk", url, target, "--chunks", "12,10,8", "--max-mem", "64MB")
    faults = s3_server.fault_count
    s3_server.set_faults(0)
    assert faults > 0, "no fault was injected"
    keys = download(s3_server, s3_bucket, "out/rechunked.zarr", tmp_path / "r.zarr")
    arr = zarr.open_array(str(tmp_path / "r.zarr"))
    assert arr.chunks == (12, 10, 8)
    np.testing.assert_array_equal(arr[:], data)
    assert "zarr.json" in keys
    # Direct reads under faults too.
    s3_server.set_faults(0.2, seed=8)
    np.testing.assert_array_equal(chunkfuse.read(target), data)


def test_missing_array_and_denied_access_name_the_url(
    source: tuple[str, np.ndarray], s3_bucket: str, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    url, _ = source
    missing = f"s3://{s3_bucket}/nothing/here.zarr"
    with pytest.raises(OSError, match="nothing/here.zarr"):
        chunkfuse.read(missing)
    r = cli("info", missing, expect_rc=None)
    assert r.returncode != 0 and "nothing/here.zarr" in r.stderr, r.describe()
    # Without credentials requests go unsigned, and this server refuses unsigned GETs.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(OSError, match="403") as err:
        chunkfuse.read(url)
    assert "data/src.zarr" in str(err.value)


def test_server_stopped_mid_rechunk_leaves_whole_chunks_and_a_rerun_finishes(
    source: tuple[str, np.ndarray], s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The server dies while a rechunk writes: the job fails with a clear error naming the
    store; every target chunk is whole or absent; once the server is back, rerunning the same
    command completes the job."""
    url, data = source
    target = f"s3://{s3_bucket}/out/killed.zarr"
    env = {**os.environ, "CHUNKFUSE_IO_RETRIES": "1", "CHUNKFUSE_IO_RETRY_TIMEOUT_S": "2"}
    args = [
        str(chunkfuse_bin_path()),
        "rechunk",
        url,
        target,
        "--chunks",
        "12,5,5",
        "--max-mem",
        "64MB",
        "--threads",
        "1",
    ]
    s3_server.reset_stats()
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stopper = threading.Thread(target=_stop_after_writes, args=(s3_server, proc, 10))
    stopper.start()
    out, err = proc.communicate(timeout=120)
    stopper.join()
    assert proc.returncode != 0, (out, err)
    assert "127.0.0.1" in err or "s3://" in err, err
    s3_server.start_backend()
    keys = download(s3_server, s3_bucket, "out/killed.zarr", tmp_path / "k.zarr")
    chunk_keys = [k for k in keys if k.startswith("c/")]
    assert len(chunk_keys) < 48, "the run finished before the server stopped"
    local = tmp_path / "k.zarr"
    if (local / "zarr.json").exists():
        arr = zarr.open_array(str(local))
        for key in chunk_keys:
            idx = tuple(int(i) for i in key.split("/")[1:])
            sel = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, arr.chunks, strict=True))
            np.testing.assert_array_equal(arr[sel], data[sel])
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    np.testing.assert_array_equal(chunkfuse.read(target), data)


def test_a_server_back_within_the_retry_window_goes_unnoticed(
    source: tuple[str, np.ndarray], s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The server is down for two seconds while a rechunk writes: with the default retries
    (tries until the window of 20 s ends), the run rides it out and the result is exact."""
    url, data = source
    target = f"s3://{s3_bucket}/out/outage.zarr"
    env = {k: v for k, v in os.environ.items() if k != "CHUNKFUSE_IO_RETRIES"}
    args = [str(chunkfuse_bin_path()), "rechunk", url, target, "--chunks", "12,5,5"]
    args += ["--max-mem", "64MB", "--threads", "1"]
    s3_server.reset_stats()
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stopper = threading.Thread(target=_stop_after_writes, args=(s3_server, proc, 10))
    stopper.start()
    stopper.join()
    stopped = not s3_server.backend_running
    time.sleep(2)
    s3_server.start_backend()
    out, err = proc.communicate(timeout=120)
    assert stopped, "the run finished before the server stopped"
    assert proc.returncode == 0, (out, err)
    np.testing.assert_array_equal(chunkfuse.read(target), data)


def _stop_after_writes(server: S3Server, proc: subprocess.Popen[Any], writes: int) -> None:
    """Stops the backend once the proxy has seen `writes` chunk PUTs (or the process ends)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        puts = sum(1 for m, p, _ in server.request_log if m == "PUT" and "/c/" in p)
        if puts >= writes:
            server.stop_backend()
            return
        time.sleep(0.01)


def test_cubed_and_dask_arrays_opened_from_s3_run_natively(
    source: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    """Arrays zarr-python opens from s3:// (through fsspec) are read by the engine itself."""
    import cubed
    import cubed.array_api as xp
    import dask.array as da
    from chunkfuse import RustExecutor
    from chunkfuse.dask import get, last_stats

    url, data = source
    want = ((data.astype("float64") + 1) * 2).sum(axis=0)
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="200MB")
    x = cubed.from_zarr(url, spec=spec)
    executor = RustExecutor()
    got = xp.sum((x + 1) * 2, axis=0).compute(executor=executor)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    stats = executor.last_stats
    assert stats.native_tasks > 0 and stats.python_tasks == 0, stats

    y = da.from_zarr(url)
    got = ((y + 1) * 2).sum(axis=0).compute(scheduler=get)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    s = last_stats()
    assert s.native_tasks > 0 and s.python_tasks == 0, s


def test_small_windows_of_sharded_arrays_read_only_their_inner_chunks(
    s3_server: S3Server, s3_bucket: str, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """One ranged GET for each shard's index (its last bytes), then ranged GETs of just the
    inner chunks wanted: no whole shard, no HEAD."""
    data = sample((4, 40, 60), seed=3)
    zarr.create_array(str(tmp_path / "s.zarr"), data=data, chunks=(1, 10, 10), shards=(4, 40, 60))
    upload(s3_server, s3_bucket, tmp_path / "s.zarr", "s.zarr")
    url = f"s3://{s3_bucket}/s.zarr"
    reader = chunkfuse.ArrayReader(url)
    s3_server.reset_stats()
    got = chunkfuse.read_windows(reader, [[1, 12, 25], [2, 0, 0]], (2, 5, 5))
    np.testing.assert_array_equal(got[0], data[1:3, 12:17, 25:30])
    np.testing.assert_array_equal(got[1], data[2:4, 0:5, 0:5])
    log = s3_server.request_log
    assert all(m == "GET" and r is not None for m, _, r in log), log
    # The index (bytes=-N) and four inner chunks, which object_store may coalesce.
    assert any(r.startswith("bytes=-") for _, _, r in log if r), log
    assert 2 <= len(log) <= 5, log


def test_a_job_run_in_batches_keeps_its_work_directory_on_s3(
    source: tuple[str, np.ndarray], s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Intermediates and partial states of a job run in batches go to a work directory given
    as an s3:// URL (what every worker of a cluster sees), and are removed when it finishes."""
    from chunkfuse.distributed import LocalRuntime, run_distributed

    url, data = source
    plan = {
        "name": "anomaly",
        "arrays": [{"id": "x", "zarr": url}],
        "ops": [
            {
                "id": "m",
                "op": "reduce",
                "input": "x",
                "func": "mean",
                "axes": [0],
                "keepdims": True,
            },
            {
                "id": "a",
                "op": "elementwise",
                "inputs": ["x", "m"],
                "expr": {"op": "subtract", "args": [{"input": 0}, {"input": 1}]},
            },
            {"id": "out", "op": "write", "input": "a", "target": f"s3://{s3_bucket}/out/a.zarr"},
        ],
    }
    run = run_distributed(
        plan,
        runtime=LocalRuntime(3),
        work_dir=f"s3://{s3_bucket}/work",
        max_mem="16MB",
    )
    assert any(s["merges"] for s in run.stages) or len(run.batches) > 2, run.stages
    download(s3_server, s3_bucket, "out/a.zarr", tmp_path / "a.zarr")
    got = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]
    np.testing.assert_allclose(got, data - data.mean(axis=0, keepdims=True), atol=1e-3)
    assert download(s3_server, s3_bucket, "work", tmp_path / "work") == []
