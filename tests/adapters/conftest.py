"""Helpers for the adapter tests (psycopg, SQLAlchemy, context, errors, metrics).

All tests here run against the real test database of ``tests/conftest.py`` (``db``/``dsn``),
with fencekit's core installed and tables protected by the real generated triggers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from fencekit import metrics
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

TOKEN_SQL = "SELECT NULLIF(current_setting('fencekit.token', true), '')"


def protect(dsn: str, ddl: str, table: str, scope: str = "row", key: tuple[str, ...] = ()) -> None:
    """Create a table with ``ddl`` and protect it with the real generator."""
    spec = FenceSpec(table=TableName.parse(table), scope=Scope(scope), key=key)
    with psycopg.connect(dsn) as conn:
        conn.execute(ddl.encode())
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())


@pytest.fixture
def billing(dsn: str) -> str:
    """``billing_summary`` as getting-started.md creates and protects it (key fence on
    account_id), seeded with account 42; returns the dsn."""
    protect(
        dsn,
        "CREATE TABLE billing_summary (account_id bigint PRIMARY KEY, summary text NOT NULL)",
        "billing_summary",
        "key",
        ("account_id",),
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '1', true)")
        conn.execute("INSERT INTO billing_summary VALUES (42, 'initial')")
    return dsn


def sa_url(dsn: str, driver: str = "psycopg") -> str:
    """SQLAlchemy URL for a libpq conninfo/URI (unix-socket hosts included)."""
    from sqlalchemy.engine import URL

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    query = {"host": str(params["host"])} if str(params.get("host", "")).startswith("/") else {}
    return URL.create(
        f"postgresql+{driver}",
        username=str(params.get("user") or "postgres"),
        password=params.get("password"),  # type: ignore[arg-type]
        host=None if query else str(params.get("host") or "localhost"),
        port=int(params["port"]) if params.get("port") else None,
        database=str(params["dbname"]),
        query=query,
    ).render_as_string(hide_password=False)


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """asyncpg.connect() keyword arguments for a libpq conninfo (unix-socket hosts included)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    kwargs: dict[str, Any] = {
        "host": params.get("host"),
        "port": int(params["port"]) if params.get("port") else None,
        "user": params.get("user") or "postgres",
        "database": params.get("dbname"),
        "password": params.get("password"),
    }
    return {k: v for k, v in kwargs.items() if v is not None}


def round_trips(conn: psycopg.Connection[Any], fn: Callable[[], object]) -> int:
    """How many times the client waited for the server while ``fn`` ran (libpq's trace).

    A round trip is a run of frontend messages followed by backend messages: count the
    transitions from backend (or start) to frontend in the protocol trace.
    """
    with tempfile.TemporaryFile() as fh:
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        try:
            fn()
        finally:
            conn.pgconn.untrace()
        fh.seek(0)
        directions = [line.split("\t", 1)[0] for line in fh.read().decode().splitlines() if line]
    return sum(
        1 for a, b in zip(["B", *directions], directions, strict=False) if a == "B" and b == "F"
    )


@pytest.fixture
def events() -> Iterator[list[metrics.MetricEvent]]:
    """Metric events seen during the test."""
    seen: list[metrics.MetricEvent] = []
    remove = metrics.add_listener(seen.append)
    try:
        yield seen
    finally:
        remove()


@pytest.fixture
def greenlet() -> None:
    """SQLAlchemy's asyncio layer needs greenlet (SQLAlchemy[asyncio])."""
    pytest.importorskip("greenlet", reason="SQLAlchemy asyncio needs greenlet: SQLAlchemy[asyncio]")
