"""A forgotten grant: an application role with DML rights only writes protected tables.

Writing a protected table needs NO fencekit grant. A role that may write
the table is fenced like any other writer: a stale token is rejected with YF001 (not a bare
42501 "permission denied for function ..."), a missing token with YF003, both counted in
``fencekit.rejections``; a fresh token writes. The same holds for the table's owner.

Every write path a client or the database itself can take is tried, for each scope: INSERT,
INSERT ... ON CONFLICT DO UPDATE, UPDATE, UPDATE ... FROM, DELETE, DELETE ... USING, MERGE
(update, delete, insert), COPY FROM STDIN, writable CTEs, an updatable view, and FK actions
(ON DELETE CASCADE, ON UPDATE CASCADE, ON DELETE SET NULL) fired by a write to a parent table.
Partitions and inheritance children are in test_children.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import (
    APP,
    DML,
    FENCE,
    FRESH,
    STALE,
    Conn,
    Findings,
    counts,
    fences,
    outcome,
    protect,
)

SCHEMA = """
CREATE TABLE par (id int PRIMARY KEY);
CREATE TABLE par2 (id int PRIMARY KEY);
CREATE TABLE w (
  id int PRIMARY KEY,
  k int NOT NULL,
  v text,
  pid int REFERENCES par ON DELETE CASCADE ON UPDATE CASCADE,
  nid int REFERENCES par2 ON DELETE SET NULL
);
CREATE VIEW w_view AS SELECT id, k, v FROM w;
INSERT INTO par VALUES (1), (2), (3);
INSERT INTO par2 VALUES (1), (2);
"""
# Row 1 (key 1) is what every path writes; keys 1 and 2 and the table are fenced at FENCE.
SEED = "INSERT INTO w VALUES (1, 1, 'a', 1, 1), (2, 2, 'b', 2, 2), (3, 1, 'c', 3, NULL)"


@dataclass(frozen=True)
class Path:
    name: str
    stmt: str
    # Writes only a new row: a row fence has nothing to compare a stale token with.
    new_row_only: bool = False
    copy_rows: tuple[str, ...] = ()


PATHS = [
    Path("INSERT", "INSERT INTO w (id, k, v) VALUES (10, 1, 'new')", new_row_only=True),
    Path(
        "INSERT ON CONFLICT DO UPDATE",
        "INSERT INTO w (id, k, v) VALUES (1, 1, 'up') "
        "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
    ),
    Path("UPDATE", "UPDATE w SET v = 'u' WHERE id = 1"),
    Path("UPDATE moving the key", "UPDATE w SET k = 2 WHERE id = 1"),
    Path(
        "UPDATE FROM",
        "UPDATE w SET v = s.v FROM (VALUES (1, 'uf')) AS s(id, v) WHERE w.id = s.id",
    ),
    Path("DELETE", "DELETE FROM w WHERE id = 1"),
    Path("DELETE USING", "DELETE FROM w USING (VALUES (1)) AS s(id) WHERE w.id = s.id"),
    Path(
        "MERGE UPDATE",
        "MERGE INTO w USING (VALUES (1, 'm')) AS s(id, v) ON w.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = s.v",
    ),
    Path(
        "MERGE DELETE",
        "MERGE INTO w USING (VALUES (1)) AS s(id) ON w.id = s.id WHEN MATCHED THEN DELETE",
    ),
    Path(
        "MERGE INSERT",
        "MERGE INTO w USING (VALUES (10, 1, 'mi')) AS s(id, k, v) ON w.id = s.id "
        "WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (s.id, s.k, s.v)",
        new_row_only=True,
    ),
    Path(
        "COPY FROM STDIN",
        "COPY w (id, k, v) FROM STDIN",
        new_row_only=True,
        copy_rows=("10\t1\tcopied",),
    ),
    Path(
        "writable CTE UPDATE",
        "WITH u AS (UPDATE w SET v = 'cte' WHERE id = 1 RETURNING id) SELECT count(*) FROM u",
    ),
    Path(
        "writable CTE DELETE",
        "WITH d AS (DELETE FROM w WHERE id = 1 RETURNING id) SELECT count(*) FROM d",
    ),
    Path(
        "writable CTE INSERT",
        "WITH i AS (INSERT INTO w (id, k, v) VALUES (10, 1, 'ci') RETURNING id) "
        "SELECT count(*) FROM i",
        new_row_only=True,
    ),
    Path("updatable view UPDATE", "UPDATE w_view SET v = 'view' WHERE id = 1"),
    Path("updatable view DELETE", "DELETE FROM w_view WHERE id = 1"),
    Path(
        "updatable view INSERT",
        "INSERT INTO w_view (id, k, v) VALUES (10, 1, 'vi')",
        new_row_only=True,
    ),
    Path("FK ON DELETE CASCADE from par", "DELETE FROM par WHERE id = 1"),
    Path("FK ON UPDATE CASCADE from par", "UPDATE par SET id = 100 WHERE id = 1"),
    Path("FK ON DELETE SET NULL from par2", "DELETE FROM par2 WHERE id = 1"),
]

SPECS = {
    "row": FenceSpec(TableName("public", "w")),
    "key": FenceSpec(TableName("public", "w"), scope=Scope.KEY, key=("k",)),
    "table": FenceSpec(TableName("public", "w"), scope=Scope.TABLE),
}


def _state(db: Conn) -> tuple[object, ...]:
    db.rollback()
    state = (
        db.execute("SELECT * FROM w ORDER BY id").fetchall(),
        db.execute("SELECT * FROM par ORDER BY id").fetchall(),
        db.execute("SELECT * FROM par2 ORDER BY id").fetchall(),
        fences(db, "public.w"),
    )
    db.rollback()
    return state


def _moved(before: dict[str, int], after: dict[str, int], reason: str) -> int:
    return after.get(reason, 0) - before.get(reason, 0)


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_dml_only_role_is_fenced_not_denied(
    db: Conn, make_role, findings: Findings, scope: str
) -> None:
    db.execute(SCHEMA)
    protect(db, SPECS[scope])
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute(SEED)
    db.commit()
    start = _state(db)
    app_dsn = make_role(APP, DML)  # after the tables: ALL TABLES covers them and the view
    with psycopg.connect(app_dsn) as app:
        for who, conn in (("the app role (DML only)", app), ("the owner", db)):
            for path in PATHS:
                if "MERGE" in path.name and db.info.server_version < 150000:
                    continue  # MERGE arrived in PostgreSQL 15
                label = f"{scope} fence, {path.name}, as {who}"
                if not (scope == "row" and path.new_row_only):
                    before = counts(db, "w")
                    got = outcome(conn, path.stmt, token=STALE, copy_rows=path.copy_rows)
                    if findings.expect(f"{label}, stale token {STALE}", got, "YF001"):
                        moved = _moved(before, counts(db, "w"), "stale")
                        findings.check(
                            f"{label}, stale token {STALE}",
                            moved == 1,
                            f"the 'stale' counter moved by {moved}, not 1",
                        )
                before = counts(db, "w")
                got = outcome(conn, path.stmt, copy_rows=path.copy_rows)
                if findings.expect(f"{label}, no token", got, "YF003"):
                    moved = _moved(before, counts(db, "w"), "missing")
                    findings.check(
                        f"{label}, no token",
                        moved == 1,
                        f"the 'missing' counter moved by {moved}, not 1",
                    )
                got = outcome(conn, path.stmt, token=FRESH, copy_rows=path.copy_rows)
                findings.expect(f"{label}, fresh token {FRESH}", got, None)
                conn.rollback()  # keep the seed for the next path
    findings.check("the table after every attack", _state(db) == start, "it changed")
    findings.assert_clean()


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_admin_member_owning_the_table_protects_it(db: Conn, make_role, scope: str) -> None:
    """A migration role that owns the table (not a superuser) can protect it once it may create
    in schema fencekit (as the role that installed fencekit does), and the fence then holds for
    an application role with DML only. Membership of fencekit_admin alone is not enough
    (tests/security/test_schema_fencekit_create.py)."""
    from fencekit.sqlgen import protect_statements

    owner_dsn = make_role("sec_migrator", "fencekit_admin")
    app_dsn = make_role(
        "sec_plain_app", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"
    )
    db.execute("CREATE TABLE owned (id int PRIMARY KEY, k int NOT NULL, v int)")
    db.execute("ALTER TABLE owned OWNER TO sec_migrator")
    db.execute("GRANT CREATE ON SCHEMA fencekit TO sec_migrator")
    db.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON owned TO sec_plain_app")
    db.commit()
    spec = FenceSpec(
        TableName("public", "owned"),
        scope=Scope(scope),
        key=("k",) if scope == "key" else (),
    )
    with psycopg.connect(owner_dsn) as owner:
        assert owner.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False,)
        for stmt in protect_statements(spec):
            owner.execute(stmt.encode())
        owner.commit()
    with psycopg.connect(app_dsn) as app:
        app.execute("SELECT set_config('fencekit.token', '20', true)")
        app.execute("INSERT INTO owned VALUES (1, 1, 0)")
        app.commit()
        app.execute("SELECT set_config('fencekit.token', '10', true)")
        with pytest.raises(psycopg.Error) as info:
            app.execute("UPDATE owned SET v = 1 WHERE id = 1")
        assert info.value.sqlstate == "YF001", info.value
        app.rollback()
        app.execute("SELECT set_config('fencekit.token', '21', true)")
        app.execute("UPDATE owned SET v = 2 WHERE id = 1")
        app.commit()
    assert db.execute("SELECT v FROM owned").fetchone() == (2,)
    db.rollback()
