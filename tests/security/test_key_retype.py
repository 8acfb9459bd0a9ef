"""A key column retyped after protect runs no code as fencekit.

The table's owner (``kr_own``: owns the table, not an admin, not a superuser) retypes the key
column of a key-fenced table that a superuser protected, to a composite type of its own with a
cast to text of its own (which counts each run in a sequence, a rollback does not undo it, and
tries to make the owner a superuser). Two ways: ``ALTER COLUMN ... TYPE`` (which PostgreSQL
refuses while the key fence's ``_keys`` trigger names the column: the owner drops it first),
and ``DROP COLUMN ... CASCADE`` then ``ADD COLUMN`` of the same name. Then:

- F1: the owner writes the table (INSERT, UPDATE, DELETE, TRUNCATE) and claims a key. The key
  fence's SECURITY DEFINER trigger computed ``k::text`` as the superuser that ran protect: the
  owner became a superuser. Now every write that would name a key is refused (YF000, naming the
  column, its type and the protected one) before any key text is computed.
- F2: the DBA (a superuser) runs ``fencekit move`` to another key column. The carry computed the
  old key's text as the DBA. Now the move is refused and changes nothing.

The same holds for a session whose key fence had taken the fast path before the retype (its
statement, planned again, finds the new type and leaves the keys to the full check), and for a
key column renamed or dropped (a name that is no column any more would read as a function of
the whole row).

After each: the owner is not a superuser and its cast never ran. A retype within the protected
family (int to bigint) and a domain over the protected type still write (once the ``_keys``
trigger is out of the way); a retype to another
built-in family (numeric(10,2)) is refused as well: its keys would be named differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, fences, protect, without_keys_guard

OWNER = "kr_own"

HOSTILE = f"""
CREATE SCHEMA kr AUTHORIZATION {OWNER};
GRANT USAGE ON SCHEMA kr TO PUBLIC;
SET ROLE {OWNER};
CREATE SEQUENCE kr.ran;
GRANT USAGE ON SEQUENCE kr.ran TO PUBLIC;
CREATE TYPE kr.kt AS (n int);
CREATE FUNCTION kr.kt_text(kr.kt) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('kr.ran');
  BEGIN EXECUTE 'ALTER ROLE {OWNER} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN ($1).n::text;
END $$;
CREATE CAST (kr.kt AS text) WITH FUNCTION kr.kt_text(kr.kt);
RESET ROLE;
"""

# The owner's enum whose cast to json is its code: run by to_json(row), which a qualified name
# that is no column (x.to_json) reads as.
ENUM_WITH_JSON_CAST = f"""
CREATE TYPE kr.e AS ENUM ('a');
CREATE FUNCTION kr.e_json(kr.e) RETURNS json LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('kr.ran');
  BEGIN EXECUTE 'ALTER ROLE {OWNER} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN '1'::json;
END $$;
CREATE CAST (kr.e AS json) WITH FUNCTION kr.e_json(kr.e);
"""

RETYPES = {
    # The key fence's trigger naming k makes PostgreSQL refuse the retype: dropped first.
    "alter_type": without_keys_guard("kr_t")
    + "; ALTER TABLE kr_t ALTER COLUMN k TYPE kr.kt USING ROW(k)::kr.kt",
    "drop_add": "ALTER TABLE kr_t DROP COLUMN k CASCADE;"
    " ALTER TABLE kr_t ADD COLUMN k kr.kt NOT NULL DEFAULT ROW(1)::kr.kt",
}

WRITES = {
    "insert": "INSERT INTO kr_t (id, k, k2, v) VALUES (3, ROW(3)::kr.kt, 3, 0)",
    "update": "UPDATE kr_t SET v = v + 1 WHERE id = 1",
    "delete": "DELETE FROM kr_t WHERE id = 1",
}


def _ran(db: Conn) -> int:
    db.rollback()
    row = db.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM kr.ran").fetchone()
    db.rollback()
    assert row is not None
    return int(row[0])


def _superuser(db: Conn) -> bool:
    db.rollback()
    row = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()
    db.rollback()
    assert row is not None
    return bool(row[0])


def _clean(db: Conn, what: str) -> None:
    assert not _superuser(db), f"{what}: the owner became a superuser"
    assert _ran(db) == 0, f"{what}: the owner's cast ran"


@pytest.fixture
def owner(db: Conn, make_role: Callable[..., str]) -> str:
    """The owner's DSN; kr_t (key fence on k, protected by the superuser) holds keys 1 and 2
    at fence 10; the owner's type and cast exist, unused."""
    dsn = make_role(OWNER)
    db.execute(HOSTILE)
    db.execute(
        "CREATE TABLE public.kr_t (id int PRIMARY KEY, k int NOT NULL, k2 int NOT NULL, v int)"
    )
    protect(db, FenceSpec(TableName("public", "kr_t"), scope=Scope.KEY, key=("k",)))
    db.execute(f"ALTER TABLE kr_t OWNER TO {OWNER}")
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("INSERT INTO kr_t VALUES (1, 1, 1, 0), (2, 2, 2, 0)")
    db.commit()
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()
    return dsn


