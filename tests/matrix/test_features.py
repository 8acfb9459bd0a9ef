"""Fences under what changed between PostgreSQL majors: MERGE (15), MERGE ... RETURNING and
WHEN NOT MATCHED BY SOURCE (17), RETURNING OLD/NEW (18), generated columns (stored since 12,
virtual in 18) next to the fence, and GRANT SET ON PARAMETER (15).

Every test here is in the version matrix (tests/conftest.py): it runs on each major from 14 to
18; ``pg_since(n)`` leaves out the majors that lack the feature (they are not skips: the syntax
does not exist there).
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit import catalog
from tests.core.helpers import (
    BYPASS_REFUSED,
    MISSING,
    STALE,
    Conn,
    detail,
    key_fence,
    make_app_role,
    one,
    protect,
    reject,
    rows,
    write,
)

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

SCOPES = ("row", "key", "table")


def _protected(db: Conn, scope: str, table: str = "m") -> Conn:
    """Table ``m`` (id, k, v) fenced by ``scope`` (key fences on k), rows 1..3 written at 10."""
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, k int NOT NULL, v text)")
    kw = {"key": ("k",)} if scope == "key" else {}
    protect(db, table, scope, **kw)
    write(db, 10, f"INSERT INTO {table} VALUES (1, 1, 'a'), (2, 1, 'b'), (3, 2, 'c')")
    return db


def _fence_of(db: Conn, scope: str, row_id: int, k: int) -> int | None:
    if scope == "row":
        return one(db, "SELECT fencekit_fence FROM m WHERE id = %s", (row_id,))  # type: ignore[no-any-return]
    if scope == "key":
        return key_fence(db, "public.m", str(k))
    return key_fence(db, "public.m")


# ---------------------------------------------------------------- MERGE (15) and its RETURNING (17)

_MERGE = """MERGE INTO m USING (VALUES (1, 'merged'), (9, 'new')) AS s(id, v) ON m.id = s.id
            WHEN MATCHED THEN UPDATE SET v = s.v
            WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (s.id, 1, s.v)"""


@pytest.mark.pg_since(15)
@pytest.mark.parametrize("scope", SCOPES)
def test_merge_is_fenced_on_every_scope(db: Conn, scope: str) -> None:
    _protected(db, scope)
    err = reject(db, STALE, 9, _MERGE)
    assert detail(err)["fence"] == 10
    reject(db, MISSING, None, _MERGE)
    assert rows(db, "SELECT id, v FROM m ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
    assert write(db, 11, _MERGE) == 2
    assert rows(db, "SELECT id, v FROM m ORDER BY id") == [
        (1, "merged"),
        (2, "b"),
        (3, "c"),
        (9, "new"),
    ]
    assert _fence_of(db, scope, 1, 1) == 11
    # A MERGE that only deletes is a write too.
    reject(
        db,
        STALE,
        10,
        "MERGE INTO m USING (VALUES (9)) s(id) ON m.id = s.id WHEN MATCHED THEN DELETE",
    )
    assert (
        write(
            db, 11, "MERGE INTO m USING (VALUES (9)) s(id) ON m.id = s.id WHEN MATCHED THEN DELETE"
        )
        == 1
    )


@pytest.mark.pg_since(17)
@pytest.mark.parametrize("scope", SCOPES)
def test_merge_returning_returns_nothing_from_a_rejected_merge(db: Conn, scope: str) -> None:
    _protected(db, scope)
    stmt = _MERGE + " RETURNING merge_action(), m.id, m.v"
    reject(db, STALE, 9, stmt)
    db.rollback()
    db.execute("SELECT set_config('fencekit.token', '12', true)")
    got = sorted(db.execute(stmt).fetchall())
    db.commit()
    assert got == [("INSERT", 9, "new"), ("UPDATE", 1, "merged")]
    if scope == "row":
        # The fence column is set before the row is stored: RETURNING sees the new fence.
        db.execute("SELECT set_config('fencekit.token', '13', true)")
        back = db.execute(_MERGE + " RETURNING m.id, m.fencekit_fence").fetchall()
        db.commit()
        assert sorted(back) == [(1, 13), (9, 13)]
    assert _fence_of(db, scope, 1, 1) in (12, 13)


@pytest.mark.pg_since(17)
@pytest.mark.parametrize("scope", SCOPES)
def test_merge_not_matched_by_source_deletes_are_fenced(db: Conn, scope: str) -> None:
    _protected(db, scope)
    # Rows that are not in the source are deleted: rows 2 and 3 (keys 1 and 2).
    stmt = """MERGE INTO m USING (VALUES (1)) AS s(id) ON m.id = s.id
              WHEN NOT MATCHED BY SOURCE THEN DELETE"""
    write(db, 20, "UPDATE m SET v = 'later' WHERE id = 3")  # row 3 / key 2 / the table at 20
    reject(db, STALE, 15, stmt)
    assert one(db, "SELECT count(*) FROM m") == 3
    assert write(db, 20, stmt) == 2
    assert rows(db, "SELECT id FROM m") == [(1,)]


@pytest.mark.pg_since(17)
@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(("switched_to", "late_check"), [("5", STALE), ("", MISSING)])
def test_token_switched_in_merge_returning(
    db: Conn, scope: str, switched_to: str, late_check: str
) -> None:
    """One statement, one token, with MERGE's RETURNING (17): the statement starts under a
    fresh token and RETURNING switches it. A key fence judges at the end of the statement, so it
    sees the switch and rejects with what it read; a row fence (each row before it is written)
    and a table fence (once, at the start) judged the fresh token, so the write lands under it.
    Never does a write land under the stale, cleared or malformed token."""
    _protected(db, scope)
    stmt = (
        "MERGE INTO m USING (VALUES (1)) s(id) ON m.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = 'switched' "
        f"RETURNING set_config('fencekit.token', '{switched_to}', true)"
    )
    if scope == "key":
        reject(db, late_check, 12, stmt)
        assert rows(db, "SELECT v FROM m WHERE id = 1") == [("a",)]
        assert _fence_of(db, scope, 1, 1) == 10
    else:
        assert write(db, 12, stmt) == 1
        assert rows(db, "SELECT v FROM m WHERE id = 1") == [("switched",)]
        assert _fence_of(db, scope, 1, 1) == 12


# ------------------------------------------------------------ MERGE moving rows across partitions

# MERGE ... WHEN MATCHED THEN UPDATE that moves row 1 from partition 'eu' to 'us': PostgreSQL
# puts a MERGE's moved rows in no UPDATE transition table, only in the DELETE and INSERT ones,
# whose statement triggers fire only for a MERGE with such actions. Each shape: the moving
# UPDATE alone, and with the other actions (matching no row).
_INSERT = " WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'eu', 7, 'new')"
_DELETE = " WHEN MATCHED AND s.id = 99 THEN DELETE"
_MOVES = {
    "update": "{u}",
    "update and insert": "{u}" + _INSERT,
    "update and delete": _DELETE + "{u}",
    "all three": _DELETE + "{u}" + _INSERT,
}


def _moving_merge(shape: str) -> str:
    update = " WHEN MATCHED THEN UPDATE SET region = 'us', v = 'moved'"
    actions = _MOVES[shape].format(u=update)
    return f"MERGE INTO pm USING (VALUES (1)) AS s(id) ON pm.id = s.id{actions}"


def _partitioned(db: Conn, scope: str, key: tuple[str, ...]) -> None:
    """Table ``pm`` partitioned by region: 'eu' a leaf, 'us' partitioned again by k. Row 1
    (eu, k 1) and row 2 (us, k 2) written at 10; key fences on ``key``."""
    db.execute(
        "CREATE TABLE pm (id int NOT NULL, region text NOT NULL, k int NOT NULL, v text)"
        " PARTITION BY LIST (region);"
        " CREATE TABLE pm_eu PARTITION OF pm FOR VALUES IN ('eu');"
        " CREATE TABLE pm_us PARTITION OF pm FOR VALUES IN ('us') PARTITION BY RANGE (k);"
        " CREATE TABLE pm_us_lo PARTITION OF pm_us FOR VALUES FROM (0) TO (100);"
        " CREATE TABLE pm_us_hi PARTITION OF pm_us FOR VALUES FROM (100) TO (MAXVALUE)"
    )
    protect(db, "pm", scope, **({"key": key} if scope == "key" else {}))
    write(db, 10, "INSERT INTO pm VALUES (1, 'eu', 1, 'a'), (2, 'us', 2, 'b')")


@pytest.mark.pg_since(15)
@pytest.mark.parametrize("shape", sorted(_MOVES))
@pytest.mark.parametrize(
    ("scope", "key"), [("key", ("k",)), ("key", ("region", "k")), ("row", ()), ("table", ())]
)
def test_a_merge_that_moves_a_row_to_another_partition_is_fenced(
    db: Conn, scope: str, key: tuple[str, ...], shape: str
) -> None:
    """A stale MERGE that moves a row to another partition is refused, whatever other actions
    it has, with a key that keeps its value across the move (k) or changes it (region, k); a
    fresh one moves the row and raises the fences of both keys."""
    _partitioned(db, scope, key)
    stmt = _moving_merge(shape)
    write(db, 20, "UPDATE pm SET v = 'later' WHERE id = 1")  # row 1's key, or the table, at 20
    reject(db, STALE, 15, stmt)
    assert rows(db, "SELECT id, region, v FROM pm ORDER BY id") == [
        (1, "eu", "later"),
        (2, "us", "b"),
    ]
    assert write(db, 21, stmt) == 1
    assert rows(db, "SELECT tableoid::regclass::text, v FROM pm WHERE id = 1") == [
        ("pm_us_lo", "moved")
    ]
    if scope == "key":
        keys = ["1"] if key == ("k",) else ["(eu,1)", "(us,1)"]
        assert [key_fence(db, "public.pm", k) for k in keys] == [21] * len(keys)
    reject(db, STALE, 20, "UPDATE pm SET v = 'x' WHERE id = 1")


@pytest.mark.pg_since(15)
def test_a_merge_on_a_partitioned_partition_that_moves_a_row_is_fenced(db: Conn, make_role) -> None:
    """The same, run by an application role on the partition that is partitioned again (its
    own statement triggers), moving a row between its partitions."""
    _partitioned(db, "key", ("region", "k"))
    write(db, 20, "UPDATE pm SET v = 'later' WHERE id = 2")
    db.commit()
    stmt = (
        "MERGE INTO pm_us USING (VALUES (2)) AS s(id) ON pm_us.id = s.id"
        " WHEN MATCHED THEN UPDATE SET k = 200"
    )
    with psycopg.connect(make_app_role(make_role, "mx_crossing_app")) as app:
        reject(app, STALE, 15, stmt)
        assert write(app, 21, stmt) == 1
    assert key_fence(db, "public.pm", "(us,200)") == 21
    assert key_fence(db, "public.pm", "(us,2)") == 21


_UPSERT = "ON CONFLICT (id, region, k) DO UPDATE SET v = excluded.v"


@pytest.mark.pg_since(15)
def test_the_row_checks_of_crossing_rows_run_only_in_statements_that_update(db: Conn) -> None:
    """The row checks of crossing rows run once an UPDATE began on the table in the
    transaction: an INSERT, an INSERT ... ON CONFLICT DO NOTHING, a DELETE, and an UPDATE or
    an upsert that moves and inserts nothing run none. A row an upsert or a MERGE inserts is
    judged twice (nothing tells it from a row a MERGE moved); a moved row once leaving and once
    arriving. Counted with pg_stat_xact_user_functions in each writing transaction."""
    _partitioned(db, "key", ("k",))
    writes = {
        "INSERT INTO pm VALUES (3, 'eu', 3, 'c')": 0,
        "INSERT INTO pm VALUES (4, 'us', 4, 'd') ON CONFLICT DO NOTHING": 0,
        "UPDATE pm SET v = 'x' WHERE id = 1": 0,
        "DELETE FROM pm WHERE id = 3": 0,
        f"INSERT INTO pm VALUES (1, 'eu', 1, 'y') {_UPSERT}": 0,
        f"INSERT INTO pm VALUES (6, 'eu', 6, 'f') {_UPSERT}": 1,
        "MERGE INTO pm USING (VALUES (1), (5)) AS s(id) ON pm.id = s.id"
        " WHEN MATCHED THEN UPDATE SET v = 'y'"
        " WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'eu', 5, 'e')": 1,
        _moving_merge("update"): 2,
    }
    calls = (
        "SELECT COALESCE(sum(calls), 0)::int FROM pg_stat_xact_user_functions"
        " WHERE schemaname = 'fencekit' AND funcname LIKE '%cross%'"
    )
    db.execute("CREATE UNIQUE INDEX ON pm (id, region, k)")
    db.commit()
    db.execute("SET track_functions = 'pl'")
    tag = _tag(db, "pm")
    for stmt, expected in writes.items():
        db.execute("SELECT set_config('fencekit.token', '11', true)")
        # A delta: the view counts earlier transactions' calls until they are flushed.
        before = _int(db, calls)
        db.execute(stmt)
        got = (_int(db, calls) - before,)
        db.commit()
        left = db.execute(
            f"SELECT COALESCE(current_setting('fencekit.cross_{tag}', true), '')"
        ).fetchone()
        assert (got, left) == ((expected,), ("",)), stmt  # the setting ends with its transaction


@pytest.mark.pg_since(15)
@pytest.mark.parametrize(
    "stmt",
    [
        # A writable CTE that updates the table ends before the MERGE moves its rows.
        "WITH u AS (UPDATE pm SET v = v WHERE false RETURNING id)"
        " MERGE INTO pm USING (SELECT 1 AS id FROM (SELECT count(*) FROM u) c) AS s"
        " ON pm.id = s.id WHEN MATCHED THEN UPDATE SET region = 'us'",
        "WITH u AS (UPDATE pm SET v = v WHERE false RETURNING id),"
        " w AS (UPDATE pm SET v = v WHERE false RETURNING id)"
        " MERGE INTO pm USING (SELECT 1 AS id FROM (SELECT count(*) FROM u, w) c) AS s"
        " ON pm.id = s.id WHEN MATCHED THEN UPDATE SET region = 'us'",
    ],
    ids=["one cte", "two ctes"],
)
def test_a_merge_under_writable_ctes_that_moves_a_row_is_fenced(db: Conn, stmt: str) -> None:
    """PostgreSQL fires a BEFORE STATEMENT trigger once per table and query level, and
    evaluates an AFTER STATEMENT trigger's WHEN once per write in the query: a count kept by
    the two was back at zero (or below) while the MERGE moved rows. The setting the row checks
    read stays set for the transaction; the fresh write passes, and so do later ones."""
    _partitioned(db, "key", ("region", "k"))
    write(db, 20, "UPDATE pm SET v = 'later' WHERE id = 1")
    reject(db, STALE, 15, stmt)
    db.execute("SELECT set_config('fencekit.token', '21', true)")
    db.execute(stmt)
    db.execute("INSERT INTO pm VALUES (9, 'eu', 9, 'after')")  # the same transaction
    db.commit()
    assert key_fence(db, "public.pm", "(us,1)") == 21
    assert key_fence(db, "public.pm", "(eu,9)") == 21


@pytest.mark.pg_since(15)
def test_a_stale_move_out_of_a_partition_made_after_protect_is_stale(db: Conn) -> None:
    """A partition made after protect has PostgreSQL's clones of the row checks before it is
    covered; a stale MERGE moving a row out of it is refused as stale (YF001, counted), not as
    a caller fencekit.reject does not know (42501)."""
    _partitioned(db, "key", ("k",))
    db.execute("CREATE TABLE pm_x PARTITION OF pm FOR VALUES IN ('x')")
    db.commit()
    write(db, 50, "INSERT INTO pm VALUES (7, 'x', 7, 'late')")
    err = reject(
        db,
        STALE,
        10,
        "MERGE INTO pm USING (VALUES (7)) AS s(id) ON pm.id = s.id"
        " WHEN MATCHED THEN UPDATE SET region = 'eu'",
    )
    assert detail(err)["fence"] == 50


_WRITER_PATHS = {
    "merge": "MERGE INTO public.pm USING (VALUES (1)) AS s(id) ON pm.id = s.id"
    " WHEN MATCHED THEN UPDATE SET region = 'us'",
    "a definer function": "SELECT public.pm_move(1)",
    "a writable cte": "WITH u AS (UPDATE public.pm SET v = v WHERE false RETURNING id)"
    " MERGE INTO public.pm USING (SELECT 1 AS id FROM (SELECT count(*) FROM u) c) AS s"
    " ON pm.id = s.id WHEN MATCHED THEN UPDATE SET region = 'us'",
}


@pytest.mark.pg_since(15)
@pytest.mark.parametrize("path", sorted(_WRITER_PATHS))
def test_a_writer_on_a_fresh_connection_with_other_settings_cannot_move_a_row_stale(
    db: Conn, make_role, path: str
) -> None:
    """The application's role (DML and fencekit_writer, nothing of the owner's), on a
    connection just opened with other TimeZone, DateStyle and search_path, moves a row to
    another partition with a stale token: by MERGE, through a SECURITY DEFINER function of
    the owner's, and under a writable CTE. Each is refused; the fence and the row stay."""
    _partitioned(db, "key", ("region", "k"))
    db.execute(
        "CREATE FUNCTION public.pm_move(i int) RETURNS void LANGUAGE sql SECURITY DEFINER"
        " SET search_path = pg_catalog AS $$ MERGE INTO public.pm USING (VALUES (i)) AS s(id)"
        " ON pm.id = s.id WHEN MATCHED THEN UPDATE SET region = 'us' $$"
    )
    db.commit()
    write(db, 20, "UPDATE pm SET v = 'later' WHERE id = 1")
    writer = make_conninfo(
        make_app_role(make_role, "mx_move_app"),
        options="-c TimeZone=Pacific/Chatham -c DateStyle=German,DMY -c search_path=pg_temp",
    )
    with psycopg.connect(writer) as app:
        err = reject(app, STALE, 15, _WRITER_PATHS[path])
    assert detail(err)["fence"] == 20
    assert rows(db, "SELECT id, region, v FROM pm WHERE id = 1") == [(1, "eu", "later")]
    assert key_fence(db, "public.pm", "(us,1)") is None


