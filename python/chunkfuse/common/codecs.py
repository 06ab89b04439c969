"""Filters of a zarr-python array that the engine cannot read, or cannot write as numcodecs
writes them: the frontends keep work on such an array in Python (see docs/dask.md)."""

from __future__ import annotations

from typing import Any

#: numcodecs filters the engine reads (through zarrs). It writes none of them: zarrs rounds
#: halves away from zero in `fixedscaleoffset`, where numcodecs rounds them to even.
_READ = frozenset({"fixedscaleoffset", "vlen-utf8"})


def filter_ids(array: Any) -> list[str]:
    """The numcodecs filters of `array`: a v2 array's `filters`, a v3 array's `numcodecs.*`
    codecs (by their numcodecs id)."""
    meta = array.metadata
    if meta.zarr_format == 2:
        return [str(getattr(f, "codec_id", f)) for f in (meta.filters or ())]
    names = (getattr(c, "codec_name", None) for c in meta.codecs)
    return [n.removeprefix("numcodecs.") for n in names if isinstance(n, str)]


def unsupported_filter(array: Any, writing: bool) -> str | None:
    """Why the engine cannot read (or, when `writing`, write) `array`'s values as
    zarr-python does; None when it can."""
    for name in filter_ids(array):
        if writing or name not in _READ:
            action = "write" if writing else "read"
            return f"an array with a numcodecs {name!r} filter, which the engine does not {action}"
    return None
