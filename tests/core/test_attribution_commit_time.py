"""A writer without a token is last seen when its transaction commits.

Its record becomes visible at the commit: a transaction that wrote without a token long before
it committed must not look that old to ``fencekit rollout``, which would call the table ready
to enforce the moment the transaction commits. At READ COMMITTED a deferred trigger dates the
writer's row at the commit; at REPEATABLE READ and SERIALIZABLE (which append to
``fencekit.unfenced_log``, never read it) one appends a marker at the commit, which the fold
takes the writer's last time from. An admin's fold, whose commit is not the writer's, keeps
the times the log holds. These tests sleep for real: the report allows a writer's last time
to lag its statements by ``attribution_lag()`` (10 s), so a transaction must outlive it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit.catalog.rollout import TableRollout, rollout_report
from fencekit.spec import TableName
from tests.core.helpers import rollout_tables

Conn = psycopg.Connection[Any]

SCOPES = {
    "c_row": {"scope": "row"},
    "c_key": {"scope": "key", "key": ("k",)},
    "c_table": {"scope": "table"},
}
LEVELS = {
    "read committed": psycopg.IsolationLevel.READ_COMMITTED,
    "repeatable read": psycopg.IsolationLevel.REPEATABLE_READ,
    "serializable": psycopg.IsolationLevel.SERIALIZABLE,
}
WINDOW = timedelta(seconds=1)
# Longer than attribution_lag() + WINDOW: a writer dated at its statement is out of the window
# by the time it commits.
HOLD = 11.5


@pytest.fixture
def tables(db: Conn) -> None:
    rollout_tables(db, "c", rows=20)


def _connect(dsn: str, level: str, app: str = "longtx") -> Conn:
    c = psycopg.connect(make_conninfo(dsn, application_name=app))
    c.isolation_level = LEVELS[level]
    c.execute("SET enable_seqscan = off")  # the writes below meet on no row of the table
    c.commit()
    return c


def _now(c: Conn) -> datetime:
    row = c.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _long_write(dsn: str, level: str, table: str, hold: float, row: int = 20) -> datetime:
    """A tokenless UPDATE, then ``hold`` seconds in the transaction, then COMMIT; returns the
    server's clock just before the commit."""
    c = _connect(dsn, level)
    try:
        c.execute(f"UPDATE {table} SET v = 'long' WHERE id = %s", [row])
        c.execute("SELECT pg_sleep(%s)", [hold])
        before = _now(c)
        c.commit()
        return before
    finally:
        c.close()


def _report(db: Conn, table: str) -> TableRollout:
    db.commit()
    (t,) = rollout_report(db, [TableName("public", table)], window=WINDOW)
    db.commit()
    return t


def test_a_long_transaction_is_seen_at_its_commit(db: Conn, dsn: str) -> None:
    """The tokenless write ran HOLD seconds before its commit; right after the commit the
    table is not ready, and the writer's last_seen is the commit's time. One long writer per
    fence and isolation level, all side by side (each on tables of its own): the nine wait out
    one HOLD together rather than one per level."""
    prefixes = dict(zip(LEVELS, ("rc", "rr", "sz"), strict=True))
    tables = [
        (level, table)
        for level, prefix in prefixes.items()
        for table in rollout_tables(db, prefix, rows=20)
    ]
    with ThreadPoolExecutor(len(tables)) as pool:
        commits = dict(
            zip(
                tables,
                pool.map(lambda lt: _long_write(dsn, lt[0], lt[1], HOLD), tables),
                strict=True,
            )
        )
    for (level, table), committed in commits.items():
        t = _report(db, table)
        assert t.verdict == "not_ready", (level, table, t.writers)
        (w,) = t.writers
        assert w.application_name == "longtx"
        assert w.statement == f"UPDATE {table} SET v = ? WHERE id = $1"
        assert committed <= w.last_seen <= committed + timedelta(seconds=2), (level, table)
        assert w.first_seen <= committed - timedelta(seconds=HOLD - 1), (level, table)
        assert w.statements == 1


@pytest.mark.parametrize("level", ["read committed", "repeatable read"])
def test_a_fold_by_an_admin_keeps_the_writers_commit_time(
    db: Conn, dsn: str, tables: None, level: str
) -> None:
    """The fold writes the writers' table in the admin's transaction, later than the writer
    committed: the writer keeps the time of its own commit. At READ COMMITTED the writer's row
    exists and the fold adds a REPEATABLE READ record of the same writer to it (an update of
    its count, which dates a writer's own row at its commit)."""
    table = "c_row"
    if level == "read committed":
        _long_write(dsn, "read committed", table, 0, row=1)
    committed = _long_write(dsn, "repeatable read", table, 0, row=2)
    db.execute("SELECT pg_sleep(2)")
    db.commit()
    folded_at = _now(db)
    _report(db, table)  # folds, and commits
    (w,) = _report(db, table).writers  # what the fold's commit left
    assert committed <= w.last_seen < committed + timedelta(seconds=1) < folded_at
    assert w.statements == (2 if level == "read committed" else 1)
    row = db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone()
    db.commit()
    assert row == (0,)


