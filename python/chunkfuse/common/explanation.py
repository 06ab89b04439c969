"""What `RustExecutor.explain` and `chunkfuse.dask.explain` return: the steps a computation
runs in order, each an engine run (with its stages, as `chunkfuse.explain_plan` gives them) or
work done in Python (with the reason), printable for people."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineStep:
    """One engine run: the front end's ops it covers and the plan's explained stages."""

    #: The Cubed ops, or the Dask task keys' names, the run covers.
    ops: list[str]
    #: The plan IR the run executes.
    plan: dict[str, Any]
    #: `chunkfuse.explain_plan`'s answer for it (budget, threads, stages), or None (see `note`).
    explained: dict[str, Any] | None
    #: Why the stages are not known beforehand, or what the run may do instead.
    note: str = ""

    @property
    def stages(self) -> list[dict[str, Any]]:
        """The stages the run uses (empty when they are not known beforehand)."""
        return [] if self.explained is None else list(self.explained["stages"])


@dataclass
class PythonStep:
    """Work run in Python, not by the engine."""

    #: The Cubed op, or the name of the Dask tasks.
    op: str
    #: Why it runs in Python.
    reason: str
    #: How many tasks.
    tasks: int = 0


@dataclass
class Explanation:
    """The steps of a computation, in the order they run."""

    steps: list[EngineStep | PythonStep] = field(default_factory=list)

    @property
    def engine_steps(self) -> list[EngineStep]:
        """The engine runs."""
        return [s for s in self.steps if isinstance(s, EngineStep)]

    @property
    def python_steps(self) -> list[PythonStep]:
        """The work run in Python."""
        return [s for s in self.steps if isinstance(s, PythonStep)]

    def __str__(self) -> str:
        lines: list[str] = []
        for i, step in enumerate(self.steps):
            if isinstance(step, PythonStep):
                lines.append(f"step {i}: Python: {step.op} ({step.tasks} task(s)): {step.reason}")
                continue
            lines.append(f"step {i}: engine run of {len(step.ops)} op(s): {', '.join(step.ops)}")
            if step.explained is not None:
                e = step.explained
                lines.append(
                    f"  budget {e['max_mem']} bytes ({e['task_budget']} for tasks), "
                    f"{e['threads']} thread(s), {e['device']}"
                )
                lines.extend(_stage_lines(s) for s in e["stages"])
            if step.note:
                lines.append(f"  note: {step.note}")
        return "\n".join(lines)


def _stage_lines(s: dict[str, Any]) -> str:
    how = f"{s['kind']} stage, {s['strategy']}"
    if s["strategy"] == "bands":
        how += f" ({s['bands']} band(s))"
    text = (
        f"  stage {s['index']}: {s['label']}: {how}; {s['tasks']} task(s) in {s['parts']} "
        f"part(s), the largest reserving {s['largest_task_bytes']} of {s['task_budget']} bytes"
        f"\n    reads {'; '.join(s['reads'])}"
    )
    if s["fused"]:
        text += f"\n    fused {', '.join(s['fused'])}"
    if s["shared"]:
        text += f"\n    loads once {', '.join(s['shared'])}"
    for c in s["caches"]:
        text += f"\n    keeps up to {c['room']} bytes of {c['array']}'s chunks for a later stage"
    return text + _device_line(s)


def _device_line(s: dict[str, Any]) -> str:
    """Where the stage runs when the run has a GPU (nothing on a CPU run)."""
    note = s.get("device_note")
    if s.get("device") == "gpu":
        return "\n    on the GPU" + (f"; {note}" if note else "")
    return f"\n    on the CPU: {note}" if note else ""