def test_the_triggers_of_crossing_rows_are_on_partitioned_tables_only(db: Conn) -> None:
    """A table that is not partitioned moves no rows: it gets neither the row checks of
    crossing rows nor their counting triggers, and pays nothing for them. A partitioned one has
    them on every level, and status finds one missing."""
    _protected(db, "key")
    _partitioned(db, "key", ("k",))
    crossing = (
        "SELECT tgrelid::regclass::text, count(*) FILTER (WHERE tgparentid = 0)::int,"
        " count(*)::int FROM pg_trigger"
        " WHERE tgname ~ '_(cross_in|cross_out|updating)$'"
        " GROUP BY 1 ORDER BY 1"
    )
    # The root's three; the statement trigger on every descendant (statements may name it), the
    # row checks as the clones PostgreSQL makes on each partition.
    assert rows(db, crossing) == [
        ("pm", 3, 3),
        ("pm_eu", 1, 3),
        ("pm_us", 1, 3),
        ("pm_us_hi", 1, 3),
        ("pm_us_lo", 1, 3),
    ]
    assert not catalog.status(db).all_drift()
    db.rollback()
    db.execute(f"DROP TRIGGER fencekit_{_tag(db, 'pm')}_updating ON pm_us")
    db.commit()
    found = {(d.kind.value, d.object) for d in catalog.status(db).all_drift()}
    db.rollback()
    assert found == {("partition_triggers_missing", "partition pm_us")}, found


