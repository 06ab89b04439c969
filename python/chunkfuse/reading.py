"""Direct reads: the engine fetches and decodes chunks concurrently, with the GIL released,
into one new numpy array.

``read(url, selection)`` reads a whole array or a basic selection of it; ``read_windows(url,
starts, shape)`` reads many same-shaped windows at once (random crops for training), decoding
every chunk they touch once. URLs are local paths, ``file://``, ``s3://``, ``gs://``,
``http(s)://`` or ``memory://``. With ``device="cuda"`` both return a `DeviceArray` in GPU
memory (zstd chunks decoded there by nvCOMP), for ``torch.from_dlpack`` and the like.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import chunkfuse._engine as _engine
import chunkfuse.iomode as iomode
from chunkfuse.sizes import thread_count

__all__ = ["ArrayReader", "ChunkCache", "DeviceArray", "read", "read_windows"]

Selection = Any  # an int, a slice, Ellipsis, or a tuple of them (numpy basic indexing)


ArrayReader = _engine.ArrayReader
ChunkCache = _engine.ChunkCache
DeviceArray = _engine.DeviceArray

#: The variable naming nvCOMP's library (or its folder) for device reads.
NVCOMP_VAR = "CHUNKFUSE_NVCOMP"

Source = str | os.PathLike[str] | ArrayReader


def _reader(source: Source) -> ArrayReader:
    if isinstance(source, ArrayReader):
        return source
    if isinstance(source, (str, os.PathLike)):
        return ArrayReader(os.fspath(source))
    raise TypeError(
        f"url must be a path, a URL string or a chunkfuse.ArrayReader, got {type(source).__name__}"
    )


def _fill(
    reader: ArrayReader,
    starts: list[list[int]],
    size: list[int],
    threads: int,
    out: npt.NDArray[Any] | None = None,
    cache: ChunkCache | None = None,
) -> npt.NDArray[Any]:
    """The windows of `size` at `starts`, read into `out` (or a new array), returned as an
    ``(n, *size)`` array."""
    threads = thread_count(threads)
    dtype = np.dtype(reader.dtype)
    shape = (len(starts), *size)
    if out is None:
        # numpy allocates large arrays lazily (and on huge pages where it can): the decode
        # threads, not this one, touch the memory first.
        target = np.empty(shape, dtype=dtype)
    else:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(
                f"out must be a writable C-contiguous {dtype} array, got a "
                f"{'' if out.flags.c_contiguous else 'non-contiguous '}{out.dtype} array"
            )
        if out.size != int(np.prod(shape)):
            raise ValueError(f"out holds {out.size} elements, the read gives {np.prod(shape)}")
        target = out.reshape(shape)
    reader.read_into(starts, size, target.reshape(-1).view(np.uint8), threads, cache)
    return target


def _point_at_nvcomp() -> None:
    """Points the engine at the ``nvidia-libnvcomp`` wheel's library when one is installed and
    `CHUNKFUSE_NVCOMP` is not set (the engine looks there, else on the system's path)."""
    if os.environ.get(NVCOMP_VAR):
        return
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    for folder in spec.submodule_search_locations or []:
        lib = os.path.join(folder, "lib64")
        if os.path.isdir(lib):
            os.environ[NVCOMP_VAR] = lib
            return


def _on_device(device: str) -> bool:
    """Whether a read goes to the GPU: ``cpu`` no, ``cuda`` yes (an error without one),
    ``auto`` when one can be used."""
    if not isinstance(device, str) or device.lower() not in ("cpu", "cuda", "gpu", "auto"):
        raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'auto'")
    name = device.lower()
    if name == "cpu":
        return False
    if name == "auto":
        return _engine.device_info("auto").startswith("cuda")
    return True


def _device_read(
    reader: ArrayReader,
    starts: list[list[int]],
    size: list[int],
    out_shape: Sequence[int],
    threads: int,
) -> DeviceArray:
    _point_at_nvcomp()
    return reader.read_device(starts, size, [int(n) for n in out_shape], thread_count(threads))


def _expand(selection: Selection, rank: int) -> list[Any]:
    """The selection as one entry (int or slice) per axis."""
    items = list(selection) if isinstance(selection, tuple) else [selection]
    ellipses = sum(1 for s in items if s is Ellipsis)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if ellipses:
        at = items.index(Ellipsis)
        fill = rank - (len(items) - 1)
        items[at : at + 1] = [slice(None)] * max(fill, 0)
    if len(items) > rank:
        raise IndexError(
            f"too many indices for array: array is {rank}-dimensional, "
            f"but {len(items)} were indexed"
        )
    return items + [slice(None)] * (rank - len(items))


def _bounds(
    selection: Selection, shape: tuple[int, ...]
) -> tuple[list[int], list[int], tuple[Any, ...], bool]:
    """The box to read (start, size), the selection relative to it, and whether it strides."""
    start: list[int] = []
    size: list[int] = []
    local: list[Any] = []
    strided = False
    for axis, (item, n) in enumerate(zip(_expand(selection, len(shape)), shape, strict=True)):
        if isinstance(item, slice):
            r = range(*item.indices(n))
            if len(r) == 0:
                start.append(0)
                size.append(0)
                local.append(slice(0, 0))
                continue
            lo, hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
            start.append(lo)
            size.append(hi - lo)
            stop = r[-1] - lo + (1 if r.step > 0 else -1)
            local.append(slice(r[0] - lo, stop if stop >= 0 else None, r.step))
            strided = strided or r.step != 1
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            start.append(i % n)
            size.append(1)
            local.append(0)
        else:
            raise IndexError(
                f"chunkfuse.read takes basic selections (ints, slices, ...); "
                f"axis {axis} got {type(item).__name__}"
            )
    return start, size, tuple(local), strided


def read(
    source: Source,
    selection: Selection = None,
    *,
    out: npt.NDArray[Any] | None = None,
    threads: int = 0,
    io: str | None = None,
    device: str = "cpu",
) -> Any:
    """Read the array at `source` (a path or URL, or an open `ArrayReader`), or a basic
    `selection` of it (as ``zarr_array[selection]``), into a new numpy array, or into `out`
    (a C-contiguous array of the result's dtype and size, reused across calls: no new
    memory to fault in; selections with steps take no `out`); `threads` decode threads (0:
    one per core); `io` sets how local files are read (see `chunkfuse.set_io`).

    `device="cuda"` reads into GPU memory instead and returns a `DeviceArray` (zstd chunks
    are decoded on the GPU by nvCOMP, found through the ``nvidia-libnvcomp-cu13`` wheel or
    ``CHUNKFUSE_NVCOMP``; other chunks on the CPU); hand it over with ``torch.from_dlpack``,
    ``cupy.from_dlpack`` or ``jax.dlpack.from_dlpack``. Without a usable GPU that is an error
    saying why; ``"auto"`` reads to the GPU when there is one, else to numpy."""
    iomode.apply(io)
    reader = _reader(source)
    shape = tuple(int(n) for n in reader.shape)
    if _on_device(device):
        if out is not None:
            raise ValueError("out is a host array: a read to the GPU makes its own array")
        if selection is None:
            return _device_read(reader, [[0] * len(shape)], list(shape), shape, threads)
        start, size, local, strided = _bounds(selection, shape)
        if strided:
            raise ValueError("a read to the GPU takes selections without steps")
        kept = [n for n, item in zip(size, local, strict=True) if not isinstance(item, int)]
        return _device_read(reader, [start], size, kept, threads)
    if selection is None:
        whole = _fill(reader, [[0] * len(shape)], list(shape), threads, out)[0]
        return whole if out is None else out
    start, size, local, strided = _bounds(selection, shape)
    if out is not None and strided:
        raise ValueError("out cannot take a selection with steps")
    box = _fill(reader, [start], size, threads, out)[0][local]
    if out is not None:
        return out
    return np.ascontiguousarray(box) if strided else box


def read_windows(
    source: Source,
    starts: npt.ArrayLike,
    shape: Sequence[int],
    *,
    out: npt.NDArray[Any] | None = None,
    threads: int = 0,
    io: str | None = None,
    cache: ChunkCache | None = None,
    device: str = "cpu",
) -> Any:
    """Read the windows of `shape` whose first corners are the rows of `starts` (an
    ``(n, ndim)`` array of non-negative ints) into one ``(n, *shape)`` numpy array (or into
    `out`, reused across calls), read concurrently; each chunk the windows touch is read and
    decoded once. Open the array once with ``ArrayReader(url)`` and pass that to skip
    reading its metadata on every call. A `ChunkCache` keeps decoded chunks across calls
    within its byte budget, so later windows over the same chunks do not decode them
    again (for arrays that do not change meanwhile). `device="cuda"` (or ``"auto"``) reads
    them into one `DeviceArray` in GPU memory instead, as `read` does (no `out`, no
    `cache`)."""
    iomode.apply(io)
    reader = _reader(source)
    corners = np.asarray(starts)
    if corners.ndim != 2 or (corners.size and not np.issubdtype(corners.dtype, np.integer)):
        raise ValueError(
            f"starts must be an (n, ndim) array of integers, got shape {corners.shape} "
            f"and dtype {corners.dtype}"
        )
    if corners.size and corners.min() < 0:
        raise ValueError("starts must be non-negative")
    size = [int(s) for s in shape]
    if any(s < 0 for s in size):
        raise ValueError(f"window shape must be non-negative, got {tuple(size)}")
    if _on_device(device):
        if out is not None or cache is not None:
            raise ValueError("out and cache are for host reads: a read to the GPU takes neither")
        rows = corners.reshape(-1, len(size)).tolist() if corners.size else []
        return _device_read(reader, rows, size, [len(rows), *size], threads)
    return _fill(reader, corners.tolist(), size, threads, out, cache)
