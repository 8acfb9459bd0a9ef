"""A named resource is shared by key fences or by table fences, never both.

A table fence is its resource's key '', which a key fence's keys share: a writer of one table
would advance the other's fence and lock its holder out. Protect refuses the pairing, in either
order, from the spec check of a set of declarations and from the core's registry (so the SQL
script a DBA runs refuses it too).
"""

from __future__ import annotations

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, SpecError, TableName, check_shared_resources
from tests.core.helpers import USAGE, Conn, protect, run_script, unprotect


def _tables(db: Conn) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v int)")
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v int)")
    db.commit()


@pytest.mark.parametrize("first", ["key", "table"])
def test_protect_refuses_a_key_and_a_table_fence_on_one_resource(db: Conn, first: str) -> None:
    _tables(db)
    second = "table" if first == "key" else "key"

    def kw(scope: str) -> dict[str, object]:
        return {"key": ("id",)} if scope == "key" else {}

    protect(db, "a", first, resource="shared", **kw(first))
    with pytest.raises(psycopg.Error) as info:
        protect(db, "b", second, resource="shared", **kw(second))
    assert info.value.sqlstate == USAGE
    assert "cannot be shared by a key fence and a table fence" in str(info.value)
    assert "public.a" in str(info.value)
    rows = db.execute("SELECT table_name FROM fencekit.protected").fetchall()
    db.rollback()
    assert rows == [("a",)]
    # Another resource name is fine, and so is the same scope.
    protect(db, "b", second, resource="other", **kw(second))
    db.execute("CREATE TABLE c (id int PRIMARY KEY, v int)")
    db.commit()
    protect(db, "c", first, resource="shared", **kw(first))


def test_a_named_resource_equal_to_a_tables_default_is_refused(db: Conn) -> None:
    """The default resource of a table fence on public.a is 'public.a'."""
    _tables(db)
    protect(db, "a", "table")
    with pytest.raises(psycopg.Error) as info:
        protect(db, "b", "key", key=("id",), resource="public.a")
    assert info.value.sqlstate == USAGE


def test_moving_the_only_table_of_a_resource_to_another_scope_is_allowed(db: Conn) -> None:
    _tables(db)
    spec = protect(db, "a", "table", resource="shared")
    new = spec.with_changes(scope=Scope.KEY, key=("id",))
    run_script(db, sqlgen.render_move(spec, new))
    got = db.execute("SELECT scope FROM fencekit.protected").fetchone()
    db.rollback()
    assert got == ("key",)
    unprotect(db, new)


def test_the_spec_check_refuses_the_pairing() -> None:
    key = FenceSpec(TableName("public", "a"), scope=Scope.KEY, key=("id",), resource="r")
    table = FenceSpec(TableName("public", "b"), scope=Scope.TABLE, resource="r")
    with pytest.raises(SpecError, match="cannot be shared by the key fence of"):
        check_shared_resources([key, table])
    with pytest.raises(SpecError):
        check_shared_resources([table, key])
    check_shared_resources([key, table.with_changes(resource="s")])
    check_shared_resources([key, key.with_changes(table=TableName("public", "c"))])


def test_declared_fences_refuse_the_pairing() -> None:
    """What alembic autogenerate reads: the declarations of one MetaData, checked together."""
    from sqlalchemy import Column, Integer, MetaData, Table

    from fencekit.declare import declare_fence, declared_fences

    md = MetaData()
    a = Table("a", md, Column("id", Integer, primary_key=True))
    b = Table("b", md, Column("id", Integer, primary_key=True))
    declare_fence(a, scope="key", key=["id"], resource="shared")
    declare_fence(b, scope="table", resource="shared")
    with pytest.raises(SpecError, match="cannot be shared"):
        list(declared_fences(md))
