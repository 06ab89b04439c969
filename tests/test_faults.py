"""The storage faults matrix (issue 38): a rechunk through faults of the loopback S3 server
(tests/s3_server.py) and of local disk (a full tmpfs, a read-only one, intermediates removed
mid-run). Each case ends with the exact result or one clear error naming the URL or path,
and nothing half-written: every chunk in the target equals the source's values there.

With ``CHUNKFUSE_FAULTS_REPORT=FILE`` each case appends a JSON line to FILE (`make
reliability` renders them into docs/reliability.md)."""

# ruff: noqa: F811  (pytest fixtures imported from s3_fixtures and used as arguments)
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import chunkfuse_bin_path
from s3_fixtures import s3_bucket, s3_env, s3_server  # noqa: F401
from s3_server import S3Server
from test_s3 import download, upload

SHAPE = (12, 64, 128)  # 384 KiB of float32, 12 source chunks
TARGET_CHUNKS = "12,16,16"  # 32 target chunks
Record = Callable[..., None]


@pytest.fixture
def record() -> Iterator[Record]:
    """Appends the case's outcome to $CHUNKFUSE_FAULTS_REPORT when set."""
    report = os.environ.get("CHUNKFUSE_FAULTS_REPORT")
    started = time.perf_counter()

    def write(storage: str, fault: str, operation: str, outcome: str, error: str = "") -> None:
        if not report:
            return
        line = {
            "storage": storage,
            "fault": fault,
            "operation": operation,
            "outcome": outcome,
            "error": error.strip(),
            "half_written": False,  # a case that finds a half-written chunk fails before this
            "seconds": round(time.perf_counter() - started, 2),
            **json.loads(os.environ.get("CHUNKFUSE_FAULTS_STAMP", "{}")),
        }
        with open(report, "a") as f:
            f.write(json.dumps(line) + "\n")

    yield write


def values() -> np.ndarray:
    return np.random.default_rng(38).standard_normal(SHAPE).astype("float32")


def assert_whole_chunks(local: Path, data: np.ndarray) -> int:
    """Every chunk of the target at `local` holds the source's values; returns how many."""
    if not (local / "zarr.json").exists():
        assert not any(p.is_file() for p in local.rglob("*")), "chunks without metadata"
        return 0
    arr = zarr.open_array(str(local), mode="r")
    chunks = [p for p in (local / "c").rglob("*") if p.is_file()] if (local / "c").exists() else []
    for p in chunks:
        assert ".partial-" not in p.name, f"temporary left: {p}"
        idx = tuple(int(i) for i in p.relative_to(local / "c").parts)
        sel = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, arr.chunks, strict=True))
        np.testing.assert_array_equal(arr[sel], data[sel])
    return len(chunks)


def rechunk_args(source: str, target: str, *more: str) -> list[str]:
    return [
        str(chunkfuse_bin_path()), "rechunk", source, target, "--chunks", TARGET_CHUNKS,
        "--max-mem", "64MB", "--threads", "2", *more,
    ]  # fmt: skip


# -- the loopback S3 server ------------------------------------------------------------------

#: (fault, kinds, share of requests, CLI options, what must happen: "exact" or a text the
#: error names).
S3_CASES: list[tuple[str, tuple[str, ...], float, list[str], str]] = [
    ("500 and 503 bursts (30% of requests)", ("500", "503"), 0.3, [], "exact"),
    ("dropped connections (30%)", ("drop",), 0.3, [], "exact"),
    ("slow responses (30%, 0.3 s each)", ("slow",), 0.3, [], "exact"),
    ("stalls (10% held 2 s; 1 s timeout)", ("stall",), 0.1, ["--io-timeout", "1"], "exact"),
    ("truncated bodies (30% of requests)", ("truncate",), 0.3, [], "exact"),
    (
        "a stalled server (every request)",
        ("stall",),
        1.0,
        ["--io-timeout", "1", "--io-retry-timeout", "3"],
        "s3://",
    ),  # fmt: skip
    ("403 AccessDenied (every request)", ("403",), 1.0, [], "403"),
]


