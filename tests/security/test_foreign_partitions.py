"""A foreign table never sits unfenced in a protected tree.

A foreign table's rows live on another server, where no fencekit trigger runs: a write naming
a foreign partition or child of a protected table is judged by nothing (writes through the
root fail: PostgreSQL collects no transition rows from a foreign child). Protect covered the
tree's other members and said nothing; status then prescribed a re-protect that could not help.
Protect now refuses such a tree, and auto-cover refuses a foreign table added to a protected
one, so that it is never there unnoticed.
"""

from __future__ import annotations

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

SPECS = {
    "row": FenceSpec(TableName("public", "ft"), key=()),
    "key": FenceSpec(TableName("public", "ft"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "ft"), scope=Scope.TABLE),
}


def _server(db: Conn) -> None:
    # A wrapper without a handler: a foreign table can be made and attached, never read.
    db.execute(
        "CREATE FOREIGN DATA WRAPPER ft_none; CREATE SERVER ft_srv FOREIGN DATA WRAPPER ft_none"
    )


def _tree(db: Conn, tree: str) -> None:
    if tree == "partitions":
        db.execute(
            "CREATE TABLE ft (id int NOT NULL, k int NOT NULL, p int NOT NULL)"
            " PARTITION BY LIST (p); CREATE TABLE ft1 PARTITION OF ft FOR VALUES IN (1)"
        )
    else:
        db.execute(
            "CREATE TABLE ft (id int NOT NULL, k int NOT NULL, p int NOT NULL);"
            " CREATE TABLE ft1 () INHERITS (ft)"
        )


def _add_foreign(db: Conn, tree: str, *, under: str = "ft") -> None:
    if tree == "partitions":
        db.execute(f"CREATE FOREIGN TABLE ftf PARTITION OF {under} FOR VALUES IN (3) SERVER ft_srv")
    else:
        db.execute(f"CREATE FOREIGN TABLE ftf () INHERITS ({under}) SERVER ft_srv")


def _fencekit_triggers(db: Conn) -> int:
    row = db.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'fencekit\\_%' AND NOT tgisinternal"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("scope", sorted(SPECS))
@pytest.mark.parametrize("tree", ["partitions", "inheritance"])
def test_protect_refuses_a_tree_that_holds_a_foreign_table(db: Conn, scope: str, tree: str) -> None:
    _server(db)
    _tree(db, tree)
    db.execute("CREATE TABLE ft1_sub (LIKE ft)")  # an unrelated table: no effect
    _add_foreign(db, tree)
    db.commit()
    with pytest.raises(psycopg.Error) as e:
        protect(db, SPECS[scope])
    db.rollback()
    assert e.value.sqlstate == "YF000"
    assert "partition or child public.ftf is a foreign table" in str(e.value), e.value
    assert "DETACH PARTITION" in (e.value.diag.message_hint or "")
    # Nothing was changed.
    assert db.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (0,)
    assert _fencekit_triggers(db) == 0
    db.rollback()


@pytest.mark.parametrize("scope", sorted(SPECS))
@pytest.mark.parametrize("tree", ["partitions", "inheritance"])
def test_auto_cover_refuses_a_foreign_table_added_to_a_protected_tree(
    db: Conn, scope: str, tree: str
) -> None:
    _server(db)
    _tree(db, tree)
    protect(db, SPECS[scope])
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.commit()
    with pytest.raises(psycopg.Error) as e:
        _add_foreign(db, tree)
    db.rollback()
    assert e.value.sqlstate == "YF000", e.value
    assert "is a foreign table" in str(e.value)
    # Under a sub-partition or a grandchild too, and by ATTACH / INHERIT.
    if tree == "partitions":
        fence = ", fencekit_fence bigint" if scope == "row" else ""
        db.execute(
            f"CREATE FOREIGN TABLE ftf (id int NOT NULL, k int NOT NULL, p int NOT NULL{fence})"
            " SERVER ft_srv"
        )
        db.commit()
        with pytest.raises(psycopg.Error) as e:
            db.execute("ALTER TABLE ft ATTACH PARTITION ftf FOR VALUES IN (3)")
    else:
        with pytest.raises(psycopg.Error) as e:
            _add_foreign(db, tree, under="ft1")
    db.rollback()
    assert e.value.sqlstate == "YF000", e.value
    # The foreign table is not in the tree.
    row = db.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass('ftf')"
    ).fetchone()
    assert row == (0,)
    db.execute("SELECT fencekit.set_auto_cover(false)")
    db.commit()
