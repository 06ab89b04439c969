"""Memory budgets as bytes or as text, as Cubed writes them (``"1GB"``, ``"512MiB"``)."""

from __future__ import annotations

import numbers

import chunkfuse._engine as _engine


def budget_bytes(value: int | str | None, name: str = "max_mem") -> int | None:
    """Bytes in ``value``: an integer, or text such as ``"1GB"`` (decimal units as in Dask
    and Cubed: KB, MB, GB, TB, PB and the bare K, M, G, T, P, powers of 1000), ``"512MiB"``
    (binary: KiB, MiB, GiB, TiB, PiB, or Ki, Mi, ..., powers of 1024) or ``"1000000"``; None
    stays None. Bad values raise ValueError (TypeError for a
    value of another type) naming the argument ``name``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return int(_engine.parse_bytes(value))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{name} must be at least one byte, got {value}")
        if value >= 2**63:
            raise ValueError(f"{name} is too large: sizes go up to 8 EiB, got {value}")
        return int(value)
    raise TypeError(
        f"{name} must be a number of bytes or text such as '1GB' or '512MiB', "
        f"got {type(value).__name__} {value!r}"
    )


def thread_count(value: object, name: str = "threads") -> int:
    """`value` as a count of threads (0: one per core), or a ValueError/TypeError naming
    `name` and what was given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a whole number of threads, got {value!r}")
    if value < 0:
        raise ValueError(f"{name}: expected 0 (one per core) or more threads, got {value}")
    return int(value)
