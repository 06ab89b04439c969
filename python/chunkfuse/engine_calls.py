"""The engine's calls behind the package's facade: `run_plan`, `explain_plan`, `device_info`
and `engine_version`. Modules of the package call them from here, never through the facade
(`chunkfuse/__init__.py` re-exports them), so that no module imports the package it is in."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import chunkfuse._engine as _engine
import chunkfuse.iomode as iomode
from chunkfuse.sizes import budget_bytes, thread_count


def engine_version() -> str:
    """Return the version of the Rust engine."""
    return _engine.version()


def device_info(device: str = "auto") -> str:
    """Where fused elementwise programs run for `device` ("cpu", "cuda" or "auto"): "cpu", or
    "cuda: NAME (compute_XY)". Raises RuntimeError naming why when "cuda" cannot be used (no
    driver, no NVRTC, no device, or an engine built without the cuda feature)."""
    return _engine.device_info(device)


def run_plan(
    plan: str | Mapping[str, Any],
    params: Mapping[str, str] | None = None,
    *,
    max_mem: int | str | None = None,
    threads: int = 0,
    work_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    resume: bool = True,
    io: str | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Validate and run a plan (JSON text or a dict); return the run summary.

    `work_dir` is where multi-stage intermediates go (the system temporary directory by
    default). `progress(tasks_done, tasks_total)` is called as tasks finish (the total grows
    as stages start); an exception it raises cancels the run. Ctrl-C cancels the run and
    raises KeyboardInterrupt. With `resume` (the default), rerunning a job that failed or was
    killed keeps every chunk it had written and computes only the rest; `resume=False`
    starts over. `io` sets how local files are read (see `chunkfuse.set_io`). `device` is
    where fused elementwise programs and reductions run: "cpu", "cuda" (an NVIDIA GPU; an
    error naming why when none can be used) or "auto" (the GPU when present); FFTs and codecs
    run on the CPU. The summary's `device` and `gpu_blocks`, and each stage's `device` and
    `device_note`, say where they ran.

    `max_mem` is the memory budget: bytes, or text such as "1GB" or "512MiB" (a quarter of
    the available memory by default). Peak RSS stays within it plus a fixed baseline (see
    the README's memory paragraph); a budget too small for one task raises MemoryError
    naming the task, the bytes it needs and the budget, before anything is written.
    """
    iomode.apply(io)
    text = plan if isinstance(plan, str) else json.dumps(plan)
    budget = budget_bytes(max_mem, "max_mem")
    threads = thread_count(threads)
    summary = _engine.run_plan(
        text, dict(params or {}), budget, threads, work_dir, progress, resume, device
    )
    return json.loads(summary)


def explain_plan(
    plan: str | Mapping[str, Any],
    params: Mapping[str, str] | None = None,
    *,
    max_mem: int | str | None = None,
    threads: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """How `run_plan` would run a plan (JSON text or a dict) with the same `max_mem`,
    `threads` and `device`, without running it or creating anything: a dict with the budget
    (`max_mem`, `task_budget`), `threads`, `device`, and `stages`, each a record as a run's
    summary has them (`kind`, `strategy`, `label`, `reads`, `fused`, `unit`, `tasks`,
    `parts`, `bands`, `caches`, `shared`, `largest_task_bytes`, `task_budget`, ...; what a
    stage moves and how long it takes are 0). The plan's sources must exist; its targets need
    not. Plan errors raise as `run_plan`'s do."""
    text = plan if isinstance(plan, str) else json.dumps(plan)
    budget = budget_bytes(max_mem, "max_mem")
    threads = thread_count(threads)
    return json.loads(_engine.explain_plan(text, dict(params or {}), budget, threads, device))
