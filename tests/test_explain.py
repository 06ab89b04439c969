"""`chunkfuse explain` and `chunkfuse.explain_plan` show the stages, strategies, tasks and parts
that a run under the same budget and threads then uses, without creating anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import REPO, Cli

PLANS = sorted((REPO / "plans").glob("*.json"))

#: What explain must agree with the run on, stage by stage.
CHOICES = (
    "index",
    "kind",
    "label",
    "output",
    "strategy",
    "reads",
    "fused",
    "unit",
    "tasks",
    "parts",
    "bands",
    "shared",
)


def choices(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: s[k] for k in CHOICES} for s in summary["stages"]]


@pytest.fixture(scope="module")
def era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("era5") / "era5.zarr"
    args = ["--time", "16", "--lat", "91", "--lon", "180"]
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_era5.py"), str(out), *args],
        check=True,
        capture_output=True,
    )
    return out


# 256MB: every plan in one or two stages of blocks or folds; 3MB: bands, spilled copies and
# fewer threads, or a refusal, which explain must give as the run does.
@pytest.mark.parametrize("max_mem", ["256MB", "3MB"])
@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_explain_shows_the_stages_the_run_uses(
    cli: Cli, era5: Path, tmp_path: Path, plan: Path, max_mem: str
) -> None:
    target = tmp_path / "out.zarr"
    args = ["--param", f"source={era5}", "--param", f"target={target}"]
    args += ["--max-mem", max_mem, "--threads", "2", "--json"]
    explained = cli("explain", plan, *args, expect_rc=None)
    assert not target.exists(), "explain created the target"
    ran = cli("run", plan, *args, expect_rc=None)
    assert explained.returncode == ran.returncode, (explained.describe(), ran.describe())
    if ran.returncode != 0:
        assert explained.stderr == ran.stderr
        return
    e, r = explained.json(), ran.json()
    assert choices(e) == choices(r)
    assert (e["threads"], e["max_mem"]) == (r["threads"], r["max_mem"])
    for s in e["stages"]:
        assert 0 < s["largest_task_bytes"] <= s["task_budget"] == e["task_budget"], s
        assert (s["bytes_read"], s["bytes_written"], s["seconds"]) == (0, 0, 0), s
    for s in r["stages"]:
        assert s["seconds"] > 0 and s["bytes_written"] > 0, s
    assert sum(s["decoded_bytes"] for s in r["stages"]) == r["decoded_bytes"]


def test_explain_prints_each_stage_for_people(cli: Cli, era5: Path, tmp_path: Path) -> None:
    plan = REPO / "plans" / "era5-anomaly.json"
    out = cli(
        "explain", plan, "--param", f"source={era5}", "--param", f"target={tmp_path / 'a.zarr'}"
    ).stdout
    assert out.startswith("era5-anomaly: 2 stage(s); budget"), out
    assert "stage 0: mean of x" in out and "stage 1: write out" in out, out
    assert "fused subtract" in out and "the largest reserving" in out, out


def test_explain_for_a_gpu_prints_where_each_stage_runs(
    cli: Cli, era5: Path, tmp_path: Path
) -> None:
    """With `--device cuda` (on a machine with a GPU or without one) each stage says where it
    runs; without it, nothing is said of devices."""
    plan = REPO / "plans" / "era5-anomaly.json"
    args = ["--param", f"source={era5}", "--param", f"target={tmp_path / 'a.zarr'}"]
    out = cli("explain", plan, *args, "--device", "cuda").stdout
    assert ", cuda" in out.splitlines()[0], out
    # The mean (read, decode and fold) and the fused subtract both run on the GPU.
    assert out.count("    on the GPU\n") == 2, out
    assert "on the " not in cli("explain", plan, *args).stdout


def test_explain_plan_from_python_matches_run_plan(tmp_path: Path) -> None:
    a = np.arange(6 * 8 * 10, dtype="float32").reshape(6, 8, 10)
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(2, 4, 10))
    plan = {
        "name": "scaled-mean",
        "arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {"op": "multiply", "args": [{"input": 0}, {"const": 2.0}]},
            },
            {"id": "m", "op": "reduce", "input": "y", "func": "mean", "axes": [0]},
            {"id": "w", "op": "write", "input": "m", "target": str(tmp_path / "m.zarr")},
        ],
    }
    explained = chunkfuse.explain_plan(plan, max_mem="64MB", threads=2)
    assert not (tmp_path / "m.zarr").exists()
    summary = chunkfuse.run_plan(json.dumps(plan), max_mem="64MB", threads=2)
    assert choices(explained) == choices(summary)
    [stage] = explained["stages"]
    assert (stage["kind"], stage["strategy"], stage["fused"]) == ("reduce", "folds", ["multiply"])
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "m.zarr"))[:], (2 * a).mean(0))


def test_explain_plan_names_a_missing_source_as_a_run_does(tmp_path: Path) -> None:
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "nowhere.zarr")}],
        "ops": [{"id": "w", "op": "write", "input": "x", "target": str(tmp_path / "o.zarr")}],
    }
    with pytest.raises(Exception) as explained:
        chunkfuse.explain_plan(plan)
    with pytest.raises(Exception) as ran:
        chunkfuse.run_plan(plan)
    assert type(explained.value) is type(ran.value)
    assert str(explained.value) == str(ran.value)
    assert "nowhere.zarr" in str(explained.value)
