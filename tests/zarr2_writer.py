"""Write one Zarr v2 array with zarr-python 2 (run with ``.venv-zarr2/bin/python``).

Usage: ``zarr2_writer.py SPEC_JSON`` where SPEC_JSON holds ``npy`` (input data), ``out``,
``chunks``, ``compressor`` (blosc | blosc-zstd-bitshuffle | zstd | zlib | none), ``order``
(C | F), ``fill_value`` (JSON; "NaN"/"Infinity" strings and [re, im] for complex),
``dimension_separator`` ("." or "/") and ``dtype`` (null, or e.g. ">f8" for big-endian).

Only used by the test suite (tests/conftest.py::write_v2); it runs in the zarr-python 2
environment, so it imports nothing from the tests.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numcodecs
import numpy as np
import zarr


def compressor_for(name: str) -> Any:
    if name == "blosc":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    if name == "blosc-zstd-bitshuffle":
        return numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE)
    if name == "zstd":
        return numcodecs.Zstd(level=3)
    if name == "zlib":
        return numcodecs.Zlib(level=5)
    if name == "none":
        return None
    raise SystemExit(f"unknown compressor {name!r}")


def decode_fill(value: Any) -> Any:
    if isinstance(value, list):
        return complex(decode_fill(value[0]), decode_fill(value[1]))
    if isinstance(value, str):
        return float(value.replace("Infinity", "inf"))
    return value


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    data = np.load(spec["npy"])
    dtype = np.dtype(spec["dtype"]) if spec.get("dtype") else data.dtype
    kwargs: dict[str, Any] = {}
    if spec.get("fill_value") is not None:
        kwargs["fill_value"] = decode_fill(spec["fill_value"])
    arr = zarr.open_array(
        spec["out"],
        mode="w",
        shape=data.shape,
        chunks=tuple(spec["chunks"]),
        dtype=dtype,
        compressor=compressor_for(spec["compressor"]),
        order=spec.get("order", "C"),
        dimension_separator=spec.get("dimension_separator", "."),
        **kwargs,
    )
    arr[...] = data.astype(dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
