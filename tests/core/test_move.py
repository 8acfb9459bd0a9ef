"""Moving a protected table to another spec (fencekit/sqlgen/move.py) on a real server: the
fences are carried conservatively (no row or key ends up below a token the old spec accepted
for it), the current holder still writes, writers during the move wait, never pass unfenced,
and policies change in place."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, SpecError, TableName
from tests.core.helpers import (
    MISSING,
    STALE,
    USAGE,
    Conn,
    key_fence,
    one,
    protect,
    reject,
    run_script,
    write,
)

T = TableName("public", "acct")


def spec(scope: str = "row", **kw: object) -> FenceSpec:
    return FenceSpec(T, scope=Scope(scope), **kw)  # type: ignore[arg-type]


def move(conn: Conn, old: FenceSpec, new: FenceSpec) -> None:
    run_script(conn, sqlgen.render_move(old, new))


def registered(conn: Conn) -> dict[str, object]:
    return dict(one(conn, "SELECT spec FROM fencekit.protected WHERE table_name = 'acct'"))


def columns(conn: Conn) -> set[str]:
    found = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'acct'::regclass AND attnum > 0 "
        "AND NOT attisdropped"
    ).fetchall()
    return {r[0] for r in found}


def floor(conn: Conn, resource: str) -> int | None:
    row = conn.execute("SELECT floor FROM fencekit.floors WHERE resource = %s", (resource,))
    found = row.fetchone()
    return None if found is None else int(found[0])


@pytest.fixture
def acct(db: Conn) -> Conn:
    """acct: accounts 1-2 in region eu, 3 in us; account 4 gets a fence, then its row goes."""
    db.execute(
        "CREATE TABLE acct (id int PRIMARY KEY, region text NOT NULL, grp int NOT NULL, v text)"
    )
    db.commit()
    return db


def seed_rows(db: Conn) -> None:
    """Under a row fence: row 1 fence 10, row 2 fence 20, row 3 fence 5, row 4 written at 50
    and deleted (a row fence forgets it)."""
    write(db, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    write(db, 20, "INSERT INTO acct VALUES (2, 'eu', 1, 'b')")
    write(db, 5, "INSERT INTO acct VALUES (3, 'us', 2, 'c')")


def test_row_to_key_takes_the_highest_row_fence_per_key(acct: Conn) -> None:
    old = protect(acct, "acct")
    seed_rows(acct)
    write(acct, None, "UPDATE acct SET v = 'x' WHERE id = 3", bypass=True)  # no new fence
    new = spec("key", key=("region",))
    move(acct, old, new)
    assert registered(acct)["scope"] == "key"
    assert "fencekit_fence" not in columns(acct)  # dropped after the carry
    assert key_fence(acct, "public.acct", "eu") == 20
    assert key_fence(acct, "public.acct", "us") == 5
    # A token lower than what row 2 accepted is stale for every row of its key now.
    reject(acct, STALE, 19, "UPDATE acct SET v = 'late' WHERE id = 1")
    write(acct, 20, "UPDATE acct SET v = 'holder' WHERE id = 2")  # the current holder
    write(acct, 5, "UPDATE acct SET v = 'us' WHERE id = 3")
    reject(acct, MISSING, None, "UPDATE acct SET v = 'none'")
    assert floor(acct, "public.acct") is None  # a row fence accepted anything for a new key


def test_row_to_table_takes_the_highest_row_fence(acct: Conn) -> None:
    old = protect(acct, "acct")
    seed_rows(acct)
    move(acct, old, spec("table"))
    assert key_fence(acct, "public.acct") == 20
    reject(acct, STALE, 19, "INSERT INTO acct VALUES (9, 'eu', 1, 'late')")
    write(acct, 20, "UPDATE acct SET v = 'holder' WHERE id = 2")
    assert "fencekit_fence" not in columns(acct)


def test_key_to_row_gives_each_row_its_keys_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a'), (2, 'eu', 1, 'b')")
    write(acct, 30, "UPDATE acct SET v = 'b2' WHERE id = 2")  # key eu: 30
    write(acct, 7, "INSERT INTO acct VALUES (3, 'us', 2, 'c')")  # key us: 7
    new = spec("row")
    move(acct, old, new)
    fences = dict(acct.execute("SELECT id, fencekit_fence FROM acct").fetchall())
    assert fences == {1: 30, 2: 30, 3: 7}
    assert key_fence(acct, "public.acct", "eu") is None  # the old fences are gone
    reject(acct, STALE, 29, "UPDATE acct SET v = 'late' WHERE id = 1")
    write(acct, 30, "UPDATE acct SET v = 'holder' WHERE id = 1")
    write(acct, 7, "UPDATE acct SET v = 'us' WHERE id = 3")


def test_key_to_table_takes_the_highest_key_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    write(acct, 40, "INSERT INTO acct VALUES (4, 'ap', 1, 'gone')")
    write(acct, 40, "DELETE FROM acct WHERE id = 4")  # key ap keeps its fence 40
    move(acct, old, spec("table"))
    assert rows_of(acct) == [("public.acct", "", 40)]
    reject(acct, STALE, 39, "UPDATE acct SET v = 'late'")
    write(acct, 40, "UPDATE acct SET v = 'holder'")


def rows_of(conn: Conn) -> list[tuple[str, str, int]]:
    found = conn.execute("SELECT resource, key, fence FROM fencekit.fences ORDER BY 1, 2")
    return [(r[0], r[1], int(r[2])) for r in found.fetchall()]


def test_table_to_key_starts_unseen_keys_at_the_table_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "table")
    write(acct, 25, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    move(acct, old, spec("key", key=("region",)))
    assert key_fence(acct, "public.acct", "eu") == 25
    assert key_fence(acct, "public.acct", "") is None
    assert floor(acct, "public.acct") == 25
    # The old table fence accepted 25 for every key: a stale writer cannot start a new key.
    reject(acct, STALE, 24, "INSERT INTO acct VALUES (2, 'us', 1, 'late')")
    reject(acct, STALE, 24, "UPDATE acct SET v = 'late' WHERE id = 1")
    write(acct, 25, "INSERT INTO acct VALUES (2, 'us', 1, 'holder')")
    write(acct, 30, "INSERT INTO acct VALUES (3, 'ap', 1, 'new')")
    assert key_fence(acct, "public.acct", "ap") == 30
    # Existing keys keep their own fence: the floor is only where a key starts.
    write(acct, 26, "UPDATE acct SET v = 'us2' WHERE id = 2")
    assert key_fence(acct, "public.acct", "us") == 26


def test_table_to_row_gives_every_row_the_table_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "table")
    write(acct, 25, "INSERT INTO acct VALUES (1, 'eu', 1, 'a'), (2, 'us', 1, 'b')")
    move(acct, old, spec("row", column="fence"))
    assert dict(acct.execute("SELECT id, fence FROM acct").fetchall()) == {1: 25, 2: 25}
    reject(acct, STALE, 24, "UPDATE acct SET v = 'late' WHERE id = 2")
    write(acct, 25, "UPDATE acct SET v = 'holder' WHERE id = 2")
    assert rows_of(acct) == []


def test_key_columns_changed_merge_takes_the_max_split_takes_the_old_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region", "grp"))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")  # (eu,1): 10
    write(acct, 12, "INSERT INTO acct VALUES (2, 'eu', 2, 'b')")  # (eu,2): 12
    write(acct, 8, "INSERT INTO acct VALUES (3, 'us', 2, 'c')")  # (us,2): 8
    merged = spec("key", key=("region",))
    move(acct, old, merged)
    assert key_fence(acct, "public.acct", "eu") == 12  # the max of the keys it merges
    assert key_fence(acct, "public.acct", "us") == 8
    assert key_fence(acct, "public.acct", "(eu,1)") is None  # old key texts are gone
    reject(acct, STALE, 11, "UPDATE acct SET v = 'late' WHERE id = 1")
    write(acct, 8, "UPDATE acct SET v = 'holder' WHERE id = 3")
    # Split back: each new key takes its old key's fence; unseen new keys start at the max.
    move(acct, merged, old)
    assert key_fence(acct, "public.acct", "(eu,1)") == 12
    assert key_fence(acct, "public.acct", "(us,2)") == 8
    assert floor(acct, "public.acct") == 12
    reject(acct, STALE, 11, "INSERT INTO acct VALUES (5, 'eu', 9, 'new key, late')")
    write(acct, 8, "UPDATE acct SET v = 'holder' WHERE id = 3")


def test_old_keys_without_rows_raise_every_new_key(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region", "grp"))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    write(acct, 50, "INSERT INTO acct VALUES (4, 'eu', 7, 'gone')")
    write(acct, 50, "DELETE FROM acct WHERE id = 4")  # key (eu,7): 50, no rows
    move(acct, old, spec("key", key=("region",)))
    # (eu,7) would become key eu: nothing can tell, so every new key takes it.
    assert key_fence(acct, "public.acct", "eu") == 50
    reject(acct, STALE, 49, "INSERT INTO acct VALUES (4, 'eu', 7, 'late')")


def test_resource_renamed_copies_every_fence(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    write(acct, 40, "INSERT INTO acct VALUES (4, 'ap', 1, 'gone')")
    write(acct, 40, "DELETE FROM acct WHERE id = 4")
    new = spec("key", key=("region",), resource="accounts")
    move(acct, old, new)
    assert rows_of(acct) == [("accounts", "ap", 40), ("accounts", "eu", 10)]
    reject(acct, STALE, 39, "INSERT INTO acct VALUES (4, 'ap', 1, 'late')")
    write(acct, 10, "UPDATE acct SET v = 'holder' WHERE id = 1")


def test_shared_resource_keeps_the_higher_fence_and_the_other_tables_fences(db: Conn) -> None:
    db.execute("CREATE TABLE inv (id int PRIMARY KEY, account int NOT NULL)")
    db.execute("CREATE TABLE pay (id int PRIMARY KEY, account int NOT NULL)")
    db.commit()
    protect(db, "inv", "key", key=("account",), resource="billing")
    old = protect(db, "pay", "key", key=("account",), resource="billing")
    write(db, 30, "INSERT INTO inv VALUES (1, 1)")
    write(db, 20, "INSERT INTO pay VALUES (1, 2)")
    new = FenceSpec(TableName("public", "pay"), scope=Scope.KEY, key=("account",))
    run_script(db, sqlgen.render_move(old, new))
    assert key_fence(db, "billing", "1") == 30  # inv still uses billing
    assert key_fence(db, "public.pay", "1") == 30  # a key of billing pay could have written
    assert key_fence(db, "public.pay", "2") == 20
    reject(db, STALE, 29, "INSERT INTO pay VALUES (2, 1)")


def test_fence_column_renamed_keeps_the_values(acct: Conn) -> None:
    old = protect(acct, "acct")
    seed_rows(acct)
    move(acct, old, spec("row", column="fence"))
    assert "fencekit_fence" not in columns(acct)
    assert dict(acct.execute("SELECT id, fence FROM acct").fetchall()) == {1: 10, 2: 20, 3: 5}
    reject(acct, STALE, 19, "UPDATE acct SET v = 'late' WHERE id = 2")
    write(acct, 21, "UPDATE acct SET v = 'holder' WHERE id = 2")
    assert one(acct, "SELECT fence FROM acct WHERE id = 2") == 21
    write(acct, 30, "INSERT INTO acct VALUES (7, 'eu', 1, 'new')")
    assert one(acct, "SELECT fence FROM acct WHERE id = 7") == 30


def test_key_text_is_the_triggers_whatever_the_session_settings(db: Conn) -> None:
    db.execute("CREATE TABLE ev (id int PRIMARY KEY, at timestamptz NOT NULL)")
    db.commit()
    old = protect(db, "ev")
    write(db, 10, "INSERT INTO ev VALUES (1, '2024-01-02 03:04:05+00')")
    db.execute("SET TimeZone = 'America/New_York'")
    db.execute("SET DateStyle = 'German'")
    db.commit()
    new = FenceSpec(TableName("public", "ev"), scope=Scope.KEY, key=("at",))
    run_script(db, sqlgen.render_move(old, new))
    assert one(db, "SHOW TimeZone") == "America/New_York"  # the caller's settings are back
    reject(db, STALE, 9, "UPDATE ev SET id = 2")  # the trigger names the key as the move did
    assert key_fence(db, "public.ev", "2024-01-02 03:04:05+00") == 10


def test_policy_change_in_place_keeps_the_fences(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    # Re-running protect with another policy: in place, no unprotect in between.
    new = protect(acct, "acct", "key", key=("region",), on_missing="allow")
    assert registered(acct)["on_missing"] == "allow"
    write(acct, None, "UPDATE acct SET v = 'unfenced'")
    reject(acct, STALE, 9, "UPDATE acct SET v = 'stale'")
    # And through the move script (same SQL behind its lock and guard).
    move(acct, new, old)
    reject(acct, MISSING, None, "UPDATE acct SET v = 'none'")
    reject(acct, STALE, 9, "UPDATE acct SET v = 'stale'")


def test_issuer_change_in_place_rebinds_an_unshared_resource(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",), issuer="etcd")
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    new = spec("key", key=("region",), issuer="zookeeper")
    move(acct, old, new)
    assert one(acct, "SELECT issuer FROM fencekit.resources WHERE resource = 'public.acct'") == (
        "zookeeper"
    )
    assert key_fence(acct, "public.acct", "eu") == 10


def test_a_script_for_another_spec_refuses_and_changes_nothing(acct: Conn) -> None:
    protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    with pytest.raises(psycopg.Error) as err:
        move(acct, spec("row"), spec("table"))
    assert err.value.sqlstate == USAGE
    assert "fencekit sql move" in (err.value.diag.message_hint or "")
    assert registered(acct)["scope"] == "key"
    assert key_fence(acct, "public.acct", "eu") == 10
    with pytest.raises(SpecError):  # a move keeps the table; a rename is another script
        sqlgen.change_statements(spec().with_changes(table=TableName("public", "b")), spec())
    acct.execute("CREATE TABLE other (id int)")
    acct.commit()
    o = FenceSpec(TableName("public", "other"))
    with pytest.raises(psycopg.Error) as err:
        run_script(acct, sqlgen.render_move(o, o.with_changes(scope=Scope.TABLE)))
    assert err.value.sqlstate == USAGE
    assert "not protected" in str(err.value)


def test_plain_protect_still_refuses_a_structural_change(acct: Conn) -> None:
    protect(acct, "acct", "key", key=("region",))
    with pytest.raises(psycopg.Error) as err:
        protect(acct, "acct", "row")
    assert err.value.sqlstate == USAGE
    assert "fencekit move" in (err.value.diag.message_hint or "")


def test_writers_during_a_move_wait_and_meet_the_new_fence(acct: Conn, dsn: str) -> None:
    old = protect(acct, "acct")
    seed_rows(acct)
    new = spec("key", key=("region",))
    script = sqlgen.change_statements(old, new)
    results: dict[str, object] = {}
    with psycopg.connect(dsn, autocommit=False) as mover:
        for statement in script:
            mover.execute(statement.encode())
        # The move holds its lock; a stale writer (row 1 accepted 10, key eu had 20) queues.

        def stale() -> None:
            with psycopg.connect(dsn) as w:
                w.execute("SELECT set_config('fencekit.token', '15', true)")
                try:
                    w.execute("UPDATE acct SET v = 'stale' WHERE id = 1")
                    w.commit()
                    results["stale"] = "accepted"
                except psycopg.Error as exc:
                    results["stale"] = exc.sqlstate

        writer = threading.Thread(target=stale)
        writer.start()
        time.sleep(1.0)
        assert writer.is_alive(), "the writer did not wait for the move"
        assert one(mover, "SELECT count(*) FROM pg_locks WHERE NOT granted") >= 1
        mover.commit()
        writer.join(10)
    assert results["stale"] == STALE


def test_a_move_on_a_partitioned_table_covers_the_partitions(db: Conn) -> None:
    db.execute("CREATE TABLE pt (id int NOT NULL, region text NOT NULL) PARTITION BY LIST (region)")
    db.execute("CREATE TABLE pt_eu PARTITION OF pt FOR VALUES IN ('eu')")
    db.execute("CREATE TABLE pt_us PARTITION OF pt FOR VALUES IN ('us')")
    db.commit()
    old = protect(db, "pt")
    write(db, 10, "INSERT INTO pt VALUES (1, 'eu')")
    write(db, 20, "INSERT INTO pt VALUES (2, 'us')")
    new = FenceSpec(TableName("public", "pt"), scope=Scope.KEY, key=("region",))
    run_script(db, sqlgen.render_move(old, new))
    reject(db, STALE, 19, "UPDATE pt_us SET id = 3")  # through the partition itself
    write(db, 10, "UPDATE pt SET id = 4 WHERE region = 'eu'")


def test_a_move_to_a_row_fence_refuses_a_column_that_exists(acct: Conn) -> None:
    old = protect(acct, "acct", "key", key=("region",))
    write(acct, 10, "INSERT INTO acct VALUES (1, 'eu', 1, 'a')")
    with pytest.raises(psycopg.Error) as err:
        move(acct, old, spec("row", column="grp"))
    assert err.value.sqlstate == USAGE
    assert "already has a column grp" in str(err.value)
    assert one(acct, "SELECT grp FROM acct") == 1
    assert registered(acct)["scope"] == "key"
