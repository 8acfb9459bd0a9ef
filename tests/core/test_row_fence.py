"""Row fences: every write path that reaches a protected table is checked against the row's
fence, on both servers."""

from __future__ import annotations

import psycopg
import pytest

from tests.core.helpers import (
    MALFORMED,
    MISSING,
    REUSED,
    STALE,
    Conn,
    detail,
    make_app_role,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    write,
)

pytestmark = pytest.mark.all_servers


def _fences(conn: Conn, table: str = "t") -> dict[int, int | None]:
    return dict(rows(conn, f"SELECT id, fencekit_fence FROM {table} ORDER BY id"))  # type: ignore[arg-type]


@pytest.fixture
def t(db: Conn) -> Conn:
    """Table t (id, v) with a row fence, rows 1 and 2 written under token 5."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    protect(db, "t")
    write(db, 5, "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    return db


def test_insert_records_the_token(t: Conn) -> None:
    assert _fences(t) == {1: 5, 2: 5}


def test_update_and_delete_compare_with_the_row_fence(t: Conn) -> None:
    err = reject(t, STALE, 4, "UPDATE t SET v = 'stale' WHERE id = 1")
    assert detail(err)["fence"] == 5
    assert rows(t, "SELECT v, fencekit_fence FROM t WHERE id = 1") == [("a", 5)]
    assert write(t, 5, "UPDATE t SET v = 'same holder' WHERE id = 1") == 1
    assert write(t, 8, "UPDATE t SET v = 'new holder' WHERE id = 1") == 1
    assert _fences(t) == {1: 8, 2: 5}
    reject(t, STALE, 7, "DELETE FROM t WHERE id = 1")
    reject(t, STALE, 7, "DELETE FROM t")  # one stale row fails the whole statement
    assert _fences(t) == {1: 8, 2: 5}
    assert write(t, 8, "DELETE FROM t WHERE id = 1") == 1
    assert write(t, 6, "DELETE FROM t WHERE id = 2") == 1
    assert _fences(t) == {}


def test_stale_write_in_a_multi_row_update_writes_nothing(t: Conn) -> None:
    write(t, 9, "UPDATE t SET v = 'newer' WHERE id = 2")
    reject(t, STALE, 6, "UPDATE t SET v = 'mixed'")
    assert rows(t, "SELECT id, v, fencekit_fence FROM t ORDER BY id") == [
        (1, "a", 5),
        (2, "newer", 9),
    ]


def test_on_equal_reject_refuses_a_reused_token(db: Conn) -> None:
    db.execute("CREATE TABLE once (id int PRIMARY KEY, v text)")
    protect(db, "once", on_equal="reject")
    write(db, 3, "INSERT INTO once VALUES (1, 'a')")
    reject(db, REUSED, 3, "UPDATE once SET v = 'again'")
    reject(db, REUSED, 3, "DELETE FROM once")
    reject(db, STALE, 2, "UPDATE once SET v = 'older'")
    write(db, 4, "UPDATE once SET v = 'next'")
    assert rows(db, "SELECT v, fencekit_fence FROM once") == [("next", 4)]


def test_insert_on_conflict_do_update(t: Conn) -> None:
    upsert = (
        "INSERT INTO t VALUES (1, 'up'), (3, 'c') ON CONFLICT (id) DO UPDATE SET v = excluded.v"
    )
    reject(t, STALE, 4, upsert)
    assert _fences(t) == {1: 5, 2: 5}
    write(t, 6, upsert)
    assert rows(t, "SELECT id, v, fencekit_fence FROM t ORDER BY id") == [
        (1, "up", 6),
        (2, "b", 5),
        (3, "c", 6),
    ]


@pytest.mark.pg_since(15)
def test_merge(t: Conn) -> None:
    t.execute("CREATE TABLE src (id int, v text, del bool)")
    t.execute("INSERT INTO src VALUES (1, 'm1', false), (2, NULL, true), (4, 'm4', false)")
    t.commit()
    merge = """
        MERGE INTO t USING src ON t.id = src.id
        WHEN MATCHED AND src.del THEN DELETE
        WHEN MATCHED THEN UPDATE SET v = src.v
        WHEN NOT MATCHED THEN INSERT (id, v) VALUES (src.id, src.v)"""
    reject(t, STALE, 4, merge)
    assert _fences(t) == {1: 5, 2: 5}
    write(t, 7, merge)
    assert rows(t, "SELECT id, v, fencekit_fence FROM t ORDER BY id") == [
        (1, "m1", 7),
        (4, "m4", 7),
    ]
    # A MERGE that only deletes is checked too.
    reject(t, STALE, 6, "MERGE INTO t USING src ON t.id = src.id WHEN MATCHED THEN DELETE")


def test_copy_from(db: Conn) -> None:
    db.execute("CREATE TABLE c (id int PRIMARY KEY, v text)")
    protect(db, "c")
    db.execute("SELECT set_config('fencekit.token', '12', true)")
    with db.cursor() as cur, cur.copy("COPY c (id, v) FROM STDIN") as copy:
        for i in range(1, 4):
            copy.write_row((i, f"v{i}"))
    db.commit()
    assert _fences(db, "c") == {1: 12, 2: 12, 3: 12}
    # COPY without a token, or with a malformed one, writes nothing.
    for token, state in ((None, MISSING), ("1.5", MALFORMED)):
        if token is not None:
            db.execute("SELECT set_config('fencekit.token', %s, true)", (token,))
        with (
            pytest.raises(psycopg.Error) as info,
            db.cursor() as cur,
            cur.copy("COPY c (id, v) FROM STDIN") as copy,
        ):
            copy.write_row((10, "x"))
        assert info.value.sqlstate == state
        db.rollback()
    assert one(db, "SELECT count(*) FROM c") == 3


def test_update_from(t: Conn) -> None:
    write(t, 9, "UPDATE t SET v = 'newer' WHERE id = 2")
    t.execute("CREATE TABLE src (id int, v text)")
    t.execute("INSERT INTO src VALUES (1, 'x'), (2, 'y')")
    t.commit()
    stmt = "UPDATE t SET v = src.v FROM src WHERE src.id = t.id"
    reject(t, STALE, 7, stmt)
    assert rows(t, "SELECT v FROM t ORDER BY id") == [("a",), ("newer",)]
    write(t, 9, stmt)
    assert _fences(t) == {1: 9, 2: 9}


def test_updates_through_views(t: Conn) -> None:
    t.execute("CREATE VIEW tv AS SELECT id, v FROM t WHERE id > 0")
    t.execute("CREATE VIEW tv_barrier WITH (security_barrier) AS SELECT id, v FROM t")
    # A view with an INSTEAD OF trigger: the write reaches t from inside a trigger.
    t.execute("CREATE VIEW tv_instead AS SELECT id, upper(v) AS v FROM t")
    t.execute(
        """CREATE FUNCTION tv_instead_upd() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN UPDATE t SET v = lower(NEW.v) WHERE id = OLD.id; RETURN NEW; END $$"""
    )
    t.execute(
        "CREATE TRIGGER tv_instead_upd INSTEAD OF UPDATE ON tv_instead "
        "FOR EACH ROW EXECUTE FUNCTION tv_instead_upd()"
    )
    t.commit()
    for view in ("tv", "tv_barrier", "tv_instead"):
        reject(t, STALE, 4, f"UPDATE {view} SET v = 'STALE' WHERE id = 1")
        if view != "tv_instead":  # it has no INSTEAD OF DELETE trigger
            reject(t, STALE, 4, f"DELETE FROM {view} WHERE id = 2")
    assert rows(t, "SELECT v, fencekit_fence FROM t ORDER BY id") == [("a", 5), ("b", 5)]
    write(t, 6, "UPDATE tv SET v = 'via view' WHERE id = 1")
    write(t, 7, "UPDATE tv_instead SET v = 'VIA TRIGGER' WHERE id = 2")
    write(t, 8, "INSERT INTO tv_barrier VALUES (3, 'new')")
    assert rows(t, "SELECT v, fencekit_fence FROM t ORDER BY id") == [
        ("via view", 6),
        ("via trigger", 7),
        ("new", 8),
    ]


def test_writes_inside_functions_and_security_definer(t: Conn, make_role: object) -> None:
    t.execute(
        """CREATE FUNCTION set_v(i int, val text) RETURNS void LANGUAGE plpgsql AS $$
           BEGIN UPDATE t SET v = val WHERE id = i; END $$"""
    )
    t.execute(
        """CREATE FUNCTION set_v_definer(i int, val text) RETURNS void
           LANGUAGE sql SECURITY DEFINER SET search_path = public AS
           $$ UPDATE t SET v = val WHERE id = i $$"""
    )
    t.execute("REVOKE ALL ON FUNCTION set_v_definer(int, text) FROM PUBLIC")
    t.commit()
    app_dsn = make_app_role(make_role, "row_fn_app", dml=False)
    t.execute("GRANT EXECUTE ON FUNCTION set_v_definer(int, text) TO row_fn_app")
    t.commit()
    reject(t, STALE, 4, "SELECT set_v(1, 'stale')")
    write(t, 6, "SELECT set_v(1, 'fresh')")
    with psycopg.connect(app_dsn) as app:
        # The app role cannot write t itself, only through the definer function: still fenced.
        reject(app, "42501", 9, "UPDATE t SET v = 'direct'")
        reject(app, STALE, 5, "SELECT set_v_definer(1, 'stale')")
        reject(app, MISSING, None, "SELECT set_v_definer(2, 'no token')")
        write(app, 9, "SELECT set_v_definer(2, 'definer')")
    assert rows(t, "SELECT v, fencekit_fence FROM t ORDER BY id") == [
        ("fresh", 6),
        ("definer", 9),
    ]


def test_writes_from_other_triggers(t: Conn) -> None:
    t.execute("CREATE TABLE events (id int, v text)")
    t.execute(
        """CREATE FUNCTION apply_event() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN UPDATE t SET v = NEW.v WHERE id = NEW.id; RETURN NULL; END $$"""
    )
    t.execute(
        "CREATE TRIGGER apply_event AFTER INSERT ON events "
        "FOR EACH ROW EXECUTE FUNCTION apply_event()"
    )
    t.commit()
    reject(t, STALE, 4, "INSERT INTO events VALUES (1, 'stale')")
    assert one(t, "SELECT count(*) FROM events") == 0  # the whole transaction rolled back
    write(t, 6, "INSERT INTO events VALUES (1, 'fresh')")
    assert rows(t, "SELECT v, fencekit_fence FROM t WHERE id = 1") == [("fresh", 6)]


@pytest.fixture
def parted(db: Conn) -> Conn:
    """Partitioned table pt (id 1..99 in pt_low, 100..199 in pt_high), rows 1 and 101 at 5."""
    db.execute("CREATE TABLE pt (id int, v text, PRIMARY KEY (id)) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE pt_low PARTITION OF pt FOR VALUES FROM (1) TO (100)")
    db.execute("CREATE TABLE pt_high PARTITION OF pt FOR VALUES FROM (100) TO (200)")
    protect(db, "pt")
    write(db, 5, "INSERT INTO pt VALUES (1, 'a'), (101, 'b')")
    return db


def test_partitioned_table_through_the_parent(parted: Conn) -> None:
    assert _fences(parted, "pt") == {1: 5, 101: 5}
    reject(parted, STALE, 4, "UPDATE pt SET v = 'stale'")
    reject(parted, STALE, 4, "DELETE FROM pt WHERE id = 101")
    reject(parted, MISSING, None, "UPDATE pt SET v = 'none'")
    write(parted, 6, "UPDATE pt SET v = 'ok' WHERE id = 1")
    assert _fences(parted, "pt") == {1: 6, 101: 5}


def test_partitioned_rows_moving_between_partitions(parted: Conn) -> None:
    reject(parted, STALE, 4, "UPDATE pt SET id = 150 WHERE id = 1")
    assert rows(parted, "SELECT id FROM pt_low") == [(1,)]
    write(parted, 7, "UPDATE pt SET id = 150 WHERE id = 1")
    assert rows(parted, "SELECT id, fencekit_fence FROM pt_high ORDER BY id") == [
        (101, 5),
        (150, 7),
    ]
    assert rows(parted, "SELECT id FROM pt_low") == []
    # Moving back under an older token than the moved row's fence is stale.
    reject(parted, STALE, 6, "UPDATE pt SET id = 2 WHERE id = 150")


def test_partitioned_writes_naming_a_partition(parted: Conn) -> None:
    reject(parted, STALE, 4, "UPDATE pt_low SET v = 'stale'")
    reject(parted, STALE, 4, "DELETE FROM pt_high")
    reject(parted, MISSING, None, "INSERT INTO pt_low VALUES (3, 'none')")
    for bad in ("abc", "-3", " 34", "034"):
        reject(parted, MALFORMED, bad, "INSERT INTO pt_low VALUES (3, 'bad')")
        reject(parted, MALFORMED, bad, "UPDATE pt_high SET v = 'bad'")
    write(parted, 8, "INSERT INTO pt_low VALUES (3, 'direct')")
    write(parted, 8, "UPDATE pt_high SET v = 'direct'")
    assert _fences(parted, "pt") == {1: 5, 3: 8, 101: 8}


def _late_partition(parted: Conn) -> None:
    parted.execute("CREATE TABLE pt_late PARTITION OF pt FOR VALUES FROM (200) TO (300)")
    parted.commit()
    write(parted, 5, "INSERT INTO pt VALUES (201, 'late')")


def test_partition_created_after_protect_is_fenced_per_row(parted: Conn) -> None:
    """PostgreSQL clones row triggers to a partition created after protect."""
    _late_partition(parted)
    reject(parted, STALE, 4, "UPDATE pt_late SET v = 'stale'")
    reject(parted, STALE, 4, "DELETE FROM pt_late")
    reject(parted, MISSING, None, "UPDATE pt_late SET v = 'none'")
    assert rows(parted, "SELECT id, v, fencekit_fence FROM pt_late") == [(201, "late", 5)]


def test_partition_created_after_protect_checks_token_format(parted: Conn) -> None:
    # Statement triggers are not cloned to a partition created after protect, but the cloned
    # row trigger validates the token it reads itself (one statement, one token).
    _late_partition(parted)
    for bad in ("abc", "-3", "0", "034", " 7", "1e3"):
        reject(parted, MALFORMED, bad, "INSERT INTO pt_late VALUES (202, 'bad')")


def test_reprotect_covers_partitions_created_after_protect(parted: Conn) -> None:
    _late_partition(parted)
    protect(parted, "pt")  # idempotent: only adds what the new partition lacks
    for bad in ("abc", "-3", "0", "034"):
        reject(parted, MALFORMED, bad, "INSERT INTO pt_late VALUES (202, 'bad')")
    assert rows(parted, "SELECT id FROM pt_late") == [(201,)]


def test_table_without_primary_key(db: Conn) -> None:
    db.execute("CREATE TABLE log (k int, v text)")
    protect(db, "log")
    write(db, 5, "INSERT INTO log VALUES (1, 'a'), (1, 'a')")  # duplicate rows are fine
    write(db, 7, "UPDATE log SET v = 'b' WHERE ctid = (SELECT min(ctid) FROM log)")
    err = reject(db, STALE, 6, "DELETE FROM log WHERE v = 'b'")
    assert detail(err)["key"] is None  # no primary key to name
    assert rows(db, "SELECT v, fencekit_fence FROM log ORDER BY fencekit_fence") == [
        ("a", 5),
        ("b", 7),
    ]
    write(db, 6, "DELETE FROM log WHERE v = 'a'")
    assert one(db, "SELECT count(*) FROM log") == 1


def test_table_with_its_own_before_triggers(db: Conn) -> None:
    db.execute("CREATE TABLE own (id int PRIMARY KEY, v text, touched int NOT NULL DEFAULT 0)")
    db.execute(
        """CREATE FUNCTION own_touch() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN NEW.touched := NEW.touched + 1; NEW.v := lower(NEW.v); RETURN NEW; END $$"""
    )
    # Triggers fire in name order: one before fencekit's, one after.
    for name in ("aaa_touch", "zzz_touch"):
        db.execute(
            f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON own "
            "FOR EACH ROW EXECUTE FUNCTION own_touch()"
        )
    db.commit()
    protect(db, "own")
    write(db, 5, "INSERT INTO own (id, v) VALUES (1, 'A')")
    assert rows(db, "SELECT v, touched, fencekit_fence FROM own") == [("a", 2, 5)]
    reject(db, STALE, 4, "UPDATE own SET v = 'STALE'")
    write(db, 6, "UPDATE own SET v = 'B'")
    assert rows(db, "SELECT v, touched, fencekit_fence FROM own") == [("b", 4, 6)]


def test_client_cannot_lower_the_fence_column(t: Conn) -> None:
    write(t, 5, "UPDATE t SET fencekit_fence = 1 WHERE id = 1")  # same token: WHEN path
    write(t, 6, "UPDATE t SET fencekit_fence = 1 WHERE id = 2")
    assert _fences(t) == {1: 5, 2: 6}
    write(t, 7, "UPDATE t SET fencekit_fence = 1000 WHERE id = 1")  # nor raise it past the token
    write(t, 3, "INSERT INTO t (id, v, fencekit_fence) VALUES (3, 'c', 99)")
    write(t, 3, "INSERT INTO t (id, v, fencekit_fence) VALUES (4, 'd', -1)")
    assert _fences(t) == {1: 7, 2: 6, 3: 3, 4: 3}


def test_missing_token_policy(db: Conn) -> None:
    db.execute("CREATE TABLE strict (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE lax (id int PRIMARY KEY, v text)")
    protect(db, "strict")
    protect(db, "lax", on_missing="allow")
    write(db, 5, "INSERT INTO strict VALUES (1, 'a')")
    write(db, 5, "INSERT INTO lax VALUES (1, 'a')")
    # The same session set a token in an earlier transaction: now it reads '' (missing).
    for stmt in (
        "INSERT INTO strict VALUES (2, 'b')",
        "UPDATE strict SET v = 'x'",
        "DELETE FROM strict",
    ):
        reject(db, MISSING, None, stmt)
    reject(db, MISSING, "", "UPDATE strict SET v = 'empty string is missing'")
    assert rows(db, "SELECT id, v, fencekit_fence FROM strict") == [(1, "a", 5)]
    assert rejection_count(db, "strict", "missing") == 4
    # on_missing = allow: the write passes and keeps its fence (an UPDATE cannot touch the fence
    # column); a new row keeps what its writer wrote there (a row moved between partitions
    # arrives as an INSERT carrying its fence, which must not be cleared).
    write(db, None, "UPDATE lax SET v = 'unfenced', fencekit_fence = 1")
    write(db, None, "INSERT INTO lax VALUES (2, 'b')")
    write(db, "", "INSERT INTO lax (id, v, fencekit_fence) VALUES (3, 'c', 42)")
    assert rows(db, "SELECT id, v, fencekit_fence FROM lax ORDER BY id") == [
        (1, "unfenced", 5),
        (2, "b", None),
        (3, "c", 42),
    ]
    assert rejection_count(db, "lax", "unfenced") == 3  # counted once per statement
    # A stale token is still refused where a missing one is allowed.
    reject(db, STALE, 4, "UPDATE lax SET v = 'stale' WHERE id = 1")
