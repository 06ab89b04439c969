"""Cubed on chunkfuse: the same array code, computed by RustExecutor.

    python examples/cubed_quickstart.py [--size N]

Makes an N x N float32 Zarr array, computes `sum((x + 1) * 2, axis=0)`, a mean and a rechunk
with Cubed's threads executor and with RustExecutor, and checks that they agree.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import cubed
import cubed.array_api as xp
import numpy as np
import zarr
from chunkfuse import RustExecutor
from cubed.runtime.create import create_executor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4000, help="array side (default 4000)")
    args = parser.parse_args()
    n = args.size
    chunk = max(1, n // 8)

    with tempfile.TemporaryDirectory() as tmp:
        url = str(Path(tmp) / "x.zarr")
        data = np.random.default_rng(0).random((n, n), dtype=np.float32)
        zarr.create_array(url, shape=data.shape, chunks=(chunk, chunk), dtype=data.dtype)[...] = (
            data
        )

        spec = cubed.Spec(work_dir=tmp, allowed_mem="500MB")
        x = cubed.from_zarr(url, spec=spec)
        rust = RustExecutor()
        threads = create_executor("threads")
        for label, build in [
            ("sum((x + 1) * 2, axis=0)", lambda: xp.sum((x + 1) * 2, axis=0)),
            ("mean(x, axis=1)", lambda: xp.mean(x, axis=1)),
            ("x.rechunk((n, chunk // 2))", lambda: x.rechunk((n, max(1, chunk // 2)))),
        ]:
            t0 = time.perf_counter()
            ours = build().compute(executor=rust)
            t1 = time.perf_counter()
            theirs = build().compute(executor=threads)
            t2 = time.perf_counter()
            np.testing.assert_allclose(ours, theirs, rtol=1e-5)
            stats = rust.last_stats
            print(
                f"{label:28s} RustExecutor {t1 - t0:6.3f} s, threads {t2 - t1:6.3f} s "
                f"({(t2 - t1) / (t1 - t0):4.1f}x); native tasks {stats.native_tasks}, "
                f"Python tasks {stats.python_tasks}"
            )
    print("results agree")


if __name__ == "__main__":
    main()
