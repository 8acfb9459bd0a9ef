"""auto-cover covers a child or partition that ``CREATE SCHEMA`` creates among its elements:
``CREATE SCHEMA s CREATE TABLE c (...) INHERITS (t)`` and ``... PARTITION OF t``. Before, the
event trigger listened to CREATE TABLE and ALTER TABLE only, so a table created inside CREATE
SCHEMA was written unfenced. For each scope."""

from __future__ import annotations

import pytest

from tests.core.helpers import MISSING, STALE, Conn, protect, reject, write

KW = {"row": {}, "key": {"key": ("k",)}, "table": {}}
DDL = {
    "inherits": "CREATE SCHEMA s CREATE TABLE c (extra int) INHERITS (public.t)",
    "partition": "CREATE SCHEMA s CREATE TABLE c PARTITION OF public.t FOR VALUES IN (2)",
    "partition_then_view": "CREATE SCHEMA s CREATE TABLE c PARTITION OF public.t "
    "FOR VALUES IN (2) CREATE VIEW w AS SELECT 1 AS one",
}


@pytest.mark.parametrize("how", list(DDL))
@pytest.mark.parametrize("scope", list(KW))
def test_auto_cover_fences_a_child_created_by_create_schema(db: Conn, scope: str, how: str) -> None:
    partitioned = how.startswith("partition")
    db.execute(
        "CREATE TABLE t (id int NOT NULL, k int NOT NULL, v int, PRIMARY KEY (id, k))"
        + (" PARTITION BY LIST (k)" if partitioned else "")
    )
    if partitioned:
        db.execute("CREATE TABLE t_1 PARTITION OF t FOR VALUES IN (1)")
    db.commit()
    protect(db, "t", scope, **KW[scope])
    db.execute("SELECT fencekit.set_auto_cover(true)")
    db.execute(DDL[how])
    db.commit()
    write(db, 10, "INSERT INTO s.c (id, k, v) VALUES (1, 2, 0)")
    reject(db, STALE, 9, "UPDATE s.c SET v = 1")
    reject(db, MISSING, None, "DELETE FROM s.c")
    db.execute("SELECT fencekit.set_auto_cover(false)")
    db.commit()
