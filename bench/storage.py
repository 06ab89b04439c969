"""The storage section of bench/run.py: full-array reads and random-crop reads.

    python bench/storage.py [--time 256] [--threads N] [--repeat 3] [--batches 8] [--s3-time 16]
                            [--s3-repeat 5] [--no-s3] [--skip zarr-python,...] [--quick]

Times, on the same data in one run, each measurement in its own child process (peak RSS is that
child's, through bench/run.py's ``measure``):

  full read   ``chunkfuse.read(ArrayReader(url))``  vs  zarr-python ``zarr.open_array(url)[:]``,
              zarrs-python (the same with ``codec_pipeline.path = zarrs.ZarrsCodecPipeline``),
              tensorstore ``ts.open(zarr3 spec).result().read().result()``; next to them the
              engine's decode floor ``chunkfuse bench decode`` (every chunk already in memory,
              decoded once: what no reader of this array can beat on this machine)
  crops       B batches of 32 windows of 4 x 128 x 128 at random positions (seed 0, the same
              positions for every tool): ``chunkfuse.read_windows(reader, starts, shape)`` once
              per batch; zarr-python / zarrs-python: from local disk a plain loop of
              ``a[t:t+4, y:y+128, x:x+128]``, from S3 every window's ``AsyncArray.getitem``
              gathered on zarr's event loop (the faster of the two in each place); tensorstore:
              every window's ``read()`` future issued, then all awaited (its idiomatic
              concurrency; concurrent reads of one chunk share one fetch and decode in its
              cache, even at its default cache pool size of 0)

first from local disk (page cache warm), then from a loopback S3 server (moto behind a proxy,
tests/s3_server.py) holding a smaller array of the same grid: moto serves ~100-150 requests/s
and ~470 MB/s from inside the driver process, so the S3 figures measure the tools against a slow
server, not S3 itself. zarr-python and zarrs-python read S3 through ``zarr.storage.ObjectStore``
(obstore) when it is importable (zarrs-python supports no fsspec S3 store); otherwise their S3
rows say why they are missing.

Every tool's output is hashed (sha1 of all bytes, outside the timed region) and compared with
chunkfuse's: the ``check`` column says ``ok`` or ``MISMATCH``.

The child processes are this script: ``python bench/storage.py child TOOL OP URL ...`` prints
one JSON object ``{"seconds", "checksum", "nbytes", "crops"}``; ``seconds`` excludes imports and
opening the array (metadata read) and includes everything after. The repeats go round the tools,
so a disturbance of the machine hits all of them alike; each keeps its best run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRIPT = Path(__file__).resolve()
TOOLS = ("chunkfuse", "zarr-python", "zarrs-python", "tensorstore")
PEER_MODULES = {
    "zarr-python": ("zarr",),
    "zarrs-python": ("zarr", "zarrs"),
    "tensorstore": ("tensorstore",),
}
WINDOW = (4, 128, 128)
BATCH = 32
SEED = 0
BUCKET = "chunkfuse-bench"
FLOOR = "chunkfuse decode floor"
# How zarr-python / zarrs-python read a batch of crops: the faster way in trials on this machine
# (local: a plain loop of a[box] beat gathering; S3: gathering beat the loop, zarr-python 1.5x).
ZARR_BATCH = {"local": "loop", "local, sharded": "loop", "s3": "gather"}


# --------------------------------------------------------------------------------------------
# Shared by the driver and the children
# --------------------------------------------------------------------------------------------


def window_for(shape: tuple[int, ...]) -> tuple[int, ...]:
    """4 x 128 x 128, shrunk to at most half of each axis for tiny (smoke-test) arrays."""
    return tuple(min(w, max(1, n // 2)) for w, n in zip(WINDOW, shape, strict=True))


def crop_starts(shape: tuple[int, ...], window: tuple[int, ...], batches: int) -> np.ndarray:
    """``(batches, BATCH, ndim)`` window corners, uniformly random (seed ``SEED``)."""
    rng = np.random.default_rng(SEED)
    return np.stack(
        [
            rng.integers(0, n - w + 1, size=(batches, BATCH))
            for n, w in zip(shape, window, strict=True)
        ],
        axis=-1,
    ).astype(np.int64)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --------------------------------------------------------------------------------------------
# Children: one tool, one op, timed
# --------------------------------------------------------------------------------------------


def _split_s3(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def _zarr_open(url: str, threads: int, zarrs: bool) -> Any:
    import zarr

    config: dict[str, Any] = {"threading.max_workers": threads}
    if zarrs:
        config["codec_pipeline.path"] = "zarrs.ZarrsCodecPipeline"
        config["codec_pipeline.strict"] = True  # fail rather than fall back to zarr-python's
    zarr.config.set(config)
    if url.startswith("s3://"):
        from obstore.store import S3Store
        from zarr.storage import ObjectStore

        bucket, prefix = _split_s3(url)
        # S3Store reads AWS_ENDPOINT_URL, the keys, AWS_REGION and AWS_ALLOW_HTTP from the env.
        store: Any = ObjectStore(S3Store(bucket, prefix=prefix), read_only=True)
    else:
        store = url
    return zarr.open_array(store, mode="r")


def _tensorstore_open(url: str, threads: int) -> Any:
    import tensorstore as ts

    context = ts.Context(
        {
            "data_copy_concurrency": {"limit": threads},
            "file_io_concurrency": {"limit": threads},
        }
    )
    if url.startswith("s3://"):
        bucket, prefix = _split_s3(url)
        kvstore: dict[str, Any] = {
            "driver": "s3",
            "bucket": bucket,
            "path": prefix + "/",
            "endpoint": os.environ["AWS_ENDPOINT_URL"],
            "aws_region": os.environ.get("AWS_REGION", "us-east-1"),
            "aws_credentials": {"type": "environment"},
        }
    else:
        kvstore = {"driver": "file", "path": url}
    return ts.open({"driver": "zarr3", "kvstore": kvstore}, context=context).result()


def _open(tool: str, url: str, threads: int) -> Any:
    if tool == "chunkfuse":
        import chunkfuse

        return chunkfuse.ArrayReader(url)
    if tool in ("zarr-python", "zarrs-python"):
        return _zarr_open(url, threads, tool == "zarrs-python")
    if tool == "tensorstore":
        return _tensorstore_open(url, threads)
    raise ValueError(f"unknown tool {tool}")


def _full(tool: str, array: Any, threads: int) -> np.ndarray:
    if tool == "chunkfuse":
        import chunkfuse

        return chunkfuse.read(array, threads=threads)
    if tool == "tensorstore":
        return array.read().result()
    return array[:]


def _batch_reader(
    tool: str, array: Any, window: tuple[int, ...], threads: int, zarr_batch: str = "loop"
) -> Callable[[np.ndarray], np.ndarray]:
    """A function reading one batch of windows (corners ``(BATCH, ndim)``) into one array.
    ``zarr_batch``: ``loop`` (``a[box]`` per window) or ``gather`` (every window's
    ``AsyncArray.getitem`` gathered on zarr's event loop) for zarr-python / zarrs-python."""
    if tool == "chunkfuse":
        import chunkfuse

        return lambda starts: chunkfuse.read_windows(array, starts, window, threads=threads)

    def boxes(starts: np.ndarray) -> list[tuple[slice, ...]]:
        return [
            tuple(slice(int(s), int(s) + w) for s, w in zip(row, window, strict=True))
            for row in starts
        ]

    if tool == "tensorstore":

        def read_ts(starts: np.ndarray) -> np.ndarray:
            futures = [array[box].read() for box in boxes(starts)]
            return np.stack([f.result() for f in futures])

        return read_ts

    if zarr_batch == "loop":
        return lambda starts: np.stack([array[box] for box in boxes(starts)])

    from zarr.core.sync import sync

    async_array = array._async_array

    async def gather(starts: np.ndarray) -> list[Any]:
        return await asyncio.gather(*(async_array.getitem(box) for box in boxes(starts)))

    return lambda starts: np.stack(sync(gather(starts)))


def _uring_read(url: str, out: np.ndarray, threads: int) -> float | str:
    """Seconds chunkfuse takes to read the local array at ``url`` into ``out`` with
    ``io="uring"`` (every chunk read into a pooled buffer through io_uring, where ``auto``
    maps whole chunk files), or why it cannot."""
    import chunkfuse

    try:
        chunkfuse.set_io("uring")
        reader = chunkfuse.ArrayReader(url)
    except Exception as e:  # noqa: BLE001 - io_uring refused here: say why in the report
        return f"io_uring unavailable: {e}"
    finally:
        chunkfuse.set_io("auto")
    start = time.perf_counter()
    chunkfuse.read(reader, out=out, threads=threads)
    return time.perf_counter() - start


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="storage.py child")
    parser.add_argument("tool", choices=TOOLS)
    parser.add_argument("op", choices=["full", "crops"])
    parser.add_argument("url")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--zarr-batch", choices=["loop", "gather"], default="loop")
    args = parser.parse_args(argv)
    array = _open(args.tool, args.url, args.threads)
    shape = tuple(int(n) for n in array.shape)
    digest = hashlib.sha1()
    if args.op == "full":
        start = time.perf_counter()
        out = _full(args.tool, array, args.threads)
        seconds = time.perf_counter() - start
        digest.update(memoryview(np.ascontiguousarray(out)).cast("B"))
        nbytes = out.nbytes
        del out
        # The same read again in this process: thread pools, connections and the allocator
        # are warm now (the output is a fresh array again).
        start = time.perf_counter()
        out = _full(args.tool, array, args.threads)
        again = time.perf_counter() - start
        reuse = None
        uring: float | str | None = None
        if args.tool == "chunkfuse":
            # Into the array just read (`out=`, as a training loop reuses its buffer): no
            # fresh memory for the kernel to zero and fault in.
            import chunkfuse

            start = time.perf_counter()
            chunkfuse.read(array, out=out, threads=args.threads)
            reuse = time.perf_counter() - start
            if "://" not in args.url:
                uring = _uring_read(args.url, out, args.threads)
    else:
        window = window_for(shape)
        starts = crop_starts(shape, window, args.batches)
        read = _batch_reader(args.tool, array, window, args.threads, args.zarr_batch)
        seconds, nbytes = 0.0, 0
        for batch in starts:
            start = time.perf_counter()
            out = read(batch)
            seconds += time.perf_counter() - start
            if out.shape != (BATCH, *window):
                raise AssertionError(f"batch of shape {out.shape}")
            digest.update(memoryview(np.ascontiguousarray(out)).cast("B"))
            nbytes += out.nbytes
    crops = 0 if args.op == "full" else int(starts.shape[0] * starts.shape[1])
    extra = {"again": again, "reuse": reuse, "uring": uring} if args.op == "full" else {}
    print(
        json.dumps(
            {
                "seconds": seconds,
                "checksum": digest.hexdigest()[:16],
                "nbytes": nbytes,
                "crops": crops,
                **extra,
            }
        )
    )
    return 0


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _upload(s3: Any, path: Path, bucket: str, prefix: str) -> int:
    client = s3.client()
    stored = 0
    for p in sorted(path.rglob("*")):
        if p.is_file():
            body = p.read_bytes()
            client.put_object(
                Bucket=bucket, Key=f"{prefix}/{p.relative_to(path).as_posix()}", Body=body
            )
            stored += len(body)
    return stored


