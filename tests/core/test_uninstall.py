"""Core uninstall: refused while a table is protected, complete once none is."""

from __future__ import annotations

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, TableName
from tests.core.helpers import Conn


def _uninstall(db: Conn) -> None:
    for stmt in sqlgen.uninstall_statements():
        db.execute(stmt)


def test_uninstall_refuses_while_a_table_is_protected(db: Conn) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for stmt in sqlgen.protect_statements(FenceSpec(TableName("public", "t"))):
        db.execute(stmt)
    db.commit()
    with pytest.raises(psycopg.DatabaseError) as info:
        _uninstall(db)
    assert info.value.sqlstate == "YF000"
    db.rollback()
    assert db.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (1,)


def test_uninstall_removes_the_schema_once_nothing_is_protected(db: Conn) -> None:
    spec = FenceSpec(TableName("public", "t"))
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for stmt in sqlgen.protect_statements(spec):
        db.execute(stmt)
    for stmt in sqlgen.unprotect_statements(spec):
        db.execute(stmt)
    _uninstall(db)
    db.commit()
    assert db.execute("SELECT to_regnamespace('fencekit')").fetchone() == (None,)
    # The table is back to what it was, and installing again works.
    db.execute("INSERT INTO t VALUES (1)")
    db.execute(sqlgen.render_install().replace("BEGIN;", "").replace("COMMIT;", ""))
    db.commit()
    assert db.execute("SELECT value FROM fencekit.meta WHERE key = 'core_version'").fetchone() == (
        str(sqlgen.CORE_VERSION),
    )