@pytest.mark.parametrize("level", list(LEVELS))
def test_a_rolled_back_writer_leaves_neither_record_nor_marker(
    db: Conn, dsn: str, tables: None, level: str
) -> None:
    for table in SCOPES:
        c = _connect(dsn, level)
        try:
            c.execute(f"UPDATE {table} SET v = 'r' WHERE id = %s", [3])
            c.rollback()
        finally:
            c.close()
    rows = db.execute(
        "SELECT (SELECT count(*) FROM fencekit.unfenced_log),"
        " (SELECT count(*) FROM fencekit.unfenced_writers),"
        " (SELECT count(*) FROM fencekit.unfenced_overflow)"
    ).fetchone()
    db.commit()
    assert rows == (0, 0, 0)
    for table in SCOPES:
        assert _report(db, table).writers == []


@pytest.mark.all_servers  # what SSI tracks is the server's business
@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
@pytest.mark.parametrize("table", list(SCOPES))
def test_commit_markers_fail_no_concurrent_writer(
    db: Conn, dsn: str, tables: None, table: str, level: str
) -> None:
    """Four transactions of one writer, each with a snapshot taken before any of them wrote,
    write without a token and commit in turn: each commit appends a marker, and none of them
    fails (no 40001). The log holds each append and its marker; the fold counts the appends
    and dates the writer at the last commit."""
    conns = [_connect(dsn, level) for _ in range(4)]
    try:
        for c in conns:
            c.execute("SELECT 1 FROM pg_class LIMIT 1")  # takes the snapshot
        for i, c in enumerate(conns):
            c.execute(f"UPDATE {table} SET v = 'm' WHERE id = %s", [5 + i])
        last = datetime.min
        for c in conns:
            last = _now(c)
            c.commit()
    finally:
        for c in conns:
            c.close()
    row = db.execute(
        "SELECT count(*) FILTER (WHERE statements > 0), count(*) FILTER (WHERE statements = 0),"
        " count(*) FILTER (WHERE statements = 0 AND statement = '')"
        " FROM fencekit.unfenced_log"
    ).fetchone()
    db.commit()
    assert row == (4, 4, 4)
    (w,) = _report(db, table).writers
    assert w.statements == 4
    assert w.statement == f"UPDATE {table} SET v = ? WHERE id = $1"
    assert last <= w.last_seen


def test_a_serializable_reader_of_the_totals_sees_the_commit_time(
    db: Conn, dsn: str, tables: None
) -> None:
    """A SERIALIZABLE reader of the public totals does not read the log: it sees the last
    append's time in a sequence, which the commit marker moves to the commit."""
    committed = _long_write(dsn, "serializable", "c_row", 2)
    reader = _connect(dsn, "serializable")
    try:
        row = reader.execute(
            "SELECT last_seen FROM fencekit.unfenced_writer_totals WHERE table_name = 'c_row'"
        ).fetchone()
        reader.commit()
    finally:
        reader.close()
    assert row is not None
    assert committed - timedelta(milliseconds=1) <= row[0] <= committed + timedelta(seconds=1)


def test_set_constraints_immediate_dates_the_writer_then(db: Conn, dsn: str, tables: None) -> None:
    """A writer that runs SET CONSTRAINTS ALL IMMEDIATE fires the deferred trigger at once:
    its own row is dated at that statement, earlier than its commit (nobody else's changes)."""
    c = _connect(dsn, "read committed")
    try:
        c.execute("UPDATE c_row SET v = 'i' WHERE id = %s", [4])
        c.execute("SET CONSTRAINTS ALL IMMEDIATE")
        fired = _now(c)
        c.execute("SELECT pg_sleep(1.5)")
        committed = _now(c)
        c.commit()
    finally:
        c.close()
    (w,) = _report(db, "c_row").writers
    assert w.last_seen <= fired < committed - timedelta(seconds=1)


def test_a_procedure_s_commit_dates_what_it_recorded_before(
    db: Conn, dsn: str, tables: None
) -> None:
    """A CALL that commits: its deferred triggers fire at its COMMIT, so the writer is seen at
    that commit, not at its statement nor at the end of the CALL."""
    db.execute(
        "CREATE PROCEDURE p() LANGUAGE plpgsql AS $$ BEGIN"
        " UPDATE c_row SET v = 'p' WHERE id = 7; PERFORM pg_sleep(2); COMMIT;"
        " PERFORM pg_sleep(2); END $$"
    )
    db.commit()
    with psycopg.connect(make_conninfo(dsn, application_name="proc"), autocommit=True) as c:
        c.execute("CALL p()")
    (w,) = _report(db, "c_row").writers
    assert w.statement == "CALL p()"
    gap = w.last_seen - w.first_seen
    assert timedelta(seconds=1.5) <= gap <= timedelta(seconds=3.5)