def _int(db: Conn, query: str) -> int:
    """The one integer ``query`` returns, read in the current transaction."""
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _tag(db: Conn, table: str) -> str:
    return str(one(db, "SELECT tag FROM fencekit.protected WHERE table_name = %s", (table,)))


@pytest.mark.pg_since(16)
@pytest.mark.parametrize("how", ["update", "merge"])
def test_a_row_moved_to_a_partition_that_computes_its_key_otherwise_is_fenced(
    db: Conn, how: str
) -> None:
    """Since 16 a partition may compute a stored generated column by an expression of its own.
    A row moved into it is, in the statement's transition tables, the row its old partition
    computed: key 10 here, where the new partition stores 100. The row check of the arriving
    row judges the key it is stored with, so a stale write to key 100 is refused."""
    db.execute(
        "CREATE TABLE pg (region text NOT NULL, n int NOT NULL,"
        " k int GENERATED ALWAYS AS (n * 10) STORED) PARTITION BY LIST (region);"
        " CREATE TABLE pg_eu PARTITION OF pg FOR VALUES IN ('eu');"
        " CREATE TABLE pg_us (region text NOT NULL, n int NOT NULL,"
        " k int GENERATED ALWAYS AS (n * 100) STORED);"
        " ALTER TABLE pg ATTACH PARTITION pg_us FOR VALUES IN ('us')"
    )
    protect(db, "pg", "key", key=("k",))
    write(db, 10, "INSERT INTO pg VALUES ('eu', 1), ('us', 2)")  # keys 10 and 200
    write(db, 50, "UPDATE pg SET n = 1 WHERE region = 'us'")  # key 100, at 50
    stmt = {
        "update": "UPDATE pg SET region = 'us' WHERE region = 'eu'",
        "merge": "MERGE INTO pg USING (VALUES (1)) AS s(n) ON pg.n = s.n AND pg.region = 'eu'"
        " WHEN MATCHED THEN UPDATE SET region = 'us'",
    }[how]
    err = reject(db, STALE, 20, stmt)
    assert detail(err)["fence"] == 50
    assert write(db, 60, stmt) == 1
    assert key_fence(db, "public.pg", "100") == 60


