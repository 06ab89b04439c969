"""Where Zarr arrays live: the local path or URL the engine opens for a path, a URL or an
opened zarr-python array."""

from __future__ import annotations

import os
from typing import Any

import zarr


def local_url(store: Any, path: str | None) -> str | None:
    """The path or URL the engine opens for `store`/`path`: a local path, or an ``s3://`` or
    ``gs://`` URL for fsspec stores on object storage; None for any other kind of store."""
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
    elif isinstance(store, zarr.storage.FsspecStore):
        # Object storage the engine reads itself (credentials and endpoint from the
        # environment, as s3fs/gcsfs also read them).
        scheme = _object_scheme(store.fs.protocol)
        if scheme is None:
            return None
        root = f"{scheme}://{str(store.path).strip('/')}"
        return f"{root}/{path.strip('/')}" if path else root
    else:
        return None
    return os.path.join(root, path) if path else root


def _object_scheme(protocol: Any) -> str | None:
    names = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    for name, scheme in (("s3", "s3"), ("s3a", "s3"), ("gs", "gs"), ("gcs", "gs")):
        if name in names:
            return scheme
    return None


def _local_protocol(protocol: Any) -> bool:
    names = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return "file" in names or "local" in names


def zarr_array_url(array: zarr.Array) -> str | None:
    """The path or URL of an opened zarr-python array, or None where the engine cannot read it."""
    sp = array.store_path
    return local_url(sp.store, sp.path)


def engine_url(source: Any, what: str) -> str:
    """The URL the engine opens for `source`: a path, a URL or a zarr-python array on local
    disk or object storage. `what` names the argument in errors."""
    if isinstance(source, zarr.Array):
        url = zarr_array_url(source)
        if url is None:
            raise ValueError(
                f"{what}: the zarr array lives in a {type(source.store_path.store).__name__}; "
                "chunkfuse reads arrays on local disk and object storage (pass a path or URL)"
            )
        return url
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    raise TypeError(f"{what} must be a path or a zarr.Array, got {type(source).__name__}")
