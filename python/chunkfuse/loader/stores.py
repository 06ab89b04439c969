"""What a source's URL holds, as the loader needs it: a Zarr group as xarray opens it (named
dimensions, coordinates, CF decoding), or a bare Zarr array as zarr-python opens it (the
dimension names its metadata gives, positions as labels, values as stored)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import chunkfuse._engine as _engine


class SourceError(ValueError):
    """A source that cannot serve the windows asked of it: the message names the source and
    the dimension."""


@dataclass(frozen=True)
class Decoding:
    """What xarray's CF decoding does to a variable's stored values."""

    scale: float | None
    offset: float | None
    fill: Any

    @property
    def identity(self) -> bool:
        """Whether the stored values are the decoded ones."""
        return self.scale is None and self.offset is None and self.fill is None

    @staticmethod
    def of(var: Any) -> Decoding:
        """The decoding of a variable xarray opened (its `encoding`)."""
        enc = var.encoding
        fill = enc.get("_FillValue")
        stored = np.dtype(enc.get("dtype", var.dtype))
        if fill is not None and stored.kind == "f" and np.isnan(fill):
            fill = None  # a NaN fill value reads as NaN already
        return Decoding(enc.get("scale_factor"), enc.get("add_offset"), fill)

    def apply(self, raw: npt.NDArray[Any], out: npt.NDArray[Any], threads: int) -> None:
        """Decodes `raw` into `out` in the engine (the GIL released)."""
        _engine.decode_cf(
            raw.reshape(-1).view(np.uint8),
            raw.dtype.name,
            out.reshape(-1).view(np.uint8),
            out.dtype.name,
            None if self.scale is None else float(self.scale),
            None if self.offset is None else float(self.offset),
            None if self.fill is None else float(self.fill),
            threads,
        )

    def apply_torch(self, raw: Any, dtype: np.dtype[Any]) -> Any:
        """Decodes `raw` (a torch tensor of stored values, on whatever device it lies) into a
        new tensor of `dtype` on that device, computing as `apply` does: the stored value
        converted to `dtype`, times the scale, plus the offset, NaN where it is the fill."""
        import torch

        if self.identity:
            return raw
        kind = torch.float32 if np.dtype(dtype) == np.float32 else torch.float64
        x = raw.to(kind)
        if self.scale is not None:
            x = x * torch.tensor(float(self.scale), dtype=kind, device=raw.device)
        if self.offset is not None:
            x = x + torch.tensor(float(self.offset), dtype=kind, device=raw.device)
        if self.fill is not None:
            x[raw.to(torch.float64) == float(self.fill)] = float("nan")
        return x


#: Stored values read as they are: a bare array's, or a group variable without CF attributes.
AS_STORED = Decoding(None, None, None)


@dataclass(frozen=True)
class Layout:
    """The variables a source reads, as the loader sees them."""

    #: The variables, in the order asked for.
    variables: tuple[str, ...]
    #: Their dimensions (the same for every variable).
    dims: tuple[str, ...]
    sizes: dict[str, int]
    #: Each dimension's labels: its coordinate, or its positions where it has none.
    coords: dict[str, npt.NDArray[Any]]
    #: The dimensions labelled by position (no coordinate).
    positional: frozenset[str]
    #: Per variable: its decoded dtype, how its stored values decode, and its array's URL.
    dtypes: dict[str, np.dtype[Any]]
    decodings: dict[str, Decoding]
    urls: dict[str, str]


def open_layout(name: str, url: str, variables: Sequence[str] | None) -> Layout:
    """The layout of the group or array at `url` (a group's `variables`; an array's own name,
    the last part of its URL without `.zarr`, when `variables` is None)."""
    node = _zarr_node(name, url)
    if node is not None:
        return _array_layout(name, url, node, variables)
    return _group_layout(name, url, variables)


def _zarr_node(name: str, url: str) -> Any | None:
    """The array at `url` as zarr-python opens it, or None where `url` holds a group."""
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*onsolidated metadata.*")
            node = zarr.open(url, mode="r")
    except Exception as e:
        raise SourceError(
            f"source {name!r}: cannot open {url} as a Zarr group or array: {e}"
        ) from e
    return node if isinstance(node, zarr.Array) else None


def _array_layout(name: str, url: str, array: Any, variables: Sequence[str] | None) -> Layout:
    # Its name: the last part of its URL, without a `.zarr` suffix ("era5.zarr/t2m": "t2m",
    # "sat.zarr": "sat").
    own = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".zarr") or url
    if variables is not None and list(variables) != [own]:
        raise SourceError(
            f"source {name!r}: {url} is a Zarr array, not a group; read it with "
            f"variables=None (or [{own!r}]), or give its group's URL to choose variables"
        )
    dims = _array_dims(array)
    sizes = {d: int(n) for d, n in zip(dims, array.shape, strict=True)}
    return Layout(
        variables=(own,),
        dims=dims,
        sizes=sizes,
        coords={d: np.arange(n) for d, n in sizes.items()},
        positional=frozenset(dims),
        dtypes={own: np.dtype(array.dtype)},
        decodings={own: AS_STORED},
        urls={own: url},
    )


def _array_dims(array: Any) -> tuple[str, ...]:
    """A bare array's dimension names: Zarr v3's `dimension_names`, else xarray's
    `_ARRAY_DIMENSIONS` attribute, else `dim_0`, `dim_1`, ... as xarray names them."""
    names = getattr(array.metadata, "dimension_names", None)
    if not names or any(n is None for n in names):
        names = array.attrs.get("_ARRAY_DIMENSIONS")
    if not names or len(names) != array.ndim:
        names = [f"dim_{i}" for i in range(array.ndim)]
    return tuple(str(n) for n in names)


def _group_layout(name: str, url: str, variables: Sequence[str] | None) -> Layout:
    import xarray as xr

    if not variables:
        raise SourceError(f"source {name!r}: {url} is a Zarr group: name the variables to read")
    try:
        with warnings.catch_warnings():
            # A store without consolidated metadata is fine: xarray reads it unconsolidated.
            warnings.filterwarnings("ignore", message=".*consolidated metadata.*")
            ds = xr.open_zarr(url, chunks=None)
    except Exception as e:
        raise SourceError(f"source {name!r}: cannot open {url} as a Zarr group: {e}") from e
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        raise SourceError(
            f"source {name!r}: {url} has no variable {missing[0]!r} "
            f"(it has {sorted(str(v) for v in ds.data_vars)})"
        )
    dims = tuple(str(d) for d in ds[variables[0]].dims)
    for v in variables[1:]:
        if tuple(str(d) for d in ds[v].dims) != dims:
            raise SourceError(
                f"source {name!r}: variables {variables[0]!r} and {v!r} have different "
                f"dimensions ({dims} and {ds[v].dims})"
            )
    sizes = {d: int(ds.sizes[d]) for d in dims}
    coords = {d: np.asarray(ds[d].values) for d in dims if d in ds.coords}
    positional = frozenset(d for d in dims if d not in coords)
    coords.update({d: np.arange(sizes[d]) for d in positional})
    decodings = {v: Decoding.of(ds[v]) for v in variables}
    for v, decoding in decodings.items():
        if not decoding.identity and np.dtype(ds[v].dtype).name not in ("float32", "float64"):
            raise SourceError(
                f"source {name!r}, variable {v!r}: xarray decodes it to {ds[v].dtype}; "
                "the loader decodes packed values to float32 or float64 only"
            )
    return Layout(
        variables=tuple(variables),
        dims=dims,
        sizes=sizes,
        coords=coords,
        positional=positional,
        dtypes={v: np.dtype(ds[v].dtype) for v in variables},
        decodings=decodings,
        urls={v: f"{url.rstrip('/')}/{v}" for v in variables},
    )
