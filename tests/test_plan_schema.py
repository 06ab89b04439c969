"""docs/plan-ir.schema.json, generated from the engine's wire types, against every plan in
plans/ and the plans the Cubed and Dask front ends and `chunkfuse.rechunk` hand the engine;
a misspelt field anywhere is refused naming its JSON path, before anything runs."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chunkfuse
import chunkfuse._engine as _engine
import chunkfuse.fft as cf
import cubed
import cubed.array_api as xp
import dask
import dask.array as da
import jsonschema
import numpy as np
import pytest
import zarr
from chunkfuse import RustExecutor
from chunkfuse.dask import get

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "plan-ir.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def assert_valid(plan: dict[str, Any]) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in VALIDATOR.iter_errors(plan)]
    assert not errors, (errors, plan)


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", sorted((ROOT / "plans").glob("*.json")), ids=lambda p: p.name)
def test_every_plan_in_plans_validates(path: Path) -> None:
    assert_valid(json.loads(path.read_text()))


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every plan handed to the engine while the test runs, as JSON."""
    plans: list[dict[str, Any]] = []
    run = _engine.run_plan

    def recording(text: str, *args: Any) -> Any:
        plans.append(json.loads(text))
        return run(text, *args)

    monkeypatch.setattr(_engine, "run_plan", recording)
    yield plans


def stored(path: Path, data: np.ndarray, chunks: tuple[int, ...]) -> str:
    z = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return str(path)


DATA = np.random.default_rng(35).random((24, 16), dtype=np.float32)

Workflow = Callable[[str, Path], Any]

CUBED: dict[str, Workflow] = {
    "reductions": lambda x, _: xp.sum(x, axis=0) + xp.mean(x, axis=0) + xp.max(x, axis=0),
    "variance": lambda x, _: xp.var(x, axis=1),
    "elementwise": lambda x, _: xp.where(x > 0.5, xp.sqrt(x), -x) * 2,
    "astype": lambda x, _: xp.astype(x, xp.float64) + 1,
    "slices": lambda x, _: x[2:20:3, None, 5],
    "concat": lambda x, _: xp.concat([x[:5], x[10:]], axis=0),
    "stack": lambda x, _: xp.stack([x, x + 1]),
    "transpose": lambda x, _: xp.permute_dims(x, (1, 0)),
    "rechunk": lambda x, _: x.rechunk((24, 4)),
}


@pytest.mark.parametrize("name", list(CUBED))
def test_cubed_plans_validate(tmp_path: Path, emitted: list[dict[str, Any]], name: str) -> None:
    spec = cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="500MB")
    x = cubed.from_zarr(stored(tmp_path / "x.zarr", DATA, (8, 4)), spec=spec)
    CUBED[name](x, tmp_path).compute(executor=RustExecutor())
    assert emitted, "the workflow ran no plan in the engine"
    for plan in emitted:
        assert_valid(plan)


def test_cubed_fft_plans_validate(tmp_path: Path, emitted: list[dict[str, Any]]) -> None:
    spec = cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="500MB")
    x = cubed.from_zarr(stored(tmp_path / "x.zarr", DATA, (8, 16)), spec=spec)
    xp.abs(cf.rfft(x, axis=1)).compute(executor=RustExecutor())
    assert emitted
    for plan in emitted:
        assert_valid(plan)


DASK: dict[str, Workflow] = {
    "reductions": lambda x, _: (x.sum(axis=0) + x.std(axis=0), x.argmax(axis=1)),
    "elementwise": lambda x, _: (da.where(x > 0.5, np.sqrt(x), -x) * 2,),
    "fft": lambda x, _: (abs(da.fft.rfft(x.rechunk({1: -1}), axis=1)),),
    "fftn": lambda x, _: (da.fft.fftn(x.rechunk(-1)),),
    "slices-concat": lambda x, _: (da.concatenate([x[:4, ::2], x[10:, 1::2]], axis=0),),
    "roll": lambda x, _: (da.roll(x, 5, axis=0),),
}


@pytest.mark.parametrize("name", list(DASK))
def test_dask_plans_validate(tmp_path: Path, emitted: list[dict[str, Any]], name: str) -> None:
    x = da.from_zarr(stored(tmp_path / "x.zarr", DATA, (8, 4)))
    for out in DASK[name](x, tmp_path):
        out.compute(scheduler=get)
    assert emitted, "the workflow ran no plan in the engine"
    for plan in emitted:
        assert_valid(plan)


