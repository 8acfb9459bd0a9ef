"""A repair lends the table owner's code neither an admin's rights nor the
bypass.

``rr_acct`` (row fence) belongs to ``rr_owner`` (not an admin), who put an AFTER UPDATE trigger
on it. The trigger turns the bypass on and tries to set the fence of every row of another
protected table (``rr_victim``, row fence, owned by the DBA) and every key and table fence in
fencekit.fences to 1, each attempt on its own, and logs the role it ran as and the bypass it
saw. An admin (fencekit_admin, granted the owner's role and, carelessly, DML on the victim) and
the DBA (a superuser) try to repair a row of ``rr_acct`` with ``fencekit fence set``, raising
and lowering it.

SET ROLE to the owner is no sandbox (the trigger can RESET ROLE back to the admin or the DBA:
tests/security/test_owner_code_in_admin_sessions.py), so the repair of a row runs only in a
session logged in as the table's owner. The admin's and the DBA's are refused before the table
is touched: the row keeps its fence, the victim's fences are untouched, the trigger never ran.
In the owner's own session (the owner made a member of fencekit_admin for the repair) the
trigger runs as the owner with the bypass off. Before that rule it ran as the admin (or the
superuser) with the bypass on and set the victim's fences to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, fences, protect

HOSTILE = """
CREATE TABLE rr_log (who text, bypass text);
CREATE FUNCTION rr_after() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.rr_log VALUES (current_user, current_setting('fencekit.bypass', true));
  PERFORM set_config('fencekit.bypass', 'on', true);
  BEGIN UPDATE public.rr_victim SET fencekit_fence = 1; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN UPDATE fencekit.fences SET fence = 1; EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN NULL;
