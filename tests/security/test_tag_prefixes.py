"""One protected table's re-protect and unprotect never touch another's objects.

A table's functions and triggers are named by its tag, ``<name>_<10 hex>``; re-protect and
unprotect drop the objects whose names start with it that the template no longer makes. A
table named ``<tag>_x`` has the tag ``<tag>_x_<hash>``, so every name of its objects starts with
the first table's prefix too: the first table's re-protect and unprotect failed on them (its
functions have dependent triggers), and in one inheritance tree they dropped the child's own
protection. Tags are known offline, so any owner whose table a DBA protects could do this.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen.protect import unprotect_statements
from tests.security.conftest import Conn, attempt, protect, write_as


def _objects(db: Conn, tag: str) -> set[str]:
    """The table's functions and triggers (by their names' own prefix)."""
    rows = db.execute(
        "SELECT 'function ' || proname FROM pg_proc"
        " WHERE pronamespace = 'fencekit'::regnamespace AND starts_with(proname, %s)"
        " UNION ALL SELECT 'trigger ' || tgrelid::regclass || ' ' || tgname FROM pg_trigger"
        " WHERE NOT tgisinternal AND starts_with(tgname, %s)",
        (f"{tag}_", f"fencekit_{tag}_"),
    ).fetchall()
    db.rollback()
    return {r[0] for r in rows}


def _spec(schema: str, name: str, scope: str) -> FenceSpec:
    kw = {"key": ("k",)} if scope == "key" else {}
    return FenceSpec(TableName(schema, name), scope=Scope(scope), **kw)


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_a_table_named_after_another_tables_tag_is_left_alone(
    db: Conn, make_role: Callable[..., str], scope: str
) -> None:
    make_role("tp_owner")
    make_role("tp_other")
    db.execute("CREATE SCHEMA tp AUTHORIZATION tp_owner; CREATE SCHEMA tp2 AUTHORIZATION tp_other")
    victim_tag = object_tag("tp", "t")
    other = f"{victim_tag}_x"
    db.execute("SET ROLE tp_owner; CREATE TABLE tp.t (id int PRIMARY KEY, k int NOT NULL)")
    db.execute(
        f'SET ROLE tp_other; CREATE TABLE tp2."{other}" (id int PRIMARY KEY, k int NOT NULL)'
    )
    db.execute("RESET ROLE")
    victim, colliding = _spec("tp", "t", scope), _spec("tp2", other, scope)
    assert colliding.table.name.startswith(f"{victim_tag}_")
    other_tag = object_tag("tp2", other)
    assert other_tag.startswith(f"{victim_tag}_")
    protect(db, victim)
    protect(db, colliding)
    db.commit()
    write_as(db, 10, f'INSERT INTO tp2."{other}" VALUES (1, 1)')
    theirs = _objects(db, other_tag)
    assert theirs

    protect(db, victim)  # re-protect, as status and upgrades prescribe
    db.commit()
    assert _objects(db, other_tag) == theirs
    for stmt in unprotect_statements(victim):
        db.execute(stmt.encode())
    db.commit()
    assert _objects(db, victim_tag) == theirs  # the victim's own are gone, the other's stay
    # And the other table is still fenced.
    attempt(db, "YF001", f'UPDATE tp2."{other}" SET id = id', token=5)


def test_a_child_named_after_its_parents_tag_keeps_its_own_protection(
    db: Conn, make_role: Callable[..., str]
) -> None:
    make_role("tp_owner")
    db.execute("CREATE SCHEMA tp AUTHORIZATION tp_owner")
    parent_tag = object_tag("tp", "t")
    child = f"{parent_tag}_x"
    db.execute(
        "SET ROLE tp_owner; CREATE TABLE tp.t (id int, k int NOT NULL);"
        f' CREATE TABLE tp."{child}" () INHERITS (tp.t); RESET ROLE'
    )
    parent, own = _spec("tp", "t", "table"), _spec("tp", child, "row")
    protect(db, parent)
    protect(db, own)
    db.commit()
    child_tag = object_tag("tp", child)
    write_as(db, 10, f'INSERT INTO tp."{child}" VALUES (1, 1)')
    its_own = _objects(db, child_tag)
    assert {o for o in its_own if o.startswith("function ")}

    protect(db, parent)  # re-protect covers the child again
    db.commit()
    assert _objects(db, child_tag) == its_own
    for stmt in unprotect_statements(parent):
        db.execute(stmt.encode())
    db.commit()
    assert _objects(db, child_tag) == its_own
    attempt(db, "YF001", f'UPDATE tp."{child}" SET k = k', token=5)


def test_a_tables_own_names_are_its_own(db: Conn) -> None:
    # The rule that tells a table's objects from another's holds for every name protect makes.
    db.execute("CREATE TABLE own_names (id int PRIMARY KEY, k int NOT NULL, p int NOT NULL)")
    db.execute(
        "CREATE TABLE own_parts (id int NOT NULL, k int NOT NULL, p int NOT NULL)"
        " PARTITION BY LIST (p); CREATE TABLE own_parts1 PARTITION OF own_parts FOR VALUES IN (1)"
    )
    for table in ("own_names", "own_parts"):
        for scope in ("row", "key", "table"):
            spec = _spec("public", table, scope)
            spec = FenceSpec.from_dict({**spec.as_dict(), "on_missing": "allow"})
            protect(db, spec)
            tag = object_tag("public", table)
            names = db.execute(
                "SELECT proname::text, %s FROM pg_proc"
                " WHERE pronamespace = 'fencekit'::regnamespace"
                " AND starts_with(proname, %s) UNION ALL SELECT tgname::text, %s FROM pg_trigger"
                " WHERE starts_with(tgname, %s)",
                (f"{tag}_", f"{tag}_", f"fencekit_{tag}_", f"fencekit_{tag}_"),
            ).fetchall()
            assert names
            for name, prefix in names:
                ok = db.execute("SELECT fencekit.named_by(%s, %s)", (name, prefix)).fetchone()
                assert ok == (True,), (scope, table, name)
            for stmt in unprotect_statements(spec):
                db.execute(stmt.encode())
    db.rollback()


def test_the_rule_refuses_another_tags_names(db: Conn) -> None:
    tag = object_tag("public", "t")
    other = object_tag("public", f"{tag}_x")
    for name in (f"{other}_ins", f"{other}_cover"):
        row = db.execute("SELECT fencekit.named_by(%s, %s)", (name, f"{tag}_")).fetchone()
        assert row == (False,)
    db.rollback()
