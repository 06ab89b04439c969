"""A source of training windows: variables of a Zarr group, in named dimensions, with the
coordinates xarray decodes (CF times, packed values), or a bare Zarr array, and a window per
dimension around each anchor. Values are read by the engine (`ArrayReader.read_into`, GIL
released), then decoded as xarray would (`scale_factor`, `add_offset`, `_FillValue` to NaN),
also by the engine (`decode_cf`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from chunkfuse.loader.stores import SourceError, open_layout
from chunkfuse.reading import ArrayReader, ChunkCache, _device_read

__all__ = ["METHODS", "Source", "SourceError", "Window"]

#: How a source's coordinate is matched to an anchor's label: `exact`, `nearest` (within half
#: the coordinate's step) or `pad` (the last label at or before the anchor's: the latest
#: forecast issued by then).
METHODS = ("exact", "nearest", "pad")


@dataclass(frozen=True)
class Window:
    """The window along one dimension: `length` steps starting `offset` steps from the
    anchor's index (`offset=-3, length=4`: three steps of history and the anchor's)."""

    offset: int
    length: int


def _window(spec: int | tuple[int, int] | Window) -> Window:
    if isinstance(spec, Window):
        return spec
    if isinstance(spec, int):
        # A bare length: the anchor's index first.
        return Window(0, spec)
    offset, length = spec
    return Window(int(offset), int(length))


class Source:
    """Variables `variables` of the Zarr group at `url` (or of the Dataset xarray opened from
    it, `xr.open_zarr(url)`, which must be the whole store; or a DataArray whose encoding
    names its store, `variables=None` reading it by its name), or the bare Zarr array at
    `url` (`variables=None`: its dimensions named by its metadata, `dim_0`, ... without
    names; its values as stored), read as windows.

    `window` maps each dimension to a length (from the anchor's index on), an (offset, length)
    pair or a `Window`; dimensions it omits are read whole. `align` maps a dimension to how
    its coordinate is matched to anchor labels (see `METHODS`; default `exact`). A dimension
    without a coordinate (every dimension of a bare array) is labelled by position, 0, 1, ...,
    and aligns only with dimensions labelled the same way. With `max_missing` (a fraction, 0
    to 1), the loader drops the anchors where more than that share of this source's window
    values (over its variables) are missing: NaN, or the variable's `_FillValue`; the engine
    counts them in one pass before the first batch."""

    def __init__(
        self,
        name: str,
        url: str | os.PathLike[str] | Any,
        variables: Sequence[str] | None,
        window: Mapping[str, int | tuple[int, int] | Window],
        *,
        align: Mapping[str, str] | None = None,
        max_missing: float | None = None,
    ) -> None:
        import xarray as xr

        self.name = name
        opened = url if isinstance(url, (xr.Dataset, xr.DataArray)) else None
        if opened is not None:
            url, variables = _opened_store(name, opened, variables)
        self.url = os.fspath(url)
        layout = open_layout(name, self.url, variables)
        if opened is not None:
            _check_whole(name, opened, layout.sizes)
        self.variables = layout.variables
        self.dims = layout.dims
        self.sizes = layout.sizes
        #: Each dimension's labels: its coordinate, or its positions (`positional`).
        self.coords: dict[str, npt.NDArray[Any]] = layout.coords
        #: The dimensions without a coordinate, labelled by position.
        self.positional = layout.positional
        self.windows: dict[str, Window] = {}
        for dim, spec in window.items():
            if dim not in self.sizes:
                raise SourceError(
                    f"source {name!r} has no dimension {dim!r} (its variables have {self.dims})"
                )
            w = _window(spec)
            if w.length < 1 or w.length > self.sizes[dim]:
                raise SourceError(
                    f"source {name!r}, dimension {dim!r}: a window of {w.length} steps does "
                    f"not fit its {self.sizes[dim]}"
                )
            self.windows[dim] = w
        if max_missing is not None and not 0 <= max_missing <= 1:
            raise SourceError(
                f"source {name!r}: max_missing must be a fraction from 0 to 1, got {max_missing}"
            )
        self.max_missing = max_missing
        self.align = dict(align or {})
        for dim, method in self.align.items():
            if method not in METHODS:
                raise SourceError(
                    f"source {name!r}, dimension {dim!r}: alignment {method!r} is not one of "
                    f"{METHODS}"
                )
        self.shape = tuple(
            self.windows[d].length if d in self.windows else self.sizes[d] for d in self.dims
        )
        self._decode = layout.decodings
        self.dtypes = layout.dtypes
        self._readers = {v: ArrayReader(layout.urls[v]) for v in self.variables}

    def indices(self, dim: str, labels: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """The index along `dim` of each anchor label (-1 where none matches)."""
        return _match(self.coords[dim], labels, self.align.get(dim, "exact"))

    def starts(self, dim: str, index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The first index of the window along `dim` for anchors at `index`."""
        return index + self.windows[dim].offset

    def fits(self, dim: str, index: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Whether the window along `dim` at each `index` (-1: unmatched) lies in the array."""
        w = self.windows.get(dim, Window(0, self.sizes[dim]))
        first = index + w.offset
        return (index >= 0) & (first >= 0) & (first + w.length <= self.sizes[dim])

    def missing_share(
        self, starts: Sequence[npt.NDArray[np.int64]], threads: int = 0
    ) -> npt.NDArray[np.float64]:
        """The share of missing values (NaN, or a variable's `_FillValue`), over every
        variable, in the window at each combination of `starts` (per dimension of the source,
        ascending window starts), shaped by those combinations."""
        counts = np.zeros(tuple(len(s) for s in starts), dtype=np.uint64)
        lists = [[int(v) for v in s] for s in starts]
        for v, reader in self._readers.items():
            out = np.empty(counts.shape, dtype=np.uint64)
            fill = self._decode[v].fill
            reader.count_missing(
                list(self.shape),
                lists,
                out.reshape(-1).view(np.uint8),
                None if fill is None else float(fill),
                threads,
            )
            counts += out
        return counts / float(np.prod(self.shape) * len(self._readers))

    def read(
        self,
        starts: npt.NDArray[np.int64],
        out: Mapping[str, npt.NDArray[Any]],
        threads: int,
        cache: ChunkCache | None = None,
    ) -> None:
        """Reads each variable's windows at `starts` (an (n, ndim) array) into `out`, taking
        decoded chunks from `cache` and keeping those decoded there."""
        corners = starts.tolist()
        for v, reader in self._readers.items():
            decoding = self._decode[v]
            raw = out[v] if decoding.identity else np.empty(out[v].shape, np.dtype(reader.dtype))
            reader.read_into(
                corners, list(self.shape), raw.reshape(-1).view(np.uint8), threads, cache
            )
            if not decoding.identity:
                decoding.apply(raw, out[v], threads)

    def read_device(self, starts: npt.NDArray[np.int64], threads: int) -> dict[str, Any]:
        """Each variable's windows at `starts` (an (n, ndim) array) read onto the GPU (zstd
        chunks decoded there by nvCOMP) as torch CUDA tensors of `(n, *shape)`, CF-decoded
        there."""
        import torch

        rows = starts.tolist()
        out = {}
        for v, reader in self._readers.items():
            raw = torch.from_dlpack(
                _device_read(reader, rows, list(self.shape), [len(rows), *self.shape], threads)
            )
            out[v] = self._decode[v].apply_torch(raw, self.dtypes[v])
        return out


def _opened_store(name: str, opened: Any, variables: Sequence[str] | None) -> tuple[str, list[str]]:
    """The store path of a Dataset or DataArray xarray opened from Zarr, and the variables
    to read (a DataArray's own name unless given)."""
    import xarray as xr

    source = opened.encoding.get("source")
    if isinstance(opened, xr.DataArray):
        if variables is None:
            if opened.name is None:
                raise SourceError(f"source {name!r}: the DataArray has no name to read it by")
            variables = [str(opened.name)]
    if not source:
        raise SourceError(
            f"source {name!r}: the {type(opened).__name__} does not say which store it was "
            "opened from (encoding['source']; a DataArray taken from a Dataset does not): "
            "give the Zarr store's URL, or the Dataset xr.open_zarr(url) returned"
        )
    return str(source), list(variables or [])


def _check_whole(name: str, opened: Any, stored: Mapping[str, int]) -> None:
    """Refuses a Dataset or DataArray that is a selection of its store along a dimension the
    source reads: the loader reads the store, so a subset would be silently ignored."""
    for dim, size in opened.sizes.items():
        if dim in stored and stored[dim] != size:
            raise SourceError(
                f"source {name!r}, dimension {dim!r}: the {type(opened).__name__} holds "
                f"{size} of the store's {stored[dim]} labels; the loader reads "
                "the whole store: restrict anchors with where= or keep= instead"
            )


def _match(coord: npt.NDArray[Any], labels: npt.NDArray[Any], method: str) -> npt.NDArray[np.int64]:
    """Indices into `coord` (monotonic) of `labels` by `method`; -1 where none matches."""
    n = coord.shape[0]
    descending = n > 1 and coord[0] > coord[-1]
    c = coord[::-1] if descending else coord
    pos = np.searchsorted(c, labels, side="left")
    found = np.full(labels.shape, -1, dtype=np.int64)
    inside = pos < n
    exact = inside & (c[np.minimum(pos, n - 1)] == labels)
    found[exact] = pos[exact]
    if method == "pad":
        before = np.searchsorted(c, labels, side="right") - 1
        found = np.where(before >= 0, before, -1)
    elif method == "nearest" and n > 1:
        steps = np.diff(c)
        half = np.abs(steps).min() / 2
        lo = np.clip(pos - 1, 0, n - 1)
        hi = np.clip(pos, 0, n - 1)
        pick = np.where(np.abs(c[hi] - labels) <= np.abs(labels - c[lo]), hi, lo)
        near = np.abs(c[pick] - labels) <= half
        found = np.where(near, pick, -1)
    if descending:
        found = np.where(found >= 0, n - 1 - found, -1)
    return found.astype(np.int64)
