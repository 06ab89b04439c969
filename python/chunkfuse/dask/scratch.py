"""The scratch directories of the graphs `batched` rewrites in this process, and when they go.

A rewritten graph's last task removes its scratch (arrays, intermediates, the job's work
directory). A graph that never gets there would leave it behind, possibly gigabytes: a
compute that fails or is interrupted on Dask's local schedulers (whose pool threads may still
be running batches that write into it), and a graph optimised but never computed. Such
scratch is removed here: a failed compute's once its last running batch in this process
returns, the rest when the process exits. Batches that run in other processes (a cluster's
workers) are not seen here; the scratch of a graph they failed goes at the exit of the
process that rewrote it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dask

#: The prefix of the key of a rewritten graph's last task; the graph's token follows it.
FINISH_PREFIX = "chunkfuse-finish-"


@dataclass
class _Scratch:
    path: str
    running: int = 0
    abandoned: bool = False


_lock = threading.Lock()
_open: dict[str, _Scratch] = {}


def base_dir(work_dir: str | None) -> str:
    """The directory a compute's scratch directory goes in: `work_dir`, else Dask's
    `temporary-directory` setting (where Dask's workers spill), else the system temporary
    directory; created when missing."""
    base = work_dir or dask.config.get("temporary-directory", None) or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    return str(base)


def opened(token: str, path: str) -> None:
    """Records the scratch `path` of the graph `token`."""
    with _lock:
        _open[token] = _Scratch(path)


def finished(token: str) -> None:
    """The graph `token` removed its own scratch."""
    with _lock:
        _open.pop(token, None)


@contextmanager
def batch_running(token: str) -> Iterator[None]:
    """Around a batch of the graph `token` run in this process: an abandoned graph's scratch
    goes when the last of its running batches returns."""
    with _lock:
        entry = _open.get(token)
        if entry is not None:
            entry.running += 1
    try:
        yield
    finally:
        if entry is not None:
            with _lock:
                entry.running -= 1
                gone = _take_if_idle(token, entry)
            _remove(gone)


def abandon(keys: Iterable[object]) -> None:
    """A compute of a graph with `keys` failed: the scratch of each rewritten graph among
    them (known by its last task's key) goes now, or when its batches still running in this
    process return."""
    tokens = [
        k[len(FINISH_PREFIX) :] for k in keys if isinstance(k, str) and k.startswith(FINISH_PREFIX)
    ]
    gone: list[str] = []
    with _lock:
        for token in tokens:
            entry = _open.get(token)
            if entry is not None:
                entry.abandoned = True
                gone += _take_if_idle(token, entry)
    _remove(gone)


def _take_if_idle(token: str, entry: _Scratch) -> list[str]:
    """(Under the lock.) The abandoned, idle entry's path, taken out of the record."""
    if entry.abandoned and entry.running == 0 and _open.get(token) is entry:
        del _open[token]
        return [entry.path]
    return []


def _remove(paths: Iterable[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _at_exit() -> None:
    # Dask's pool threads have returned by now (threading joins them before atexit runs).
    with _lock:
        paths = [entry.path for entry in _open.values()]
        _open.clear()
    _remove(paths)
