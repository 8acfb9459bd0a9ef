"""Attribution never fails or serializes an application's write, at any isolation level.

A tokenless write of a table in rollout mode is attributed inside the writer's transaction. A
transaction at REPEATABLE READ or SERIALIZABLE must not get a serialization failure (40001)
because another transaction attributed the same writer, or any writer, at the same time: the
attribution is fencekit's bookkeeping, never a reason for the application to retry. Those
transactions append to a log that nothing in a writer's transaction reads
(``fencekit.unfenced_log``); the report side folds it into ``fencekit.unfenced_writers``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.core.helpers import rollout_tables

Conn = psycopg.Connection[Any]

SCOPES = {
    "i_row": {"scope": "row"},
    "i_key": {"scope": "key", "key": ("k",)},
    "i_table": {"scope": "table"},
}
LEVELS = ["repeatable read", "serializable"]


@pytest.fixture
def tables(db: Conn) -> None:
    rollout_tables(db, "i", rows=20)


def _connect(dsn: str, level: str, app: str = "iso-app") -> Conn:
    c = psycopg.connect(make_conninfo(dsn, application_name=app))
    c.isolation_level = (
        psycopg.IsolationLevel.SERIALIZABLE
        if level == "serializable"
        else psycopg.IsolationLevel.REPEATABLE_READ
    )
    # The application's own statements read by the primary key only, so that the two
    # transactions below do not conflict over the table itself: any failure is attribution's.
    c.execute("SET enable_seqscan = off")
    c.commit()
    return c


def fold(db: Conn) -> None:
    db.commit()
    db.execute("SELECT fencekit.fold_unfenced_log(NULL)")
    db.commit()


def writers(db: Conn, table: str) -> list[tuple[str, int]]:
    fold(db)
    rows = db.execute(
        "SELECT u.statement, u.statements FROM fencekit.unfenced_writers u"
        " JOIN fencekit.protected p USING (tag) WHERE p.table_name = %s ORDER BY 1",
        [table],
    ).fetchall()
    db.commit()
    return [(str(s), int(n)) for s, n in rows]


@pytest.mark.all_servers  # what SSI tracks is the server's business
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("table", list(SCOPES))
@pytest.mark.parametrize("recorded_before", [False, True], ids=["new", "known"])
def test_the_same_writer_recorded_after_a_snapshot_fails_no_write(
    db: Conn, dsn: str, tables: None, table: str, level: str, recorded_before: bool
) -> None:
    """Two connections of one writer (same roles, application_name, address, statement). The
    second's snapshot predates the first's record; its own tokenless write must still commit.
    ``known``: the writer was recorded before both (its row is updated), ``new``: it was not
    (its row is inserted)."""
    stmt = f"UPDATE {table} SET v = 'w' WHERE id = %s"
    if recorded_before:
        with psycopg.connect(make_conninfo(dsn, application_name="iso-app"), autocommit=True) as c:
            c.execute(stmt, [20])
    first, second = _connect(dsn, level), _connect(dsn, level)
    try:
        second.execute("SELECT 1 FROM pg_class LIMIT 1")  # takes the snapshot
        first.execute(stmt, [1])
        first.commit()
        second.execute(stmt, [2])  # the same writer, recorded since its snapshot
        second.commit()
    finally:
        first.close()
        second.close()
    ((shape, count),) = writers(db, table)
    assert shape == f"UPDATE {table} SET v = ? WHERE id = $1"
    assert count == (3 if recorded_before else 2)


@pytest.mark.all_servers  # what SSI tracks is the server's business
@pytest.mark.parametrize("table", list(SCOPES))
def test_serializable_writers_of_different_statements_do_not_conflict(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    """Two SERIALIZABLE transactions, each attributing a different statement while the other
    is open: the attribution's reads (how many writers the table has, the writer's row) must
    not become read-write conflicts between them."""
    first, second = _connect(dsn, "serializable"), _connect(dsn, "serializable")
    try:
        first.execute("SELECT 1 FROM pg_class LIMIT 1")
        second.execute("SELECT 1 FROM pg_class LIMIT 1")
        first.execute(f"UPDATE {table} SET v = 'x' WHERE id = %s", [3])
        second.execute(f"UPDATE {table} SET k = k WHERE id = %s", [4])
        first.commit()
        second.commit()
    finally:
        first.close()
        second.close()
    assert [s for s, _ in writers(db, table)] == [
        f"UPDATE {table} SET k = k WHERE id = $1",
        f"UPDATE {table} SET v = ? WHERE id = $1",
    ]


def _tag(db: Conn, table: str) -> str:
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = %s", [table]).fetchone()
    db.commit()
    assert row is not None
    return str(row[0])


ATTRIBUTION = (
    "'fencekit.unfenced_writers'::regclass, 'fencekit.unfenced_overflow'::regclass,"
    " 'fencekit.unfenced_log'::regclass"
)


@pytest.mark.all_servers  # what SSI tracks is the server's business
@pytest.mark.parametrize("table", list(SCOPES))
def test_a_serializable_writer_takes_no_predicate_lock_on_attribution(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    """What a SERIALIZABLE writer's record reads is what SSI tracks: it holds no predicate
    lock (SIReadLock) on an attribution table, and the sequences it uses are not tracked at
    all, so no other transaction's record can make it a read-write conflict. A SERIALIZABLE
    reader of the public totals does not scan the log either, and the fold refuses to run
    there (returns false, reads nothing): either would lock the log against every append."""
    w = _connect(dsn, "serializable")
    try:
        w.execute(f"UPDATE {table} SET v = 'p' WHERE id = %s", [5])
        held = w.execute(
            "SELECT l.relation::regclass::text, l.locktype FROM pg_locks l"
            " JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.mode = 'SIReadLock' AND l.pid = pg_backend_pid()"
            "   AND c.relnamespace = 'fencekit'::regnamespace"
            f"  AND (l.relation IN ({ATTRIBUTION}) OR c.relkind = 'S')"
        ).fetchall()
        assert held == []
        w.commit()
        reader = w
        reader.execute("SELECT * FROM fencekit.unfenced_writer_totals").fetchall()
        assert reader.execute("SELECT fencekit.fold_unfenced_log(NULL)").fetchone() == (False,)
        held = reader.execute(
            "SELECT l.relation::regclass::text FROM pg_locks l"
            " WHERE l.mode = 'SIReadLock' AND l.pid = pg_backend_pid()"
            "   AND l.relation = 'fencekit.unfenced_log'::regclass"
        ).fetchall()
        assert held == []
        reader.commit()
    finally:
        w.close()
    assert [s for s, _ in writers(db, table)] == [f"UPDATE {table} SET v = ? WHERE id = $1"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("table", list(SCOPES))
def test_a_rolled_back_writer_leaves_no_record(
    db: Conn, dsn: str, tables: None, table: str, level: str
) -> None:
    w = _connect(dsn, level)
    try:
        w.execute(f"UPDATE {table} SET v = 'r' WHERE id = %s", [6])
        (n,) = w.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() or (0,)
        assert n == 1  # its own append, which nobody else sees until it commits
        w.rollback()
    finally:
        w.close()
    totals = db.execute(
        "SELECT writers, last_seen FROM fencekit.unfenced_writer_totals WHERE table_name = %s",
        [table],
    ).fetchone()
    db.commit()
    assert totals == (0, None)
    assert writers(db, table) == []


@pytest.mark.parametrize("table", list(SCOPES))
def test_the_totals_count_the_log_before_a_fold(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    """The public totals (the exporter's, and enforce's for a role that may not read the
    writers) count what waits in the log: its writers and its last time, at READ COMMITTED and
    REPEATABLE READ from the rows themselves, at SERIALIZABLE from the appends' sequences."""
    monitor = make_role("iso_monitor")
    for app in ("one", "two"):
        w = _connect(dsn, "repeatable read", app)
        try:
            w.execute(f"UPDATE {table} SET v = 't' WHERE id = %s", [7])
            w.commit()
        finally:
            w.close()
    (appended,) = db.execute("SELECT max(seen) FROM fencekit.unfenced_log").fetchone() or (None,)
    db.commit()
    assert appended is not None
    q = "SELECT writers, last_seen FROM fencekit.unfenced_writer_totals WHERE table_name = %s"
    for level in (None, "repeatable read", "serializable"):
        with psycopg.connect(monitor) as m:
            if level is not None:
                m.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            got = m.execute(q, [table]).fetchone()
        assert got is not None
        if level == "serializable":
            assert got[0] == 0  # only the folded writers
            assert abs((got[1] - appended).total_seconds()) < 0.002  # the last append's ms
        else:
            assert got == (2, appended)
    fold(db)
    assert db.execute(q, [table]).fetchone() == (2, appended)
    db.commit()
    with psycopg.connect(monitor) as m:
        m.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        got = m.execute(q, [table]).fetchone()
    # The folded writers, and the last append's time to the millisecond (its sequence's).
    assert got is not None
    assert got[0] == 2
    assert abs((got[1] - appended).total_seconds()) < 0.002


