"""Shared fixtures and helpers for the chunkfuse Python test suite.

The suite drives the ``chunkfuse`` CLI (found through ``CHUNKFUSE_BIN``, default
``<repo>/target/release/chunkfuse``) and compares what it writes with numpy, reading the output
with zarr-python 3. Input arrays are written with zarr-python 3 in this interpreter, or with
zarr-python 2 through ``.venv-zarr2`` (a subprocess running ``tests/zarr2_writer.py``).

Fixtures are session scoped so that hypothesis tests may use them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.codecs

# A suite started in the background by a shell (`make test &`, nohup) inherits SIGINT ignored,
# and so would every child it starts: the Ctrl-C tests would see their SIGINT ignored, as no
# user at a terminal does. The suite and its children take Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ZARR2_PYTHON = Path(
    os.environ.get("CHUNKFUSE_ZARR2_PYTHON", REPO / ".venv-zarr2" / "bin" / "python")
)
ZARR2_WRITER = TESTS / "zarr2_writer.py"
RSS_EXEC = REPO / "scripts" / "rss_exec.py"

#: Dtypes the plan IR knows (docs/plan-ir.md).
ENGINE_DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
)

#: Keys of the ``--json`` summary printed by ``chunkfuse run`` and ``chunkfuse rechunk``.
SUMMARY_KEYS: dict[str, type | tuple[type, ...]] = {
    "plan": str,
    "seconds": (int, float),
    "tasks": int,
    "bytes_read": int,
    "bytes_written": int,
    "decoded_bytes": int,
    "peak_rss": int,
    "max_mem": int,
    "outputs": list,
    "device": str,
    "gpu_blocks": int,
}

Plan = dict[str, Any]


def chunkfuse_bin_path() -> Path:
    """Where the CLI binary is expected (``$CHUNKFUSE_BIN`` or the release build)."""
    env = os.environ.get("CHUNKFUSE_BIN")
    return Path(env) if env else REPO / "target" / "release" / "chunkfuse"


# --------------------------------------------------------------------------------------------
# Running the CLI
# --------------------------------------------------------------------------------------------


@dataclass
class CliResult:
    """One finished CLI process."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    #: ``ru_maxrss`` of exactly this command, in bytes (0 unless measured; see run_measured).
    peak_rss: int
    wall_seconds: float

    def json(self) -> dict[str, Any]:
        """stdout parsed as exactly one JSON object."""
        text = self.stdout.strip()
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AssertionError(
                f"stdout of {self.args} is not one JSON object ({exc}):\n{self.stdout}\n"
                f"stderr:\n{self.stderr}"
            ) from exc
        assert isinstance(value, dict), f"expected a JSON object, got {value!r}"
        return value

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.args)}\nexit status: {self.returncode}\n"
            f"stdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"
        )


def run_measured(
    args: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = 600.0,
    measure_rss: bool = False,
) -> CliResult:
    """Run one child process; return its output, exit status and (optionally) peak RSS.

    With ``measure_rss`` the command runs under ``scripts/rss_exec.py``, which reports the
    ``ru_maxrss`` of exactly that command: measured directly from this (large) pytest process, a
    child's ``ru_maxrss`` would start at pytest's own RSS (see that script). Without it
    ``peak_rss`` is 0. stdout/stderr go to temporary files, so nothing blocks on full pipes.
    """
    argv = [str(a) for a in args]
    spec = importlib.util.spec_from_file_location("rss_exec", RSS_EXEC)
    assert spec is not None and spec.loader is not None, f"cannot load {RSS_EXEC}"
    rss_exec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rss_exec)
    m = rss_exec.run_measured(argv, timeout, measure_rss)
    if m.timed_out:
        raise AssertionError(
            f"timed out after {timeout}s: {' '.join(argv)}\nstderr:\n{m.stderr[-4000:]}"
        )
    return CliResult(
        args=argv,
        returncode=m.returncode,
        stdout=m.stdout,
        stderr=m.stderr,
        peak_rss=m.peak_rss,
        wall_seconds=m.wall,
    )


