"""Only the installer and superusers create in schema fencekit.

A member of fencekit_admin is trusted with fencekit's state (fences, the registry), not with
code: a function it could put in schema fencekit might be an overload that wins a call of
fencekit's own SECURITY DEFINER code (the reviewed attack: ``check_key_types(text, oid)`` run as
the superuser that protected the table). So no admin member can create a function there, move
one in, or rename one there, and protect, which creates the table's functions there, refuses an
admin member up front, saying why."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName


@pytest.fixture
def admin(db: psycopg.Connection[Any], make_role: Any) -> str:
    db.execute("CREATE TABLE adm_t (id int PRIMARY KEY, k int NOT NULL)")
    db.commit()
    return str(make_role("sc_admin", "fencekit_admin", "ALL ON adm_t"))


@pytest.mark.parametrize(
    "stmts",
    [
        [
            "CREATE FUNCTION fencekit.check_key_types(tag text, relid oid) RETURNS void "
            "LANGUAGE sql AS 'SELECT'"
        ],
        [
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "ALTER FUNCTION pg_temp.f() SET SCHEMA fencekit",
        ],
        ["CREATE SEQUENCE fencekit.s"],
        ["CREATE TABLE fencekit.t (x int)"],
    ],
    ids=["create-function", "move-function-in", "create-sequence", "create-table"],
)
def test_an_admin_member_creates_nothing_in_schema_fencekit(admin: str, stmts: list[str]) -> None:
    with psycopg.connect(admin) as c:
        for s in stmts[:-1]:
            c.execute(s)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(stmts[-1])


def test_protect_by_an_admin_member_is_refused_before_anything_changes(
    db: psycopg.Connection[Any], admin: str
) -> None:
    spec = FenceSpec(TableName("public", "adm_t"), scope=Scope.KEY, key=("k",))
    first = sqlgen.protect_statements(spec)[0]  # the guard: before anything is changed
    with (
        psycopg.connect(admin) as c,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as err,
    ):
        c.execute(first.encode())
    assert "only the role that installed fencekit and superusers create" in str(err.value)
    row = db.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'adm_t'::regclass AND NOT tgisinternal"
    ).fetchone()
    db.commit()
    assert row == (0,)
