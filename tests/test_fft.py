"""FFTs against numpy.fft: the engine's `fft` plan op (property tests over kinds, axes, n,
norm, dtypes and chunkings, axes spanning several chunks included), `chunkfuse.fft` on Cubed
arrays with RustExecutor (native) and with Cubed's own executor, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chunkfuse
import chunkfuse.fft as cf
import cubed
import cubed.array_api as xp
import numpy as np
import pytest
import zarr
from chunkfuse import RustExecutor
from conftest import Cli, power_spectrum_plan, read_zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KINDS = ("fft", "ifft", "rfft", "irfft")
NORMS = ("backward", "ortho", "forward")
DTYPES = ("float32", "float64", "complex64", "complex128", "int16")


def numpy_fft(
    a: np.ndarray, kind: str, nd: bool, axes: list[int], lengths: list[int] | None, norm: str
) -> np.ndarray:
    if nd:
        return getattr(np.fft, kind + "n")(a, s=lengths, axes=axes, norm=norm)
    n = None if lengths is None else lengths[0]
    return getattr(np.fft, kind)(a, n=n, axis=axes[0], norm=norm)


def assert_fft_close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype and shape; values within the precision's rounding, scaled by the largest
    magnitude (an FFT mixes every value of a lane into every output)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    single = want.dtype in (np.float32, np.complex64)
    rtol = 2e-5 if single else 1e-11
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    err = float(np.abs(got.astype(np.complex128) - want.astype(np.complex128)).max(initial=0.0))
    assert err <= rtol * scale * 10, f"max error {err} (scale {scale})"


def sample(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.startswith("int"):
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run_fft_plan(
    cli: Cli, source: Path, target: Path, op: dict[str, Any], max_mem: str = "64MB"
) -> dict[str, Any]:
    plan = {
        "arrays": [{"id": "x", "zarr": str(source)}],
        "ops": [
            {"id": "f", "op": "fft", "input": "x", **op},
            {"id": "w", "op": "write", "input": "f", "target": str(target)},
        ],
    }
    return cli.run_plan(plan, max_mem=max_mem)


@st.composite
def fft_cases(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, n)) for n in shape)
    kind = draw(st.sampled_from(KINDS))
    dtype = draw(st.sampled_from(DTYPES))
    if kind == "rfft" and dtype.startswith("complex"):
        dtype = "float64"
    nd = draw(st.booleans())
    if nd:
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    else:
        axes = [draw(st.integers(-rank, rank - 1))]
    lengths = None
    if draw(st.booleans()):
        lengths = [draw(st.integers(1, 16)) for _ in axes]
    if kind == "irfft" and lengths is None and shape[axes[-1]] < 2:
        lengths = [2] * len(axes)
    return {
        "shape": shape,
        "chunks": chunks,
        "kind": kind,
        "dtype": dtype,
        "nd": nd,
        "axes": axes,
        "lengths": lengths,
        "norm": draw(st.sampled_from(NORMS)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fft_cases())
def test_engine_fft_matches_numpy(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]
) -> None:
    tmp = tmp_path_factory.mktemp("fft")
    a = sample(np.random.default_rng(case["seed"]), case["shape"], case["dtype"])
    zarr.create_array(str(tmp / "x.zarr"), data=a, chunks=case["chunks"])
    op: dict[str, Any] = {"kind": case["kind"] + ("n" if case["nd"] else ""), "norm": case["norm"]}
    if case["nd"]:
        op["axes"] = case["axes"]
        if case["lengths"] is not None:
            op["s"] = case["lengths"]
    else:
        op["axis"] = case["axes"][0]
        if case["lengths"] is not None:
            op["n"] = case["lengths"][0]
    run_fft_plan(cli, tmp / "x.zarr", tmp / "out.zarr", op)
    want = numpy_fft(a, case["kind"], case["nd"], case["axes"], case["lengths"], case["norm"])
    assert_fft_close(read_zarr(tmp / "out.zarr"), want)


@pytest.mark.parametrize(
    ("shape", "chunks", "axis", "kind"),
    [
        ((6, 721, 16), (2, 100, 16), 1, "rfft"),  # 721 = 7 x 103, over 8 chunks
        ((3, 8, 1440), (1, 8, 200), 2, "fft"),  # 1440, over 8 chunks
        ((4, 721, 5), (4, 91, 5), 1, "irfft"),
        ((40, 6, 7), (3, 6, 7), 0, "ifft"),  # the time axis over 14 chunks
    ],
)
def test_awkward_lengths_over_several_chunks(
    cli: Cli, tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], axis: int, kind: str
) -> None:
    for dtype in ("float32", "float64"):
        a = sample(np.random.default_rng(3), shape, dtype)
        zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=chunks, overwrite=True)
        run_fft_plan(cli, tmp_path / "x.zarr", tmp_path / "out.zarr", {"kind": kind, "axis": axis})
        assert_fft_close(read_zarr(tmp_path / "out.zarr"), getattr(np.fft, kind)(a, axis=axis))


@pytest.mark.parametrize(
    ("max_mem", "way", "lon_chunk"),
    [
        # Budgets under 16 MiB run on one thread whatever is asked (see README, Memory).
        ("64MB", "in 1 band", 40),
        ("3MB", "in 2 bands", 40),
        ("1500KB", "spilled", 40),
        ("64MB", "in 1 band", 16),
        ("2MB", "in 2 bands", 16),
    ],
)
def test_fft_along_a_finely_split_axis_reads_bands_or_spills_whichever_is_cheaper(
    cli: Cli, tmp_path: Path, max_mem: str, way: str, lon_chunk: int
) -> None:
    """Time is split into one chunk per step, so every output block needs a slab of every
    chunk. With room, the input is held in memory in bands, each decoded once (zstd chunks
    only as far as a band reaches in them); when the bands would be so many that decoding for
    each costs more than a rechunked copy, the copy is spilled first. The result equals numpy
    either way, and no chunk is decoded once per output block."""
    a = sample(np.random.default_rng(5), (48, 240, 40), "float32")
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(1, 240, 40))
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}],
        "ops": [
            {"id": "f", "op": "fft", "input": "x", "kind": "rfft", "axis": 0},
            {
                "id": "w",
                "op": "write",
                "input": "f",
                "target": str(tmp_path / "out.zarr"),
                "chunks": [-1, 15, lon_chunk],
            },
        ],
    }
    # Blocks read their boxes where they lie in the band: whole rows of it (40), or rows of
    # 16 lanes 40 apart, then an edge of 8 that the kernel cannot read so, copied out first.
    summary = cli.run_plan(plan, max_mem=max_mem, threads=2)
    stages = summary["stages"]
    if way == "spilled":
        assert stages[0]["label"] == "write f input", stages
        assert not any(s["strategy"] == "bands" for s in stages), stages
    else:
        want = ("write w", "bands", [1, 1, 1], 1 if way == "in 1 band" else 2)
        assert [(s["label"], s["strategy"], s["unit"], s["bands"]) for s in stages] == [want]
        # 16 blocks each need all 48 chunks: read per block, that is 16 decodes of each;
        # in bands, at most one full decode per band.
        bands = 1 if way == "in 1 band" else 2
        assert summary["decoded_bytes"] <= bands * a.nbytes, summary
    assert_fft_close(read_zarr(tmp_path / "out.zarr"), np.fft.rfft(a, axis=0))


def test_fft_read_by_a_reduction_spills_rather_than_bands(cli: Cli, tmp_path: Path) -> None:
    """Only a write's tasks run band by band. A reduction of a transform whose regions (from the
    rechunk before it, as Cubed plans them) each need a slab of every time step reads a
    rechunked copy, decoding each chunk once, instead of re-reading every chunk per task."""
    a = sample(np.random.default_rng(8), (48, 60, 40), "float32")
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(1, 60, 40))
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}],
        "ops": [
            {"id": "c", "op": "rechunk", "input": "x", "chunks": [-1, 15, 20]},
            {"id": "f", "op": "fft", "input": "c", "kind": "rfft", "axis": 0},
            {
                "id": "m",
                "op": "elementwise",
                "inputs": ["f"],
                "expr": {"op": "abs", "args": [{"input": 0}]},
            },
            {"id": "r", "op": "reduce", "input": "m", "func": "mean", "axes": [1]},
            {"id": "w", "op": "write", "input": "r", "target": str(tmp_path / "out.zarr")},
        ],
    }
    summary = cli.run_plan(plan, max_mem="64MB", threads=2)
    stages = summary["stages"]
    assert stages[0]["label"] == "write f input", stages
    assert not any(s["strategy"] == "bands" for s in stages), stages
    # The source decoded once and the copy read once (per task, 4 decodes of each chunk).
    assert summary["decoded_bytes"] <= 2 * a.nbytes, summary
    want = np.abs(np.fft.rfft(a, axis=0)).mean(axis=1)
    np.testing.assert_allclose(read_zarr(tmp_path / "out.zarr"), want, rtol=1e-5, atol=1e-4)


def test_power_spectrum_regions_follow_the_write_at_any_budget(cli: Cli, tmp_path: Path) -> None:
    """|rfft|**2 written in (-1, 15, 20) chunks: the transform is computed chunk by chunk of
    the write (not in a few huge blocks) even when the budget could hold far more."""
    a = sample(np.random.default_rng(6), (32, 60, 80), "float32")
    zarr.create_array(str(tmp_path / "x.zarr"), data=a, chunks=(1, 60, 80))
    plan = power_spectrum_plan(tmp_path / "x.zarr", tmp_path / "out.zarr", [-1, 15, 20])
    for max_mem in ("64MB", "4GB"):
        summary = cli.run_plan(plan, max_mem=max_mem, threads=2)
        write = [s for s in summary["stages"] if s["label"] == "write w"]
        assert len(write) == 1, summary["stages"]
        assert write[0]["unit"] == [1, 1, 1], write
        # 16 output chunks, and before them the input's bands loaded or its copy split for
        # two threads.
        assert summary["tasks"] >= 16 + 1, summary
        np.testing.assert_allclose(
            read_zarr(tmp_path / "out.zarr"),
            np.abs(np.fft.rfft(a, axis=0)) ** 2,
            rtol=1e-4,
            atol=1e-2,
        )


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"kind": "fft", "axis": 3}, "axis 3 is out of range"),
        ({"kind": "fftn", "axes": [0, -4]}, "axis -4 is out of range"),
        ({"kind": "rfft", "n": 0}, "FFT lengths must be positive"),
        ({"kind": "irfftn", "s": [4, -1]}, "FFT lengths must be positive"),
        ({"kind": "fft", "norm": "unitary"}, "unknown norm"),
        ({"kind": "hfft"}, "unknown FFT"),
    ],
)
def test_bad_fft_ops_are_refused_before_anything_is_written(
    cli: Cli, tmp_path: Path, op: dict[str, Any], message: str
) -> None:
    zarr.create_array(str(tmp_path / "x.zarr"), data=np.ones((4, 5, 6), "float32"))
    plan = {
        "arrays": [{"id": "x", "zarr": str(tmp_path / "x.zarr")}],
        "ops": [
            {"id": "f", "op": "fft", "input": "x", **op},
            {"id": "w", "op": "write", "input": "f", "target": str(tmp_path / "out.zarr")},
        ],
    }
    result = cli.run_plan(plan, expect_rc=2)
    assert message in result["stderr"], result["stderr"]
    assert "ops[0]" in result["stderr"], result["stderr"]
    assert not (tmp_path / "out.zarr").exists()


def test_fft_of_non_numeric_and_rfft_of_complex_are_refused(cli: Cli, tmp_path: Path) -> None:
    for dtype, kind, message in [
        ("bool", "fft", "needs numeric values"),
        ("complex64", "rfft", "rfft needs real values"),
    ]:
        zarr.create_array(str(tmp_path / f"{dtype}.zarr"), data=np.zeros((4, 4), dtype))
        plan = {
            "arrays": [{"id": "x", "zarr": str(tmp_path / f"{dtype}.zarr")}],
            "ops": [
                {"id": "f", "op": "fft", "input": "x", "kind": kind},
                {"id": "w", "op": "write", "input": "f", "target": str(tmp_path / "o.zarr")},
            ],
        }
        result = cli.run_plan(plan, expect_rc=2)
        assert message in result["stderr"], result["stderr"]
        assert not (tmp_path / "o.zarr").exists()


# ---------------------------------------------------------------------------------------------
# chunkfuse.fft on Cubed arrays
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def spec(tmp_path: Path) -> cubed.Spec:
    return cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="200MB")


@pytest.fixture
def stored(tmp_path: Path) -> tuple[np.ndarray, str]:
    a = sample(np.random.default_rng(11), (12, 73, 40), "float32")
    path = str(tmp_path / "t2m.zarr")
    zarr.create_array(path, data=a, chunks=(1, 73, 40))
    return a, path


CUBED_CASES = [
    ("rfft lat", lambda x: cf.rfft(x, axis=1), lambda a: np.fft.rfft(a, axis=1)),
    (
        "fft time, n",
        lambda x: cf.fft(x, axis=0, n=16, norm="ortho"),
        lambda a: np.fft.fft(a, axis=0, n=16, norm="ortho"),
    ),
    ("ifftn", lambda x: cf.ifftn(x, axes=(1, 2)), lambda a: np.fft.ifftn(a, axes=(1, 2))),
    (
        "rfftn then irfftn",
        lambda x: cf.irfftn(cf.rfftn(x, axes=(0, 2)), s=(12, 40), axes=(0, 2)),
        lambda a: a,
    ),
    (
        "mean |rfft|",
        lambda x: xp.mean(xp.abs(cf.rfft(x, axis=1)), axis=0),
        lambda a: np.abs(np.fft.rfft(a, axis=1)).mean(axis=0),
    ),
    (
        "power spectrum",
        lambda x: xp.abs(cf.rfft(x, axis=0)) ** 2,
        lambda a: np.abs(np.fft.rfft(a, axis=0)) ** 2,
    ),
]


@pytest.mark.parametrize(("name", "f", "ref"), CUBED_CASES, ids=[c[0] for c in CUBED_CASES])
def test_cubed_fft_runs_natively_and_matches_numpy(
    spec: cubed.Spec, stored: tuple[np.ndarray, str], name: str, f: Any, ref: Any
) -> None:
    a, path = stored
    x = cubed.from_zarr(path, spec=spec)
    ex = RustExecutor()
    got = f(x).compute(executor=ex)
    assert_fft_close(np.asarray(got), ref(a).astype(np.asarray(got).dtype))
    assert not ex.last_stats.python_ops, ex.last_stats.python_ops
    # The same plan on Cubed's own executor (numpy.fft in each block) agrees.
    theirs = f(cubed.from_zarr(path, spec=spec)).compute()
    assert_fft_close(np.asarray(got), np.asarray(theirs))


def test_rfft_lanes_keep_their_own_nans_and_precision(spec: cubed.Spec) -> None:
    """Real transforms pack two lanes into one complex transform; lanes that must not mix (a
    NaN or an infinity, magnitudes far apart) are transformed apart, so each lane's spectrum
    is its own, as numpy's: NaN only where numpy has NaN, and a small lane beside a large one
    as precise as numpy's float32."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((16, 3, 4)).astype(np.float32)
    a[1, 0, 0] = np.nan
    a[2, 2, 1] = np.inf
    a[:, 1, 2] *= 1e6
    x = cubed.from_array(a, chunks=(16, 3, 4), spec=spec)
    got = np.asarray(cf.rfft(x, axis=0).compute(executor=RustExecutor()))
    want = np.fft.rfft(a.astype(np.float64), axis=0)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    for i in range(3):
        for j in range(4):
            lane, ref = got[:, i, j], want[:, i, j]
            if not np.isfinite(ref).all():
                continue
            size = np.abs(a[:, i, j].astype(np.float64)).max() * 16
            np.testing.assert_allclose(lane, ref, rtol=0, atol=1e-6 * size, err_msg=f"{i, j}")


