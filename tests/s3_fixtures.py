"""Pytest fixtures around ``s3_server.S3Server`` for the object-storage tests.

Import them into a test module (tests/ is on ``sys.path``)::

    from s3_fixtures import s3_bucket, s3_env, s3_server  # noqa: F401
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from s3_server import S3Server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server behind the fault-injecting proxy for the whole session."""
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh, uniquely named bucket; faults are off before and after the test.

    Also restarts moto if an earlier test stopped it, and zeroes the proxy's counters and
    request log, so that a test sees only its own requests.
    """
    s3_server.set_faults(0)
    s3_server.start_backend()
    name = f"chunkfuse-test-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    s3_server.reset_stats()
    try:
        yield name
    finally:
        s3_server.set_faults(0)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``s3_server.env()`` plus ``CHUNKFUSE_IO_RETRY_TIMEOUT_S=20``, set in ``os.environ``."""
    env = {**s3_server.env(), "CHUNKFUSE_IO_RETRY_TIMEOUT_S": "20"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
