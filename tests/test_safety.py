"""Safety of inputs (issue 38): a run writes only to the targets its plan declares, never into
its sources' stores (nor over them); plan parameters fill only the field they are in; a
second job writing a target another job is writing is refused; concurrent runs in one
process on different targets do not interfere."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import REPO, chunkfuse_bin_path


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root`: its bytes and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """An array `src.zarr` and a group `ds.zarr` holding arrays `a` and `b`, in `tmp_path`."""
    data = np.arange(16 * 16 * 16, dtype="f4").reshape(16, 16, 16)
    zarr.create_array(str(tmp_path / "src.zarr"), data=data, chunks=(4, 16, 16))
    g = zarr.open_group(str(tmp_path / "ds.zarr"), mode="w")
    g.create_array("a", data=np.ones((8, 8), "f4"), chunks=(4, 4), dimension_names=["y", "x"])
    g.create_array("b", data=np.zeros((8, 8), "f4"), chunks=(4, 4), dimension_names=["y", "x"])
    (tmp_path / "parent").mkdir()
    zarr.create_array(str(tmp_path / "parent" / "src.zarr"), data=data, chunks=(4, 16, 16))
    return tmp_path


@pytest.mark.parametrize(
    ("source", "target", "chunks"),
    [
        ("src.zarr", "src.zarr", (16, 4, 4)),
        ("src.zarr", "src.zarr/inside", (16, 4, 4)),
        ("src.zarr", "./elsewhere/../src.zarr/inside", (16, 4, 4)),
        ("parent/src.zarr", "parent", (16, 4, 4)),
        ("ds.zarr/a", "ds.zarr", (8, 8)),
        ("ds.zarr", "ds.zarr/rechunked", {"y": 8}),
        ("ds.zarr", "ds.zarr", {"y": 8}),
    ],
    ids=[
        "itself",
        "inside",
        "inside-through-dotdot",
        "around",
        "array-into-its-group",
        "group-into-itself",
        "group-over-itself",
    ],
)
def test_a_target_holding_or_inside_a_source_is_refused_and_nothing_changes(
    sources: Path,
    source: str,
    target: str,
    chunks: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(sources)
    before = snapshot(sources)
    with pytest.raises(ValueError, match=r"hold one another|also an input") as info:
        chunkfuse.rechunk(source, target, chunks, overwrite=True)  # type: ignore[arg-type]
    assert "never writes into its sources" in str(info.value) or "also an input" in str(info.value)
    assert snapshot(sources) == before
    # A sibling is fine.
    chunkfuse.rechunk(source, "sibling.zarr", chunks, overwrite=True)  # type: ignore[arg-type]


def test_sources_are_never_written_by_runs_that_read_them(sources: Path) -> None:
    """Neither bytes nor modification times of a source change (no marker, no metadata
    rewrite), through a plan, a dataset rechunk and a Dask write."""
    import dask
    import dask.array as da
    from chunkfuse.dask import get

    before = snapshot(sources)
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    chunkfuse.run_plan(
        plan, {"source": str(sources / "src.zarr"), "target": str(sources / "anomaly.zarr")}
    )
    chunkfuse.rechunk(sources / "ds.zarr", sources / "ds2.zarr", {"y": 8})
    x = da.from_zarr(str(sources / "ds.zarr" / "a"))
    with dask.config.set(scheduler=get):
        da.to_zarr(x * 2, str(sources / "twice.zarr"))
    after = snapshot(sources)
    assert {k: v for k, v in after.items() if k in before} == before


def test_a_parameter_fills_only_its_field(sources: Path) -> None:
    """A parameter's value is a string put where `${NAME}` stands, never parsed: `${...}`
    and JSON in it stay as written."""
    before = snapshot(sources / "src.zarr")
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    odd = sources / 'out-${source}", "overwrite": true, "x": "'
    chunkfuse.run_plan(plan, {"source": str(sources / "src.zarr"), "target": str(odd)})
    assert (odd / "zarr.json").exists()
    assert snapshot(sources / "src.zarr") == before


def test_a_second_job_on_a_target_being_written_is_refused(sources: Path) -> None:
    """A CLI rechunk is paused (SIGSTOP) while it writes its target; a second rechunk of the
    same target, from this process, is refused naming the target; once the first resumes, it
    finishes exactly."""
    data = np.random.default_rng(38).standard_normal((64, 256, 256)).astype("f4")
    source, target = sources / "big.zarr", sources / "out.zarr"
    zarr.create_array(str(source), data=data, chunks=(1, 256, 256))
    args = ["rechunk", str(source), str(target), "--chunks", "64,16,16", "--max-mem", "6MB"]
    first = subprocess.Popen(
        [str(chunkfuse_bin_path()), *args, "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (target / "zarr.json").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(first.pid, signal.SIGSTOP)
        assert first.poll() is None, "the first job ended before it could be paused"
        with pytest.raises(OSError, match="another job is writing this target") as info:
            chunkfuse.rechunk(source, target, (64, 16, 16), max_mem="6MB", overwrite=True)
        assert "out.zarr" in str(info.value)
    finally:
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    np.testing.assert_array_equal(zarr.open_array(str(target))[...], data)


def test_concurrent_runs_in_one_process_do_not_interfere(sources: Path) -> None:
    data = np.random.default_rng(7).standard_normal((32, 128, 128)).astype("f4")
    source = sources / "c.zarr"
    zarr.create_array(str(source), data=data, chunks=(1, 128, 128))
    plan = (REPO / "plans" / "era5-anomaly.json").read_text()
    want = data - data.mean(axis=0, dtype="f8").astype("f4")

    def rechunk(i: int) -> None:
        chunkfuse.rechunk(source, sources / f"r{i}.zarr", (32, 16 * (i + 1), 16), max_mem="8MB")

    def anomaly(i: int) -> None:
        params = {"source": str(source), "target": str(sources / f"a{i}.zarr")}
        chunkfuse.run_plan(plan, params, max_mem="16MB")

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(f, i) for i in range(3) for f in (rechunk, anomaly)]
        for f in futures:
            f.result(timeout=300)
    for i in range(3):
        np.testing.assert_array_equal(zarr.open_array(str(sources / f"r{i}.zarr"))[...], data)
        got = zarr.open_array(str(sources / f"a{i}.zarr"))[...]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
