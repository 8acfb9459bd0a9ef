"""Names a table's owner chose never become SQL when protect covers partitions and children.

The cover function used to copy the root's ``fencekit_<tag>_*`` triggers to each descendant by
reading their definitions back with ``pg_get_triggerdef`` and replacing the root's name with
the child's. An owner that planted a trigger named with fencekit's prefix and holding
`` ON <root> `` (the tag is known offline: it depends only on the table's name), and a child
whose name is SQL, had the replacement land inside the quoted trigger name and close it: the
child's name ran as SQL in the session that ran protect, a superuser's, and the owner made
itself superuser. Every definition the cover function puts on a descendant is now the
generator's own.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

CHILD = "AFTER DELETE ON c.t1 EXECUTE FUNCTION c.f();SELECT c.g()--"


@pytest.mark.parametrize("scope", ["row", "key", "table"])
@pytest.mark.parametrize("tree", ["partitions", "inheritance"])
def test_a_child_named_like_sql_runs_nothing_when_protect_covers_it(
    db: Conn, make_role: Callable[..., str], scope: str, tree: str
) -> None:
    owner_dsn = make_role("cov_owner")
    db.execute("CREATE SCHEMA c AUTHORIZATION cov_owner")
    db.commit()
    tag = object_tag("c", "t")
    planted = f"fencekit_{tag}_x ON c.t y"
    if tree == "partitions":
        table = (
            "CREATE TABLE c.t (id int NOT NULL, k int NOT NULL, p int NOT NULL)"
            " PARTITION BY LIST (p)"
        )
        children = [
            "CREATE TABLE c.t1 PARTITION OF c.t FOR VALUES IN (1)",
            f'CREATE TABLE c."{CHILD}" PARTITION OF c.t FOR VALUES IN (3)',
        ]
    else:
        table = "CREATE TABLE c.t (id int NOT NULL, k int NOT NULL, p int NOT NULL)"
        children = [
            "CREATE TABLE c.t1 () INHERITS (c.t)",
            f'CREATE TABLE c."{CHILD}" () INHERITS (c.t)',
        ]
    with psycopg.connect(owner_dsn) as owner:
        owner.execute(table)
        for stmt in children:
            owner.execute(stmt)
        owner.execute(
            "CREATE FUNCTION c.f() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$"
        )
        # The payload, and the trigger fencekit's next statement expects, so that the old
        # cover function committed.
        owner.execute(
            "CREATE FUNCTION c.g() RETURNS text LANGUAGE plpgsql AS $$ BEGIN"
            " ALTER ROLE cov_owner SUPERUSER;"
            f' CREATE TRIGGER "{planted}" AFTER UPDATE ON c."{CHILD}"'
            " FOR EACH STATEMENT EXECUTE FUNCTION c.f();"
            " RETURN 'ran'; END $$"
        )
        for rel in ("c.t", "c.t1"):
            owner.execute(
                f'CREATE TRIGGER "{planted}" AFTER UPDATE ON {rel}'
                " FOR EACH STATEMENT EXECUTE FUNCTION c.f()"
            )
            owner.execute(f"COMMENT ON TRIGGER \"{planted}\" ON {rel} IS 'z'")
        owner.commit()
    kw = {"key": ("k",)} if scope == "key" else {}
    spec = FenceSpec(TableName("c", "t"), scope=Scope(scope), **kw)
    try:
        protect(db, spec)  # as the superuser: what covers the children
        db.commit()
    except psycopg.Error as e:
        print("PROTECTFAILED", e)
        db.rollback()  # refusing is fine; running the owner's SQL is not
    row = db.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'cov_owner'").fetchone()
    db.rollback()
    assert row == (False,)
    # The planted trigger is gone from the root and the children: its name is fencekit's.
    left = db.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", (planted,)).fetchone()
    db.rollback()
    assert left == (0,)