def check_summary(summary: Mapping[str, Any]) -> None:
    """The ``--json`` summary of ``run``/``rechunk`` has the documented keys and types."""
    for key, kind in SUMMARY_KEYS.items():
        assert key in summary, f"summary lacks {key!r}: {summary}"
        value = summary[key]
        assert isinstance(value, kind), f"summary[{key!r}] = {value!r} is not {kind}"
        if kind is int:
            assert not isinstance(value, bool) and value >= 0, f"summary[{key!r}] = {value!r}"
    assert all(isinstance(o, str) for o in summary["outputs"]), summary["outputs"]
    assert summary["seconds"] >= 0


class Cli:
    """Runs ``chunkfuse`` subcommands and checks exit status."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self._counter = itertools.count()

    def __call__(
        self,
        *args: str | os.PathLike[str],
        expect_rc: int | None = 0,
        timeout: float = 600.0,
        measure_rss: bool = False,
    ) -> CliResult:
        result = run_measured([self.binary, *args], timeout=timeout, measure_rss=measure_rss)
        if expect_rc is not None and result.returncode != expect_rc:
            pytest.fail(f"expected exit status {expect_rc}\n{result.describe()}", pytrace=False)
        return result

    def write_plan(self, plan: Plan | str | os.PathLike[str]) -> Path:
        """A plan dict is written to a fresh JSON file; a path is used as is."""
        if isinstance(plan, dict):
            path = self.workdir / f"plan-{os.getpid()}-{next(self._counter)}.json"
            path.write_text(json.dumps(plan, indent=1))
            return path
        return Path(plan)

    def run_plan(
        self,
        plan: Plan | str | os.PathLike[str],
        params: Mapping[str, str | os.PathLike[str]] | None = None,
        max_mem: str | None = None,
        expect_rc: int = 0,
        *,
        threads: int | None = None,
        extra_args: Iterable[str] = (),
        timeout: float = 600.0,
    ) -> dict[str, Any]:
        """Run ``chunkfuse run PLAN --json``.

        On success (``expect_rc == 0``) returns the parsed summary (checked for the documented
        keys) plus ``"_stderr"``; otherwise returns
        ``{"returncode", "stdout", "stderr"}`` after checking the exit status.
        """
        path = self.write_plan(plan)
        args: list[str | os.PathLike[str]] = ["run", path]
        for name, value in (params or {}).items():
            args += ["--param", f"{name}={value}"]
        if max_mem is not None:
            args += ["--max-mem", max_mem]
        if threads is not None:
            args += ["--threads", str(threads)]
        args += list(extra_args)
        args.append("--json")
        result = self(*args, expect_rc=expect_rc, timeout=timeout)
        if expect_rc != 0:
            return {
                "returncode": result.returncode,
                "stdout": result.stdout,
                "stderr": result.stderr,
            }
        summary = result.json()
        check_summary(summary)
        summary["_stderr"] = result.stderr
        return summary


@pytest.fixture(scope="session")
def chunkfuse_bin() -> Path:
    """The CLI binary; a missing binary is a failure, never a skip."""
    path = chunkfuse_bin_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"chunkfuse binary not found at {path}: build it with `cargo build --release` "
            "or set CHUNKFUSE_BIN",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def cli(chunkfuse_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(chunkfuse_bin, tmp_path_factory.mktemp("plans"))


@pytest.fixture(scope="session")
def run_plan(cli: Cli) -> Callable[..., dict[str, Any]]:
    """``run_plan(plan_dict_or_path, params, max_mem=None, expect_rc=0) -> dict``."""
    return cli.run_plan


# --------------------------------------------------------------------------------------------
# Writing and reading Zarr arrays
# --------------------------------------------------------------------------------------------


def power_spectrum_plan(
    source: str | os.PathLike[str], target: str | os.PathLike[str], chunks: Sequence[int]
) -> dict[str, Any]:
    """The plan of ``abs(rfft(x, axis=0)) ** 2`` of the array at ``source``, written to
    ``target`` in ``chunks`` (op ids: f, m, p, w)."""
    return {
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {"id": "f", "op": "fft", "input": "x", "kind": "rfft", "axis": 0},
            {
                "id": "m",
                "op": "elementwise",
                "inputs": ["f"],
                "expr": {"op": "abs", "args": [{"input": 0}]},
            },
            {
                "id": "p",
                "op": "elementwise",
                "inputs": ["m"],
                "expr": {"op": "multiply", "args": [{"input": 0}, {"input": 0}]},
            },
            {"id": "w", "op": "write", "input": "p", "target": str(target), "chunks": list(chunks)},
        ],
    }


def chunk_grid(shape: Sequence[int], chunks: Sequence[int]) -> list[tuple[int, ...]]:
    """All chunk grid indices of an array."""
    counts = [max(1, -(-s // c)) for s, c in zip(shape, chunks, strict=True)]
    return list(itertools.product(*(range(n) for n in counts)))


def chunk_region(
    index: Sequence[int], shape: Sequence[int], chunks: Sequence[int]
) -> tuple[slice, ...]:
    return tuple(
        slice(i * c, min((i + 1) * c, s)) for i, s, c in zip(index, shape, chunks, strict=True)
    )


def apply_missing(
    data: np.ndarray,
    chunks: Sequence[int],
    missing: Iterable[Sequence[int]],
    fill_value: Any,
) -> np.ndarray:
    """What an array reads as once the chunks (or shards) ``missing`` are deleted."""
    out = np.array(data, copy=True, order="C")
    for index in missing:
        out[chunk_region(index, data.shape, chunks)] = fill_value
    return out


def v3_chunk_key(index: Sequence[int]) -> str:
    return "/".join(["c", *map(str, index)]) if index else "c"


def v2_chunk_key(index: Sequence[int], separator: str = ".") -> str:
    return separator.join(map(str, index)) if index else "0"


def v3_codec(name: str, level: int | None = None) -> list[Any] | None:
    """zarr-python 3 ``compressors=`` for a short codec name."""
    if name == "zstd":
        return [zarr.codecs.ZstdCodec(level=3 if level is None else level)]
    if name == "gzip":
        return [zarr.codecs.GzipCodec(level=5 if level is None else level)]
    if name == "blosc":
        return [zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    if name == "zstd+crc32c":
        return [zarr.codecs.ZstdCodec(level=3), zarr.codecs.Crc32cCodec()]
    if name == "crc32c":
        return [zarr.codecs.Crc32cCodec()]
    if name == "none":
        return None
    raise ValueError(f"unknown codec {name!r}")


def write_v3(
    path: Path,
    data: np.ndarray,
    chunks: Sequence[int],
    *,
    shards: Sequence[int] | None = None,
    codec: str = "zstd",
    level: int | None = None,
    filters: Sequence[Any] | None = None,
    serializer: Any = "auto",
    fill_value: Any = None,
    missing: Iterable[Sequence[int]] = (),
) -> np.ndarray:
    """Write ``data`` as a Zarr v3 array with zarr-python 3; return what it reads as.

    ``missing`` lists chunk indices (shard indices when sharded) whose stored object is deleted
    afterwards, so readers must produce ``fill_value`` there.
    """
    kwargs: dict[str, Any] = {}
    if fill_value is not None:
        kwargs["fill_value"] = fill_value
    arr = zarr.create_array(
        store=str(path),
        shape=data.shape,
        dtype=data.dtype,
        chunks=tuple(chunks),
        shards=tuple(shards) if shards is not None else None,
        compressors=v3_codec(codec, level),
        filters=list(filters) if filters is not None else None,
        serializer=serializer,
        overwrite=True,
        zarr_format=3,
        **kwargs,
    )
    arr[...] = data
    fill = arr.metadata.fill_value
    missing = [tuple(m) for m in missing]
    grid = tuple(shards) if shards is not None else tuple(chunks)
    for index in missing:
        key = path / v3_chunk_key(index)
        if key.exists():
            key.unlink()
    return apply_missing(data, grid, missing, fill)


def write_v2(
    path: Path,
    data: np.ndarray,
    chunks: Sequence[int],
    *,
    compressor: str = "blosc",
    order: str = "C",
    fill_value: Any = None,
    dimension_separator: str = ".",
    missing: Iterable[Sequence[int]] = (),
    dtype: str | None = None,
) -> np.ndarray:
    """Write ``data`` as a Zarr v2 array with zarr-python 2.18 (``.venv-zarr2``).

    ``compressor`` is one of ``blosc`` (lz4, clevel 5, byte shuffle: zarr-python 2's default),
    ``blosc-zstd-bitshuffle``, ``zstd``, ``zlib``, ``none``; ``dtype`` may name a non-native
    byte order such as ``">f8"``. Returns what the array reads as.
    """
    if not ZARR2_PYTHON.exists():
        pytest.fail(f"{ZARR2_PYTHON} is missing: the zarr-python 2 environment is required")
    with tempfile.TemporaryDirectory() as tmp:
        npy = Path(tmp) / "data.npy"
        np.save(npy, np.ascontiguousarray(data))
        spec = {
            "npy": str(npy),
            "out": str(path),
            "chunks": list(chunks),
            "compressor": compressor,
            "order": order,
            "fill_value": encode_fill(fill_value),
            "dimension_separator": dimension_separator,
            "dtype": dtype,
        }
        proc = subprocess.run(
            [str(ZARR2_PYTHON), str(ZARR2_WRITER), json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"zarr-python 2 writer failed:\n{proc.stderr}", pytrace=False)
    meta = json.loads((path / ".zarray").read_text())
    fill = decode_fill(meta["fill_value"], data.dtype)
    missing = [tuple(m) for m in missing]
    for index in missing:
        key = path / v2_chunk_key(index, dimension_separator)
        if key.exists():
            key.unlink()
    expected = data if fill is None else apply_missing(data, chunks, missing, fill)
    return np.asarray(expected, dtype=data.dtype)


def encode_fill(value: Any) -> Any:
    """A fill value as JSON (NaN/inf as strings, complex as [re, im])."""
    if value is None:
        return None
    if isinstance(value, (complex, np.complexfloating)):
        return [encode_fill(float(value.real)), encode_fill(float(value.imag))]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    f = float(value)
    if np.isnan(f):
        return "NaN"
    if np.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return f


def decode_fill(value: Any, dtype: np.dtype[Any]) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return complex(decode_fill(value[0], np.dtype("f8")), decode_fill(value[1], np.dtype("f8")))
    if isinstance(value, str):
        return float(value.replace("Infinity", "inf"))
    return np.asarray(value).astype(dtype)[()]


def read_zarr(path: Path | str) -> np.ndarray:
    """Read a whole Zarr array (v2 or v3) with zarr-python 3."""
    arr = zarr.open_array(str(path), mode="r")
    return np.asarray(arr[...])


def open_zarr(path: Path | str) -> Any:
    return zarr.open_array(str(path), mode="r")


def zarr_format_of(path: Path) -> int | None:
    if (path / "zarr.json").exists():
        return 3
    if (path / ".zarray").exists():
        return 2
    return None


def list_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def assert_no_partial_files(root: Path) -> None:
    """No temporary / partial file is visible and every stored chunk decodes."""
    files = list_files(root)
    bad = [p for p in files if ".tmp" in p.name.lower() or "partial" in p.name.lower()]
    assert not bad, f"temporary files left behind: {bad}"
    fmt = zarr_format_of(root)
    if fmt is None:
        # no metadata: there must be no chunk either
        assert not files, f"chunk files without array metadata: {files}"
        return
    arr = zarr.open_array(str(root), mode="r")
    shape = arr.shape
    grid = arr.shards if getattr(arr, "shards", None) else arr.chunks
    for index in chunk_grid(shape, grid):
        key = v3_chunk_key(index) if fmt == 3 else v2_chunk_key(index)
        if (root / key).exists():
            arr[chunk_region(index, shape, grid)]  # raises if the stored object does not decode


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------------


def assert_same_array(
    result: np.ndarray, expected: np.ndarray, *, check_dtype: bool = True
) -> None:
    """Exact equality (NaN == NaN), same shape, and by default the same dtype."""
    assert result.shape == expected.shape, f"shape {result.shape} != numpy {expected.shape}"
    if check_dtype:
        assert result.dtype == expected.dtype, f"dtype {result.dtype} != numpy {expected.dtype}"
    np.testing.assert_array_equal(result, expected, strict=False)


def dtype_eps(dtype: np.dtype[Any]) -> float:
    if dtype.kind in "fc":
        return float(np.finfo(dtype).eps)
    return float(np.finfo(np.float64).eps)


def single_precision(dtype: np.dtype[Any]) -> bool:
    return (dtype.kind == "f" and dtype.itemsize <= 4) or (
        dtype.kind == "c" and dtype.itemsize <= 8
    )


def tolerance_floor(dtype: np.dtype[Any]) -> float:
    """Smallest relative tolerance used for floating results of a given precision."""
    return 1e-5 if single_precision(dtype) else 1e-12
