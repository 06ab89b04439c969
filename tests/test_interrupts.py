"""Interrupts and timeouts on storage that stalls: a loopback HTTP server serves an array's
metadata and accepts every other request without ever answering it. Ctrl-C must stop any wait
within a second (KeyboardInterrupt in Python, exit status 130 from the CLI), and the request
timeouts must end a wait with an error naming the URL within the documented bound."""

from __future__ import annotations

import _thread
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import chunkfuse
import numpy as np
import pytest
import zarr
from conftest import chunkfuse_bin_path

#: Seconds within which Ctrl-C must end a call.
PROMPT = 1.0


class _StallingHandler(http.server.BaseHTTPRequestHandler):
    """Answers requests for metadata from the served directory; holds every other request
    open without an answer until the server closes."""

    server: _StallingServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _metadata(self) -> bytes | None:
        name = self.path.split("?")[0].lstrip("/")
        if not name.endswith(("zarr.json", ".zarray", ".zattrs", ".zgroup")):
            return None
        path = self.server.root / name
        return path.read_bytes() if path.is_file() else b""

    def _stall(self) -> None:
        self.server.stalled.set()
        self.server.closing.wait()

    def _answer(self, with_body: bool) -> None:
        body = self._metadata()
        if body is None:
            return self._stall()
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)


class _StallingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _StallingHandler)
        self.root = root
        self.stalled = threading.Event()
        self.closing = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def stalling(tmp_path: Path) -> Iterator[tuple[_StallingServer, np.ndarray]]:
    data = np.arange(4 * 6 * 8, dtype="float32").reshape(4, 6, 8)
    zarr.create_array(tmp_path / "a.zarr", shape=data.shape, chunks=(1, 6, 8), dtype="float32")[
        ...
    ] = data
    server = _StallingServer(tmp_path)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, data
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()


def _interrupted_after(
    call: Callable[[], Any], server: _StallingServer, *, as_a_signal: bool = False
) -> float:
    """Runs `call`, sends this process a Ctrl-C once a request stalls; returns the seconds from
    the Ctrl-C to the KeyboardInterrupt. `as_a_signal`: a real SIGINT, which (unlike
    `interrupt_main`) also wakes a main thread blocked on a lock, as Dask's scheduler waits."""
    sent: list[float] = []

    def interrupt() -> None:
        if server.stalled.wait(30):
            time.sleep(0.2)
            sent.append(time.monotonic())
            if as_a_signal:
                os.kill(os.getpid(), signal.SIGINT)
            else:
                _thread.interrupt_main(signal.SIGINT)

    # A process started in the background by a non-interactive shell (a CI runner's job)
    # inherits SIGINT ignored, and Python then installs no handler: Ctrl-C is what this tests,
    # so Python's own handler is installed for the call.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent, "no request stalled"
    return time.monotonic() - sent[0]


def test_ctrl_c_stops_a_read_waiting_on_a_stalled_server(
    stalling: tuple[_StallingServer, np.ndarray],
) -> None:
    server, _ = stalling
    url = f"{server.url}/a.zarr"
    assert _interrupted_after(lambda: chunkfuse.read(url), server) < PROMPT
    reader = chunkfuse.ArrayReader(url)
    assert (
        _interrupted_after(lambda: chunkfuse.read_windows(reader, [[1, 0, 0]], [1, 2, 2]), server)
        < PROMPT
    )


def test_ctrl_c_stops_a_rechunk_waiting_on_a_stalled_server(
    stalling: tuple[_StallingServer, np.ndarray], tmp_path: Path
) -> None:
    server, _ = stalling
    url = f"{server.url}/a.zarr"
    target = tmp_path / "out.zarr"
    took = _interrupted_after(lambda: chunkfuse.rechunk(url, target, chunks=(4, 3, 8)), server)
    assert took < PROMPT
    # No chunk of the target was written, whole or partial.
    assert not [p for p in target.rglob("*") if p.is_file() and "/c/" in p.as_posix()]


def test_ctrl_c_stops_metadata_reads(tmp_path: Path) -> None:
    """`info` and opening an array wait on metadata: a server that stalls on everything."""
    server = _StallingServer(tmp_path / "nothing-served")
    server.root = tmp_path / "never"

    class _StallAll(_StallingHandler):
        def _metadata(self) -> bytes | None:
            return None

    server.RequestHandlerClass = _StallAll
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"{server.url}/a.zarr"
        assert _interrupted_after(lambda: chunkfuse._engine.array_info(url), server) < PROMPT
        assert _interrupted_after(lambda: chunkfuse.ArrayReader(url), server) < PROMPT
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()


def test_a_stalled_server_times_out_naming_the_url(
    stalling: tuple[_StallingServer, np.ndarray],
) -> None:
    server, _ = stalling
    url = f"{server.url}/a.zarr"
    worst = chunkfuse.set_io_timeouts(connect=1, request=0.5, retry=0.5)
    try:
        assert worst == pytest.approx(0.5 + 1 + 5)
        started = time.monotonic()
        with pytest.raises(OSError) as info:
            chunkfuse.read(url)
        took = time.monotonic() - started
    finally:
        chunkfuse.set_io_timeouts()
    message = str(info.value)
    assert url in message, message
    assert "timed out" in message and "CHUNKFUSE_IO_TIMEOUT_S" in message, message
    assert took < worst + 2, took


def test_timeouts_are_checked() -> None:
    with pytest.raises(ValueError, match="request"):
        chunkfuse.set_io_timeouts(request=-1)
    with pytest.raises(ValueError, match="request_timeout"):
        chunkfuse.set_io_timeouts(request=0)
    # Back to the defaults: 60 s of retries + 30 s + 5 s of backoff.
    assert chunkfuse.set_io_timeouts() == pytest.approx(95)


