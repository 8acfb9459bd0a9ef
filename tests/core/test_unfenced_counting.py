"""How writes let through without a token are counted, and what that costs.

Under ``on_missing = allow`` every tokenless write is counted as ``unfenced`` (and every write
let through by the bypass without a token as ``bypassed``): once per statement on every scope,
by the check that lets the statement through, on every write path, a statement that writes no
row included. A row fence's tokenless rows then pass on their triggers' WHEN clauses: no
PL/pgSQL runs per row (before, each row ran the row trigger's slow path and was counted on its
own, so a row fence counted rows where key and table fences counted statements). The count is
a ``nextval()``: it survives the rollback of the write's transaction and does not read
``pg_locks`` (before, each count called ``fencekit.writing()``, which reads the server's whole
lock table, so its cost grew with the locks other sessions held).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.core.helpers import (
    MALFORMED,
    MISSING,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    write,
)

Conn = psycopg.Connection[Any]

SCOPES = {
    "c_row": {"scope": "row"},
    "c_key": {"scope": "key", "key": ("k",)},
    "c_table": {"scope": "table"},
}
# Per write path: the statement, and how many it counts, on every scope.
# Table c_* starts with rows (1, k 1) and (2, k 2).
PATHS = [
    ("INSERT INTO {t} (id, k, v) VALUES (3, 1, 0), (4, 2, 0)", 1),
    # An upsert is checked as an INSERT and as an UPDATE, and counted by each check.
    ("INSERT INTO {t} VALUES (1, 1, 0) ON CONFLICT (id) DO UPDATE SET v = 9", 2),
    ("UPDATE {t} SET v = v + 1", 1),
    ("UPDATE {t} SET v = v + 1 WHERE id = 1", 1),
    # A statement that writes no row is let through without a token all the same.
    ("UPDATE {t} SET v = v + 1 WHERE id > 100", 1),
    ("DELETE FROM {t} WHERE id = 2", 1),
    ("DELETE FROM {t}", 1),
    ("WITH w AS (UPDATE {t} SET v = 5 WHERE id = 1 RETURNING id) SELECT * FROM w", 1),
    ("TRUNCATE {t}", 1),
]


@pytest.fixture
def tables(db: Conn) -> None:
    for name, kw in SCOPES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v int)")
        db.commit()
        protect(db, name, on_missing="allow", **kw)  # type: ignore[arg-type]
        write(db, 10, f"INSERT INTO {name} VALUES (1, 1, 0), (2, 2, 0)")


@pytest.mark.parametrize(("stmt", "counted"), PATHS)
@pytest.mark.parametrize("table", list(SCOPES))
def test_each_write_path_is_counted(
    db: Conn, tables: None, table: str, stmt: str, counted: int
) -> None:
    write(db, None, stmt.format(t=table))
    assert rejection_count(db, table, "unfenced") == counted


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
    # One check per action (UPDATE, INSERT): before it on row and table fences, after it on
    # key fences.
    assert rejection_count(db, table, "unfenced") == 2


@pytest.mark.parametrize("table", list(SCOPES))
def test_copy_is_counted(db: Conn, tables: None, table: str) -> None:
    db.rollback()
    with db.cursor() as cur, cur.copy(f"COPY {table} (id, k, v) FROM STDIN") as copy:
        copy.write_row((5, 1, 0))
        copy.write_row((6, 2, 0))
    db.commit()
    assert rejection_count(db, table, "unfenced") == 1


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
    assert rejection_count(db, "c_row", "unfenced") == 3
    assert rejection_count(db, "c_key", "unfenced") == 3
    assert rejection_count(db, "c_table", "unfenced") == 3
    # A rejection still goes through fencekit.reject, which checks the caller (pg_locks).
    stale = "PERFORM set_config('fencekit.token', '3', true); UPDATE c_key SET v = 0;"
    with pytest.raises(psycopg.Error):
        db.execute(f"DO $$ BEGIN {stale} END $$")
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    assert db.execute(writing).fetchone()[0] > before[0]  # type: ignore[index]


def _row_check_calls(db: Conn, tag: str) -> dict[str, int]:
    """Calls of a row fence's generated functions and of the slow path's
    ``fencekit.statement_token`` (track_functions = 'all'), by suffix."""
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    got = db.execute(
        "SELECT funcname, calls FROM pg_stat_user_functions "
        "WHERE schemaname = 'fencekit' AND funcname = ANY (%s)",
        [[*(f"{tag}_{s}" for s in ("stmt", "ins", "upd", "del")), "statement_token"]],
    ).fetchall()
    return {name.rsplit("_", 1)[1]: int(calls) for name, calls in got}


@pytest.mark.pg_since(15)  # pg_stat_force_next_flush
def test_tokenless_rows_of_a_row_fence_take_no_slow_path(db: Conn, tables: None) -> None:
    """The statement check judges a tokenless statement once; its rows pass on the INSERT
    trigger's WHEN clause and in the UPDATE and DELETE checks' second expression, on every
    write path: no row reaches fencekit.statement_token. Fails on a template that runs each
    row's slow path."""
    tag = one(db, "SELECT tag FROM fencekit.protected WHERE table_name = 'c_row'")
    db.rollback()
    db.autocommit = True
    db.execute("SET track_functions = 'all'")
    before = _row_check_calls(db, tag)
    statements = [
        "UPDATE c_row SET v = v + 1",
        "INSERT INTO c_row (id, k, v) SELECT g, 1, 0 FROM generate_series(10, 19) g",
        "INSERT INTO c_row VALUES (1, 1, 0), (2, 2, 0) ON CONFLICT (id) DO UPDATE SET v = 7",
        "DELETE FROM c_row WHERE id >= 10",
    ]
    for stmt in statements:
        db.execute(stmt)
    with db.cursor() as cur, cur.copy("COPY c_row (id, k, v) FROM STDIN") as copy:
        copy.write_row((30, 1, 0))
        copy.write_row((31, 2, 0))
    after = _row_check_calls(db, tag)
    ran = {k: after.get(k, 0) - before.get(k, 0) for k in ("stmt", "ins", "upd", "del", "token")}
    # One check per statement (two for the upsert, one for COPY); no INSERT row check (its
    # WHEN clause); the UPDATE and DELETE row checks on the rows they write (2, the upsert's 2,
    # and 10 deleted), each passing in its second expression: no slow path.
    assert ran == {"stmt": 6, "ins": 0, "upd": 4, "del": 10, "token": 0}
    assert rejection_count(db, "c_row", "unfenced") == 6
    # Nothing moved a fence; the rows written without a token have none.
    assert rows(db, "SELECT id, fencekit_fence FROM c_row ORDER BY id") == [
        (1, 10),
        (2, 10),
        (30, None),
        (31, None),
    ]