def _missing(tool: str) -> str | None:
    absent = [m for m in PEER_MODULES.get(tool, ()) if not _importable(m)]
    return f"not installed ({', '.join(absent)})" if absent else None


def _merge(best: Any, new: Any) -> None:
    """Fold one run (``new``) into the best-of row ``best``: fastest seconds, highest RSS, every
    checksum seen."""
    sums = best.extra.get("checksums", set()) | {new.extra.get("checksum")} - {None}
    agains = [a for a in (best.extra.get("again_best"), new.extra.get("again")) if a is not None]
    reuses = [a for a in (best.extra.get("reuse_best"), new.extra.get("reuse")) if a is not None]
    urings = [a for a in (best.extra.get("uring_best"), new.extra.get("uring")) if a is not None]
    if new.seconds is None:
        best.note = best.note or new.note
    elif best.seconds is None or new.seconds < best.seconds:
        best.seconds, best.wall, best.nbytes = new.seconds, new.wall, new.nbytes
        best.extra = dict(new.extra)
    best.peak_rss = max(best.peak_rss or 0, new.peak_rss or 0) or None
    best.extra["checksums"] = sums
    if agains:
        best.extra["again_best"] = min(agains)
    if reuses:
        best.extra["reuse_best"] = min(reuses)
    if urings:
        # Seconds where io_uring ran, else why it did not.
        times = [a for a in urings if isinstance(a, float)]
        best.extra["uring_best"] = min(times) if times else urings[-1]