# ---------------------------------------------------------------- RETURNING OLD/NEW (18)


@pytest.mark.pg_since(18)
@pytest.mark.parametrize("scope", SCOPES)
def test_returning_old_and_new(db: Conn, scope: str) -> None:
    _protected(db, scope)
    reject(db, STALE, 9, "UPDATE m SET v = 'x' WHERE id = 1 RETURNING old.v, new.v")
    db.execute("SELECT set_config('fencekit.token', '12', true)")
    got = db.execute("UPDATE m SET v = 'x' WHERE id = 1 RETURNING old.v, new.v").fetchall()
    db.commit()
    assert got == [("a", "x")]
    upsert = (
        "INSERT INTO m VALUES (1, 1, 'up') ON CONFLICT (id) DO UPDATE SET v = excluded.v "
        "RETURNING old.v, new.v"
    )
    reject(db, STALE, 11, upsert)
    db.execute("SELECT set_config('fencekit.token', '12', true)")
    assert db.execute(upsert).fetchall() == [("x", "up")]
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '12', true)")
    gone = db.execute("DELETE FROM m WHERE id = 3 RETURNING old.v, new.v").fetchall()
    db.commit()
    assert gone == [("c", None)]
    if scope == "row":
        # OLD is the row as stored (its fence), NEW as written (the fence the token set).
        db.execute("SELECT set_config('fencekit.token', '14', true)")
        fences = db.execute(
            "UPDATE m SET v = 'y' WHERE id = 1 RETURNING old.fencekit_fence, new.fencekit_fence"
        ).fetchall()
        db.commit()
        assert fences == [(12, 14)]