def test_a_row_fence_column_written_without_a_token_keeps_its_fence(db: Conn, tables: None) -> None:
    """The WHEN clause passes a tokenless row only when its fence column is unchanged: a write
    of the column fires the row check, which keeps the old fence (counted once, with its
    statement)."""
    write(db, None, "UPDATE c_row SET v = 1, fencekit_fence = fencekit_fence + 100")
    write(db, "", "UPDATE c_row SET fencekit_fence = NULL WHERE id = 1")
    write(db, None, "UPDATE c_row SET fencekit_fence = 1 WHERE id = 2")
    assert rows(db, "SELECT id, v, fencekit_fence FROM c_row ORDER BY id") == [
        (1, 1, 10),
        (2, 1, 10),
    ]
    assert rejection_count(db, "c_row", "unfenced") == 3


def test_a_token_set_after_a_tokenless_check_is_refused(db: Conn, tables: None) -> None:
    """A statement its check let through without a token that sets one part-way: a row that
    then reads it (an INSERT's column default, a DELETE's or an UPDATE's row check) reads a
    token the check never saw, and is refused (YF004), as a token swapped after the check is:
    one statement, one token."""
    db.execute(
        "CREATE FUNCTION public.set_token(t text) RETURNS bigint LANGUAGE sql VOLATILE "
        "AS $$ SELECT set_config('fencekit.token', t, true)::bigint $$"
    )
    db.commit()
    reject(db, MALFORMED, None, "UPDATE c_row SET fencekit_fence = public.set_token('50')")
    reject(db, MALFORMED, None, "DELETE FROM c_row WHERE public.set_token('50') > 0")
    reject(
        db,
        MALFORMED,
        None,
        "INSERT INTO c_row (id, k, v) SELECT g, 1, public.set_token('50') "
        "FROM generate_series(5, 6) g",
    )
    reject(db, MALFORMED, None, "UPDATE c_row SET v = public.set_token('50')")
    assert rows(db, "SELECT id, v, fencekit_fence FROM c_row ORDER BY id") == [
        (1, 0, 10),
        (2, 0, 10),
    ]