def _measure_set(
    measure: Callable[..., Any],
    row_type: Any,
    where: str,
    url: str,
    floor_path: Path | None,
    binary: Path,
    threads: int,
    repeat: int,
    batches: int,
    nbytes: int,
    tool_notes: dict[str, str],
    failures: list[str],
) -> tuple[list[Any], list[Any]]:
    """Full-read rows (tools, then the floor) and crop rows of one source. The repeats go round
    the tools (tool 1, tool 2, ..., tool 1, ...) so that a disturbance of the machine hits all
    of them alike; each row keeps its best run."""
    py = sys.executable
    out: dict[str, list[Any]] = {}
    for op in ("full", "crops"):
        print(f"storage {op} ({where}):", file=sys.stderr)
        commands: dict[str, list[str]] = {}
        rows: dict[str, Any] = {}
        for tool in TOOLS:
            rows[tool] = row_type(op, tool, "", note=tool_notes.get(tool, ""))
            if tool not in tool_notes:
                commands[tool] = [
                    *(py, str(SCRIPT), "child", tool, op, url),
                    *("--threads", str(threads), "--batches", str(batches)),
                    *("--zarr-batch", ZARR_BATCH[where]),
                ]
        if op == "full" and floor_path is not None:
            rows[FLOOR] = row_type(op, FLOOR, "")
            commands[FLOOR] = [
                *(str(binary), "bench", "decode", str(floor_path)),
                *("--threads", str(threads), "--json"),
            ]
        for _ in range(repeat):
            for tool, argv in commands.items():
                run = measure(f"{op}-{where}", tool, argv, nbytes if op == "full" else 0, 1, None)
                if op == "crops" and run.extra:
                    run.nbytes = int(run.extra.get("nbytes", 0))
                _merge(rows[tool], run)
                rows[tool].command = run.command
        reference = rows["chunkfuse"].extra.get("checksums", set())
        for tool, r in rows.items():
            if tool == FLOOR:
                continue
            sums = r.extra.get("checksums", set())
            if not sums:
                r.extra["check"] = ""
            elif len(reference) != 1:
                r.extra["check"] = "not compared"
            else:
                r.extra["check"] = "ok" if sums == reference else "MISMATCH"
            if r.seconds is None and tool not in tool_notes:
                failures.append(f"{op} ({where}) {tool}: {r.note}")
            elif r.extra["check"] == "MISMATCH":
                failures.append(f"{op} ({where}) {tool}: MISMATCH")
        out[op] = list(rows.values())
    return out["full"], out["crops"]


