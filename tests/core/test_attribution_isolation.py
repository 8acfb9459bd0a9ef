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

from tests.core.helpers import protect, write

Conn = psycopg.Connection[Any]

SCOPES = {
    "i_row": {"scope": "row"},
    "i_key": {"scope": "key", "key": ("k",)},
    "i_table": {"scope": "table"},
}
LEVELS = ["repeatable read", "serializable"]


@pytest.fixture
def tables(db: Conn) -> None:
    for name, kw in SCOPES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v text)")
        db.commit()
        protect(db, name, on_missing="allow", **kw)  # type: ignore[arg-type]
        write(db, 10, f"INSERT INTO {name} SELECT g, g, 'a' FROM generate_series(1, 20) g")


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
    db.execute("SELECT fencekit.fold_unfenced_log()")
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
