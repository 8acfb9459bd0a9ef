"""Issue 23, item 2: a repair lends the table owner's code neither an admin's rights nor the
bypass.

``rr_acct`` (row fence) belongs to ``rr_owner`` (not an admin), who put an AFTER UPDATE trigger
on it. The trigger turns the bypass on and tries to set the fence of every row of another
protected table (``rr_victim``, row fence, owned by the DBA) and every key and table fence in
fencekit.fences to 1, each attempt on its own, and logs the role it ran as and the bypass it
saw. An admin (fencekit_admin, granted the owner's role and, carelessly, DML on the victim) and
the DBA (a superuser) repair a row of ``rr_acct`` with ``fencekit fence set``, raising and
lowering it.

After each repair: the row has its new fence; the victim's fences are untouched; the trigger
ran as the owner with the bypass off. Before: it ran as the admin (or the superuser) with the
bypass on and set the victim's fences to 1.
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
    make_role("rr_owner")
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
    return {"rr_admin": admin}


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
def test_a_row_repair_runs_the_owners_trigger_as_the_owner_without_bypass(
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
    assert code == 0, out
    assert _rows(db, "rr_acct") == {1: to, 2: 10}
    assert _rows(db, "rr_victim") == {1: 10, 2: 10}, "the owner's trigger lowered another table"
    assert fences(db, "public.rr_keyed") == {"1": 10}, "the owner's trigger lowered a key fence"
    log = db.execute("SELECT who, coalesce(bypass, '') FROM rr_log").fetchall()
    db.rollback()
    assert log == [("rr_owner", "")], "the trigger ran with more than the owner's rights"


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


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
def test_a_move_to_a_row_fence_runs_the_owners_trigger_as_the_owner_without_bypass(
    db: Conn, repair: dict[str, str], scope: Scope
) -> None:
    """``fencekit move`` fills the new fence column with an UPDATE of the user's table: the
    owner's trigger runs as the owner, not as the DBA running the move, and without the bypass
    the DBA's session had on."""
    from fencekit.sqlgen import move_statements

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
    db.execute("SELECT set_config('fencekit.bypass', 'on', true)")  # the DBA's own session
    for stmt in move_statements(old, FenceSpec(TableName("public", "rr_moved"))):
        db.execute(stmt.encode())
    db.commit()
    assert _rows(db, "rr_moved") == {1: 30, 2: 30}
    assert _rows(db, "rr_victim") == {1: 10, 2: 10}, "the owner's trigger lowered another table"
    su = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'rr_owner'").fetchone()
    log = db.execute("SELECT DISTINCT who, coalesce(bypass, '') FROM rr_mlog").fetchall()
    db.rollback()
    assert su == (False,), "the move ran the owner's trigger as a superuser"
    assert log == [("rr_owner", "")], "the trigger ran with more than the owner's rights"
