"""Run one command and record exactly its peak RSS.

    python -S scripts/rss_exec.py REPORT.json COMMAND [ARGS...]

Writes ``{"returncode": int, "maxrss_kib": int}`` to REPORT.json and exits with the command's
status (128 + N when killed by signal N). SIGINT and SIGTERM are forwarded to the command.

Why a helper: on Linux a child's ``ru_maxrss`` starts at the RSS of the process that spawned it
(fork copies the parent's page tables; vfork/posix_spawn hand the parent's memory to exec, which
records its high-water mark), so a command spawned from pytest or a benchmark driver that holds
hundreds of MB reports at least that much. This helper imports only ``os``, ``json``, ``signal``
and ``sys`` (run it with ``-S``), so what it adds is a few MiB, the same for every measurement,
and it cancels out against a baseline measured the same way.

Drivers (the benchmark, the test suite) import ``run_measured`` from here rather than spawning
the launcher themselves; its imports are local so the launcher itself stays small.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType


class Measured:
    """What ``run_measured`` saw of one command."""

    def __init__(
        self,
        returncode: int,
        stdout: str,
        stderr: str,
        peak_rss: int,
        wall: float,
        timed_out: bool,
    ) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.peak_rss = peak_rss  # bytes; 0 when not measured
        self.wall = wall  # seconds
        self.timed_out = timed_out


def run_measured(argv: list[str], timeout: float, measure_rss: bool = True) -> Measured:
    """Run ``argv`` (under this launcher when ``measure_rss``), its output in temporary files so
    nothing blocks on full pipes; a command past ``timeout`` seconds is killed with its group."""
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    report = None
    command = argv
    if measure_rss:
        fd, report = tempfile.mkstemp(suffix=".json", prefix="rss-")
        os.close(fd)
        command = [sys.executable, "-S", os.path.abspath(__file__), report, *argv]
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen(
                command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
            timed_out = False
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
                timed_out = True
            wall = time.perf_counter() - start
            peak = 0
            if report is not None:
                measured = json.loads(Path(report).read_text() or "{}")
                returncode = int(measured.get("returncode", returncode))
                peak = int(measured.get("maxrss_kib", 0)) * 1024
            out.seek(0)
            err.seek(0)
            return Measured(
                returncode,
                out.read().decode(errors="replace"),
                err.read().decode(errors="replace"),
                peak,
                wall,
                timed_out,
            )
    finally:
        if report is not None:
            os.unlink(report)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    report, command = argv[1], argv[2:]
    pid = os.posix_spawnp(command[0], command, dict(os.environ))

    def forward(signum: int, frame: FrameType | None) -> None:
        os.kill(pid, signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with open(report, "w") as f:
        json.dump({"returncode": code, "maxrss_kib": int(usage.ru_maxrss)}, f)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