def _uncovered_partition(db: Conn, name: str) -> None:
    """``name``, partitioned, protected in rollout mode; then ``<name>_3``, made after protect
    (auto-cover off): the row checks cloned from the parent, not the statement check."""
    db.execute(
        f"CREATE TABLE {name} (id int, k int NOT NULL, v int, PRIMARY KEY (id, k)) "
        f"PARTITION BY LIST (k); CREATE TABLE {name}_1 PARTITION OF {name} FOR VALUES IN (1)"
    )
    db.commit()
    protect(db, name, on_missing="allow")
    db.execute(f"CREATE TABLE {name}_3 PARTITION OF {name} FOR VALUES IN (3)")
    db.commit()


def test_a_partition_without_its_statement_check_is_judged_by_the_token(db: Conn) -> None:
    """A partition created after protect (auto-cover off) has the row checks, cloned from the
    parent, but not yet the statement check. A statement naming it finds in the checked setting
    what an earlier statement of the session left ('' after a tokenless one): a stale token
    must still be refused, in rollout mode too."""
    _uncovered_partition(db, "pq")
    write(db, 60, "INSERT INTO pq VALUES (1, 3, 0)")
    write(db, None, "UPDATE pq SET v = 1")  # leaves the checked setting at ''
    reject(db, "YF001", 3, "UPDATE pq_3 SET v = 44 WHERE id = 1")
    assert rows(db, "SELECT v, fencekit_fence FROM pq_3") == [(1, 60)]


@pytest.mark.parametrize("table", list(SCOPES))
def test_under_reject_every_tokenless_path_is_refused(db: Conn, table: str) -> None:
    """What passes on the WHEN clause in rollout mode does not under on_missing = reject."""
    name = f"s{table}"
    db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v int)")
    db.commit()
    protect(db, name, **SCOPES[table])  # type: ignore[arg-type]
    write(db, 10, f"INSERT INTO {name} VALUES (1, 1, 0), (2, 2, 0)")
    for stmt, _ in PATHS:
        reject(db, MISSING, None, stmt.format(t=name))
    db.rollback()
    copy_in = f"COPY {name} (id, k, v) FROM STDIN"
    with pytest.raises(psycopg.Error) as info, db.cursor() as cur, cur.copy(copy_in) as copy:
        copy.write_row((5, 1, 0))
    assert info.value.sqlstate == MISSING
    db.rollback()
    assert rows(db, f"SELECT id, v FROM {name} ORDER BY id") == [(1, 0), (2, 0)]


