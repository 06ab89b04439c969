"""The engine plans of rechunk jobs: a `rechunk` and a `write` op per array, each write taking
its source's fill value, attributes and dimension names (`metadata_from`), and for a group a
`groups` entry that makes the target group with the source group's attributes (see
docs/plan-ir.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import chunkfuse.rechunking.chunks as sizes
from chunkfuse.rechunking.sources import ArraySource, GroupSource


def array_plan(
    src: ArraySource, dst: str, chunks: sizes.Chunks, write: Mapping[str, Any], shards: Any
) -> dict[str, Any]:
    """The plan rechunking the array `src` into `dst`; `write` holds the write op's codec,
    format and overwrite."""
    var = None
    if isinstance(chunks, Mapping) or isinstance(shards, Mapping):
        named = any(isinstance(k, str) for k in (*_keys(chunks), *_keys(shards)))
        var = src.variable(named)
    target = sizes.for_array(chunks, var, "chunks") if var else sizes.per_axis(chunks, "chunks")
    plan: dict[str, Any] = {"name": "rechunk", "arrays": [], "ops": []}
    _add(plan, ("source", "rechunked", "target"), src.url, dst, target, write)
    if shards is not None:
        whole = (
            sizes.shards_for(shards, target, var, "shards")
            if var
            else sizes.per_axis(shards, "shards")
        )
        plan["ops"][-1]["shards"] = whole
    return plan


def group_plan(
    src: GroupSource, dst: str, chunks: Any, write: Mapping[str, Any], shards: Any
) -> dict[str, Any]:
    """The plan rechunking every array of `src` into the group `dst`."""
    per_var = sizes.for_group(chunks, src.variables, "chunks")
    per_var_shards = sizes.for_group(shards, src.variables, "shards")
    plan: dict[str, Any] = {
        "name": "rechunk",
        "arrays": [],
        "ops": [],
        "groups": [
            {
                "target": dst,
                "metadata_from": src.url,
                "zarr_format": write["zarr_format"],
                "overwrite": write["overwrite"],
            }
        ],
    }
    for var in src.variables:
        wanted = per_var[var.name]
        target = list(var.chunks) if wanted is None else sizes.for_array(wanted, var, "chunks")
        ids = (var.name, f"{var.name} (rechunked)", f"{var.name} (target)")
        _add(plan, ids, _join(src.url, var.name), _join(dst, var.name), target, write)
        var_shards = per_var_shards[var.name]
        if var_shards is not None:
            whole = sizes.shards_for(var_shards, target, var, "shards")
            plan["ops"][-1]["shards"] = whole
    return plan


def _keys(given: Any) -> list[Any]:
    return list(given) if isinstance(given, Mapping) else []


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def _add(
    plan: dict[str, Any],
    ids: Sequence[str],
    source: str,
    target: str,
    chunks: list[int],
    write: Mapping[str, Any],
) -> None:
    src, rechunked, written = ids
    plan["arrays"].append({"id": src, "zarr": source})
    plan["ops"].append({"id": rechunked, "op": "rechunk", "input": src, "chunks": chunks})
    plan["ops"].append(
        {
            "id": written,
            "op": "write",
            "input": rechunked,
            "target": target,
            "metadata_from": src,
            **write,
        }
    )
