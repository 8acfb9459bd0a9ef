"""The tiers below the full suite (docs/testing.md): ``pytest --fast``, the server-free tier,
and ``pytest --embedded``, everything the embedded server can run with pip alone and no root.

The fast tier: ``pytest --fast``.

It runs every test that needs no server: spec, identifiers, DDL parsing, the SQL golden files,
error translation, the chaos checker, argument parsing and drift formatting. Nothing but pip
is needed, and it takes seconds. Which tests those are is decided, not listed: a test is left
out when it is marked ``server`` / ``slow`` / ``multiproc`` / ``bench`` or when any fixture it
uses (directly or through other fixtures) starts or reaches a server. A guard makes the
classification honest: in the fast tier, starting a server or opening a connection fails the
test with a message that says to mark it ``server``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: Fixtures that start or reach a server (the suite's and the test directories' conftests).
SERVER_FIXTURES = frozenset(
    {
        "pg_server", "pg_dsn", "debian15_server", "target_server", "pg_target", "db", "dsn",
        "raw_db", "raw_dsn", "make_role", "pgbouncer", "postgresql", "postgresql_proc",
        "postgresql_noproc", *(f"pg{v}_server" for v in range(14, 19)),
        # tests/ha, tests/issuers, tests/leases, tests/chaos
        "cluster", "etcd", "zk", "etcd_cluster", "zk_ensemble", "restartable_pg", "_needs_servers",
    }
)  # fmt: skip
#: Markers that say a test needs servers or real processes.
SERVER_MARKERS = ("server", "slow", "multiproc", "bench", "all_servers", "django_db", "system")

#: Fixtures that start a program pip does not install (Debian's PostgreSQL and the version
#: matrix's builds, which need its libraries; pgbouncer, etcd, ZooKeeper, redis, Patroni):
#: left out of the embedded tier.
SYSTEM_FIXTURES = frozenset(
    {
        "debian15_server", *(f"pg{v}_server" for v in range(14, 19)), "pgbouncer",
        "postgresql_proc", "cluster", "ha_db", "etcd_cluster", "etcd", "etcd_issuer",
        "zk_ensemble", "zk", "zk_issuer", "restartable_pg", "redis_url",
    }
)  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only the tests that need no server (seconds, nothing but pip; docs/testing.md)",
    )
    parser.addoption(
        "--embedded",
        action="store_true",
        help="only the tests the embedded server can run with pip alone and no root (use with "
        "--pg=embedded --pg-matrix=; docs/testing.md)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "server: needs a server (or a program pip does not install) although it uses no server "
        "fixture (left out of --fast)",
    )
    config.addinivalue_line(
        "markers",
        "system: needs a program pip does not install (Debian's PostgreSQL, pgbouncer, etcd, "
        "ZooKeeper, redis, chromium, plpgsql_check, libfaketime, Patroni) or root, although it "
        "uses no fixture that starts one (left out of --fast and --embedded)",
    )


def needs_server(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(m) is not None for m in SERVER_MARKERS):
        return True
    names = set(getattr(item, "fixturenames", ()))
    # Fixtures of the test directories' conftests that start servers are named for them.
    servers = {n for n in names if n in SERVER_FIXTURES}
    return bool(servers)


def needs_system(item: pytest.Item) -> bool:
    if item.get_closest_marker("system") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    target = callspec.params.get("pg_target") if callspec is not None else None
    if target not in (None, "embedded"):
        return True
    return bool(set(getattr(item, "fixturenames", ())) & SYSTEM_FIXTURES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--fast"):
        leave_out = needs_server
    elif config.getoption("--embedded"):
        leave_out = needs_system
    else:
        return
    keep, drop = [], []
    for item in items:
        (drop if leave_out(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _fast_tier_guard(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """In the fast tier, reaching for a server is a misclassified test: say how to fix it."""
    if not request.config.getoption("--fast"):
        yield
        return
    import psycopg

    import fencekit.embedded

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        pytest.fail(
            f"{request.node.nodeid} reached for a PostgreSQL server in the fast tier (--fast): "
            "mark it @pytest.mark.server (tests/fast_tier.py)",
            pytrace=False,
        )

    monkeypatch.setattr(fencekit.embedded, "start_embedded", refuse)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(refuse))
    yield