def _retype(owner: str, how: str) -> None:
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(RETYPES[how])


def _refused(exc: psycopg.Error, what: str) -> None:
    assert exc.sqlstate == "YF000", f"{what}: {exc.sqlstate} {exc}"
    message = exc.diag.message_primary or ""
    assert "key column k of public.kr_t has type kr.kt" in message, message
    assert "protected with a key of integer" in message, message


@pytest.mark.parametrize("how", sorted(RETYPES))
@pytest.mark.parametrize("write", sorted(WRITES))
def test_owner_write_after_retype_is_refused(db: Conn, owner: str, how: str, write: str) -> None:
    _retype(owner, how)
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '20'")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(WRITES[write])
    _refused(caught.value, f"{write} after {how}")
    _clean(db, f"{write} after {how}")
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()


@pytest.mark.parametrize("how", sorted(RETYPES))
@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("where", ["same session", "another session"])
def test_a_session_on_the_fast_path_is_refused_after_a_retype(
    db: Conn, owner: str, how: str, write: str, where: str
) -> None:
    """The owner's session wrote first, on the fast path: its key function's statements are
    planned for an integer key column. Then the column is retyped (by that session or
    another): its next write is refused as a fresh session's is."""
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '20'")
        conn.execute("UPDATE kr_t SET v = v + 1 WHERE id = 2")
        conn.commit()
        if where == "same session":
            conn.execute(RETYPES[how])
            conn.commit()
        else:
            _retype(owner, how)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(WRITES[write])
    _refused(caught.value, f"{write} after {how} in {where}")
    _clean(db, f"{write} after {how} in {where}")
    assert fences(db, "public.kr_t") == {"1": 10, "2": 20}
    db.rollback()


@pytest.mark.parametrize("name", ["to_json", "row_to_json"])
@pytest.mark.parametrize("how", ["rename", "drop"])
def test_a_key_name_that_is_no_column_any_more_runs_no_function_of_the_row(
    db: Conn, owner: str, name: str, how: str
) -> None:
    """``x.<name>``, where ``<name>`` is no column of ``x``, reads as ``<name>(x)``: to_json
    of the whole row, which runs each column type's cast to json, an owner's among them. The
    owner's session wrote first (its key fence keeps the key column's type for the session),
    then renamed or dropped the key column and added one of an enum with its own cast to json:
    its next write is refused, and nothing of the row but its columns was read."""
    db.execute(
        f'CREATE TABLE public.kr_j (id int PRIMARY KEY, "{name}" int NOT NULL, v int NOT NULL)'
    )
    protect(db, FenceSpec(TableName("public", "kr_j"), scope=Scope.KEY, key=(name,)))
    db.execute(f"ALTER TABLE kr_j OWNER TO {OWNER}")
    db.commit()
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '20'")
        conn.execute(f'INSERT INTO kr_j (id, "{name}", v) VALUES (1, 1, 0)')
        conn.commit()
        conn.execute(ENUM_WITH_JSON_CAST)
        if how == "rename":
            conn.execute(f'ALTER TABLE kr_j RENAME COLUMN "{name}" TO n')
        else:
            # CASCADE: the key fence's _keys trigger names the column.
            conn.execute(f'ALTER TABLE kr_j DROP COLUMN "{name}" CASCADE')
        conn.execute("ALTER TABLE kr_j ADD COLUMN e kr.e NOT NULL DEFAULT 'a'")
        conn.commit()
        insert = "INSERT INTO kr_j (id, v) VALUES (2, 0)"
        if how == "rename":
            insert = "INSERT INTO kr_j (id, n, v) VALUES (2, 2, 0)"
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(insert)
    assert caught.value.sqlstate == "YF000", caught.value
    assert f"key column {name} of public.kr_j" in str(caught.value), caught.value
    _clean(db, f"a write after the key column was {how}d")


