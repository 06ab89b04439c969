"""A loopback S3 server for the object-storage tests: moto behind a fault-injecting proxy.

``S3Server`` starts moto's S3 implementation in this process (``moto.server.ThreadedMotoServer``
on a free ``127.0.0.1`` port) and, in front of it, a small HTTP/1.1 reverse proxy on another free
port. Clients talk to the proxy (``endpoint``); the proxy forwards every request unchanged
(method, path and query, headers including ``Host`` and ``Range``, body) to moto and relays the
answer with an exact ``Content-Length``, so that pooled keep-alive connections (reqwest/hyper,
urllib3) stay usable. On request the proxy instead answers ``500 InternalError`` or drops the
connection without answering for a seeded random fraction of requests (``set_faults``), and
``stop_backend`` kills moto while the proxy keeps answering ``502``, to simulate a server dying
mid-run. ``client()`` gives a boto3 client that talks to moto directly, without faults, for test
setup and inspection.

Typical use::

    with S3Server() as s3:
        s3.create_bucket("data")
        s3.set_faults(0.2)
        subprocess.run([...], env={**os.environ, **s3.env()})
        assert s3.fault_count > 0

Moto keeps its state in module globals of this process, so buckets survive ``stop_backend`` /
``start_backend`` and are shared by all ``S3Server`` instances of one process.
"""

from __future__ import annotations

import http.client
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FAULT_KINDS", "MORE_FAULT_KINDS", "S3Server"]

#: Fault kinds ``S3Server.set_faults`` knows: ``"500"`` answers ``500 InternalError`` with an
#: S3-style XML body; ``"drop"`` reads the request and closes the connection without answering.
#: The default set of ``set_faults``.
FAULT_KINDS: tuple[str, ...] = ("500", "drop")
#: Further kinds, asked for by name: ``"503"`` answers ``503 SlowDown``; ``"403"`` answers
#: ``403 AccessDenied``; ``"slow"`` forwards the request after ``S3Server.slow_seconds``;
#: ``"stall"`` holds the connection ``S3Server.stall_seconds`` without answering, then closes
#: it; ``"truncate"`` forwards the request and answers a GET with the full ``Content-Length``
#: but half the body, then closes the connection (other methods are forwarded unchanged).
MORE_FAULT_KINDS: tuple[str, ...] = ("503", "403", "slow", "stall", "truncate")

_HOST = "127.0.0.1"
_ACCESS_KEY = "testing"
_SECRET_KEY = "testing"
_REGION = "us-east-1"

# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones the proxy recomputes itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
    }
)


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    """Whether a listening socket could be bound to ``127.0.0.1:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
        return True


def _error_xml(code: str, message: str) -> bytes:
    """An S3-style ``<Error>`` document."""
    request_id = uuid.uuid4().hex[:16].upper()
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()


class _ProxyServer(ThreadingHTTPServer):
    """The proxy's listening server: one daemon thread per client connection."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # connection pools open many connections at once

    def __init__(self, owner: S3Server) -> None:
        self.owner = owner
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__((_HOST, 0), _ProxyHandler)

    def close_open_connections(self) -> None:
        """Shut down every client connection still open, so that their threads end."""
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one client connection's requests to moto, injecting faults."""

    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def setup(self) -> None:
        """Register the connection so that ``close`` can shut it down."""
        super().setup()
        # Headers and body go out in two writes; with Nagle's algorithm on, the body would wait
        # for the client's delayed ACK of the headers, about 40 ms per request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.sockets_lock:
            self.server.open_sockets.add(self.connection)

    def finish(self) -> None:
        """Unregister the connection."""
        with self.server.sockets_lock:
            self.server.open_sockets.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Keep quiet: ``request_log`` records what the tests need."""

    def do_GET(self) -> None:
        """Forward a GET."""
        self._proxy()

    def do_HEAD(self) -> None:
        """Forward a HEAD."""
        self._proxy()

    def do_PUT(self) -> None:
        """Forward a PUT."""
        self._proxy()

    def do_POST(self) -> None:
        """Forward a POST."""
        self._proxy()

    def do_DELETE(self) -> None:
        """Forward a DELETE."""
        self._proxy()

    def do_OPTIONS(self) -> None:
        """Forward an OPTIONS (CORS preflight)."""
        self._proxy()

    def do_PATCH(self) -> None:
        """Forward a PATCH."""
        self._proxy()

    # -- plumbing -------------------------------------------------------------------------------

    def _read_body(self) -> tuple[bytes, bool]:
        """Read the request body; return it and whether the request declared one."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailer section, up to the empty line.
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)  # CRLF after the chunk
            return b"".join(parts), True
        length = self.headers.get("Content-Length")
        if length is None:
            return b"", False
        return self.rfile.read(int(length)), True

    def _send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """Send a complete response with an exact ``Content-Length`` (none for 1xx/204)."""
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if status >= 200 and status != 204:
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _send_error_xml(self, status: int, code: str, message: str) -> None:
        """Send an S3-style XML error; for HEAD only its headers."""
        body = _error_xml(code, message)
        headers = [("Content-Type", "application/xml"), ("x-amz-request-id", "chunkfuse-proxy")]
        self._send(status, headers, body)

    def _proxy(self) -> None:
        owner = self.server.owner
        try:
            body, has_body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        fault = owner._on_request(self.command, self.path, self.headers.get("Range"))
        try:
            if fault == "drop":
                self.close_connection = True
                return
            if fault == "500":
                self._send_error_xml(
                    500, "InternalError", "We encountered an internal error. Please try again."
                )
                return
            if fault == "503":
                self._send_error_xml(503, "SlowDown", "Please reduce your request rate.")
                return
            if fault == "403":
                self._send_error_xml(403, "AccessDenied", "Access Denied")
                return
            if fault == "stall":
                time.sleep(owner.stall_seconds)
                self.close_connection = True
                return
            if fault == "slow":
                time.sleep(owner.slow_seconds)
            self._forward(body, has_body, truncate=fault == "truncate")
        except OSError:  # the client went away
            self.close_connection = True

    def _forward(self, body: bytes, has_body: bool, truncate: bool = False) -> None:
        owner = self.server.owner
        host, port = owner._backend_address
        conn = http.client.HTTPConnection(host, port, timeout=owner.backend_timeout)
        try:
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                if "Host" not in self.headers:
                    conn.putheader("Host", f"{host}:{port}")
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        conn.putheader(name, value)
                if has_body or body:
                    conn.putheader("Content-Length", str(len(body)))
                conn.putheader("Connection", "close")
                conn.endheaders(body if body else None)
                response = conn.getresponse()
                payload = response.read()
                status = response.status
                headers = response.getheaders()
            except (OSError, http.client.HTTPException) as exc:
                self._send_error_xml(502, "BadGateway", f"S3 backend unreachable: {exc!r}")
                return
        finally:
            conn.close()
        forwarded = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        if self.command == "HEAD":
            # No body came back; keep the length the backend announced (the object's size).
            self.send_response_only(status)
            for name, value in forwarded:
                self.send_header(name, value)
            if status >= 200 and status != 204:
                length = response.getheader("Content-Length") or "0"
                self.send_header("Content-Length", length)
            self.end_headers()
            return
        if truncate and self.command == "GET" and status < 300 and len(payload) > 1:
            # The whole length announced, half the body sent, the connection closed.
            self.send_response_only(status)
            for name, value in forwarded:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, forwarded, payload)