END $$;
CREATE TRIGGER rr_after AFTER UPDATE ON rr_acct FOR EACH ROW EXECUTE FUNCTION rr_after();
"""


@pytest.fixture
def repair(db: Conn, make_role: Callable[..., str]) -> dict[str, str]:
    owner = make_role("rr_owner")
    admin = make_role("rr_admin", "fencekit_admin", "rr_owner")
    db.execute(
        "CREATE TABLE rr_acct (id int PRIMARY KEY, v int);"
        "CREATE TABLE rr_victim (id int PRIMARY KEY, v int);"
        "CREATE TABLE rr_keyed (id int PRIMARY KEY, k int NOT NULL);"
    )
    protect(db, FenceSpec(TableName("public", "rr_acct")))
    protect(db, FenceSpec(TableName("public", "rr_victim")))
    protect(db, FenceSpec(TableName("public", "rr_keyed"), scope=Scope.KEY, key=("k",)))
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("INSERT INTO rr_acct VALUES (1, 0), (2, 0)")
    db.execute("INSERT INTO rr_victim VALUES (1, 0), (2, 0)")
    db.execute("INSERT INTO rr_keyed VALUES (1, 1)")
    db.commit()
    db.execute(HOSTILE)
    db.execute("ALTER TABLE rr_acct OWNER TO rr_owner; ALTER TABLE rr_log OWNER TO rr_owner")
    db.execute("ALTER FUNCTION rr_after() OWNER TO rr_owner")
    db.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON rr_victim TO rr_admin")
    db.commit()
    return {"rr_admin": admin, "rr_owner": owner}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _rows(db: Conn, table: str) -> dict[int, int]:
    db.rollback()
    got = db.execute(f"SELECT id, fencekit_fence FROM {table}").fetchall()
    db.rollback()
    return {int(i): int(f) for i, f in got}


@pytest.mark.parametrize("runner", ["rr_admin", "dba"])
@pytest.mark.parametrize(("to", "flags"), [(60, ()), (5, ("--allow-lower",))])
def test_a_row_repair_in_another_session_than_the_owners_is_refused_and_runs_no_owner_code(
    db: Conn,
    repair: dict[str, str],
    dsn: str,
    runner: str,
    to: int,
    flags: tuple[str, ...],
    capsys: Any,
) -> None:
    who = dsn if runner == "dba" else repair[runner]
    code, out = _cli(
        capsys, "fence", "set", "rr_acct", "--key", "1", "--to", str(to), *flags, "--dsn", who
    )
    assert code == 1, out
    assert "logged in as the owner rr_owner" in out, out
    assert f"SELECT fencekit.set_fence('public.rr_acct', '{{1}}', {to}, " in out, "no statement"
    assert _rows(db, "rr_acct") == {1: 10, 2: 10}
    assert _rows(db, "rr_victim") == {1: 10, 2: 10}, "the owner's trigger lowered another table"
    assert fences(db, "public.rr_keyed") == {"1": 10}, "the owner's trigger lowered a key fence"
    log = db.execute("SELECT who, coalesce(bypass, '') FROM rr_log").fetchall()
    repairs = db.execute("SELECT count(*) FROM fencekit.repairs").fetchone()
    db.rollback()
    assert log == [], "the owner's trigger ran in an admin's or the DBA's session"
    assert repairs == (0,)


@pytest.mark.parametrize(("to", "flags"), [(60, ()), (5, ("--allow-lower",))])
def test_a_row_repair_runs_in_the_owners_own_session_without_bypass(
    db: Conn,
    repair: dict[str, str],
    to: int,
    flags: tuple[str, ...],
    capsys: Any,
) -> None:
    """The owner logged in as itself (a member of fencekit_admin for the audited repair) runs
    its own trigger with its own rights: nothing to lend."""
    owner = repair["rr_owner"]
    db.execute("GRANT fencekit_admin TO rr_owner")
    db.commit()
    code, out = _cli(
        capsys, "fence", "set", "rr_acct", "--key", "1", "--to", str(to), *flags, "--dsn", owner
    )
    assert code == 0, out
    assert _rows(db, "rr_acct") == {1: to, 2: 10}
    log = db.execute("SELECT who, coalesce(bypass, '') FROM rr_log").fetchall()
    su = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'rr_owner'").fetchone()
    repairs = db.execute("SELECT repaired_by, new_fence FROM fencekit.repairs").fetchall()
    db.rollback()
    assert log == [("rr_owner", "")], "the trigger ran with another role or the bypass on"
    assert su == (False,)
    assert repairs == [("rr_owner", to)]


MOVED_TRIGGER = """
CREATE TABLE rr_mlog (who text, bypass text);
CREATE FUNCTION rr_moved_after() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.rr_mlog VALUES (current_user, current_setting('fencekit.bypass', true));
  BEGIN EXECUTE 'ALTER ROLE rr_owner SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
  PERFORM set_config('fencekit.bypass', 'on', true);
  BEGIN UPDATE public.rr_victim SET fencekit_fence = 1; EXCEPTION WHEN OTHERS THEN NULL; END;
  PERFORM set_config('fencekit.bypass', '', true);  -- the next row logs what the move set
  RETURN NULL;
END $$;
CREATE TRIGGER rr_moved_after AFTER UPDATE ON rr_moved FOR EACH ROW
  EXECUTE FUNCTION rr_moved_after();
