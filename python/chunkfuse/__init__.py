"""chunkfuse: a Rust executor for chunked-array plans over Zarr.

The engine lives in the native module ``chunkfuse._engine``; this package translates and
calls it. ``run_plan`` executes a JSON plan (see docs/plan-ir.md) with the GIL released.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from chunkfuse import _engine

__all__ = ["__version__", "engine_version", "run_plan"]

__version__: str = _engine.version()


def engine_version() -> str:
    """Return the version of the Rust engine."""
    return _engine.version()


def run_plan(
    plan: str | Mapping[str, Any],
    params: Mapping[str, str] | None = None,
    *,
    max_mem: int | None = None,
    threads: int = 0,
) -> dict[str, Any]:
    """Validate and run a plan (JSON text or a dict); return the run summary."""
    text = plan if isinstance(plan, str) else json.dumps(plan)
    summary = _engine.run_plan(text, dict(params or {}), max_mem, threads)
    return json.loads(summary)