@pytest.mark.parametrize(
    ("fault", "kinds", "rate", "options", "want"), S3_CASES, ids=[c[0] for c in S3_CASES]
)
def test_s3_faults_end_exact_or_in_one_clear_error(
    fault: str,
    kinds: tuple[str, ...],
    rate: float,
    options: list[str],
    want: str,
    s3_server: S3Server,
    s3_bucket: str,
    s3_env: dict[str, str],
    tmp_path: Path,
    record: Record,
) -> None:
    data = values()
    zarr.create_array(str(tmp_path / "src.zarr"), data=data, chunks=(1, *SHAPE[1:]))
    upload(s3_server, s3_bucket, tmp_path / "src.zarr", "src.zarr")
    source, target = f"s3://{s3_bucket}/src.zarr", f"s3://{s3_bucket}/out.zarr"
    s3_server.stall_seconds = 2.0
    s3_server.set_faults(rate, kinds=kinds, seed=38)
    try:
        run = subprocess.run(
            rechunk_args(source, target, *options),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        injected = s3_server.fault_count
        s3_server.set_faults(0)
    assert injected > 0, "no fault was injected"
    download(s3_server, s3_bucket, "out.zarr", tmp_path / "out.zarr")
    written = assert_whole_chunks(tmp_path / "out.zarr", data)
    if want == "exact":
        assert run.returncode == 0, run.stderr
        assert written == 32
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"))[...], data)
        record("s3 (loopback)", fault, "CLI rechunk", f"exact ({injected} faults)")
    else:
        assert run.returncode != 0, "the run did not fail"
        error = run.stderr.strip()
        assert want in error and "src.zarr" in error, error
        assert error.count("\n") < 5, f"one error, not a cascade: {error}"
        record("s3 (loopback)", fault, "CLI rechunk", "clear error", error)


def test_a_missing_source_on_s3_is_one_error_naming_its_url(
    s3_server: S3Server, s3_bucket: str, s3_env: dict[str, str], record: Record
) -> None:
    source, target = f"s3://{s3_bucket}/nothing/here.zarr", f"s3://{s3_bucket}/out.zarr"
    run = subprocess.run(rechunk_args(source, target), capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "nothing/here.zarr" in run.stderr, run.stderr
    client = s3_server.client()
    assert "Contents" not in client.list_objects_v2(Bucket=s3_bucket, Prefix="out.zarr")
    record("s3 (loopback)", "404: the source is missing", "CLI rechunk", "clear error",
           run.stderr)  # fmt: skip


# -- local disk --------------------------------------------------------------------------------


def in_a_tmpfs(
    mount: Path, options: str, command: list[str], keep: Path
) -> subprocess.CompletedProcess[str]:
    """Runs `command` with a fresh tmpfs (mount `options`) at `mount`, in a mount namespace
    of its own (nothing outside sees it), then copies what it left at `mount` to `keep`."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a tmpfs in a mount namespace")
    script = (
        'mount -t tmpfs -o "$1" tmpfs "$2" || exit 90; shift 3; "$@"; rc=$?; '
        'cp -a "$0/." "$KEEP/" 2>/dev/null; exit $rc'
    )
    mount.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            "unshare",
            "-r",
            "-m",
            "sh",
            "-c",
            script,
            str(mount),
            options,
            str(mount),
            "--",
            *command,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KEEP": str(keep)},
    )
    if run.returncode == 90 or "unshare:" in run.stderr:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {run.stderr.strip()}")
    return run


@pytest.mark.parametrize(
    ("fault", "options", "want"),
    [
        ("a full disk (a 256 KiB tmpfs for 384 KiB)", "size=256k", "No space left on device"),
        ("a read-only target (read-only tmpfs)", "ro,size=1m", "Read-only file system"),
    ],
)
def test_local_disk_faults_are_one_error_naming_the_path(
    fault: str, options: str, want: str, tmp_path: Path, record: Record
) -> None:
    data = values()
    source = tmp_path / "src.zarr"
    zarr.create_array(str(source), data=data, chunks=(1, *SHAPE[1:]), compressors=None)
    mount = tmp_path / "disk"
    target = mount / "out.zarr"
    run = in_a_tmpfs(
        mount, options, rechunk_args(str(source), str(target), "--codec", "none"),
        tmp_path / "kept",
    )  # fmt: skip
    assert run.returncode != 0, "the write did not fail"
    error = run.stderr.strip()
    assert want in error and str(mount) in error, error
    assert error.count("\n") < 5, f"one error, not a cascade: {error}"
    assert_whole_chunks(tmp_path / "kept" / "out.zarr", data)
    np.testing.assert_array_equal(zarr.open_array(str(source))[...], data)
    record("local disk", fault, "CLI rechunk", "clear error", error)


def test_intermediates_removed_mid_run_are_one_error_not_fill_values(
    tmp_path: Path, record: Record
) -> None:
    """A rechunk through an intermediate whose work directory is removed once the second
    stage writes: its reads find chunks gone. They used to read as fill values (exit 0, a
    wrong result); now the run fails naming the intermediate, and a rerun is exact."""
    data = np.random.default_rng(38).standard_normal((64, 256, 256)).astype("float32")
    source, target, work = tmp_path / "src.zarr", tmp_path / "out.zarr", tmp_path / "work"
    zarr.create_array(str(source), data=data, chunks=(1, 256, 256))
    args = [
        str(chunkfuse_bin_path()), "rechunk", str(source), str(target), "--chunks",
        "64,16,16", "--max-mem", "6MB", "--threads", "1", "--work-dir", str(work),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    removed = False
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if (target / "c").exists() and any(p.is_file() for p in (target / "c").rglob("*")):
            shutil.rmtree(work)
            removed = True
            break
        time.sleep(0.001)
    _, err = proc.communicate(timeout=120)
    assert removed, "the run ended before its second stage wrote"
    assert proc.returncode != 0, "the run read removed intermediates as fill values"
    error = err.strip()
    assert "intermediate" in error and str(work) in error, error
    assert_whole_chunks(target, data)
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    np.testing.assert_array_equal(zarr.open_array(str(target))[...], data)
    record("local disk", "the work directory removed mid-run", "CLI rechunk (two stages)",
           "clear error; the rerun exact", error)  # fmt: skip