# ---------------------------------------------------------------- generated columns


@pytest.mark.parametrize("scope", SCOPES)
def test_stored_generated_column_next_to_the_fence(db: Conn, scope: str) -> None:
    db.execute(
        "CREATE TABLE g (id int PRIMARY KEY, k int NOT NULL, v text, "
        "v_len int GENERATED ALWAYS AS (length(v)) STORED)"
    )
    protect(db, "g", scope, **({"key": ("k",)} if scope == "key" else {}))
    write(db, 10, "INSERT INTO g (id, k, v) VALUES (1, 1, 'abc')")
    reject(db, STALE, 9, "UPDATE g SET v = 'abcdef' WHERE id = 1")
    write(db, 11, "UPDATE g SET v = 'abcdef' WHERE id = 1")
    assert rows(db, "SELECT v_len FROM g") == [(6,)]


def test_stored_generated_column_as_the_key(db: Conn) -> None:
    """A key fence reads its keys from the transition tables, which hold the stored value."""
    db.execute(
        "CREATE TABLE acct (id int PRIMARY KEY, region text NOT NULL, n int NOT NULL, "
        "shard int GENERATED ALWAYS AS (n % 4) STORED)"
    )
    protect(db, "acct", "key", key=("shard",))
    write(db, 10, "INSERT INTO acct (id, region, n) VALUES (1, 'eu', 5), (2, 'us', 9)")
    assert key_fence(db, "public.acct", "1") == 10  # 5 % 4 = 9 % 4 = 1
    reject(db, STALE, 9, "UPDATE acct SET region = 'x' WHERE id = 2")
    write(db, 12, "UPDATE acct SET n = 6 WHERE id = 2")  # moves the row to shard 2
    assert key_fence(db, "public.acct", "1") == 12
    assert key_fence(db, "public.acct", "2") == 12
    reject(db, STALE, 11, "DELETE FROM acct WHERE id = 1")


