"""Smoke test of an installed chunkfuse wheel, run by `make wheel-smoke` in a fresh virtual
environment (outside the checkout, with no Rust toolchain on PATH): the module imports from the
wheel, and `chunkfuse.read` and a plan run give zarr-python's values."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import chunkfuse
import numpy as np
import zarr


def main() -> None:
    where = Path(chunkfuse.__file__).resolve()
    assert "site-packages" in where.parts, f"chunkfuse imported from {where}, not the wheel"
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/x.zarr"
        values = np.arange(6 * 8 * 10, dtype="float32").reshape(6, 8, 10)
        zarr.create_array(src, data=values, chunks=(2, 4, 5))
        got = chunkfuse.read(src, np.s_[1:5, :, 3:9])
        np.testing.assert_array_equal(got, values[1:5, :, 3:9])
        plan = {
            "arrays": [{"id": "x", "zarr": src}],
            "ops": [
                {"id": "m", "op": "reduce", "input": "x", "func": "sum", "axes": [0]},
                {"id": "w", "op": "write", "input": "m", "target": f"{tmp}/m.zarr"},
            ],
        }
        chunkfuse.run_plan(json.dumps(plan))
        np.testing.assert_allclose(zarr.open_array(f"{tmp}/m.zarr")[...], values.sum(axis=0))
    print(f"wheel smoke: ok (chunkfuse from {where.parent}, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
