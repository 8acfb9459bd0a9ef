"""With auto-cover on, DDL that has nothing to do with a protected table
works for every role; only a new child or partition of a protected table that its creator
cannot fence fails, with fencekit's error and its hint.

For each scope (row, key, table) a protected table ``ac_<scope>`` (partitioned, so that a
partition can be made) and auto-cover on. The application role (DML and fencekit_writer, may
create tables in its own schema) and the table's owner (not an admin) then:

- create a temporary table, and a table in their own schema: both work (before: "permission
  denied for function <tag>_cover" for every one of them);
- alter an unrelated table and the protected table itself (a new column): both work;
- the owner creates a partition of its protected table: refused with YF000 and the hint (row
  fences and partitioned key fences: PostgreSQL's own 42501, cloning the row triggers before
  any event trigger runs), and
  the partition does not exist (a partition nobody fences is never left behind);
- the superuser creating one gets it covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

SCOPES = {
    "row": FenceSpec(TableName("public", "ac_row"), key=()),
    "key": FenceSpec(TableName("public", "ac_key"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "ac_table"), scope=Scope.TABLE),
}


@pytest.fixture
def auto_cover(db: Conn, make_role: Callable[..., str]) -> Iterator[dict[str, str]]:
    roles = {
        "ac_app": make_role("ac_app", "fencekit_writer"),
        "ac_owner": make_role("ac_owner"),
    }
    for spec in SCOPES.values():
        name = spec.table.name
        db.execute(
            f"CREATE TABLE {name} (id int, k int NOT NULL, v int, PRIMARY KEY (id, k)) "
            "PARTITION BY LIST (k)"
        )
        db.execute(f"CREATE TABLE {name}_1 PARTITION OF {name} FOR VALUES IN (1)")
        protect(db, spec)
        db.execute(f"ALTER TABLE {name} OWNER TO ac_owner")
        db.execute(f"ALTER TABLE {name}_1 OWNER TO ac_owner")
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {name} TO ac_app")
    for role in roles:
        db.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    db.execute("GRANT CREATE ON SCHEMA public TO ac_owner")
    db.execute("CREATE TABLE ac_unrelated (a int)")
    db.execute("ALTER TABLE ac_unrelated OWNER TO ac_owner")
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.commit()
    yield roles
    db.rollback()
    db.execute("SELECT fencekit.set_auto_cover(false)")
    db.commit()


def _ok(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn) as conn:
        for stmt in statements:
            conn.execute(stmt)
        conn.commit()


@pytest.mark.parametrize("role", ["ac_app", "ac_owner"])
def test_unrelated_ddl_works_for_every_role(auto_cover: dict[str, str], role: str) -> None:
    _ok(auto_cover[role], "CREATE TEMP TABLE scratch (a int)")
    _ok(auto_cover[role], f"CREATE TABLE {role}.mine (a int)", f"ALTER TABLE {role}.mine ADD b int")


@pytest.mark.parametrize("scope", SCOPES)
def test_the_owner_alters_its_tables_and_cannot_add_an_unfenced_partition(
    db: Conn, auto_cover: dict[str, str], scope: str
) -> None:
    name = SCOPES[scope].table.name
    owner = auto_cover["ac_owner"]
    _ok(owner, "ALTER TABLE ac_unrelated ADD b int")
    _ok(owner, f"ALTER TABLE {name} ADD extra int")  # its protected table: nothing to cover
    with psycopg.connect(owner) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"CREATE TABLE {name}_2 PARTITION OF {name} FOR VALUES IN (2)")
        if scope in ("row", "key"):
            # PostgreSQL clones row triggers (a row fence's; a partitioned key fence's checks of
            # rows crossing partitions) to a new partition itself, before any event trigger
            # runs, and refuses a role that may not execute their functions.
            assert info.value.sqlstate == "42501", info.value
        else:
            assert info.value.sqlstate == "YF000", info.value
            assert "new partition or child" in str(info.value)
            assert info.value.diag.message_hint is not None
            assert "auto-cover" in info.value.diag.message_hint
    row = db.execute("SELECT to_regclass(%s)", (f"{name}_2",)).fetchone()
    assert row == (None,)
    db.rollback()
    # The superuser's new partition is covered at once.
    db.execute(f"CREATE TABLE {name}_3 PARTITION OF {name} FOR VALUES IN (3)")
    db.commit()
    row = db.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'fencekit%%'",
        (f"{name}_3",),
    ).fetchone()
    assert row is not None
    assert row[0] > 0
    db.rollback()
