"""Where Zarr arrays live: the local path or URL the engine opens for a path, a URL or an
opened zarr-python array."""

from __future__ import annotations

import os
from typing import Any

import zarr


def local_url(store: Any, path: str | None) -> str | None:
    """The local filesystem path of `store`/`path`, or None for any other kind of store."""
    if isinstance(store, (str, os.PathLike)):
        root = os.fspath(store)
        if root.startswith("file://"):
            root = root[len("file://") :]
        elif "://" in root:
            return None
    elif isinstance(store, zarr.storage.LocalStore):
        root = str(store.root)
    elif isinstance(store, zarr.storage.FsspecStore) and _local_protocol(store.fs.protocol):
        # `da.from_zarr(path)` opens local paths through fsspec.
        root = str(store.path)
    else:
        return None
    return os.path.join(root, path) if path else root


def _local_protocol(protocol: Any) -> bool:
    names = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return "file" in names or "local" in names


def zarr_array_url(array: zarr.Array) -> str | None:
    """The local path of an opened zarr-python array, or None when it is not on local disk."""
    sp = array.store_path
    return local_url(sp.store, sp.path)


def engine_url(source: Any, what: str) -> str:
    """The URL the engine opens for `source`: a path, a `file://` URL or a zarr-python array
    on local disk. `what` names the argument in errors."""
    if isinstance(source, zarr.Array):
        url = zarr_array_url(source)
        if url is None:
            raise ValueError(
                f"{what}: the zarr array lives in a {type(source.store_path.store).__name__}; "
                "chunkfuse reads arrays on local disk (pass a path)"
            )
        return url
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    raise TypeError(f"{what} must be a path or a zarr.Array, got {type(source).__name__}")
