"""A key fence's key values rewritten by DDL, without any DML trigger.

The table's owner (``kw_own``: owns the table, not an admin) of a key-fenced table holds a row
whose key's fence is 100. Two DDL statements rewrite every row's key and fire no trigger:

- ``ALTER COLUMN id TYPE int USING (...)``, to the column's own type: no type check notices.
  PostgreSQL refuses it, since the key fence's ``_keys`` trigger (``AFTER UPDATE OF <key
  columns> ... WHEN (false)``) names the column; so does any other retype, and ``DROP COLUMN``
  needs CASCADE. Replacing that trigger with one of other columns is reported.
- ``ALTER COLUMN acct SET EXPRESSION`` on a stored generated key (PostgreSQL 17+), on the table
  or one partition alone: not refused; status reports ``key_expression_changed`` (it compares
  fingerprints of the stored expressions with those protect recorded) and re-protect refuses,
  until the expression is set back.

Before the fix each left a stale token (5 < 100) writing the moved row, with status clean.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from fencekit import catalog
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, fences, protect

OWNER = "kw_own"


def _owner_runs(dsn: str, sql: str) -> psycopg.Error | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(sql)
        except psycopg.Error as exc:
            return exc
    return None


def _stale_write(dsn: str, where: str) -> psycopg.Error | None:
    """The stale holder's write (token 5) of the row that key 1 (or 10) held at fence 100."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET fencekit.token = '5'")
        try:
            conn.execute(f"UPDATE kw SET v = 'stale5' WHERE {where}")
            conn.commit()
        except psycopg.Error as exc:
            return exc
    return None


def _drift(db: Conn, table: str) -> list[catalog.Drift]:
    db.rollback()
    (pt,) = [p for p in catalog.protected_tables(db) if p.spec.table.name == table]
    out = catalog.table_drift(db, pt)
    db.rollback()
    return out


@pytest.fixture
def keyed(db: Conn, make_role: Callable[..., str]) -> str:
    """The owner's DSN; kw (key fence on id, protected by the superuser): key 1 at fence 100."""
    dsn = make_role(OWNER)
    db.execute("CREATE TABLE public.kw (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO kw VALUES (1, 'a'), (2, 'b')")
    protect(db, FenceSpec(TableName("public", "kw"), scope=Scope.KEY, key=("id",)))
    db.execute(f"ALTER TABLE kw OWNER TO {OWNER}")
    db.execute("SELECT set_config('fencekit.token', '100', true)")
    db.execute("UPDATE kw SET v = 'k1@100' WHERE id = 1")
    db.commit()
    assert fences(db, "public.kw") == {"1": 100}
    db.rollback()
    return dsn


@pytest.mark.parametrize(
    "ddl",
    [
        "ALTER TABLE kw ALTER COLUMN id TYPE int USING (CASE WHEN id = 1 THEN 1001 ELSE id END)",
        "ALTER TABLE kw ALTER COLUMN id TYPE int",
        "ALTER TABLE kw ALTER COLUMN id TYPE bigint",
    ],
)
def test_the_owner_cannot_retype_a_key_column(db: Conn, keyed: str, ddl: str) -> None:
    err = _owner_runs(keyed, ddl)
    assert err is not None, "the retype went through"
    assert err.sqlstate == "0A000", err
    assert "used in a trigger definition" in str(err)
    err = _owner_runs(keyed, "ALTER TABLE kw DROP COLUMN id")
    assert err is not None
    assert err.sqlstate == "2BP01", err  # needs CASCADE
    err = _stale_write(keyed, "v = 'k1@100'")
    assert err is not None
    assert err.sqlstate == "YF001", err
    assert db.execute("SELECT id, v FROM kw ORDER BY id").fetchall() == [(1, "k1@100"), (2, "b")]
    db.rollback()