def test_cubed_fft_of_double_and_integer_arrays(spec: cubed.Spec) -> None:
    for dtype in ("float64", "int32", "complex128"):
        a = sample(np.random.default_rng(2), (9, 10), dtype)
        x = cubed.from_array(a, chunks=(3, 4), spec=spec)
        got = cf.fft(x, axis=0).compute(executor=RustExecutor())
        assert_fft_close(np.asarray(got), np.fft.fft(a, axis=0))


def test_fft_helpers_match_numpy(spec: cubed.Spec) -> None:
    np.testing.assert_allclose(cf.fftfreq(9, d=0.5, spec=spec).compute(), np.fft.fftfreq(9, 0.5))
    np.testing.assert_allclose(cf.rfftfreq(10, spec=spec).compute(), np.fft.rfftfreq(10))
    a = np.arange(35.0).reshape(5, 7)
    x = cubed.from_array(a, chunks=(2, 3), spec=spec)
    np.testing.assert_array_equal(cf.fftshift(x).compute(), np.fft.fftshift(a))
    np.testing.assert_array_equal(cf.ifftshift(x, axes=1).compute(), np.fft.ifftshift(a, axes=1))


def test_cubed_fft_bad_input(spec: cubed.Spec) -> None:
    x = cubed.from_array(np.ones((4, 6), "float32"), chunks=(2, 3), spec=spec)
    with pytest.raises(np.exceptions.AxisError):
        cf.fft(x, axis=2)
    with pytest.raises(TypeError, match="axes are integers .* got 'latitude'"):
        cf.rfft(x, axis="latitude")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid number of data points"):
        cf.rfft(x, n=0)
    with pytest.raises(ValueError, match="invalid norm"):
        cf.fft(x, norm="unitary")
    with pytest.raises(TypeError, match="numeric"):
        cf.fft(cubed.from_array(np.ones(4, bool), spec=spec))
    with pytest.raises(TypeError, match="real values"):
        cf.rfft(cubed.from_array(np.ones(4, "complex64"), spec=spec))
    with pytest.raises(TypeError, match="Cubed array"):
        cf.fft(np.ones(4))


def test_fft_helpers_are_exported() -> None:
    assert set(cf.__all__) >= {
        "fft",
        "ifft",
        "rfft",
        "irfft",
        "fftn",
        "ifftn",
        "rfftn",
        "irfftn",
        "fftfreq",
        "rfftfreq",
        "fftshift",
        "ifftshift",
    }
    assert chunkfuse.engine_version()