def test_a_fold_applies_the_cap_and_sums_a_writers_records(
    db: Conn, dsn: str, tables: None
) -> None:
    """The fold adds the log's records with the direct record's code: one writer's records
    become one row (first and last seen, the count summed, the first statement), a writer
    already recorded at READ COMMITTED grows, and writers beyond the cap go to the overflow."""
    db.execute("INSERT INTO fencekit.meta VALUES ('attribution_cap', '2')")
    db.commit()
    stmt = "UPDATE i_key SET v = 'f' WHERE id = %s"
    with psycopg.connect(make_conninfo(dsn, application_name="rc"), autocommit=True) as c:
        c.execute(stmt, [1])  # READ COMMITTED: recorded directly
    for app in ("rc", "rr", "rr", "over"):  # each a new connection: a record each
        w = _connect(dsn, "repeatable read", app)
        try:
            w.execute(stmt, [2])
            w.commit()
        finally:
            w.close()
    (logged,) = db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() or (0,)
    first_rr = db.execute(
        "SELECT min(seen), max(seen) FROM fencekit.unfenced_log WHERE application_name = 'rr'"
    ).fetchone()
    db.commit()
    assert logged == 8  # four appends, and a marker of each one's commit
    fold(db)
    got = db.execute(
        "SELECT application_name, statements, first_seen, last_seen, statement"
        " FROM fencekit.unfenced_writers ORDER BY first_seen"
    ).fetchall()
    over = db.execute("SELECT statements FROM fencekit.unfenced_overflow").fetchall()
    left = db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone()
    db.commit()
    assert [(a, n) for a, n, *_ in got] == [("rc", 2), ("rr", 2)]
    assert first_rr is not None
    assert (got[1][2], got[1][3]) == first_rr
    assert {s for *_, s in got} == {"UPDATE i_key SET v = ? WHERE id = $1"}
    assert over == [(1,)]
    assert left == (0,)
    fold(db)  # nothing left: nothing changes
    assert [n for _, n in writers(db, "i_key")] == [2, 2]