def test_the_guard_replaced_with_other_columns_is_reported(db: Conn, keyed: str) -> None:
    """CREATE OR REPLACE TRIGGER keeps the name; the owner may not attach fencekit's function
    (EXECUTE is not theirs), so its replacement names another function; one with fencekit's
    function and other columns differs in its columns only. Status reports both."""
    assert not [d for d in _drift(db, "kw") if d.kind == "trigger_changed"]
    row = db.execute(
        "SELECT tgname, tgfoid::regproc::text FROM pg_trigger WHERE tgrelid = 'kw'::regclass"
        " AND tgname LIKE '%\\_keys'"
    ).fetchone()
    assert row is not None
    name, fn = row
    db.rollback()
    own = (
        "CREATE FUNCTION public.kw_nothing() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN RETURN NULL; END $$;"
        f" CREATE OR REPLACE TRIGGER {name} AFTER UPDATE OF v ON kw FOR EACH STATEMENT"
        " WHEN (false) EXECUTE FUNCTION public.kw_nothing()"
    )
    db.execute(f"GRANT CREATE ON SCHEMA public TO {OWNER}")
    db.commit()
    assert _owner_runs(keyed, own) is None
    changed = [d for d in _drift(db, "kw") if d.kind == "trigger_changed"]
    assert changed
    assert name in changed[0].object, changed
    # ... which let the retype through: what status says is wrong.
    assert _owner_runs(keyed, "ALTER TABLE kw ALTER COLUMN id TYPE int") is None
    db.execute(
        f"CREATE OR REPLACE TRIGGER {name} AFTER UPDATE OF v ON kw FOR EACH STATEMENT"
        f" WHEN (false) EXECUTE FUNCTION {fn}()"
    )
    db.commit()
    changed = [d for d in _drift(db, "kw") if d.kind == "trigger_changed"]
    assert [d.message for d in changed if "columns differ" in d.message], changed


GENERATED = """
CREATE TABLE public.kw (id int, acct int NOT NULL GENERATED ALWAYS AS (id * 10) STORED, v text)
  PARTITION BY RANGE (id);
CREATE TABLE public.kw_1 PARTITION OF public.kw FOR VALUES FROM (0) TO (100);
CREATE TABLE public.kw_2 PARTITION OF public.kw FOR VALUES FROM (100) TO (200);
INSERT INTO public.kw (id, v) VALUES (1, 'a'), (2, 'b'), (150, 'c');
"""


@pytest.mark.parametrize("pg_target", ["pg17", "pg18"], indirect=True)
@pytest.mark.parametrize("on", ["kw", "kw_1"])
def test_a_changed_generation_expression_of_a_key_is_reported(
    db: Conn, make_role: Callable[..., str], on: str
) -> None:
    dsn = make_role(OWNER)
    db.execute(GENERATED)
    spec = FenceSpec(TableName("public", "kw"), scope=Scope.KEY, key=("acct",))
    protect(db, spec)
    db.execute(f"ALTER TABLE kw OWNER TO {OWNER}; ALTER TABLE kw_1 OWNER TO {OWNER};")
    db.execute(f"ALTER TABLE kw_2 OWNER TO {OWNER}")
    db.execute("SELECT set_config('fencekit.token', '100', true)")
    db.execute("UPDATE kw SET v = 'k10@100' WHERE id = 1")
    db.commit()
    assert fences(db, "public.kw") == {"10": 100}
    db.rollback()
    assert not [d for d in _drift(db, "kw") if d.kind == "key_expression_changed"]

    err = _owner_runs(dsn, f"ALTER TABLE {on} ALTER COLUMN acct SET EXPRESSION AS (id * 10 + 5)")
    assert err is None, err  # PostgreSQL allows it: the key trigger's columns do not hold it
    assert db.execute("SELECT acct FROM kw WHERE id = 1").fetchone() == (15,)
    db.rollback()
    drift = [d for d in _drift(db, "kw") if d.kind == "key_expression_changed"]
    assert [d.object for d in drift] == [f"public.{on} key (acct)"], drift
    assert drift[0].command is not None
    assert drift[0].command.action == "unprotect"
    with pytest.raises(psycopg.Error) as refused:
        protect(db, spec)
    assert refused.value.sqlstate == "YF000"
    assert "generation expression of a key column" in str(refused.value)
    db.rollback()

    # Set back as it was (spelled otherwise): nothing to report, and protect runs again.
    err = _owner_runs(dsn, f"ALTER TABLE {on} ALTER COLUMN acct SET EXPRESSION AS ((id*10))")
    assert err is None, err
    assert not [d for d in _drift(db, "kw") if d.kind == "key_expression_changed"]
    protect(db, spec)
    db.commit()
    err = _stale_write(dsn, "id = 1")
    assert err is not None
    assert err.sqlstate == "YF001", err
    # Dropping the expression keeps every key: not reported.
    assert _owner_runs(dsn, "ALTER TABLE kw ALTER COLUMN acct DROP EXPRESSION") is None
    assert not [d for d in _drift(db, "kw") if d.kind == "key_expression_changed"]