class S3Server:
    """Moto's S3 on a free loopback port behind a fault-injecting reverse proxy.

    Started by the constructor; stop it with ``close()`` or use it as a context manager.
    Thread safe: the counters and the fault generator are guarded by a lock.
    """

    #: Seconds the proxy waits for moto before answering 502.
    backend_timeout: float = 60.0
    #: Seconds a ``"slow"`` fault delays a request.
    slow_seconds: float = 0.3
    #: Seconds a ``"stall"`` fault holds a connection without answering.
    stall_seconds: float = 5.0

    def __init__(self) -> None:
        """Start moto and the proxy (about half a second, most of it importing moto)."""
        self._lock = threading.Lock()
        self._rng = random.Random(0)
        self._fault_rate = 0.0
        self._fault_kinds: tuple[str, ...] = FAULT_KINDS
        self._request_count = 0
        self._fault_count = 0
        self._request_log: list[tuple[str, str, str | None]] = []
        self._moto: Any = None
        self._backend_port = 0
        self._proxy: _ProxyServer | None = None
        self._proxy_thread: threading.Thread | None = None
        self._closed = False
        try:
            self.start_backend()
            proxy = _ProxyServer(self)
            thread = threading.Thread(
                target=proxy.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="s3-fault-proxy",
                daemon=True,
            )
            try:
                thread.start()
            except BaseException:
                proxy.server_close()
                raise
            self._proxy, self._proxy_thread = proxy, thread
        except BaseException:
            self.close()
            raise

    # -- addresses ------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The proxy's URL, ``http://127.0.0.1:PORT``: what the code under test uses."""
        assert self._proxy is not None, "S3Server is closed"
        return f"http://{_HOST}:{self._proxy.server_address[1]}"

    @property
    def direct_endpoint(self) -> str:
        """Moto's own URL, bypassing the proxy (no faults, not counted)."""
        return f"http://{_HOST}:{self._backend_port}"

    @property
    def _backend_address(self) -> tuple[str, int]:
        return _HOST, self._backend_port

    def env(self) -> dict[str, str]:
        """Environment variables pointing an S3 client (object_store, boto3) at ``endpoint``."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": _ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": _SECRET_KEY,
            "AWS_REGION": _REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    # -- boto3 helpers --------------------------------------------------------------------------

    def client(self, *, via_proxy: bool = False, config: Any = None) -> Any:
        """A boto3 S3 client for ``direct_endpoint`` (or ``endpoint`` if ``via_proxy``).

        ``config`` is an optional ``botocore.config.Config``, e.g. to configure retries.
        """
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint if via_proxy else self.direct_endpoint,
            aws_access_key_id=_ACCESS_KEY,
            aws_secret_access_key=_SECRET_KEY,
            region_name=_REGION,
            config=config,
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` directly at moto (never faulted); return the name."""
        self.client().create_bucket(Bucket=name)
        return name

    # -- faults and accounting ------------------------------------------------------------------

    def set_faults(self, rate: float, kinds: Iterable[str] = FAULT_KINDS, seed: int = 0) -> None:
        """Fault the fraction ``rate`` (0 to 1) of the proxy's requests from now on.

        Each request draws from a ``random.Random(seed)`` (reseeded by this call) whether it is
        faulted and, if so, which of ``kinds`` (see ``FAULT_KINDS``) it gets. ``set_faults(0)``
        turns faults off.
        """
        kinds = tuple(kinds)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be within [0, 1], got {rate}")
        known = FAULT_KINDS + MORE_FAULT_KINDS
        unknown = set(kinds) - set(known)
        if unknown or (rate > 0 and not kinds):
            raise ValueError(f"fault kinds must be a non-empty subset of {known}: {kinds}")
        with self._lock:
            self._fault_rate = float(rate)
            self._fault_kinds = kinds
            self._rng = random.Random(seed)

    @property
    def request_count(self) -> int:
        """Requests the proxy received, faulted ones included."""
        with self._lock:
            return self._request_count

    @property
    def fault_count(self) -> int:
        """Requests the proxy answered with a fault."""
        with self._lock:
            return self._fault_count

    @property
    def request_log(self) -> list[tuple[str, str, str | None]]:
        """A copy of ``(method, path with query, Range header or None)`` for each request."""
        with self._lock:
            return list(self._request_log)

    def reset_stats(self) -> None:
        """Zero ``request_count`` and ``fault_count`` and empty ``request_log``."""
        with self._lock:
            self._request_count = 0
            self._fault_count = 0
            self._request_log.clear()

    def _on_request(self, method: str, path: str, range_header: str | None) -> str | None:
        """Count and log a request; return the fault kind to inject, or None."""
        with self._lock:
            self._request_count += 1
            self._request_log.append((method, path, range_header))
            if self._fault_rate > 0 and self._rng.random() < self._fault_rate:
                self._fault_count += 1
                return self._rng.choice(self._fault_kinds)
            return None

    # -- life cycle -----------------------------------------------------------------------------

    @property
    def backend_running(self) -> bool:
        """Whether moto is running (false after ``stop_backend``)."""
        return self._moto is not None

    def start_backend(self) -> None:
        """(Re)start moto, on its previous port where that is still free.

        Buckets and objects survive a restart (moto keeps them in this process).
        """
        if self._moto is not None:
            return
        from moto.server import ThreadedMotoServer

        # Moto logs every request through werkzeug's logger; the request log is ours.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        port = self._backend_port
        if port == 0 or not _port_is_free(port):
            port = 0
        # ThreadedMotoServer.start() waits forever if binding fails; port 0 cannot fail.
        moto = ThreadedMotoServer(ip_address=_HOST, port=port, verbose=False)
        moto.start()
        self._moto = moto
        self._backend_port = int(moto.get_host_and_port()[1])
        self._warm_up()

    def _warm_up(self) -> None:
        """Make moto load its S3 backend now rather than on a test's first request."""
        conn = http.client.HTTPConnection(_HOST, self._backend_port, timeout=30)
        try:
            conn.request("GET", "/", headers={"Host": f"{_HOST}:{self._backend_port}"})
            conn.getresponse().read()
        finally:
            conn.close()

    def stop_backend(self) -> None:
        """Stop moto but keep the proxy, which then answers ``502`` to everything."""
        moto, self._moto = self._moto, None
        if moto is None:
            return
        moto.stop()
        # ThreadedMotoServer.stop() leaves the socket listening (connections would hang in the
        # backlog); close it so that the proxy's connects are refused at once.
        server = getattr(moto, "_server", None)
        if server is not None:
            server.server_close()

    def close(self) -> None:
        """Stop the proxy and moto; idempotent."""
        if self._closed:
            return
        self._closed = True
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
            proxy.close_open_connections()
        if self._proxy_thread is not None:
            self._proxy_thread.join(timeout=5)
            self._proxy_thread = None
        self.stop_backend()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"proxy={self.endpoint} moto={self.direct_endpoint}"
        return f"<S3Server {state}>"
