"""The engine's memory budget for a Cubed plan, from Cubed's own memory model."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import networkx as nx
import psutil
from cubed.spec import Spec

from chunkfuse.distributed.coordinator import ClusterTooSmall, batch_budget
from chunkfuse.distributed.runtime import describe
from chunkfuse.sizes import budget_bytes

log = logging.getLogger("chunkfuse.cubed")

#: Engine budget when Cubed's spec gives none (Cubed's own default allowed_mem is 2 GB).
DEFAULT_ALLOWED_MEM = 2_000_000_000

#: The smallest engine budget chosen from Cubed's projections (big enough for full speed on
#: chunks of a few MB; see bench/RESULTS.md).
MIN_ENGINE_BUDGET = 256_000_000


def worker_count(options: dict[str, Any]) -> int:
    """The compute threads RustExecutor's `options` ask for (`max_workers`; default all
    cores); below 1 is refused."""
    given = options.get("max_workers")
    workers = int(os.cpu_count() or 1) if given is None else int(given)
    if workers < 1:
        raise ValueError(f"RustExecutor: max_workers must be at least 1, got {workers}")
    return workers


@dataclass(frozen=True)
class Budget:
    """The engine budget to plan with, and the most it may grow to when a task needs more.

    `explicit` when the user gave the number (`max_mem`): a task too large for it is refused
    (MemoryError), never run with more memory nor handed to Python."""

    budget: int
    ceiling: int
    explicit: bool = False


def engine_budget(spec: Spec | None, workers: int, max_mem: Any, dag: nx.MultiDiGraph) -> Budget:
    """The engine's budget; refuses a budget the machine cannot hold (as Cubed's executors do)."""
    total = psutil.virtual_memory().total
    budget = budget_bytes(max_mem, "RustExecutor: max_mem")
    if budget is not None:
        if budget > total:
            raise ValueError(
                f"RustExecutor: max_mem ({budget}) is more than the machine's memory ({total})"
            )
        return Budget(budget, budget, explicit=True)
    # Cubed's Spec parses its own text ("2GB"); these are bytes, or text all the same.
    allowed = budget_bytes(getattr(spec, "allowed_mem", None), "allowed_mem")
    allowed = allowed or DEFAULT_ALLOWED_MEM
    reserved = budget_bytes(getattr(spec, "reserved_mem", None) or None, "reserved_mem") or 0
    if allowed * workers > total:
        raise ValueError(
            f"Total memory on machine ({total}) is less than allowed_mem * max_workers "
            f"({allowed} * {workers} = {allowed * workers})"
        )
    # One process holds every worker's share; the interpreter's reserve is counted once.
    ceiling = max(allowed - reserved, 1) * workers
    projected = max(
        (
            node["primitive_op"].projected_mem - node["primitive_op"].reserved_mem
            for _, node in dag.nodes(data=True)
            if "primitive_op" in node
        ),
        default=0,
    )
    return Budget(min(ceiling, max(MIN_ENGINE_BUDGET, projected * workers)), ceiling)


def engine_call(budget: Budget, call: Any) -> Any:
    """`call(max_mem)` with the budget; again with the ceiling (never more than the user
    allowed) if a task did not fit (the engine checks every task before it writes anything).
    A budget the user gave explicitly is never raised."""
    try:
        return call(budget.budget)
    except MemoryError:
        if budget.explicit or budget.budget >= budget.ceiling:
            raise
        log.info("a task needs more than %d bytes; planning with %d", budget.budget, budget.ceiling)
        return call(budget.ceiling)


def batch_budget_of(spec: Spec | None, max_mem: Any, runtime: Any) -> Budget:
    """The budget of each batch a runtime runs: `max_mem` when given (never raised), else one
    Cubed task's allowance (`allowed_mem − reserved_mem`), which Cubed's own executors give
    each task on a worker. Refused (ValueError) before anything runs when the runtime's
    workers cannot hold it."""
    explicit = budget_bytes(max_mem, "RustExecutor: max_mem")
    if explicit is None:
        allowed = budget_bytes(getattr(spec, "allowed_mem", None), "allowed_mem")
        reserved = budget_bytes(getattr(spec, "reserved_mem", None) or None, "reserved_mem") or 0
        wanted = max((allowed or DEFAULT_ALLOWED_MEM) - reserved, MIN_ENGINE_BUDGET // 4)
    else:
        wanted = explicit
    try:
        budget = batch_budget(wanted, runtime.shape(), describe(runtime))
    except ClusterTooSmall as e:
        raise ValueError(f"RustExecutor: {e}") from e
    return Budget(budget, budget, explicit=explicit is not None)