@pytest.mark.parametrize("pg_target", ["pg18"], indirect=True)
def test_a_partition_added_later_is_recorded_by_re_protect(
    db: Conn, make_role: Callable[..., str]
) -> None:
    """A partition created after protect has no recorded expression (status cannot compare
    it) until protect runs again, which records it, and leaves protected_at alone."""
    dsn = make_role(OWNER)
    db.execute(GENERATED)
    spec = FenceSpec(TableName("public", "kw"), scope=Scope.KEY, key=("acct",))
    protect(db, spec)
    db.execute(f"ALTER TABLE kw OWNER TO {OWNER}")
    db.execute("CREATE TABLE public.kw_3 PARTITION OF public.kw FOR VALUES FROM (200) TO (300)")
    db.execute(f"ALTER TABLE kw_3 OWNER TO {OWNER}")
    db.commit()
    (at,) = db.execute("SELECT protected_at FROM fencekit.protected").fetchone() or (None,)
    protect(db, spec)
    db.commit()
    row = db.execute(
        "SELECT protected_at, key_expressions ? 'kw_3'::regclass::oid::text FROM fencekit.protected"
    ).fetchone()
    assert row == (at, True), row
    db.rollback()
    assert _owner_runs(dsn, "ALTER TABLE kw_3 ALTER COLUMN acct SET EXPRESSION AS (id)") is None
    drift = [d for d in _drift(db, "kw") if d.kind == "key_expression_changed"]
    assert [d.object for d in drift] == ["public.kw_3 key (acct)"], drift


@pytest.mark.parametrize("pg_target", ["pg18"], indirect=True)
def test_auto_cover_refuses_a_changed_generation_expression(
    db: Conn, make_role: Callable[..., str]
) -> None:
    """With auto-cover on, its event trigger checks the expressions after each ALTER TABLE of a
    protected tree: the owner's SET EXPRESSION fails, on the table or a partition, and nothing
    moved."""
    dsn = make_role(OWNER)
    db.execute(GENERATED)
    protect(db, FenceSpec(TableName("public", "kw"), scope=Scope.KEY, key=("acct",)))
    for t in ("kw", "kw_1", "kw_2"):
        db.execute(f"ALTER TABLE {t} OWNER TO {OWNER}")
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.commit()
    for on in ("kw", "kw_1"):
        err = _owner_runs(dsn, f"ALTER TABLE {on} ALTER COLUMN acct SET EXPRESSION AS (id)")
        assert err is not None, on
        assert err.sqlstate == "YF000", err
        assert "generation expression of a key column" in str(err)
    assert db.execute("SELECT acct FROM kw WHERE id = 1").fetchone() == (10,)
    db.rollback()
    # Other DDL on the tree goes on.
    assert _owner_runs(dsn, "ALTER TABLE kw ADD COLUMN note text") is None
