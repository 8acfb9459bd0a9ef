"""No function on the write path plans its statements again on every call.

A PL/pgSQL statement with parameters is planned per call (a custom plan) until the plan cache
settles on a generic plan; when it never does, every write pays the planner (judge_fences' main
query cost a key-fence statement about 0.15 ms that way). Here, on PostgreSQL 14 to 18, each
scope's one-row writes run many times in one session, under a rising token (the advance path)
and under one token (the common path), with pg_stat_statements tracking nested statements and
their planning; every statement run by fencekit's functions (core and generated) must have been
planned a handful of times, not once per call.

The version matrix's shared servers are started without pg_stat_statements preloaded, so each
major gets a dedicated cluster here (tests/lab/postgres.py), preloading it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName
from tests.lab.postgres import ClusterServer, ServerUnavailable, start_cluster

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

CALLS = 60
# The plan cache plans custom plans for the first five executions of a statement in each
# function (pg_stat_statements counts the same text in the ins, upd and del functions as one),
# then settles; a statement planned on more than this share of its calls re-plans per call.
MAX_SHARE = 0.5


@pytest.fixture(scope="module", params=[14, 15, 16, 17, 18], ids=lambda m: f"pg{m}")
def stats_server(request: pytest.FixtureRequest) -> Iterator[ClusterServer]:
    from tests import pg_binaries

    try:
        bindir = pg_binaries.ensure(request.param)
    except pg_binaries.BinariesUnavailable as exc:
        raise ServerUnavailable(str(exc)) from exc
    server = start_cluster(bindir, f"PostgreSQL {request.param} with pg_stat_statements")
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.crash()
        server.restart()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute(sqlgen.render_install().encode())
        yield server
    finally:
        server.stop()


SPECS = {
    "row": FenceSpec(TableName("public", "w_row")),
    "key": FenceSpec(TableName("public", "w_key"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "w_table"), scope=Scope.TABLE),
    "lease": FenceSpec(
        TableName("public", "w_lease"), scope=Scope.KEY, key=("k",), lease_bound=True
    ),
    "allow": FenceSpec(
        TableName("public", "w_allow"), scope=Scope.KEY, key=("k",), on_missing="allow"
    ),
}


def _writes(conn: psycopg.Connection[Any], table: str, token: Any, key: int) -> None:
    """One-row INSERT, UPDATE and DELETE, each its own transaction, as applications write."""
    for stmt in (
        f"INSERT INTO {table} (id, k, v) VALUES (1, {key}, 0)",
        f"UPDATE {table} SET v = v + 1 WHERE id = 1",
        f"DELETE FROM {table} WHERE id = 1",
    ):
        with conn.transaction():
            if token is not None:
                conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
            conn.execute(stmt)


def _tokens(conn: psycopg.Connection[Any], scope: str, path: str) -> list[tuple[Any, int]]:
    """(token, key) per round. Lease-bound: leases granted before the count starts (granting
    is the issuer's path, not the write path); a rising token is a new key's lease."""
    if scope == "allow":
        return [(None, 1)] * CALLS
    if scope == "lease":
        keys = range(1, CALLS + 1) if path == "rising" else [1] * CALLS
        grants: dict[int, int] = {}
        for k in dict.fromkeys(keys):
            row = conn.execute(
                "SELECT fencekit.acquire(%s, 'h', '1 hour')", (f"public.w_lease:{k}",)
            ).fetchone()
            assert row is not None
            grants[k] = row[0]
        return [(grants[k], k) for k in keys]
    if path == "rising":
        return [(1000 + i, 1) for i in range(CALLS)]
    return [(10**6, 1)] * CALLS


@pytest.mark.parametrize("path", ["rising", "same"])
@pytest.mark.parametrize("scope", list(SPECS))
def test_no_statement_is_planned_per_call(
    stats_server: ClusterServer, scope: str, path: str
) -> None:
    spec = SPECS[scope]
    table = spec.table.name
    with psycopg.connect(stats_server.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, k int NOT NULL, v int)")
        for stmt in sqlgen.protect_statements(spec):
            conn.execute(stmt.encode())
        conn.execute("DELETE FROM fencekit.leases")
        rounds = _tokens(conn, scope, path)
        conn.execute("SELECT pg_stat_statements_reset()")
    # A fresh session: its plan caches start empty.
    with psycopg.connect(stats_server.dsn, autocommit=True) as conn:
        for token, key in rounds:
            _writes(conn, table, token, key)
        rows = conn.execute(
            "SELECT calls, plans, query FROM pg_stat_statements "
            "WHERE NOT toplevel AND calls >= %s AND plans > calls * %s ORDER BY plans DESC",
            (CALLS, MAX_SHARE),
        ).fetchall()
    assert rows == [], "statements planned again per call:\n" + "\n\n".join(
        f"{plans} plans in {calls} calls: {' '.join(query.split())[:300]}"
        for calls, plans, query in rows
    )
