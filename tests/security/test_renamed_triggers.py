"""A trigger of fencekit's is fencekit's by its name and its function together.

Status took any trigger named ``fencekit_*`` that calls a function in schema fencekit for one of
fencekit's own, and re-protect and unprotect found a table's triggers by their names' prefix.
A table owner could rename one of fencekit's triggers so that its name no longer belongs to the
table (``fencekit_<tag>_0123456789_upd``, another tag's shape): re-protect kept it beside the
new one, status did not show it, and unprotect failed on it. And the owner, who owns a row
fence's TRUNCATE check, could put that function on its table under a ``fencekit_`` name that
status never showed. Now a trigger is fencekit's only when both its name and its function are
one protected table's; re-protect and unprotect also drop every trigger that calls one of the
table's functions under a name the template does not make.
"""

from __future__ import annotations

from collections.abc import Callable

from fencekit.catalog import status
from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen.protect import unprotect_statements
from tests.security.conftest import Conn, attempt, protect, write_as

SPEC = FenceSpec(TableName("rt", "t"))


def _setup(db: Conn, make_role: Callable[..., str]) -> str:
    make_role("rt_owner")
    db.execute("CREATE SCHEMA rt AUTHORIZATION rt_owner")
    db.execute("SET ROLE rt_owner; CREATE TABLE rt.t (id int PRIMARY KEY, v text); RESET ROLE")
    protect(db, SPEC)
    db.commit()
    write_as(db, 10, "INSERT INTO rt.t VALUES (1, 'a')")
    return object_tag("rt", "t")


def _kinds(db: Conn) -> set[str]:
    # Table drift only (the database-wide kinds depend on what else the test database holds).
    out = {d.kind.value for t in status(db).tables for d in t.drift}
    db.rollback()
    return out


def test_a_renamed_trigger_of_fencekits_is_reported_and_dropped(
    db: Conn, make_role: Callable[..., str]
) -> None:
    tag = _setup(db, make_role)
    odd = f"fencekit_{tag}_0123456789_upd"
    db.execute(f'SET ROLE rt_owner; ALTER TRIGGER fencekit_{tag}_upd ON rt.t RENAME TO "{odd}"')
    db.execute("RESET ROLE")
    db.commit()
    kinds = _kinds(db)
    assert "trigger_missing" in kinds
    assert kinds & {"foreign_trigger_first", "foreign_trigger_fence_column", "foreign_trigger"}
    protect(db, SPEC)  # the prescribed re-protect drops the renamed one
    db.commit()
    left = db.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", (odd,)).fetchone()
    db.rollback()
    assert left == (0,)
    assert _kinds(db) == set()
    attempt(db, "YF001", "UPDATE rt.t SET v = 'stale'", token=5)
    for stmt in unprotect_statements(SPEC):  # and unprotect works
        db.execute(stmt.encode())
    db.commit()


def test_the_owners_truncate_check_under_fencekits_prefix_is_reported(
    db: Conn, make_role: Callable[..., str]
) -> None:
    tag = _setup(db, make_role)
    db.execute(
        "SET ROLE rt_owner; CREATE TRIGGER fencekit_zz BEFORE UPDATE ON rt.t FOR EACH STATEMENT"
        f" EXECUTE FUNCTION fencekit.{tag}_trunc(); RESET ROLE"
    )
    db.commit()
    assert _kinds(db) & {"foreign_trigger_first", "foreign_trigger"}
    protect(db, SPEC)  # re-protect drops it: it calls one of the table's functions
    db.commit()
    left = db.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'fencekit_zz'").fetchone()
    db.rollback()
    assert left == (0,)
    assert _kinds(db) == set()