def test_dask_stores_with_regions_validate(tmp_path: Path, emitted: list[dict[str, Any]]) -> None:
    x = da.from_zarr(stored(tmp_path / "x.zarr", DATA, (8, 4)))
    whole = zarr.create_array(str(tmp_path / "a.zarr"), shape=x.shape, chunks=(8, 4), dtype="f4")
    bigger = zarr.create_array(
        str(tmp_path / "b.zarr"), shape=(30, 16), chunks=(8, 4), dtype="f4", fill_value=-1
    )
    da.store(
        [x - x.mean(axis=0), abs(x) + 1],
        [whole, bigger],
        regions=[None, (slice(3, 27), slice(None))],
        scheduler=get,
    )
    with dask.config.set(scheduler=get):
        da.to_zarr(x * 2, str(tmp_path / "c.zarr"))
    assert len(emitted) >= 2
    assert any(op.get("region") for plan in emitted for op in plan["ops"])
    for plan in emitted:
        assert_valid(plan)


def test_rechunk_of_a_group_validates(tmp_path: Path, emitted: list[dict[str, Any]]) -> None:
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    for name in ("a", "b"):
        z = group.create_array(name, shape=DATA.shape, chunks=(1, 16), dtype="f4")
        z[...] = DATA
    chunkfuse.rechunk(
        tmp_path / "g.zarr",
        tmp_path / "out.zarr",
        {"a": (24, 2), "b": (12, 8)},
        codecs={"name": "blosc", "cname": "zstd", "clevel": 3},
    )
    chunkfuse.rechunk(tmp_path / "g.zarr" / "a", tmp_path / "one.zarr", (6, 6), shards=(12, 12))
    assert len(emitted) == 2 and emitted[0].get("groups")
    for plan in emitted:
        assert_valid(plan)


def full_plan(tmp_path: Path) -> dict[str, Any]:
    """A valid plan with an array, a group, an expression and a write's codec."""
    return {
        "version": 1,
        "arrays": [{"id": "x", "zarr": stored(tmp_path / "x.zarr", DATA, (8, 4))}],
        "groups": [{"target": str(tmp_path / "g.zarr")}],
        "ops": [
            {
                "id": "y",
                "op": "elementwise",
                "inputs": ["x"],
                "expr": {
                    "op": "add",
                    "args": [{"input": 0}, {"op": "negative", "args": [{"const": 1}]}],
                },
            },
            {"id": "s", "op": "reduce", "input": "y", "func": "sum", "axes": [0]},
            {
                "id": "o",
                "op": "write",
                "input": "s",
                "target": str(tmp_path / "g.zarr" / "o"),
                "codec": {"name": "zstd", "level": 3},
            },
        ],
    }


MISSPELT = [
    ([], "verison", "verison"),
    (["arrays", 0], "zar", "arrays[0].zar"),
    (["arrays", 0], "chunks", "arrays[0].chunks"),
    (["groups", 0], "overwite", "groups[0].overwite"),
    (["ops", 1], "axis_", "ops[1].axis_"),
    (["ops", 0, "expr"], "dtyp", "ops[0].expr.dtyp"),
    (["ops", 0, "expr", "args", 1, "args", 0], "dtype_", "ops[0].expr.args[1].args[0].dtype_"),
    (["ops", 2, "codec"], "levle", "ops[2].codec.levle"),
    (["ops", 2], "regoin", "ops[2].regoin"),
]


@pytest.mark.parametrize(("where", "key", "path"), MISSPELT, ids=[m[2] for m in MISSPELT])
def test_a_misspelt_field_is_refused_naming_its_path_and_nothing_runs(
    tmp_path: Path, where: list[Any], key: str, path: str
) -> None:
    good = full_plan(tmp_path)
    bad = copy.deepcopy(good)
    node: Any = bad
    for step in where:
        node = node[step]
    node[key] = 1
    assert_valid(good)
    assert not VALIDATOR.is_valid(bad)
    with pytest.raises(ValueError, match=rf"plan error at {re.escape(path)}: unknown field"):
        chunkfuse.run_plan(bad)
    assert not (tmp_path / "g.zarr").exists()


def test_a_version_other_than_1_is_refused(tmp_path: Path) -> None:
    plan = full_plan(tmp_path)
    plan["version"] = 2
    assert not VALIDATOR.is_valid(plan)
    with pytest.raises(ValueError, match=r"plan error at version: .*version 1"):
        chunkfuse.run_plan(plan)
    assert not (tmp_path / "g.zarr").exists()
    del plan["version"]
    chunkfuse.run_plan(plan)
    assert (tmp_path / "g.zarr" / "o").exists()