@pytest.mark.parametrize("level", LEVELS)
def test_the_log_is_bounded_and_a_full_log_counts_statements_as_unattributed(
    db: Conn, dsn: str, tables: None, level: str
) -> None:
    """At most attribution_log_cap() appends past the last fold's mark: beyond it a statement
    is counted as unattributed (never lost from the report), and a fold frees the log."""
    tag = _tag(db, "i_row")
    (cap,) = db.execute("SELECT fencekit.attribution_log_cap()").fetchone() or (0,)
    # As if the log were full: cap appends since the last fold (rolled back, here).
    db.execute("SELECT setval(format('fencekit.%%I', %s || ':logged'), %s)", [tag, cap])
    db.commit()
    stmt = "UPDATE i_row SET v = 'c' WHERE id = %s"
    w = _connect(dsn, level, "full")
    try:
        w.execute(stmt, [8])
        w.commit()
    finally:
        w.close()
    q = (
        "SELECT writers, unattributed_statements, last_seen IS NOT NULL"
        " FROM fencekit.unfenced_writer_totals WHERE table_name = 'i_row'"
    )
    assert db.execute(q).fetchone() == (0, 1, True)
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (0,)
    db.commit()
    fold(db)  # the mark moves to the last append: room again
    w = _connect(dsn, level, "room")
    try:
        w.execute(stmt, [9])
        w.commit()
    finally:
        w.close()
    assert db.execute(q).fetchone() == (1, 1, True)
    db.commit()


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_writer_cannot_forge_or_erase_log_rows(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    """The log is the writers' table's antechamber: a writer may not read, insert, change or
    delete its rows, nor fold it, nor move the marks that bound it; a direct call of the
    recorder at REPEATABLE READ appends its own identity only, whatever it claims."""
    app = make_role("iso_app", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    tag = _tag(db, table)
    victim = _connect(dsn, "repeatable read", "victim")
    try:
        victim.execute(f"UPDATE {table} SET v = 'v' WHERE id = %s", [10])
        victim.commit()
    finally:
        victim.close()
    before = db.execute("SELECT * FROM fencekit.unfenced_log").fetchall()
    db.commit()
    with psycopg.connect(app, autocommit=True) as c:
        for stmt in (
            "SELECT * FROM fencekit.unfenced_log",
            "DELETE FROM fencekit.unfenced_log",
            "UPDATE fencekit.unfenced_log SET seen = '2000-01-01'",
            "TRUNCATE fencekit.unfenced_log",
            "INSERT INTO fencekit.unfenced_log (tag, writer, session_user_name,"
            " current_user_name, application_name, fingerprint, statement, seen, statements)"
            " VALUES ('x', 'x', 'x', 'x', 'x', 'x', 'x', now(), 1)",
            "SELECT fencekit.fold_unfenced_log(NULL)",
            "SELECT fencekit.merge_unfenced_writer(u) FROM fencekit.unfenced_writers u",
            "UPDATE fencekit.unfenced_log_folded SET appends = 1000000",
            "INSERT INTO fencekit.unfenced_log_folded VALUES ('x', 1000000)",
            f"SELECT nextval(format('fencekit.%I', '{tag}' || ':logged'))",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(stmt)
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        c.execute("SET LOCAL application_name = 'victim'")
        c.execute("SELECT fencekit.record_unfenced_writer(%s, %s::regclass, 5)", [tag, table])
        c.execute("COMMIT")
    after = db.execute("SELECT * FROM fencekit.unfenced_log").fetchall()
    db.commit()
    assert after[: len(before)] == before
    new = after[len(before) :]
    # Its append and, at its commit, the append's marker (statements 0: the commit's time).
    assert [(r[2], r[3], r[4], r[10]) for r in new] == [
        ("iso_app", "iso_app", "victim", 5),
        ("iso_app", "iso_app", "victim", 0),
    ]


def test_a_fold_takes_about_the_cap_in_locks_however_many_writers_the_log_names(
    db: Conn, dsn: str, tables: None
) -> None:
    """The server's lock table is shared: a fold that took an advisory lock per writer the log
    names (a writer may use as many application names as it likes) could fill it and fail
    other sessions. Writers beyond the cap go to the overflow as one record."""
    db.execute("INSERT INTO fencekit.meta VALUES ('attribution_cap', '2')")
    db.commit()
    tag = _tag(db, "i_table")
    with psycopg.connect(dsn) as c:
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for i in range(40):
            c.execute("SELECT set_config('application_name', %s, true)", [f"app-{i}"])
            c.execute("SELECT fencekit.record_unfenced_writer(%s, 'i_table'::regclass, 1)", [tag])
    # 40 appends, and at the commit a marker for each.
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (80,)
    assert db.execute("SELECT fencekit.fold_unfenced_log(NULL)").fetchone() == (True,)
    (locks,) = db.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    ).fetchone() or (0,)
    db.commit()
    assert locks <= 2 + 2
    got = db.execute(
        "SELECT (SELECT count(*) FROM fencekit.unfenced_writers),"
        " (SELECT statements FROM fencekit.unfenced_overflow)"
    ).fetchone()
    db.commit()
    assert got == (2, 38)


def test_a_fold_rolled_back_leaves_the_logs_cap_where_it_was(
    db: Conn, dsn: str, tables: None
) -> None:
    """A fold in a transaction that rolls back (an enforce migration refused, say) puts the
    log's rows back: the mark the cap counts from goes back with them, so the rows the fold
    read still count against the cap. A fold that commits frees it."""
    tag = _tag(db, "i_row")
    for app in ("a", "b"):
        w = _connect(dsn, "repeatable read", app)
        try:
            w.execute("UPDATE i_row SET v = 'm' WHERE id = %s", [11])
            w.commit()
        finally:
            w.close()
    mark = "SELECT appends FROM fencekit.unfenced_log_folded WHERE tag = %s"
    assert db.execute("SELECT fencekit.fold_unfenced_log(NULL)").fetchone() == (True,)
    assert db.execute(mark, [tag]).fetchone() == (2,)
    db.rollback()
    assert db.execute(mark, [tag]).fetchone() is None
    # Two appends and their commit markers.
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (4,)
    db.commit()
    fold(db)
    assert db.execute(mark, [tag]).fetchone() == (2,)
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (0,)
    db.commit()
