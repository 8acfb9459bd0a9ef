"""How writes let through without a token are counted, and what that costs.

Under ``on_missing = allow`` every tokenless write is counted as ``unfenced`` (and every write
let through by the bypass as ``bypassed``): once per statement on key and table fences, once per
row on row fences, on every write path. The count is a ``nextval()``: it survives the rollback
of the write's transaction and does not read ``pg_locks`` (before, each count called
``fencekit.writing()``, which reads the server's whole lock table, so its cost grew with the
locks other sessions held). The ``pg_locks`` test fails on the code before this change.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.core.helpers import one, protect, rejection_count, write

Conn = psycopg.Connection[Any]

SCOPES = {
    "c_row": {"scope": "row"},
    "c_key": {"scope": "key", "key": ("k",)},
    "c_table": {"scope": "table"},
}
# Per write path: the statement, and how many it counts on a row fence and on the others.
# Table c_* starts with rows (1, k 1) and (2, k 2).
PATHS = [
    ("INSERT INTO {t} (id, k, v) VALUES (3, 1, 0), (4, 2, 0)", 2, 1),
    # An upsert is checked as an INSERT and as an UPDATE (on a row fence: the proposed row, then
    # the row it updates), and counted by each check.
    ("INSERT INTO {t} VALUES (1, 1, 0) ON CONFLICT (id) DO UPDATE SET v = 9", 2, 2),
    ("UPDATE {t} SET v = v + 1", 2, 1),
    ("UPDATE {t} SET v = v + 1 WHERE id = 1", 1, 1),
    ("DELETE FROM {t} WHERE id = 2", 1, 1),
    ("WITH w AS (UPDATE {t} SET v = 5 WHERE id = 1 RETURNING id) SELECT * FROM w", 1, 1),
    ("TRUNCATE {t}", 1, 1),
]


@pytest.fixture
def tables(db: Conn) -> None:
    for name, kw in SCOPES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v int)")
        db.commit()
        protect(db, name, on_missing="allow", **kw)  # type: ignore[arg-type]
        write(db, 10, f"INSERT INTO {name} VALUES (1, 1, 0), (2, 2, 0)")


@pytest.mark.parametrize(("stmt", "on_row", "on_other"), PATHS)
@pytest.mark.parametrize("table", list(SCOPES))
def test_each_write_path_is_counted(
    db: Conn, tables: None, table: str, stmt: str, on_row: int, on_other: int
) -> None:
    write(db, None, stmt.format(t=table))
    assert rejection_count(db, table, "unfenced") == (on_row if table == "c_row" else on_other)


@pytest.mark.pg_since(15)
@pytest.mark.parametrize("table", list(SCOPES))
def test_merge_is_counted(db: Conn, tables: None, table: str) -> None:
    write(
        db,
        None,
        f"MERGE INTO {table} t USING (VALUES (1), (7)) s(id) ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = 3 WHEN NOT MATCHED THEN INSERT (id, k, v) "
        "VALUES (s.id, 1, 0)",
    )
    # Row fence: two rows; key fence: one AFTER check per action (UPDATE, INSERT); table: one
    # BEFORE check per action.
    assert rejection_count(db, table, "unfenced") == 2


@pytest.mark.parametrize("table", list(SCOPES))
def test_copy_is_counted(db: Conn, tables: None, table: str) -> None:
    db.rollback()
    with db.cursor() as cur, cur.copy(f"COPY {table} (id, k, v) FROM STDIN") as copy:
        copy.write_row((5, 1, 0))
        copy.write_row((6, 2, 0))
    db.commit()
    assert rejection_count(db, table, "unfenced") == (2 if table == "c_row" else 1)


@pytest.mark.parametrize("table", list(SCOPES))
def test_the_count_survives_the_rollback(db: Conn, tables: None, table: str) -> None:
    db.rollback()
    db.execute(f"UPDATE {table} SET v = 1 WHERE id = 1")
    db.rollback()
    assert rejection_count(db, table, "unfenced") == 1
    assert one(db, f"SELECT v FROM {table} WHERE id = 1") == 0


@pytest.mark.pg_since(15)  # pg_stat_force_next_flush
def test_counting_reads_no_lock_table(db: Conn, tables: None) -> None:
    """The cost of counting must not depend on other sessions: no call of fencekit.writing()
    (pg_locks) for a write that passes, with a token or without."""
    db.rollback()
    db.autocommit = True
    db.execute("SET track_functions = 'all'")
    writing = (
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
        "WHERE schemaname = 'fencekit' AND funcname = 'writing'"
    )
    db.execute("SELECT pg_stat_clear_snapshot()")
    before = db.execute(writing).fetchone()
    for table in SCOPES:
        db.execute(f"UPDATE {table} SET v = v + 1")
        db.execute(f"INSERT INTO {table} (id, k, v) VALUES (9, 1, 0)")
        db.execute(f"DELETE FROM {table} WHERE id = 9")
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    assert db.execute(writing).fetchone() == before
    assert rejection_count(db, "c_row", "unfenced") == 4  # 2 + 1 + 1 rows
    assert rejection_count(db, "c_key", "unfenced") == 3
    assert rejection_count(db, "c_table", "unfenced") == 3
    # A rejection still goes through fencekit.reject, which checks the caller (pg_locks).
    stale = "PERFORM set_config('fencekit.token', '3', true); UPDATE c_key SET v = 0;"
    with pytest.raises(psycopg.Error):
        db.execute(f"DO $$ BEGIN {stale} END $$")
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    assert db.execute(writing).fetchone()[0] > before[0]  # type: ignore[index]
