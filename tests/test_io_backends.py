"""Local read back ends: io_uring and the pread pool give identical results, and where
io_uring is refused (here by a seccomp filter, as Docker's default profile does) `auto`
falls back to the pread pool with the reason logged while `uring` fails clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import Cli, chunkfuse_bin_path

#: Runs argv[1:] with io_uring_setup refused (EPERM) by a seccomp filter, as container
#: runtimes do. io_uring_setup is syscall 425 on x86_64 and aarch64 alike.
REFUSE_URING = r"""
import ctypes, os, platform, sys
if platform.machine() not in ("x86_64", "aarch64"):
    sys.exit(77)
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
insns = (Insn * 4)(
    Insn(0x20, 0, 0, 0),            # load the syscall number
    Insn(0x15, 0, 1, 425),          # io_uring_setup?
    Insn(0x06, 0, 0, 0x00050001),   # then fail with EPERM
    Insn(0x06, 0, 0, 0x7FFF0000),   # else allow
)
prog = Prog(4, insns)
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) != 0:                      # PR_SET_NO_NEW_PRIVS
    sys.exit(77)
if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:     # PR_SET_SECCOMP, MODE_FILTER
    sys.exit(77)
os.execv(sys.argv[1], sys.argv[1:])
"""


def uring_available() -> bool:
    before = chunkfuse.io_mode()
    try:
        chunkfuse.set_io("uring")
    except Exception:
        return False
    finally:
        chunkfuse.set_io(before)
    return True


@pytest.fixture
def sharded_and_plain(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(4)
    data = rng.standard_normal((6, 50, 70)).astype("float32")
    plain = tmp_path / "plain.zarr"
    zarr.create_array(str(plain), data=data, chunks=(1, 50, 70))
    sharded = tmp_path / "sharded.zarr"
    zarr.create_array(str(sharded), data=data, chunks=(1, 10, 10), shards=(2, 50, 70))
    return plain, sharded, data


@pytest.mark.parametrize("mode", ["pread", "auto", "uring"])
def test_every_back_end_reads_identical_values(
    mode: str, sharded_and_plain: tuple[Path, Path, np.ndarray], cli: Cli, tmp_path: Path
) -> None:
    if mode == "uring" and not uring_available():
        pytest.skip("io_uring is refused on this machine (the fallback test covers it)")
    plain, sharded, data = sharded_and_plain
    before = chunkfuse.io_mode()
    try:
        for source in (plain, sharded):
            np.testing.assert_array_equal(chunkfuse.read(source, io=mode), data)
            starts = np.array([[0, 3, 5], [4, 40, 60]])
            w = chunkfuse.read_windows(source, starts, (2, 10, 10), io=mode)
            np.testing.assert_array_equal(w[1], data[4:6, 40:50, 60:70])
    finally:
        chunkfuse.set_io(before)
    out = tmp_path / f"r-{mode}.zarr"
    cli("--io", mode, "rechunk", str(sharded), str(out), "--chunks", "6,25,35")
    np.testing.assert_array_equal(zarr.open_array(str(out))[:], data)


def test_refused_io_uring_falls_back_to_pread_with_the_reason(
    sharded_and_plain: tuple[Path, Path, np.ndarray], tmp_path: Path
) -> None:
    plain, _, data = sharded_and_plain
    binary = str(chunkfuse_bin_path())

    def refused(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", REFUSE_URING, binary, *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode == 77:
            pytest.skip("cannot install a seccomp filter here")
        return r

    out = tmp_path / "fallback.zarr"
    r = refused("--io", "auto", "rechunk", str(plain), str(out), "--chunks", "6,10,10")
    assert r.returncode == 0, r.stderr
    assert "io_uring unavailable" in r.stderr and "refused" in r.stderr, r.stderr
    assert "pread" in r.stderr, r.stderr
    np.testing.assert_array_equal(zarr.open_array(str(out))[:], data)
    r = refused("--io", "uring", "info", str(plain))
    assert r.returncode != 0
    assert "io_uring is not available here" in r.stderr and "refused" in r.stderr, r.stderr
    r = refused("--io", "pread", "info", str(plain))
    assert r.returncode == 0 and "io_uring" not in r.stderr, r.stderr