@pytest.mark.parametrize("how", sorted(RETYPES))
def test_owner_truncate_and_claim_after_retype_run_no_cast(db: Conn, owner: str, how: str) -> None:
    """TRUNCATE names no key (its check is the resource's highest fence); a claim reads the key
    values through built-in types only (fencekit.key_text) and is refused."""
    _retype(owner, how)
    with psycopg.connect(owner) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT fencekit.claim('kr_t', '{1}', 50)")
        assert caught.value.sqlstate == "YF000", caught.value
        assert "key column k of public.kr_t has type kr.kt" in str(caught.value)
        conn.rollback()
        conn.execute("SET fencekit.token = '20'")
        conn.execute("TRUNCATE kr_t")
        conn.commit()
    _clean(db, f"claim and truncate after {how}")
    # The accepted TRUNCATE advanced every fence of the resource it passed,
    # without computing any key's text.
    assert fences(db, "public.kr_t") == {"1": 20, "2": 20}
    db.rollback()


@pytest.mark.parametrize("how", sorted(RETYPES))
def test_dba_move_after_retype_is_refused(
    db: Conn, owner: str, dsn: str, how: str, capsys: Any
) -> None:
    _retype(owner, how)
    capsys.readouterr()
    code = main(["move", "kr_t", "--key", "k2", "--dsn", dsn])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 1, out
    # A re-keying move reads the table's rows, so a DBA's session never starts it: refused
    # before anything of the owner's (the retyped key's cast among it) could run there.
    assert "refusing to move public.kr_t in a session of postgres" in out, out
    _clean(db, f"move after {how}")
    row = db.execute(
        "SELECT spec::text FROM fencekit.protected WHERE table_name = 'kr_t'"
    ).fetchone()
    assert row is not None
    assert '"key": ["k"]' in row[0], row
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()


def test_retype_within_the_family_and_domains_still_write(db: Conn, owner: str) -> None:
    """int to bigint names every key alike; a domain over bigint (or over such a domain) reads
    as bigint."""
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(without_keys_guard("kr_t"))
        conn.execute("ALTER TABLE kr_t ALTER COLUMN k TYPE bigint")
        conn.execute("CREATE DOMAIN kr.acct AS bigint CHECK (VALUE > 0)")
        conn.execute("ALTER TABLE kr_t ALTER COLUMN k TYPE kr.acct")
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '20'")
        conn.execute("UPDATE kr_t SET v = v + 1 WHERE id = 1")
        conn.commit()
    # A domain over a domain takes check_key_types' slow path, which finds nothing wrong.
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE DOMAIN kr.acct2 AS kr.acct")
        conn.execute("ALTER TABLE kr_t ALTER COLUMN k TYPE kr.acct2")
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '30'")
        conn.execute("UPDATE kr_t SET v = v + 1 WHERE id = 2")
        conn.commit()
    assert fences(db, "public.kr_t") == {"1": 20, "2": 30}
    db.rollback()


def _retyped_after_a_write(owner: str, to: str) -> psycopg.Error:
    """The owner's session writes (the fast path, planned for an integer key column), drops the
    ``_keys`` trigger, retypes the key column to ``to`` and writes key 1 under token 5."""
    with psycopg.connect(owner) as conn:
        conn.execute("SET fencekit.token = '10'")
        conn.execute("UPDATE kr_t SET v = v + 1 WHERE id = 2")
        conn.commit()
        conn.execute(without_keys_guard("kr_t"))
        conn.execute(f"ALTER TABLE kr_t ALTER COLUMN k TYPE {to}")
        conn.commit()
        conn.execute("SET fencekit.token = '5'")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("UPDATE kr_t SET v = v + 1 WHERE id = 1")
    return caught.value


def test_retype_to_another_family_is_refused(db: Conn, owner: str) -> None:
    """numeric(10,2) is built in, but names key 1 as 1.00: a fresh fence, below the old one.
    It is no fast path type, so the full check refuses the write."""
    err = _retyped_after_a_write(owner, "numeric(10,2)")
    assert err.sqlstate == "YF000", err
    message = err.diag.message_primary or ""
    assert "has type numeric(10,2)" in message, message
    assert "key of integer" in message, message
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()


def test_retype_among_the_fast_types_is_judged_by_the_keys_text(db: Conn, owner: str) -> None:
    """integer to text names key 1 as 1 still: the fast path judges it by that text, and the
    stale token is refused as stale. What the owner did to get there (dropped the ``_keys``
    trigger, changed the key's family) is status's to report."""
    from fencekit import catalog

    err = _retyped_after_a_write(owner, "text")
    assert err.sqlstate == "YF001", err
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()
    (pt,) = [p for p in catalog.protected_tables(db) if p.spec.table.name == "kr_t"]
    kinds = {d.kind for d in catalog.table_drift(db, pt)}
    db.rollback()
    assert "key_type_changed" in kinds, kinds


