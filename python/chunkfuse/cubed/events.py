"""Cubed's task-end events, as RustExecutor reports them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cubed.runtime.types import Callback, TaskEndEvent


def report_tasks(
    callbacks: Sequence[Callback] | None,
    name: str,
    num_tasks: int,
    created: float,
    start: float,
    end: float,
    result: Any = None,
) -> None:
    """Fire one TaskEndEvent for `num_tasks` tasks of op `name`."""
    if not callbacks:
        return
    event = TaskEndEvent(
        name=name,
        num_tasks=num_tasks,
        result=result,
        task_create_tstamp=created,
        function_start_tstamp=start,
        function_end_tstamp=end,
        task_result_tstamp=time.time(),
    )
    for cb in callbacks:
        cb.on_task_end(event)


class TaskProgress:
    """Turns an engine run's task counts into Cubed TaskEndEvents for the ops it runs.

    Engine tasks do not map one to one onto Cubed's (one engine task may do several Cubed
    tasks' work, and Cubed's partial-reduce rounds vanish), so the fraction of engine tasks done
    is reported as the same fraction of the run's Cubed tasks, op after op; each op's events
    add up to its `num_tasks` by the end.
    """

    def __init__(self, ops: list[tuple[str, int]], callbacks: Sequence[Callback] | None) -> None:
        """`ops`: `(op name, Cubed task count)` in the order they run."""
        self.remaining = list(ops)
        self.total = sum(n for _, n in self.remaining)
        self.reported = 0
        self.callbacks = list(callbacks or [])
        self.started = time.time()

    def __call__(self, done: int, total: int) -> None:
        if total > 0:
            self._report_up_to(min(self.total, self.total * done // total))

    def finish(self) -> None:
        self._report_up_to(self.total)

    def _report_up_to(self, target: int) -> None:
        while self.reported < target and self.remaining:
            name, left = self.remaining[0]
            n = min(left, target - self.reported)
            if n == left:
                self.remaining.pop(0)
            else:
                self.remaining[0] = (name, left - n)
            self.reported += n
            self._event(name, n)
        # Ops without tasks still get their (empty) turn, in order.
        while self.remaining and self.remaining[0][1] == 0:
            self.remaining.pop(0)

    def _event(self, name: str, n: int) -> None:
        report_tasks(self.callbacks, name, n, self.started, self.started, time.time())