@pytest.mark.pg_since(15)  # pg_stat_force_next_flush
def test_partitions_and_children_in_rollout_mode(db: Conn) -> None:
    """Through the parent or naming the child: each tokenless statement is counted once, by
    the check of the table it names; its rows pass without the slow path (a row moved to
    another partition keeps its fence), and a write of the fence column keeps the old fence."""
    db.execute(
        "CREATE TABLE pp (id int, k int NOT NULL, v int, PRIMARY KEY (id, k)) "
        "PARTITION BY LIST (k);"
        "CREATE TABLE pp_1 PARTITION OF pp FOR VALUES IN (1);"
        "CREATE TABLE pp_2 PARTITION OF pp FOR VALUES IN (2);"
        "CREATE TABLE hp (id int PRIMARY KEY, k int NOT NULL, v int);"
        "CREATE TABLE hc () INHERITS (hp);"
    )
    db.commit()
    protect(db, "pp", on_missing="allow")
    protect(db, "hp", on_missing="allow")
    write(db, 10, "INSERT INTO pp VALUES (1, 1, 0), (2, 2, 0)")
    write(db, 10, "INSERT INTO hc VALUES (1, 1, 0), (2, 2, 0)")
    tags = dict(rows(db, "SELECT table_name, tag FROM fencekit.protected"))
    db.autocommit = True
    db.execute("SET track_functions = 'all'")
    before = {t: _row_check_calls(db, tags[t]) for t in ("pp", "hp")}
    for stmt in (
        "UPDATE pp SET k = 2, v = 1 WHERE id = 1",  # moves the row to pp_2
        "UPDATE pp_2 SET v = v + 1",
        "INSERT INTO pp_1 VALUES (3, 1, 0)",
        "DELETE FROM pp WHERE id = 3",
        "UPDATE hp SET v = v + 1",  # the child's rows, through the parent
        "UPDATE hc SET v = v + 1",
        "DELETE FROM hc WHERE id = 2",
    ):
        db.execute(stmt)
    after = {t: _row_check_calls(db, tags[t]) for t in ("pp", "hp")}
    # The row checks: the moved row's UPDATE and DELETE on its old partition (its INSERT passes
    # the WHEN clause), two rows of pp_2, one DELETE; hp's two rows twice, one DELETE. None
    # reaches fencekit.statement_token.
    for t, n, upd, dele in (("pp", 4, 3, 2), ("hp", 3, 4, 1)):
        checks = ("stmt", "ins", "upd", "del", "token")
        ran = {k: after[t].get(k, 0) - before[t].get(k, 0) for k in checks}
        assert ran == {"stmt": n, "ins": 0, "upd": upd, "del": dele, "token": 0}, t
        assert rejection_count(db, t, "unfenced") == n, t
    assert rows(
        db, "SELECT tableoid::regclass::text, id, v, fencekit_fence FROM pp ORDER BY id"
    ) == [
        ("pp_2", 1, 2, 10),
        ("pp_2", 2, 1, 10),
    ]
    db.execute("UPDATE pp SET fencekit_fence = 99")
    db.execute("UPDATE hc SET fencekit_fence = 1")
    assert rows(db, "SELECT fencekit_fence FROM pp UNION ALL SELECT fencekit_fence FROM hp") == [
        (10,),
        (10,),
        (10,),
    ]


def test_an_uncovered_partition_judges_a_writer_role_by_its_token(db: Conn, make_role: Any) -> None:
    """The same partition, written by a writer role (not the owner) from sessions with other
    settings (DateStyle, TimeZone, a search_path of its own), through UPDATE, MERGE and
    DELETE: a stale token is refused on every path. Until the partition is covered a newer
    token is refused too, as changed during the statement (fail closed: its statement check
    never ran, and the checked setting is what the session's earlier statement left)."""
    _uncovered_partition(db, "pw")
    write(db, 60, "INSERT INTO pw VALUES (1, 3, 0), (2, 3, 0)")
    dsn = make_role("pw_writer", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    stale = {
        "UPDATE pw_3 SET v = 1 WHERE id = 1",
        "MERGE INTO pw_3 t USING (SELECT 1 AS id) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = 2",
        "DELETE FROM pw_3 WHERE id = 2",
    }
    if db.info.server_version < 150000:
        stale.discard(next(s for s in stale if s.startswith("MERGE")))
    with psycopg.connect(dsn, autocommit=True) as w:
        w.execute("SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Pacific/Chatham'")
        w.execute("SET search_path = pg_temp, public")
        w.execute("UPDATE pw SET v = 5")  # tokenless, through the parent: '' left behind

        def under(token: str, stmt: str) -> None:
            with w.transaction():
                w.execute("SELECT set_config('fencekit.token', %s, true)", [token])
                w.execute(stmt)

        for stmt in sorted(stale):
            with pytest.raises(psycopg.Error) as info:
                under("3", stmt)
            assert info.value.sqlstate == "YF001", stmt
        with pytest.raises(psycopg.Error) as info:
            under("70", "UPDATE pw_3 SET v = 70 WHERE id = 1")
        assert info.value.sqlstate == MALFORMED
    assert rows(db, "SELECT id, v, fencekit_fence FROM pw_3 ORDER BY id") == [
        (1, 5, 60),
        (2, 5, 60),
    ]
