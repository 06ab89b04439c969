"""`RustExecutor.explain`: how a Cubed computation would run, without running it: the engine
runs with their stages and strategies, and the ops that run in Python and why."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from cubed.core.array import plan as finalized_plan

from chunkfuse.common.explanation import EngineStep, Explanation, PythonStep
from chunkfuse.cubed.budget import Budget, engine_budget, engine_call, worker_count
from chunkfuse.cubed.translate import CREATE_ARRAYS, Translation, translate
from chunkfuse.engine_calls import explain_plan


def explain_arrays(arrays: tuple[Any, ...], options: dict[str, Any]) -> Explanation:
    """The steps `compute(*arrays, executor=RustExecutor(**options))` would run."""
    if not arrays:
        raise ValueError("RustExecutor.explain: give the arrays to explain")
    plan = finalized_plan(*arrays, optimize_graph=True)
    spec = arrays[0].spec
    workers = worker_count(options)
    budget = engine_budget(spec, workers, options.get("max_mem"), plan.dag)
    device = str(options.get("device", "cpu"))
    work_dir = getattr(spec, "work_dir", None)
    local = work_dir if isinstance(work_dir, str) and "://" not in work_dir else None
    if local is not None:
        os.makedirs(local, exist_ok=True)
    stage_dir = tempfile.mkdtemp(prefix="chunkfuse-explain-", dir=local)
    try:
        t = translate(plan.dag, stage_dir, set(plan.array_names))
        return _steps(t, budget, workers, device)
    finally:
        shutil.rmtree(stage_dir, ignore_errors=True)


def _steps(t: Translation, budget: Budget, workers: int, device: str) -> Explanation:
    """The ops of `t` in order, native ones batched into engine runs as `_Run` batches them."""
    out = Explanation()
    pending: list[tuple[str, dict[str, Any]]] = []

    def flush() -> None:
        if pending:
            out.steps.append(_engine_step(t, list(pending), budget, workers, device))
            pending.clear()

    for name, node in t.ops:
        if name == CREATE_ARRAYS:
            continue
        if t.native.get(name):
            pending.append((name, node))
            continue
        flush()
        tasks = int(getattr(node.get("primitive_op"), "num_tasks", 0) or 0)
        out.steps.append(PythonStep(name, t.reasons.get(name, ""), tasks))
    flush()
    return out


def _engine_step(
    t: Translation, ops: list[tuple[str, dict[str, Any]]], budget: Budget, workers: int, device: str
) -> EngineStep:
    names = [name for name, _ in ops]
    writes = [w for name in names for w in t.writes.get(name, [])]
    if not writes:
        return EngineStep(names, {}, None, "fused into later ops: nothing of its own to write")
    plan = t.builder.plan("cubed", [(w.symbol, w.url, w.chunks, w.codec, w.shards) for w in writes])
    try:
        # As the run does: planned again with the whole allowance if a task does not fit.
        explained = engine_call(
            budget, lambda b: explain_plan(plan, max_mem=b, threads=workers, device=device)
        )
    except MemoryError as e:
        if budget.explicit:
            raise
        note = f"its tasks do not fit ({e}): the run runs these ops in Python, as Cubed planned"
        return EngineStep(names, plan, None, note)
    except (OSError, ValueError) as e:
        # Arrays an earlier step writes do not exist yet: the run explains itself then.
        return EngineStep(names, plan, None, f"known once earlier steps have run: {e}")
    return EngineStep(names, plan, explained)
