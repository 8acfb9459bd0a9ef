"""No fencekit operation run by an admin, a DBA or a superuser
evaluates a table owner's code in that session (the independent review's F3, F4 and F5).

``oc_owner`` owns ``oc_t`` (row fence) and ``oc_k`` (key fence) and is neither an admin nor a
superuser. Its AFTER UPDATE triggers do what the review's did: ``RESET ROLE`` (back to the
session's login role: SET ROLE is no sandbox), then make ``oc_owner`` a superuser when that role
is one, and lower every fence in fencekit.fences when it may. ``oc_admin`` is a member of
fencekit_admin and, as the docs used to ask for row repairs, of ``oc_owner``.

- F3: ``fencekit fence set`` on a row (``fencekit.set_fence``) used to update the table after
  SET ROLE to the owner, in the admin's or the DBA's session. Now it is refused before the table
  is touched, unless the session logged in as the owner, with the statement to run as it.
- F4: ``fencekit move`` key -> row used to fill the column the same way. Now it is refused (the
  whole move rolls back) outside the owner's session.
- F5: after the owner renames its table and puts a view under the old name, ``fencekit fences``
  read the view (its function ran as the reader). Now every command refuses a relation that only
  has the protected table's name, and ``status`` reports the rename.

Each test failed on the code before the fix (the owner became a superuser, or a fence changed
outside fencekit.repairs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import change_statements
from tests.security.conftest import Conn, fences, protect

ESCAPE = """
CREATE FUNCTION public.oc_escape() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE me text := current_setting('role');
BEGIN
  PERFORM set_config('role', 'none', true);  -- RESET ROLE: the session's login role
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE oc_owner SUPERUSER';
  END IF;
  BEGIN
    UPDATE fencekit.fences SET fence = 1;  -- every key and table fence
  EXCEPTION WHEN insufficient_privilege THEN NULL;
  END;
  PERFORM set_config('role', me, true);
  RETURN NULL;
END $$;
CREATE TRIGGER oc_escape AFTER UPDATE ON public.oc_t FOR EACH ROW
  EXECUTE FUNCTION public.oc_escape();
CREATE TRIGGER oc_escape AFTER UPDATE ON public.oc_k FOR EACH ROW
  EXECUTE FUNCTION public.oc_escape();
