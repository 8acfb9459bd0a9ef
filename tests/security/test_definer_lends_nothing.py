"""A function that runs with more rights than its caller runs none of the
caller's code.

The table's owner (``dl_own``: owns the tables, not an admin) keys them on a domain over int
whose CHECK calls a function that tries to make the owner a superuser and to lower every fence
(each attempt in its own exception block, so whichever the running role may do happens) and
counts each time it runs in a sequence, which a rollback does not undo. A hostile cast into the
domain and a hostile ``=`` on it sit beside it, in the owner's schema first on everyone's
search_path. Then:

- ``fencekit.claim`` (SECURITY DEFINER until now: the CHECK ran as the installer, a superuser)
  is called by the owner, an application role and an admin;
- ``fencekit fences --key`` and ``fencekit fence set --key`` are run by an admin
  (``fencekit_admin``, not a superuser) and by the DBA (a superuser), on the key-fenced table
  and on a row-fenced table whose primary key is of the domain.

After each: the owner is not a superuser, the fences are as the call left them, and the
domain's code never ran (the sequence was never advanced). Each call also does its job: the
key text is the one the key triggers compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, fences, protect

OWNER = "dl_own"
APP = "dl_app"
ADMIN = "dl_admin"

HOSTILE = f"""
CREATE SCHEMA dl AUTHORIZATION {OWNER};
CREATE SEQUENCE dl.ran;
GRANT USAGE ON SCHEMA dl TO PUBLIC;
GRANT USAGE ON SEQUENCE dl.ran TO PUBLIC;
CREATE FUNCTION dl.evil(v int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('dl.armed', true) = 'off' THEN
    RETURN true;  -- the test's own setup
  END IF;
  PERFORM nextval('dl.ran');
  BEGIN EXECUTE 'ALTER ROLE {OWNER} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN UPDATE fencekit.fences SET fence = 1; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN true;
END $$;
CREATE DOMAIN dl.acct AS int CHECK (dl.evil(VALUE));
CREATE FUNCTION dl.to_acct(text) RETURNS dl.acct LANGUAGE sql AS
  $$ SELECT CASE WHEN dl.evil(0) THEN $1::int END $$;
CREATE CAST (text AS dl.acct) WITH FUNCTION dl.to_acct(text);
CREATE FUNCTION dl.eq(dl.acct, dl.acct) RETURNS boolean LANGUAGE sql AS
  $$ SELECT dl.evil(0) AND $1::int OPERATOR(pg_catalog.=) $2::int $$;
CREATE OPERATOR dl.= (LEFTARG = dl.acct, RIGHTARG = dl.acct, FUNCTION = dl.eq);
ALTER FUNCTION dl.evil(int) OWNER TO {OWNER};
ALTER FUNCTION dl.to_acct(text) OWNER TO {OWNER};
ALTER FUNCTION dl.eq(dl.acct, dl.acct) OWNER TO {OWNER};
ALTER DOMAIN dl.acct OWNER TO {OWNER};
ALTER SEQUENCE dl.ran OWNER TO {OWNER};
CREATE TABLE public.dl_ledger (id int PRIMARY KEY, acct dl.acct NOT NULL, v int);
CREATE TABLE public.dl_rows (id dl.acct PRIMARY KEY, v int);
"""


def _ran(db: Conn) -> int:
    db.rollback()
    row = db.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM dl.ran").fetchone()
    db.rollback()
    assert row is not None
    return int(row[0])


def _superuser(db: Conn) -> bool:
    db.rollback()
    row = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone()
    db.rollback()
    assert row is not None
    return bool(row[0])


def _row_fences(db: Conn) -> dict[int, int]:
    db.rollback()
    rows = db.execute("SELECT id, fencekit_fence FROM dl_rows").fetchall()
    db.rollback()
    return {int(i): int(f) for i, f in rows}


@pytest.fixture
def hostile(db: Conn, make_role: Callable[..., str]) -> dict[str, str]:
    """The hostile owner's objects, both tables protected and written under token 10."""
    dsns = {
        OWNER: make_role(OWNER),
        APP: make_role(
            APP, "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public", "fencekit_writer"
        ),
        ADMIN: make_role(ADMIN, "fencekit_admin"),
    }
    db.execute(HOSTILE)
    protect(db, FenceSpec(TableName("public", "dl_ledger"), scope=Scope.KEY, key=("acct",)))
    protect(db, FenceSpec(TableName("public", "dl_rows")))
    for t in ("dl_ledger", "dl_rows"):
        db.execute(f"ALTER TABLE {t} OWNER TO {OWNER}")
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {APP}")
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {ADMIN}")
    # Everyone meets the owner's schema first: its cast and operator are what they resolve.
    db.execute(f"ALTER DATABASE {db.info.dbname} SET search_path = dl, public")
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("SELECT set_config('dl.armed', 'off', true)")
    db.execute("INSERT INTO dl_ledger VALUES (1, 1, 0), (2, 2, 0)")
    db.execute("INSERT INTO dl_rows VALUES (1, 0), (2, 0)")
    db.commit()
    assert _ran(db) == 0
    assert fences(db, "public.dl_ledger") == {"1": 10, "2": 10}
    db.rollback()
    return dsns


def _clean(db: Conn, what: str) -> None:
    assert not _superuser(db), f"{what}: the owner became a superuser"
    assert _ran(db) == 0, f"{what}: the owner's domain code ran"


@pytest.mark.parametrize("caller", [OWNER, APP, ADMIN])
def test_claim_runs_no_domain_check(db: Conn, hostile: dict[str, str], caller: str) -> None:
    with psycopg.connect(hostile[caller], autocommit=True) as conn:
        before = conn.execute("SELECT fencekit.claim('dl_ledger', '{1}', 50)").fetchone()
    assert before == (10,)
    _clean(db, f"claim as {caller}")
    assert fences(db, "public.dl_ledger") == {"1": 50, "2": 10}
    db.rollback()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("runner", [ADMIN, "dba"])
def test_admin_cli_on_a_domain_key_runs_no_domain_check(
    db: Conn, hostile: dict[str, str], dsn: str, runner: str, capsys: Any
) -> None:
    who = dsn if runner == "dba" else hostile[ADMIN]
    code, out = _cli(capsys, "fences", "dl_ledger", "--key", "1", "--json", "--dsn", who)
    assert code == 0, out
    assert '"fence": 10' in out
    _clean(db, f"fences --key as {runner}")
    code, out = _cli(capsys, "fence", "set", "dl_ledger", "--key", "1", "--to", "60", "--dsn", who)
    assert code == 0, out
    _clean(db, f"fence set --key as {runner}")
    assert fences(db, "public.dl_ledger") == {"1": 60, "2": 10}
    db.rollback()


@pytest.mark.parametrize("runner", [ADMIN, "dba"])
def test_admin_cli_on_a_domain_primary_key_runs_no_domain_check(
    db: Conn, hostile: dict[str, str], dsn: str, runner: str, capsys: Any
) -> None:
    who = dsn if runner == "dba" else hostile[ADMIN]
    code, out = _cli(capsys, "fences", "dl_rows", "--key", "1", "--json", "--dsn", who)
    # A row fence's fences are the table's rows: read only in the owner's own session.
    assert code == 1, out
    assert f"logs in as {OWNER}" in out
    _clean(db, f"fences --key on a row fence as {runner}")
    code, out = _cli(capsys, "fence", "set", "dl_rows", "--key", "1", "--to", "60", "--dsn", who)
    _clean(db, f"fence set --key on a row fence as {runner}")
    # Not the owner's own session (the DBA's neither): a row repair writes the table, which
    # runs the owner's code, so it is refused before the table is touched.
    assert code == 1
    assert f"logged in as the owner {OWNER}" in out
    assert _row_fences(db) == {1: 10, 2: 10}


def test_key_text_reads_a_domain_as_its_base_type(db: Conn, hostile: dict[str, str]) -> None:
    """What claim, fences and fence set name a key by: the key triggers' text, through the
    built-in type under the domain; a value the CHECK would refuse names a key no write can."""
    row = db.execute("SELECT fencekit.key_text('dl_ledger', '{0042}')").fetchone()
    assert row == ("42",)
    _clean(db, "key_text")
    db.rollback()


@pytest.mark.parametrize("runner", [ADMIN, "dba"])
def test_admin_cli_runs_no_row_level_security_policy(
    db: Conn, hostile: dict[str, str], dsn: str, runner: str, capsys: Any
) -> None:
    """A policy on the table is the owner's code too: the admin CLI does not read a row-fenced
    table at all outside the owner's session, so the policy never runs as the admin or DBA."""
    db.execute("ALTER TABLE dl_rows ENABLE ROW LEVEL SECURITY")
    db.execute("CREATE POLICY dl_seen ON dl_rows USING (dl.evil(id))")
    db.commit()
    who = dsn if runner == "dba" else hostile[ADMIN]
    code, out = _cli(capsys, "fences", "dl_rows", "--key", "1", "--json", "--dsn", who)
    _clean(db, f"fences on a table with a policy, as {runner}")
    # Refused before the table is read: only the owner's own session reads a row fence.
    assert code == 1, out
    assert f"logs in as {OWNER}" in out
