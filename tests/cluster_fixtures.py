"""A 2-worker dask.distributed LocalCluster on 127.0.0.1 (worker processes, one thread
each, 2 GiB each) for the distributed tests. Import the fixture into a test module::

    from cluster_fixtures import client  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        memory_limit="2GiB",
    )
    with cluster, distributed.Client(cluster) as c:
        yield c
