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
"""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType


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