def _cli_interrupted(args: list[str], server: _StallingServer) -> tuple[int, float, str]:
    proc = subprocess.Popen(
        [str(chunkfuse_bin_path()), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CHUNKFUSE_IO_TIMEOUT_S": "120"},
    )
    try:
        assert server.stalled.wait(30), "no request stalled"
        time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        return proc.returncode, time.monotonic() - sent, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(sys.platform != "linux", reason="signals to a child process")
def test_cli_exits_130_on_ctrl_c_while_storage_stalls(
    stalling: tuple[_StallingServer, np.ndarray], tmp_path: Path
) -> None:
    server, _ = stalling
    url = f"{server.url}/a.zarr"
    code, took, err = _cli_interrupted(
        ["rechunk", url, str(tmp_path / "out.zarr"), "--chunks=4,3,8"], server
    )
    assert code == 130, err
    assert took < PROMPT + 0.5, (took, err)


_SLOW_CUBED_FUNCTION = """
import os, sys, time
import cubed, cubed.array_api as xp
from chunkfuse import RustExecutor

spec = cubed.Spec(
    work_dir=sys.argv[1], allowed_mem="500MB", executor=RustExecutor(max_workers=2)
)

def slow(block):
    os.write(1, b"computing\\n")  # one write: lines of two threads stay apart
    time.sleep(1.5)
    os.write(1, b"computed\\n")
    return block + 1

x = xp.ones((8, 8), chunks=(2, 2), spec=spec)
try:
    cubed.map_blocks(slow, x, dtype=x.dtype).compute()
except KeyboardInterrupt:
    os.write(1, b"interrupted\\n")
    raise
"""


@pytest.mark.skipif(sys.platform != "linux", reason="signals to a child process")
def test_engine_calls_on_other_threads_stop_when_interrupted(
    stalling: tuple[_StallingServer, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read on a thread of its own (as Dask's pool runs engine batches) sees no Ctrl-C of
    its own; `interrupt_calls` (which `chunkfuse.dask.enabled()` calls when Ctrl-C ends its
    block) stops it as Ctrl-C stops the main thread's."""
    server, _ = stalling
    raised: list[BaseException] = []

    def read() -> None:
        try:
            chunkfuse.read(f"{server.url}/a.zarr")
        except BaseException as e:
            raised.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert server.stalled.wait(30), ("no request stalled", raised)
    sent = time.monotonic()
    chunkfuse._engine.interrupt_calls()
    reader.join(30)
    assert not reader.is_alive() and time.monotonic() - sent < PROMPT
    assert [type(e) for e in raised] == [KeyboardInterrupt], raised

    import chunkfuse.dask.setting as setting
    from chunkfuse.dask import enabled

    calls: list[int] = []
    monkeypatch.setattr(setting._engine, "interrupt_calls", lambda: calls.append(1))
    with pytest.raises(KeyboardInterrupt), enabled():
        raise KeyboardInterrupt
    assert calls == [1]


@pytest.mark.skipif(sys.platform != "linux", reason="signals to a child process")
def test_ctrl_c_ending_a_dask_compute_under_enable_stops_its_pool_s_engine_calls(
    stalling: tuple[_StallingServer, np.ndarray],
) -> None:
    """Under `chunkfuse.dask.enable()` (no block to catch the interrupt), Ctrl-C ending a
    compute on Dask's threaded scheduler stops the engine call its pool thread still runs."""
    import chunkfuse.dask
    import dask

    server, _ = stalling
    raised: list[tuple[BaseException, float]] = []

    def read() -> None:
        try:
            chunkfuse.read(f"{server.url}/a.zarr")
        except BaseException as e:
            raised.append((e, time.monotonic()))
            raise

    chunkfuse.dask.enable()
    try:
        _interrupted_after(
            lambda: dask.delayed(read)().compute(scheduler="threads"), server, as_a_signal=True
        )
        ended = time.monotonic()
        deadline = ended + 30
        while not raised and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        chunkfuse.dask.disable()
    assert [type(e) for e, _ in raised] == [KeyboardInterrupt], raised
    assert raised[0][1] - ended < PROMPT


def test_ctrl_c_while_a_python_function_computes_a_chunk_exits_cleanly(tmp_path: Path) -> None:
    """The engine call returned on Ctrl-C after its half second of grace for writes while a
    user function still ran on a compute thread; when the function returned, the
    interpreter (finalizing on the KeyboardInterrupt) aborted with "PyGILState_Release:
    thread state must be current". The call now returns once no chunk computes; and no
    chunk's function starts after Ctrl-C (each task already read used to run it in turn)."""
    # Unbuffered bytes: a buffered readline could take the second thread's "computing" into
    # a buffer that communicate() (reading the pipe itself) never sees.
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_CUBED_FUNCTION, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"computing"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out_bytes, err_bytes = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = out_bytes.decode(), err_bytes.decode(errors="replace")
    lines = ["computing", *out.split()]
    # Every chunk function that started had returned before the call raised, and none of
    # the 16 started after Ctrl-C (two workers: the two running when it came).
    assert "interrupted" in lines, (lines, err)
    before = lines[: lines.index("interrupted")]
    assert before.count("computing") == before.count("computed"), lines
    assert before.count("computing") <= 2, lines
    assert "Fatal Python error" not in err, err
    assert proc.returncode in (1, -signal.SIGINT), (proc.returncode, err)
    assert "KeyboardInterrupt" in err, err