@pytest.mark.pg_since(18)
@pytest.mark.parametrize("scope", SCOPES)
def test_virtual_generated_column_next_to_the_fence(db: Conn, scope: str) -> None:
    db.execute(
        "CREATE TABLE g (id int PRIMARY KEY, k int NOT NULL, v text, "
        "v_len int GENERATED ALWAYS AS (length(v)) VIRTUAL)"
    )
    protect(db, "g", scope, **({"key": ("k",)} if scope == "key" else {}))
    write(db, 10, "INSERT INTO g (id, k, v) VALUES (1, 1, 'abc')")
    reject(db, STALE, 9, "UPDATE g SET v = 'abcdef' WHERE id = 1")
    write(db, 11, "UPDATE g SET v = 'abcdef' WHERE id = 1")
    assert rows(db, "SELECT v_len FROM g") == [(6,)]
    reject(db, STALE, 10, "DELETE FROM g")


# ---------------------------------------------------------------- GRANT SET ON PARAMETER (15)


@pytest.mark.pg_since(15)
def test_grant_set_on_the_bypass_setting_lends_no_bypass(db: Conn, make_role) -> None:
    """Since 15 a superuser can GRANT SET on any setting, and a role can carry a default for a
    custom one. Neither makes a non-member of fencekit_admin able to bypass: the bypass is
    judged by the session's roles, not by who may set the setting."""
    _protected(db, "row")
    db.execute("GRANT SET ON PARAMETER fencekit.bypass TO PUBLIC")
    db.commit()
    app_dsn = make_app_role(make_role, "mx_grant_set_app")
    db.execute("ALTER ROLE mx_grant_set_app SET fencekit.bypass = 'on'")
    db.commit()
    with psycopg.connect(app_dsn) as app:
        assert one(app, "SELECT current_setting('fencekit.bypass')") == "on"
        reject(app, BYPASS_REFUSED, None, "UPDATE m SET v = 'bypassed' WHERE id = 1", bypass=True)
        reject(app, BYPASS_REFUSED, 9, "UPDATE m SET v = 'bypassed' WHERE id = 1")
        app.execute("SET fencekit.bypass = 'on'")  # session-wide, as GRANT SET allows
        reject(app, BYPASS_REFUSED, 9, "UPDATE m SET v = 'bypassed' WHERE id = 1")
    assert rows(db, "SELECT v FROM m WHERE id = 1") == [("a",)]