def _full_table(rows: list[Any]) -> list[str]:
    def again(r: Any) -> float | None:
        return r.extra.get("again_best") if r.extra else None

    base = next((r.seconds for r in rows if r.tool == "chunkfuse" and r.seconds), None)
    base2 = next((again(r) for r in rows if r.tool == "chunkfuse"), None)
    floor = next((r.seconds for r in rows if r.tool == FLOOR and r.seconds), None)
    lines = [
        "| tool | seconds | GB/s | ratio vs chunkfuse | 2nd read s | 2nd GB/s | 2nd ratio vs "
        "chunkfuse | wall s | peak RSS (MiB) | check | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = r.seconds / base if r.seconds and base else None
        a = again(r) if r.tool != FLOOR else floor
        ratio2 = a / base2 if a and base2 else None
        gbps2 = r.nbytes / a / 1e9 if a else None
        rss = r.peak_rss / 2**20 if r.peak_rss else None
        lines.append(
            f"| {r.tool} | {_fmt(r.seconds, '.3f')} | {_fmt(r.gbps, '.2f')} "
            f"| {_fmt(ratio, '.2f')} | {_fmt(a, '.3f')} | {_fmt(gbps2, '.2f')} "
            f"| {_fmt(ratio2, '.2f')} | {_fmt(r.wall, '.2f')} | {_fmt(rss, '.0f')} "
            f"| {r.extra.get('check', '')} | {r.note} |"
        )
    return lines


def _crops_per_second(r: Any) -> float | None:
    return r.extra["crops"] / r.seconds if r.seconds and r.extra.get("crops") else None


def _crops_table(rows: list[Any]) -> list[str]:
    base = next((_crops_per_second(r) for r in rows if r.tool == "chunkfuse"), None)
    lines = [
        "| tool | seconds | crops/s | wall s | peak RSS (MiB) | ratio vs chunkfuse | check "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        cps = _crops_per_second(r)
        ratio = base / cps if base and cps else None
        rss = r.peak_rss / 2**20 if r.peak_rss else None
        lines.append(
            f"| {r.tool} | {_fmt(r.seconds, '.3f')} | {_fmt(cps, '.1f')} | {_fmt(r.wall, '.2f')} "
            f"| {_fmt(rss, '.0f')} | {_fmt(ratio, '.2f')} | {r.extra.get('check', '')} "
            f"| {r.note} |"
        )
    return lines


def _summary(full: list[Any], crops: list[Any]) -> str:
    by = {r.tool: r for r in full}
    ours = by.get("chunkfuse")
    if ours is None or not ours.seconds:
        return "chunkfuse's full read failed."
    ours2 = ours.extra.get("again_best")

    def pair(first: float, second: float | None) -> str:
        return f"{first:.2f}×" + (f" / {second:.2f}×" if second is not None else "")

    parts = []
    for tool in ("zarrs-python", "tensorstore", "zarr-python"):
        r = by.get(tool)
        if r is not None and r.seconds:
            theirs2 = r.extra.get("again_best")
            second = theirs2 / ours2 if theirs2 and ours2 else None
            parts.append(f"{pair(r.seconds / ours.seconds, second)} {tool}'s GB/s")
    floor = by.get(FLOOR)
    text = "Full read (first read in the process / second): chunkfuse reaches " + (
        ", ".join(parts) or "no peer"
    )
    if floor is not None and floor.seconds:
        second = ours2 / floor.seconds if ours2 else None
        text += f"; its time is {pair(ours.seconds / floor.seconds, second)} the decode floor's"
    text += "."
    reuse = ours.extra.get("reuse_best")
    if reuse:
        versus = [
            f"{r.seconds / reuse:.2f}× {t}'s"
            for t in ("zarrs-python", "tensorstore", "zarr-python")
            if (r := by.get(t)) is not None and r.seconds
        ]
        text += (
            f" Read into a reused output array (`chunkfuse.read(..., out=)`), chunkfuse takes "
            f"{reuse:.3f} s: " + ", ".join(versus) + " GB/s (their first reads)"
        )
        if floor is not None and floor.seconds:
            text += f", {reuse / floor.seconds:.2f}× the decode floor's time"
        text += "."
    uring = ours.extra.get("uring_best")
    if isinstance(uring, float) and reuse:
        text += (
            f' The same with `io="uring"` (each chunk read into a pooled buffer through '
            f"io_uring instead of mapped): {uring:.3f} s, {uring / reuse:.2f}× the mapped read's."
        )
    elif isinstance(uring, str):
        text += f" No io_uring read: {uring}."
    rates = {r.tool: v for r in crops if (v := _crops_per_second(r)) is not None}
    if "chunkfuse" in rates:
        cparts = [
            f"{rates['chunkfuse'] / rates[t]:.2f}× {t}'s"
            for t in ("tensorstore", "zarrs-python", "zarr-python")
            if t in rates
        ]
        text += " Crops: chunkfuse reaches " + (", ".join(cparts) or "no peer") + " crops/s."
    return text


def sharded_shapes(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Inner chunks and shards of the sharded copy of a (time, lat, lon) array: inner chunks of
    8 steps and a quarter of each spatial axis (~2 MB for ERA5's grid), shards of 64 steps and
    2 x 2 inner chunks (~67 MB)."""
    inner = (min(8, shape[0]), -(-shape[1] // 4), -(-shape[2] // 4))
    shards = (min(64, shape[0]) // inner[0] * inner[0], 2 * inner[1], 2 * inner[2])
    return inner, shards


def ensure_sharded(binary: Path, source: Path, shape: tuple[int, ...]) -> Path:
    """A sharded Zarr v3 copy of ``source`` (zstd level 3 inner chunks; see ``sharded_shapes``),
    written by ``chunkfuse rechunk`` next to it once and reused."""
    inner, shards = sharded_shapes(shape)
    path = source.with_name(source.name.replace(".zarr", "-sharded.zarr"))
    marker = path.with_suffix(".ok")
    if path.exists() and marker.exists():
        return path
    print(f"writing {path} ...", file=sys.stderr)
    argv = [
        *(str(binary), "rechunk", str(source), str(path)),
        *("--chunks", ",".join(map(str, inner)), "--shards", ",".join(map(str, shards))),
        *("--codec", "zstd:3", "--json"),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"making the sharded copy failed:\n{proc.stderr}")
    marker.write_text(proc.stdout)
    return path


def storage_lines(
    threads: int,
    data_path: Path,
    *,
    binary: Path | None = None,
    repeat: int = 3,
    batches: int = 8,
    s3_time: int | None = 16,
    s3_repeat: int = 5,
    data_dir: Path | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
    measure: Callable[..., Any] | None = None,
    failures: list[str] | None = None,
    command: str | None = None,
    warm_bytes: int | None = None,
) -> list[str]:
    """The report section: full reads and random crops of ``data_path`` from local disk, then of
    a ``s3_time``-step array of the same grid (made next to it, in ``data_dir``) from a loopback
    S3 server (``s3_time=None``: no S3). Failed measurements go to ``failures``. ``warm_bytes``:
    what ``measure`` warms before each child, for the report (default: bench/run.py's)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import run as bench_run  # bench/run.py: measure, Row, ensure_data, warm_page_cache

    measure = measure or bench_run.measure
    warm_bytes = bench_run.WARM_BYTES if warm_bytes is None else warm_bytes
    failures = failures if failures is not None else []
    binary = binary or Path(
        os.environ.get("CHUNKFUSE_BIN", REPO / "target" / "release" / "chunkfuse")
    )
    data_dir = data_dir or data_path.parent
    import zarr

    meta = zarr.open_array(str(data_path), mode="r")
    shape = tuple(int(n) for n in meta.shape)
    nbytes = int(np.prod(shape)) * meta.dtype.itemsize
    window = window_for(shape)
    tool_notes = {t: n for t in TOOLS if (n := _missing(t)) is not None}
    for t in TOOLS[1:]:
        if t in skip:
            tool_notes[t] = "skipped"

    def local_set(where: str, path: Path) -> tuple[list[Any], list[Any]]:
        bench_run.warm_page_cache(path)
        return _measure_set(
            *(measure, bench_run.Row, where, str(path), path, binary, threads, repeat),
            *(batches, nbytes, tool_notes, failures),
        )

    full, crops = local_set("local", data_path)
    sharded = ensure_sharded(binary, data_path, shape)
    sharded_full, sharded_crops = local_set("local, sharded", sharded)
    inner, shards = sharded_shapes(shape)
    cmd = command or shlex.join([Path(sys.executable).name, *sys.argv])
    lines = [
        "## Storage: full reads and random crops",
        "",
        f"Command: `{cmd}`. Each measurement is its own child process (`bench/storage.py child "
        f"TOOL OP URL`), best of {repeat}; {threads} threads for every tool (chunkfuse "
        "`threads=`, zarr `threading.max_workers`, tensorstore `data_copy_concurrency` and "
        "`file_io_concurrency`). `seconds` excludes imports and opening the array; `wall s` is the "
        "whole child; peak RSS is that child's. Before each child the driver touches and frees "
        f"{warm_bytes / 2**30:.1f} GiB (`--warm-mem`), so every tool starts from memory "
        "the host already backs (bench/README.md). Outputs are compared by sha1 with chunkfuse's "
        "(`check`).",
        "",
        f"Full read: the whole array `{data_path.name}`, float32 {shape}, chunks "
        f"{tuple(meta.chunks)}, {nbytes / 1e6:.1f} MB decoded, page cache warm. GB/s = decoded "
        "bytes / seconds. `ratio vs chunkfuse` = seconds / chunkfuse's seconds: for a peer, "
        "chunkfuse's speed-up (above 1: the peer is slower); the decode floor row, `chunkfuse "
        "bench decode`, is the engine decoding every chunk already in memory into reused "
        "buffers, and chunkfuse's time is 1 / its ratio times the floor's. `seconds` is the "
        "first read in a fresh process (its output's pages are touched for the first time); "
        "`2nd read` is the same read again in that process (a new output array again, thread "
        "pools and allocator warm; for the floor row, the floor itself).",
        "",
        *_full_table(full),
        "",
        f"Random crops: {batches} batches of {BATCH} windows {window} at uniformly random "
        f"positions (seed {SEED}, the same for every tool), {batches * BATCH} crops. chunkfuse: "
        "one `read_windows(ArrayReader, starts, shape)` per batch (each touched chunk decoded "
        "once per batch); zarr-python and zarrs-python: a loop of `a[t:t+4, y:y+128, x:x+128]` "
        "(faster here than gathering the batch on zarr's event loop); tensorstore: every "
        "window's `read()` future issued, then awaited (default context, cache pool 0: "
        "concurrent reads of one chunk still share one decode). `seconds` = the batches' read "
        "time summed; crops/s = crops / seconds; `ratio vs chunkfuse` = chunkfuse's crops/s / "
        "the tool's.",
        "",
        *_crops_table(crops),
        "",
        _summary(full, crops),
        "",
        "### The same array sharded",
        "",
        f"`{sharded.name}`: the same values in Zarr v3 shards {shards} of inner chunks {inner} "
        "(zstd level 3), written by `chunkfuse rechunk`. chunkfuse reads each shard's index, "
        "then runs of neighbouring inner chunks (up to 8 MiB per read), and decodes the inner "
        "chunks in parallel; the floor decodes every inner chunk from memory. Same tools, "
        "settings and crops as above.",
        "",
        *_full_table(sharded_full),
        "",
        *_crops_table(sharded_crops),
        "",
        _summary(sharded_full, sharded_crops),
        "",
    ]

    if s3_time is None or "s3" in skip:
        return lines
    try:
        sys.path.insert(0, str(REPO / "tests"))
        from s3_server import S3Server
    except ImportError as exc:
        return [*lines, f"S3 rows omitted: the loopback server cannot start ({exc}).", ""]
    small, _ = bench_run.ensure_data(data_dir, s3_time, shape[1], shape[2])
    s3_repeats = max(repeat, s3_repeat) if repeat > 1 else 1  # one repeat: a smoke run
    small_meta = zarr.open_array(str(small), mode="r")
    small_shape = tuple(int(n) for n in small_meta.shape)
    small_nbytes = int(np.prod(small_shape)) * small_meta.dtype.itemsize
    window = window_for(small_shape)
    s3_notes = dict(tool_notes)
    for t in ("zarr-python", "zarrs-python"):
        if t not in s3_notes and not _importable("obstore"):
            s3_notes[t] = (
                "no S3 store: obstore not installed (s3fs is not used: see bench/README.md)"
            )
    with S3Server() as s3:
        s3.create_bucket(BUCKET)
        prefix = small.name
        stored = _upload(s3, small, BUCKET, prefix)
        with _environ(s3.env()):
            s3_full, s3_crops = _measure_set(
                measure,
                bench_run.Row,
                "s3",
                f"s3://{BUCKET}/{prefix}",
                small,
                binary,
                threads,
                s3_repeats,
                batches,
                small_nbytes,
                s3_notes,
                failures,
            )
        requests = s3.request_count
    lines += [
        "### The same from a loopback S3 server",
        "",
        f"A smaller array of the same grid, `{small.name}`: float32 {small_shape}, "
        f"{small_nbytes / 1e6:.1f} MB decoded, {stored / 1e6:.1f} MB stored, uploaded to a moto "
        "server behind a proxy on 127.0.0.1 (`tests/s3_server.py`, in the driver process). Moto "
        "answers ~100-150 requests/s and ~470 MB/s, so these rows compare the tools against a "
        "slow server, not against S3. chunkfuse: `s3://` URL, endpoint and keys from `AWS_*`; "
        "tensorstore: kvstore driver `s3` (`endpoint`, `aws_region`, keys from the environment); "
        "zarr-python and zarrs-python: `zarr.storage.ObjectStore(obstore S3Store)`. The floor "
        f"row decodes the same array from memory. Best of {s3_repeats} (moto is "
        "noisy)." + (f" {requests:,} requests served in all." if requests else ""),
        "",
        *_full_table(s3_full),
        "",
        f"Random crops: {batches} batches of {BATCH} windows {window}; each batch touches "
        f"almost every one of the {small_shape[0]} chunks (chunkfuse fetches each once per "
        "batch, tensorstore once per batch where reads overlap in time, zarr-python and "
        "zarrs-python once per window). zarr-python and zarrs-python gather the batch's "
        "`AsyncArray.getitem`s on zarr's event loop (faster from S3 than the loop).",
        "",
        *_crops_table(s3_crops),
        "",
        _summary(s3_full, s3_crops),
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=int, default=256)
    parser.add_argument("--lat", type=int, default=721)
    parser.add_argument("--lon", type=int, default=1440)
    parser.add_argument("--data", type=Path, default=BENCH / "data")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8, help="batches of 32 crops")
    parser.add_argument("--s3-time", type=int, default=16, help="time steps of the S3 array")
    parser.add_argument("--s3-repeat", type=int, default=5, help="best of N from S3 (noisier)")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--skip", default="", help="comma-separated peers to skip (or s3)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (T=4, 73 x 144)")
    parser.add_argument(
        "--warm-mem", default=None, help="memory touched and freed before each child (0: none)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.time, args.lat, args.lon, args.repeat, args.batches, args.s3_time = 4, 73, 144, 1, 2, 4
        args.data = Path(tempfile.gettempdir()) / "chunkfuse-bench-quick-data"
    sys.path.insert(0, str(BENCH))
    import run as bench_run
    from run import ensure_data

    bench_run.WARM_BYTES = (
        bench_run.default_warm_bytes(args.quick)
        if args.warm_mem is None
        else bench_run.parse_size(args.warm_mem)
    )

    source, _ = ensure_data(args.data, args.time, args.lat, args.lon)
    failures: list[str] = []
    lines = storage_lines(
        args.threads,
        source,
        repeat=args.repeat,
        batches=args.batches,
        s3_time=None if args.no_s3 else args.s3_time,
        s3_repeat=args.s3_repeat,
        data_dir=args.data,
        skip={s for s in args.skip.split(",") if s},
        failures=failures,
        command=shlex.join([Path(sys.executable).name, "bench/storage.py", *argv]),
    )
    print("\n".join(lines))
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    chunkfuse_failed = [f for f in failures if " chunkfuse" in f]
    return 1 if chunkfuse_failed or (args.quick and failures) else 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
