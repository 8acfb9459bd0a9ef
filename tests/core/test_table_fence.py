"""Table fences (one fence per table or named resource, checked once per statement) and
TRUNCATE under every scope, on both servers."""

from __future__ import annotations

import psycopg
import pytest

from tests.core.helpers import (
    MISSING,
    STALE,
    Conn,
    begin,
    detail,
    key_fence,
    make_app_role,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    write,
)

pytestmark = pytest.mark.all_servers

N = 300  # rows touched by one statement


def _function_calls(conn: Conn) -> dict[str, int]:
    """Calls of fencekit's functions counted so far by this backend, not yet flushed."""
    found = conn.execute(
        "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'fencekit'"
    ).fetchall()
    return {name: int(calls) for name, calls in found}


def _calls_of_one_statement(conn: Conn, token: int, stmt: str) -> dict[str, int]:
    """Calls made by one statement. A difference: since PostgreSQL 15 the "xact" view can
    also hold earlier transactions' calls that the backend has not flushed yet."""
    begin(conn, token)
    before = _function_calls(conn)
    conn.execute(stmt)
    after = _function_calls(conn)
    conn.rollback()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_table_fence_is_checked_once_per_statement(db: Conn) -> None:
    # Session-wide before any fenced statement: PL/pgSQL caches its expressions with the
    # tracking level in force when they are first run.
    db.execute("SET track_functions = 'all'")  # superuser only
    db.execute("CREATE TABLE tf (id int PRIMARY KEY, v int)")
    db.execute("CREATE TABLE rf (id int PRIMARY KEY, v int)")
    protect(db, "tf", "table")
    protect(db, "rf", "row")
    write(db, 5, f"INSERT INTO tf SELECT g, 0 FROM generate_series(1, {N}) g")
    write(db, 5, f"INSERT INTO rf SELECT g, 0 FROM generate_series(1, {N}) g")

    calls = _calls_of_one_statement(db, 6, "UPDATE tf SET v = v + 1")
    stmt_fn = next(name for name in calls if name.startswith("tf_") and name.endswith("_stmt"))
    assert calls[stmt_fn] == 1
    assert calls["judge_fences"] == 1
    assert not [name for name in calls if name.endswith(("_ins", "_upd", "_del"))]
    # The same measurement on a row fence counts one call per row: it can tell the two apart.
    calls = _calls_of_one_statement(db, 6, "UPDATE rf SET v = v + 1")
    assert calls[next(n for n in calls if n.startswith("rf_") and n.endswith("_upd"))] == N

    # A stale statement over N rows is one rejection, not N.
    write(db, 7, "UPDATE tf SET v = 1 WHERE id = 1")
    reject(db, STALE, 6, "UPDATE tf SET v = v + 1")
    assert rejection_count(db, "tf", "stale") == 1


def test_table_fence_compares_every_write_with_one_fence(db: Conn) -> None:
    db.execute("CREATE TABLE tf (id int PRIMARY KEY, v text)")
    protect(db, "tf", "table")
    write(db, 10, "INSERT INTO tf VALUES (1, 'a')")
    assert key_fence(db, "public.tf") == 10
    err = reject(db, STALE, 9, "INSERT INTO tf VALUES (2, 'other row, same table')")
    d = detail(err)
    assert (d["key"], d["token"], d["fence"], d["resource"]) == (None, 9, 10, "public.tf")
    reject(db, STALE, 9, "UPDATE tf SET v = 'x'")
    reject(db, STALE, 9, "DELETE FROM tf")
    reject(db, MISSING, None, "DELETE FROM tf")
    # A statement that touches no row is still a write under the fence.
    reject(db, STALE, 9, "DELETE FROM tf WHERE false")
    write(db, 10, "UPDATE tf SET v = 'same holder'")
    write(db, 12, "INSERT INTO tf VALUES (2, 'b')")
    assert key_fence(db, "public.tf") == 12
    assert rows(db, "SELECT id, v FROM tf ORDER BY id") == [(1, "same holder"), (2, "b")]


def test_named_table_fence_is_shared(db: Conn) -> None:
    db.execute("CREATE TABLE report_a (v int)")
    db.execute("CREATE TABLE report_b (v int)")
    protect(db, "report_a", "table", resource="nightly-report")
    protect(db, "report_b", "table", resource="nightly-report")
    write(db, 8, "INSERT INTO report_a VALUES (1)")
    reject(db, STALE, 7, "INSERT INTO report_b VALUES (1)")
    write(db, 9, "INSERT INTO report_b VALUES (1)")
    reject(db, STALE, 8, "UPDATE report_a SET v = 2")
    assert key_fence(db, "nightly-report") == 9


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_truncate_needs_a_token_not_lower_than_the_fence(
    db: Conn, make_role: object, scope: str
) -> None:
    db.execute("CREATE TABLE tr (k int PRIMARY KEY, v text)")
    protect(db, "tr", scope, **({"key": ("k",)} if scope == "key" else {}))
    write(db, 5, "INSERT INTO tr VALUES (1, 'a')")
    write(db, 9, "INSERT INTO tr VALUES (2, 'b')")  # highest fence: 9 whatever the scope
    err = reject(db, STALE, 8, "TRUNCATE tr")
    assert (detail(err)["token"], detail(err)["fence"]) == (8, 9)
    reject(db, MISSING, None, "TRUNCATE tr")
    assert one(db, "SELECT count(*) FROM tr") == 2
    # An admin may bypass (counted); an application role may not.
    admin_dsn = make_app_role(make_role, f"trunc_admin_{scope}", admin=True)
    app_dsn = make_app_role(make_role, f"trunc_app_{scope}")
    db.execute(f"GRANT TRUNCATE ON tr TO trunc_admin_{scope}, trunc_app_{scope}")
    db.commit()
    with psycopg.connect(app_dsn) as app:
        reject(app, "YF005", 8, "TRUNCATE tr", bypass=True)
        reject(app, STALE, 8, "TRUNCATE tr")
    with psycopg.connect(admin_dsn) as admin:
        write(admin, 8, "TRUNCATE tr", bypass=True)
    assert one(db, "SELECT count(*) FROM tr") == 0
    assert rejection_count(db, "tr", "bypassed") == 1
    write(db, 9, "INSERT INTO tr VALUES (1, 'a')")
    write(db, 9, "TRUNCATE tr")  # equal to the fence: accepted
    if scope != "row":
        # The fences outlive the rows: a stale worker cannot re-create what was truncated.
        reject(db, STALE, 8, "INSERT INTO tr VALUES (2, 'zombie')")


def test_truncate_of_a_partition(db: Conn) -> None:
    db.execute("CREATE TABLE pt (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE pt_a PARTITION OF pt FOR VALUES FROM (1) TO (100)")
    db.execute("CREATE TABLE pt_b PARTITION OF pt FOR VALUES FROM (100) TO (200)")
    protect(db, "pt")
    write(db, 5, "INSERT INTO pt VALUES (1, 'a')")
    write(db, 9, "INSERT INTO pt VALUES (101, 'b')")
    reject(db, STALE, 8, "TRUNCATE pt")
    reject(db, MISSING, None, "TRUNCATE pt_a")
    write(db, 9, "TRUNCATE pt_b")
    assert rows(db, "SELECT id FROM pt") == [(1,)]