"""

VIEW = """
CREATE FUNCTION public.oc_f(bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE oc_owner SUPERUSER';
  END IF;
  RETURN $1;
END $$;
ALTER TABLE public.oc_t RENAME TO oc_t_real;
CREATE VIEW public.oc_t AS
  SELECT id, k, public.oc_f(fencekit_fence) AS fencekit_fence FROM public.oc_t_real;
"""


@pytest.fixture
def roles(db: Conn, dsn: str, make_role: Callable[..., str]) -> dict[str, str]:
    owner = make_role("oc_owner", "CREATE ON SCHEMA public")
    admin = make_role("oc_admin", "fencekit_admin", "oc_owner")
    db.execute(
        "CREATE TABLE oc_t (id int PRIMARY KEY, k int NOT NULL);"
        "CREATE TABLE oc_k (id int PRIMARY KEY, k int NOT NULL);"
        "CREATE TABLE oc_other (id int PRIMARY KEY, k int NOT NULL);"
    )
    protect(db, FenceSpec(TableName("public", "oc_t")))
    protect(db, FenceSpec(TableName("public", "oc_k"), scope=Scope.KEY, key=("k",)))
    protect(db, FenceSpec(TableName("public", "oc_other"), scope=Scope.KEY, key=("k",)))
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("INSERT INTO oc_t VALUES (1, 1), (2, 2); INSERT INTO oc_k VALUES (1, 1)")
    db.execute("SELECT set_config('fencekit.token', '100', true)")
    db.execute("INSERT INTO oc_other VALUES (1, 1)")
    db.execute("ALTER TABLE oc_t OWNER TO oc_owner; ALTER TABLE oc_k OWNER TO oc_owner")
    db.commit()
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(ESCAPE)
    return {"dba": dsn, "admin": admin, "owner": owner}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _superuser(db: Conn) -> bool:
    db.rollback()
    row = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'oc_owner'").fetchone()
    db.rollback()
    return bool(row and row[0])


def _rows(db: Conn, table: str = "oc_t") -> list[tuple[int, int]]:
    db.rollback()
    got = db.execute(f"SELECT id, fencekit_fence FROM public.{table} ORDER BY id").fetchall()
    db.rollback()
    return [(int(i), int(f)) for i, f in got]


def _unchanged(db: Conn, table: str = "oc_t") -> None:
    assert not _superuser(db), "the owner's code ran as a superuser"
    assert _rows(db, table) == [(1, 10), (2, 10)]
    assert fences(db, "public.oc_k") == {"1": 10}, "the owner's code lowered a key fence"
    assert fences(db, "public.oc_other") == {"1": 100}, "the owner's code lowered a key fence"
    db.rollback()
    assert db.execute("SELECT count(*) FROM fencekit.repairs").fetchone() == (0,)
    db.rollback()


# ------------------------------------------------------------------------------- F3


@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize(("to", "flags"), [(20, ()), (5, ("--allow-lower",))])
def test_a_row_repair_is_refused_outside_the_owners_session(
    db: Conn,
    roles: dict[str, str],
    runner: str,
    to: int,
    flags: tuple[str, ...],
    capsys: Any,
) -> None:
    code, out = _cli(
        capsys, "fence", "set", "oc_t", "--key", "1", "--to", str(to), *flags,
        "--dsn", roles[runner],
    )  # fmt: skip
    assert code == 1, out
    assert "logged in as the owner oc_owner" in out
    assert "Log in as oc_owner" in out
    assert f"SELECT fencekit.set_fence('public.oc_t', '{{1}}', {to}, " in out
    _unchanged(db)
    # The admin's stale write to another table is still refused (its fence was not lowered).
    db.execute("SELECT set_config('fencekit.token', '5', true)")
    with pytest.raises(psycopg.DatabaseError, match="stale"):
        db.execute("UPDATE oc_other SET k = 1 WHERE id = 1")
    db.rollback()


@pytest.mark.parametrize(
    "become", ["SET ROLE oc_owner", "SET SESSION AUTHORIZATION oc_owner"], ids=["role", "auth"]
)
def test_set_role_or_session_authorization_to_the_owner_is_not_the_owners_session(
    db: Conn, roles: dict[str, str], become: str
) -> None:
    """A superuser that becomes the owner by SET ROLE or SET SESSION AUTHORIZATION is still
    refused: the owner's code could go back (RESET ROLE, RESET SESSION AUTHORIZATION). The
    login role comes from pg_stat_activity, which neither changes."""
    db.execute("GRANT fencekit_admin TO oc_owner")
    db.commit()
    with psycopg.connect(roles["dba"]) as conn:
        conn.execute(become)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="logged in as the owner"):
            conn.execute("SELECT fencekit.set_fence('public.oc_t', '{1}', 20)")
    _unchanged(db)


def test_a_row_repair_in_the_owners_own_session_runs_its_code_with_its_rights(
    db: Conn, roles: dict[str, str], capsys: Any
) -> None:
    """Logged in as the owner (a member of fencekit_admin for the audited repair): the repair
    runs; RESET ROLE in the owner's trigger leads back to the owner, nothing more."""
    db.execute("GRANT fencekit_admin TO oc_owner")
    db.commit()
    code, out = _cli(capsys, "fence", "set", "oc_t", "--key", "1", "--to", "20",
                     "--dsn", roles["owner"])  # fmt: skip
    assert code == 0, out
    assert not _superuser(db)
    assert _rows(db) == [(1, 20), (2, 10)]


# ------------------------------------------------------------------------------- F4


GIVE_GENERATED = """
DO $$DECLARE o oid; BEGIN
  FOR o IN SELECT oid FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace
            AND proname LIKE 'oc\\_k\\_%' LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO oc_admin', o::regprocedure);
  END LOOP;
  FOR o IN SELECT oid FROM pg_class WHERE relnamespace = 'fencekit'::regnamespace
            AND relname LIKE 'oc\\_k\\_%' LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO oc_admin', o::regclass);
  END LOOP;
END$$
"""


@pytest.mark.parametrize("runner", ["dba", "admin"])
def test_a_move_from_a_key_fence_to_a_row_fence_is_refused_outside_the_owners_session(
    db: Conn, roles: dict[str, str], runner: str, capsys: Any
) -> None:
    if runner == "admin":
        # As if the admin had protected the table: it owns the generated objects.
        db.execute(GIVE_GENERATED)
        db.commit()
    code, out = _cli(capsys, "move", "oc_k", "--scope", "row", "--dsn", roles[runner])
    assert code == 1, out
    assert "logged in as the owner oc_owner" in out
    assert "nothing was changed" in out
    _unchanged(db)
    db.rollback()
    spec = db.execute(
        "SELECT spec ->> 'scope' FROM fencekit.protected WHERE table_name = 'oc_k'"
    ).fetchone()
    db.rollback()
    assert spec == ("key",)


# ------------------------------------------------------------------------------- F5


@pytest.mark.parametrize("runner", ["dba", "admin"])
@pytest.mark.parametrize(
    "argv",
    [
        ("fences", "public.oc_t"),
        ("fences", "public.oc_t", "--key", "1"),
        ("fence", "set", "public.oc_t", "--key", "1", "--to", "20"),
    ],
    ids=["fences", "fences-key", "fence-set"],
)
def test_a_view_under_the_protected_tables_name_is_never_read(
    db: Conn, roles: dict[str, str], runner: str, argv: tuple[str, ...], capsys: Any
) -> None:
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(VIEW)
    code, out = _cli(capsys, *argv, "--dsn", roles[runner])
    assert code == 1, out
    assert "public.oc_t is not the table protected under that name (a view)" in out
    assert "renamed to public.oc_t_real" in out
    _unchanged(db, "oc_t_real")


def test_a_move_of_a_view_under_the_protected_tables_name_is_refused(
    db: Conn, roles: dict[str, str], capsys: Any
) -> None:
    """The move's script checks the name too (a row -> key move reads every row)."""
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(VIEW)
    code, out = _cli(capsys, "move", "public.oc_t", "--key", "k", "--dsn", roles["dba"])
    assert code == 1, out
    assert "public.oc_t is a view" in out
    _unchanged(db, "oc_t_real")
    # The script itself (fencekit sql move | psql) refuses it too.
    old = FenceSpec(TableName("public", "oc_t"))
    new = FenceSpec(TableName("public", "oc_t"), scope=Scope.KEY, key=("k",))
    with pytest.raises(psycopg.DatabaseError, match="not the table protected under that name"):
        db.execute("".join(s + ";\n" for s in change_statements(old, new)).encode())
    db.rollback()
    _unchanged(db, "oc_t_real")


def test_status_reports_the_rename_not_missing_triggers(
    db: Conn, roles: dict[str, str], capsys: Any
) -> None:
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(VIEW)
    code, out = _cli(capsys, "status", "--dsn", roles["dba"])
    assert code == 1, out
    assert "table public.oc_t was renamed to public.oc_t_real; public.oc_t is now a view" in out
    assert "fencekit rename public.oc_t public.oc_t_real" in out
    assert "[trigger_missing]" not in out
    assert not _superuser(db)
