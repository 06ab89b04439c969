"""How the engine reads local files, process-wide: ``"auto"`` (io_uring where the system
allows it, with large whole files mapped), ``"uring"`` (io_uring for every read; an error
where it is refused) or ``"pread"`` (a thread pool). The default comes from ``$CHUNKFUSE_IO``,
else ``"auto"``. Every engine entry point takes ``io=`` and sets it for that call and after."""

from __future__ import annotations

import chunkfuse._engine as _engine

__all__ = ["io_mode", "set_io", "set_io_timeouts"]


def set_io(mode: str) -> None:
    """Set how local files are read from now on (``"auto"``, ``"uring"`` or ``"pread"``)."""
    _engine.set_io(mode)


def io_mode() -> str:
    """How local files are read now."""
    return _engine.io_mode()


def set_io_timeouts(
    connect: float | None = None, request: float | None = None, retry: float | None = None
) -> float:
    """Set how long object-storage requests may take, in seconds, for stores opened from now
    on: `connect` (default 10), each `request` (default 30, from sending it to the last byte
    of the answer) and the `retry` window within which failed requests (5xx, dropped
    connections, timeouts) are retried (default 60). Each left out keeps its value from
    ``$CHUNKFUSE_IO_CONNECT_TIMEOUT_S``, ``$CHUNKFUSE_IO_TIMEOUT_S`` and
    ``$CHUNKFUSE_IO_RETRY_TIMEOUT_S``, else the default; with no arguments, all go back to
    those. Returns the longest a request to a server that never answers takes to fail (retry
    window + one request timeout + one backoff of 5 s). Ctrl-C stops any wait at once."""
    return _engine.set_io_timeouts(connect, request, retry)


def apply(io: str | None) -> None:
    """Set `io` when given (the ``io=`` keyword of the entry points)."""
    if io is not None:
        _engine.set_io(io)