# ---------------------------------------------------------------- temporal keys (18)


@pytest.mark.pg_since(18)
@pytest.mark.parametrize("scope", SCOPES)
def test_temporal_primary_key(db: Conn, scope: str) -> None:
    """PostgreSQL 18's PRIMARY KEY (..., period WITHOUT OVERLAPS): a row fence names the row by
    the whole key, period included; a key fence on the id covers every period of it."""
    db.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    db.execute(
        "CREATE TABLE price (id int, valid_at daterange, amount int, "
        "PRIMARY KEY (id, valid_at WITHOUT OVERLAPS))"
    )
    protect(db, "price", scope, **({"key": ("id",)} if scope == "key" else {}))
    write(
        db,
        10,
        "INSERT INTO price VALUES (1, '[2026-01-01,2026-02-01)', 5), "
        "(1, '[2026-02-01,2026-03-01)', 6)",
    )
    with pytest.raises(psycopg.errors.ExclusionViolation):  # the temporal key still holds
        write(db, 11, "INSERT INTO price VALUES (1, '[2026-01-15,2026-01-20)', 7)")
    db.rollback()
    err = reject(db, STALE, 9, "UPDATE price SET amount = 0 WHERE id = 1")
    if scope == "row":
        assert detail(err)["key"]["valid_at"] == "[2026-01-01,2026-02-01)"
    write(db, 11, "UPDATE price SET amount = amount + 1 WHERE valid_at @> date '2026-02-10'")
    if scope != "row":
        # One fence for every period of id 1 (key) or the table: the January row is at 11 too.
        reject(db, STALE, 10, "UPDATE price SET amount = 0 WHERE valid_at @> date '2026-01-10'")
    assert rows(db, "SELECT amount FROM price ORDER BY valid_at") == [(5,), (7,)]
