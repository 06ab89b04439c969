"""What one ``get`` call ran, kept per thread."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GetStats:
    """What one ``get`` call ran: tasks in all, and the keys of any that failed."""

    tasks: int = 0
    python_tasks: int = 0
    native_tasks: int = 0
    engine_runs: int = 0
    #: Blocks whose fused elementwise program ran on a GPU (``device="cuda"`` or ``"auto"``).
    gpu_blocks: int = 0
    #: The stages of the engine's runs, in order, as their summaries record them.
    stages: list[dict[str, Any]] = field(default_factory=list)
    failed: list[Hashable] = field(default_factory=list)


_last = threading.local()


def last_stats() -> GetStats | None:
    """Statistics of this thread's most recent ``get`` call."""
    return getattr(_last, "stats", None)


def new_stats() -> GetStats:
    """Fresh statistics, which `last_stats` gives from now on in this thread."""
    stats = GetStats()
    _last.stats = stats
    return stats
