"""Quick checks of the loopback S3 fixture (tests/s3_server.py) through its fault proxy."""

from __future__ import annotations

import http.client
import os
import uuid
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from s3_fixtures import s3_bucket, s3_env, s3_server  # noqa: F401
from s3_server import S3Server

PAYLOAD = bytes(range(256)) * 40  # 10240 bytes


def proxy_client(server: S3Server, max_attempts: int = 10) -> Any:
    """A boto3 client that goes through the proxy, retrying ``max_attempts`` times in all."""
    config = Config(retries={"max_attempts": max_attempts, "mode": "standard"})
    return server.client(via_proxy=True, config=config)


def raw_connection(server: S3Server) -> http.client.HTTPConnection:
    """A keep-alive connection to the proxy (unsigned requests: fine for buckets and lists)."""
    host, port = server.endpoint.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=10)


def test_put_get_head(s3_server: S3Server, s3_bucket: str) -> None:  # noqa: F811
    s3 = proxy_client(s3_server)
    s3.put_object(Bucket=s3_bucket, Key="a/x.bin", Body=PAYLOAD)
    assert s3.get_object(Bucket=s3_bucket, Key="a/x.bin")["Body"].read() == PAYLOAD
    head = s3.head_object(Bucket=s3_bucket, Key="a/x.bin")
    assert head["ContentLength"] == len(PAYLOAD)
    # What went through the proxy really is in moto.
    direct = s3_server.client().get_object(Bucket=s3_bucket, Key="a/x.bin")
    assert direct["Body"].read() == PAYLOAD
    methods = [method for method, _, _ in s3_server.request_log]
    assert methods == ["PUT", "GET", "HEAD"]
    assert s3_server.request_count == 3
    assert s3_server.fault_count == 0


def test_ranged_get(s3_server: S3Server, s3_bucket: str) -> None:  # noqa: F811
    s3_server.client().put_object(Bucket=s3_bucket, Key="r.bin", Body=PAYLOAD)
    s3 = proxy_client(s3_server)
    got = s3.get_object(Bucket=s3_bucket, Key="r.bin", Range="bytes=100-1123")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 100-1123/{len(PAYLOAD)}"
    assert got["Body"].read() == PAYLOAD[100:1124]
    # A range running past the end is clipped; one starting past the end is refused.
    tail = s3.get_object(Bucket=s3_bucket, Key="r.bin", Range="bytes=10200-20000")
    assert tail["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert tail["Body"].read() == PAYLOAD[10200:]
    with pytest.raises(ClientError) as excinfo:
        s3.get_object(Bucket=s3_bucket, Key="r.bin", Range=f"bytes={len(PAYLOAD)}-")
    assert excinfo.value.response["Error"]["Code"] == "InvalidRange"
    assert s3_server.request_log[0] == ("GET", f"/{s3_bucket}/r.bin", "bytes=100-1123")


def test_list(s3_server: S3Server, s3_bucket: str) -> None:  # noqa: F811
    direct = s3_server.client()
    keys = ["arr/zarr.json", "arr/c/0/0", "arr/c/0/1", "arr/c/1/0", "other.txt"]
    for key in keys:
        direct.put_object(Bucket=s3_bucket, Key=key, Body=key.encode())
    s3 = proxy_client(s3_server)
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="arr/")
    assert sorted(obj["Key"] for obj in listed["Contents"]) == sorted(keys[:4])
    by_dir = s3.list_objects_v2(Bucket=s3_bucket, Prefix="arr/", Delimiter="/")
    assert [obj["Key"] for obj in by_dir["Contents"]] == ["arr/zarr.json"]
    assert [p["Prefix"] for p in by_dir["CommonPrefixes"]] == ["arr/c/"]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, PaginationConfig={})
    paged = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    assert sorted(paged) == sorted(keys)


def test_faults_are_retried(s3_server: S3Server, s3_bucket: str) -> None:  # noqa: F811
    s3_server.client().put_object(Bucket=s3_bucket, Key="f.bin", Body=PAYLOAD)
    s3 = proxy_client(s3_server)
    s3_server.set_faults(0.3, seed=1)
    for i in range(50):
        start = (i * 97) % 5000
        got = s3.get_object(Bucket=s3_bucket, Key="f.bin", Range=f"bytes={start}-{start + 999}")
        assert got["Body"].read() == PAYLOAD[start : start + 1000]
    assert s3_server.fault_count > 0
    assert s3_server.request_count == 50 + s3_server.fault_count


def test_keep_alive_and_fault_kinds(s3_server: S3Server, s3_bucket: str) -> None:  # noqa: F811
    """Every answer, faults and HEAD included, leaves a keep-alive connection usable."""
    conn = raw_connection(s3_server)
    conn.request("GET", f"/{s3_bucket}?list-type=2")
    first = conn.getresponse()
    assert first.status == 200 and b"ListBucketResult" in first.read()
    sock = conn.sock
    s3_server.set_faults(1.0, kinds=("500",))
    for method in ("HEAD", "GET", "HEAD"):
        conn.request(method, f"/{s3_bucket}?list-type=2")
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 500
        assert int(resp.getheader("Content-Length", "-1")) > 0
        assert (b"InternalError" in body) == (method == "GET")
    s3_server.set_faults(0)
    conn.request("HEAD", f"/{s3_bucket}")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    conn.request("HEAD", f"/{s3_bucket}/no-such-key")
    missing = conn.getresponse()
    assert missing.status in (403, 404) and missing.read() == b""
    assert conn.sock is sock  # still the first connection
    s3_server.set_faults(1.0, kinds=("drop",))
    conn.request("GET", f"/{s3_bucket}?list-type=2")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.getresponse()
    conn.close()
    assert s3_server.fault_count == 4


def test_stop_backend() -> None:
    bucket = f"stop-backend-{uuid.uuid4().hex[:12]}"
    with S3Server() as server:
        server.create_bucket(bucket)
        server.client().put_object(Bucket=bucket, Key="k", Body=b"v")
        s3 = proxy_client(server, max_attempts=1)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
        server.stop_backend()
        assert not server.backend_running
        with pytest.raises(ClientError) as excinfo:
            s3.get_object(Bucket=bucket, Key="k")
        assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
        with pytest.raises(EndpointConnectionError):
            server.client(config=Config(retries={"max_attempts": 1})).list_buckets()
        # Moto keeps its data in this process: a restarted backend still has the object.
        server.start_backend()
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    with pytest.raises(AssertionError):
        _ = server.endpoint


def test_env(s3_server: S3Server, s3_env: dict[str, str]) -> None:  # noqa: F811
    assert s3_env["AWS_ENDPOINT_URL"] == s3_server.endpoint
    assert s3_env["CHUNKFUSE_IO_RETRY_TIMEOUT_S"] == "20"
    for key, value in s3_env.items():
        assert os.environ[key] == value
    assert s3_server.endpoint != s3_server.direct_endpoint