def test_dba_move_from_a_retyped_row_fence_column_is_refused(
    db: Conn, owner: str, dsn: str, capsys: Any
) -> None:
    """The carry from a row fence reads its fence column as the mover (max, comparisons): the
    owner's type there is refused too, before anything is read."""
    db.execute("CREATE TABLE public.kr_r (id int PRIMARY KEY, k int NOT NULL)")
    protect(db, FenceSpec(TableName("public", "kr_r")))
    db.execute(f"ALTER TABLE kr_r OWNER TO {OWNER}")
    db.commit()
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE kr_r DROP COLUMN fencekit_fence CASCADE;"
            " ALTER TABLE kr_r ADD COLUMN fencekit_fence kr.kt"
        )
    capsys.readouterr()
    code = main(["move", "kr_r", "--key", "k", "--dsn", dsn])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 1, out
    # Moving out of a row fence reads the rows: never in a DBA's session, whatever the type.
    assert "refusing to move public.kr_r in a session of postgres" in out, out
    _clean(db, "move from a retyped row fence column")


@pytest.mark.parametrize("writer", ["owner", "app"])
@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_snapshot_older_than_the_key_column_runs_no_cast(
    db: Conn, owner: str, make_role: Callable[..., str], isolation: str, writer: str
) -> None:
    """A writer's transaction takes its snapshot; then the owner renames the key column away
    and adds one of its own composite type under the key's name. The writer's catalog check
    reads pg_attribute through that snapshot (an integer k, as protect recorded it), while
    PostgreSQL plans the statement that casts the keys against the catalogs as they are now.
    The write is refused before any such statement is planned, and the cast never runs."""
    # "app": the application's role (table rights only) on a fresh connection with other
    # TimeZone, DateStyle and search_path, as a pool opens them.
    dsn = owner
    if writer == "app":
        dsn = make_conninfo(
            make_role("kr_app", "SELECT, INSERT, UPDATE, DELETE ON public.kr_t"),
            options="-c TimeZone=Pacific/Chatham -c DateStyle=German,DMY -c search_path=pg_temp",
        )
    with psycopg.connect(dsn) as w, psycopg.connect(owner, autocommit=True) as ddl:
        w.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        w.execute("SELECT 1")  # the snapshot, before the change
        ddl.execute("ALTER TABLE kr_t RENAME COLUMN k TO k_old")
        ddl.execute("ALTER TABLE kr_t ADD COLUMN k kr.kt NOT NULL DEFAULT ROW(1)::kr.kt")
        w.execute("SET LOCAL fencekit.token = '20'")
        with pytest.raises(psycopg.Error) as caught:
            w.execute("UPDATE public.kr_t SET v = v + 1 WHERE id = 1")
        w.rollback()
    assert caught.value.sqlstate == "YF000", caught.value
    assert "changed after this transaction's snapshot" in str(caught.value), caught.value
    _clean(db, f"a {isolation} write after the key column was replaced")
    assert fences(db, "public.kr_t") == {"1": 10, "2": 10}
    db.rollback()


@pytest.mark.parametrize("name", ["to_json", "row_to_json"])
def test_a_renamed_boolean_key_in_an_old_snapshot_runs_no_function_of_the_row(
    db: Conn, owner: str, name: str
) -> None:
    """A boolean key column named like a catalog function of a whole row: a writer's
    REPEATABLE READ snapshot predates the owner renaming it away and adding a column of an enum
    with its own cast to json. The catalog check still sees the boolean through the snapshot;
    the name the statements plan now is no column: it reads the statement's marker, whose type
    no key has, so the write is refused, and no statement reads the name as to_json(row)."""
    db.execute(f'CREATE TABLE public.kr_b ("{name}" boolean NOT NULL, v int NOT NULL)')
    protect(db, FenceSpec(TableName("public", "kr_b"), scope=Scope.KEY, key=(name,)))
    db.execute("ALTER TABLE kr_b OWNER TO " + OWNER)
    db.commit()
    with psycopg.connect(owner, autocommit=True) as ddl:
        ddl.execute(ENUM_WITH_JSON_CAST)
        with psycopg.connect(owner) as writer:
            writer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            writer.execute("SELECT 1 FROM kr.ran")  # the snapshot, before the change
            ddl.execute(f'ALTER TABLE kr_b RENAME COLUMN "{name}" TO old_key')
            ddl.execute("ALTER TABLE kr_b ADD COLUMN e kr.e NOT NULL DEFAULT 'a'")
            writer.execute("SET LOCAL fencekit.token = '20'")
            with pytest.raises(psycopg.Error) as caught:
                writer.execute("INSERT INTO kr_b (old_key, v) VALUES (true, 1)")
            writer.rollback()
    assert caught.value.sqlstate == "YF000", caught.value
    _clean(db, f"a write after the boolean key {name} was renamed away")
