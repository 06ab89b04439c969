"""How the engine reads local files, process-wide: ``"auto"`` (io_uring where the system
allows it, with large whole files mapped), ``"uring"`` (io_uring for every read; an error
where it is refused) or ``"pread"`` (a thread pool). The default comes from ``$CHUNKFUSE_IO``,
else ``"auto"``. Every engine entry point takes ``io=`` and sets it for that call and after."""

from __future__ import annotations

from chunkfuse import _engine

__all__ = ["io_mode", "set_io"]


def set_io(mode: str) -> None:
    """Set how local files are read from now on (``"auto"``, ``"uring"`` or ``"pread"``)."""
    _engine.set_io(mode)


def io_mode() -> str:
    """How local files are read now."""
    return _engine.io_mode()


def apply(io: str | None) -> None:
    """Set `io` when given (the ``io=`` keyword of the entry points)."""
    if io is not None:
        _engine.set_io(io)
