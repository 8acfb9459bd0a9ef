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

import psycopg
import pytest

from fencekit.catalog import status
from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, Scope, TableName
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


@pytest.mark.parametrize(
    ("name", "timing"),
    [
        ("fencekit_zz", "BEFORE UPDATE ON rt.t FOR EACH STATEMENT"),
        # Under the table's own prefix, as a row trigger: a TRUNCATE check run per row returns
        # NULL, so every write becomes a no-op.
        ("fencekit_{tag}_zz", "BEFORE UPDATE ON rt.t FOR EACH ROW"),
    ],
)
def test_the_owners_truncate_check_under_fencekits_prefix_is_reported(
    db: Conn, make_role: Callable[..., str], name: str, timing: str
) -> None:
    tag = _setup(db, make_role)
    name = name.format(tag=tag)
    db.execute(
        f"SET ROLE rt_owner; CREATE TRIGGER {name} {timing}"
        f" EXECUTE FUNCTION fencekit.{tag}_trunc(); RESET ROLE"
    )
    db.commit()
    foreign = {"foreign_trigger_first", "foreign_trigger", "foreign_trigger_fence_column"}
    assert _kinds(db) & foreign
    protect(db, SPEC)  # re-protect drops it: it calls one of the table's functions
    db.commit()
    left = db.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", (name,)).fetchone()
    db.rollback()
    assert left == (0,)
    assert _kinds(db) == set()


def test_auto_cover_judges_a_new_child_by_what_its_triggers_call(
    db: Conn, make_role: Callable[..., str]
) -> None:
    # A child that carries a trigger merely named like fencekit's TRUNCATE check (calling the
    # owner's own function) is not covered: auto-cover must cover it, or refuse.
    make_role("rt_owner")
    db.execute("CREATE SCHEMA rt AUTHORIZATION rt_owner")
    db.execute("SET ROLE rt_owner; CREATE TABLE rt.tt (id int, v text); RESET ROLE")
    spec = FenceSpec(TableName("rt", "tt"), scope=Scope.TABLE)
    protect(db, spec)
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.commit()
    tag = object_tag("rt", "tt")
    db.execute(
        "SET ROLE rt_owner; CREATE TABLE rt.tc (LIKE rt.tt);"
        " CREATE FUNCTION rt.noop() RETURNS trigger LANGUAGE plpgsql"
        " AS $$BEGIN RETURN NULL; END$$;"
        f' CREATE TRIGGER "fencekit_{tag}_trunc" BEFORE TRUNCATE ON rt.tc'
        " FOR EACH STATEMENT EXECUTE FUNCTION rt.noop()"
    )
    db.commit()
    refused: psycopg.Error | None = None
    try:
        db.execute("ALTER TABLE rt.tc INHERIT rt.tt")  # as the owner: it may not cover
    except psycopg.Error as e:
        refused = e
    finally:
        db.rollback()
        db.execute("RESET ROLE; SELECT fencekit.set_auto_cover(false)")
        db.commit()
    assert refused is not None
    assert refused.sqlstate == "YF000", refused
