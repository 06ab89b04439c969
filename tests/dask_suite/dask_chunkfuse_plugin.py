"""pytest plugin: Dask's own array tests, every scheduler they name routed to chunkfuse.

Loaded with ``-p dask_chunkfuse_plugin`` (this directory on ``PYTHONPATH``). Dask's tests
compute with ``scheduler="sync"`` (``assert_eq``) or the default scheduler; both resolve to
``chunkfuse.dask.get`` here. Dask's repository-root conftest (options ``--runslow`` and
``--runarrayexpr``, marker skips) is not shipped in its wheel, so it is supplied here.
"""

from __future__ import annotations

from typing import Any

import pytest

ROUTED = ("sync", "synchronous", "single-threaded", "threads", "threading")

#: Calls of the routed get in this session, and the graphs and tasks the engine ran.
CALLS = {"n": 0, "engine": 0, "native": 0}


def counted_get(*args: Any, **kwargs: Any) -> Any:
    from chunkfuse.dask import get, last_stats

    CALLS["n"] += 1
    try:
        return get(*args, **kwargs)
    finally:
        stats = last_stats()
        if stats is not None and stats.engine_runs:
            CALLS["engine"] += 1
            CALLS["native"] += stats.native_tasks


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--runslow", action="store_true", help="run Dask's slow tests")
    parser.addoption("--runarrayexpr", action="store_true", help="run array-expr tests")


def pytest_configure(config: Any) -> None:
    import dask
    import dask.base

    for name in ROUTED:
        dask.base.named_schedulers[name] = counted_get
    dask.config.set(scheduler=counted_get)
    dask.config.set({"array.rechunk.method": "tasks"})


def pytest_runtest_setup(item: Any) -> None:
    if "slow" in item.keywords and not item.config.getoption("--runslow"):
        pytest.skip("needs --runslow")
    if "array_expr" in item.keywords and not item.config.getoption("--runarrayexpr"):
        pytest.skip("array-expr only")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Fails a run whose tests never reached chunkfuse: the routing did not take."""
    if session.testscollected and CALLS["n"] == 0:
        session.exitstatus = 1
    print(
        f"\nchunkfuse.dask.get ran {CALLS['n']} graphs; the engine ran part of "
        f"{CALLS['engine']} of them ({CALLS['native']} tasks)"
    )
