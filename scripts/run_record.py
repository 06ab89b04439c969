"""What every line a reliability harness records carries: which run, when, of which commit,
on what machine (see scripts/reliability_report.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def stamp() -> dict[str, Any]:
    """The run's id (its UTC start), date, commit (with `+changes` when the tree has
    uncommitted changes) and machine."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except OSError:
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    now = time.gmtime()
    return {
        "run": time.strftime("%Y%m%dT%H%M%SZ", now),
        "date": time.strftime("%Y-%m-%d", now),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }


def record(line: dict[str, Any], out: Path | None) -> None:
    """Prints `line` as JSON and appends it to `out` when given."""
    text = json.dumps(line)
    print(text, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    # The stamp, for harnesses that are not Python scripts (tests/test_faults.py's report).
    print(json.dumps(stamp()))