"""


def _moved(db: Conn, scope: Scope) -> FenceSpec:
    old = FenceSpec(
        TableName("public", "rr_moved"),
        scope=scope,
        key=("k",) if scope is Scope.KEY else (),
    )
    db.execute("CREATE TABLE rr_moved (id int PRIMARY KEY, k int NOT NULL)")
    protect(db, old)
    db.execute("SELECT set_config('fencekit.token', '30', true)")
    db.execute("INSERT INTO rr_moved VALUES (1, 1), (2, 2)")
    db.commit()
    db.execute(MOVED_TRIGGER)
    db.execute("ALTER TABLE rr_moved OWNER TO rr_owner; ALTER TABLE rr_mlog OWNER TO rr_owner")
    db.execute("ALTER FUNCTION rr_moved_after() OWNER TO rr_owner")
    db.commit()
    return old


def _moved_state(db: Conn) -> tuple[Any, ...]:
    db.rollback()
    su = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'rr_owner'").fetchone()
    log = db.execute("SELECT DISTINCT who, coalesce(bypass, '') FROM rr_mlog").fetchall()
    spec = db.execute(
        "SELECT spec ->> 'scope' FROM fencekit.protected WHERE table_name = 'rr_moved'"
    ).fetchone()
    db.rollback()
    return su, log, spec


def test_a_move_from_a_key_fence_to_a_row_fence_is_refused_outside_the_owners_session(
    db: Conn, repair: dict[str, str]
) -> None:
    """Key -> row fills the new fence column with an UPDATE (each row its key's fence), which
    runs the owner's trigger: refused in the DBA's session (bypass on or not), rolled back
    whole, the trigger never ran, the key fence still in force."""
    import psycopg

    from fencekit.sqlgen import change_statements

    old = _moved(db, Scope.KEY)
    db.execute("SELECT set_config('fencekit.bypass', 'on', true)")  # the DBA's own session
    script = "".join(s + ";\n" for s in change_statements(old, FenceSpec(old.table)))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="logged in as the owner"):
        db.execute(script.encode())
    db.rollback()
    assert _moved_state(db) == ((False,), [], ("key",))
    assert _rows(db, "rr_victim") == {1: 10, 2: 10}, "the owner's trigger lowered another table"
    assert fences(db, "public.rr_moved") == {"1": 30, "2": 30}


def test_a_move_from_a_table_fence_to_a_row_fence_runs_no_owner_code(
    db: Conn, repair: dict[str, str]
) -> None:
    """Table -> row gives every row the table fence without writing the table (the column is
    added with it as a constant default): the DBA may move it, and the owner's trigger does
    not run at all."""
    from fencekit.sqlgen import change_statements

    old = _moved(db, Scope.TABLE)
    db.execute("SELECT set_config('fencekit.bypass', 'on', true)")  # the DBA's own session
    for stmt in change_statements(old, FenceSpec(TableName("public", "rr_moved"))):
        db.execute(stmt.encode())
    db.commit()
    assert _rows(db, "rr_moved") == {1: 30, 2: 30}
    assert _rows(db, "rr_victim") == {1: 10, 2: 10}, "the owner's trigger lowered another table"
    assert _moved_state(db) == ((False,), [], ("row",))
    default = db.execute(
        "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a "
        "ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
        "WHERE d.adrelid = 'rr_moved'::regclass AND a.attname = 'fencekit_fence'"
    ).fetchone()
    db.rollback()
    assert default is not None
    assert "fencekit.token" in default[0], "protect's default is gone"


def test_a_move_to_a_row_fence_runs_in_the_owners_own_session_without_bypass(
    db: Conn, repair: dict[str, str]
) -> None:
    """Logged in as the owner (a member of fencekit_admin, owning the table's generated
    objects), key -> row fills the column: the owner's trigger runs as the owner, bypass off."""
    import psycopg

    from fencekit.sqlgen import change_statements

    old = _moved(db, Scope.KEY)
    owner = repair["rr_owner"]
    db.execute("GRANT fencekit_admin TO rr_owner")
    # The move creates the row fence's functions in schema fencekit (docs/security.md)
    db.execute("GRANT CREATE ON SCHEMA fencekit TO rr_owner")
    db.execute(
        "DO $$DECLARE f regprocedure; BEGIN FOR f IN SELECT oid FROM pg_proc WHERE pronamespace "
        "= 'fencekit'::regnamespace AND proname LIKE 'rr\\_moved\\_%' LOOP EXECUTE format("
        "'ALTER FUNCTION %s OWNER TO rr_owner', f); END LOOP; END$$"
    )
    db.execute(
        "DO $$DECLARE s regclass; BEGIN FOR s IN SELECT oid FROM pg_class WHERE relnamespace "
        "= 'fencekit'::regnamespace AND relname LIKE 'rr\\_moved\\_%' LOOP EXECUTE format("
        "'ALTER SEQUENCE %s OWNER TO rr_owner', s); END LOOP; END$$"
    )
    db.commit()
    with psycopg.connect(owner) as conn:
        conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
        for stmt in change_statements(old, FenceSpec(TableName("public", "rr_moved"))):
            conn.execute(stmt.encode())
        conn.commit()
    assert _rows(db, "rr_moved") == {1: 30, 2: 30}
    assert _moved_state(db) == ((False,), [("rr_owner", "")], ("row",))
