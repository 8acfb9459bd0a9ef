"""Bypass borrowed through someone else's privileges.

``fencekit.bypass`` is judged by the roles of the SESSION (the SET ROLE
role, else the login role), never by ``current_user``. Inside an FK cascade, a SECURITY DEFINER
function or a trigger function owned by an admin, ``current_user`` is that admin; the session
is still the application role's, and the bypass must be refused (YF005) with the protected
table unchanged.

Per scope, a protected child table ``bc`` is owned by an admin (a member of fencekit_admin),
with FKs to parents the application role may write: ON DELETE CASCADE / ON UPDATE CASCADE (to
``bp``) and ON DELETE SET NULL (to ``bp2``). The admin also owns a SECURITY DEFINER function and
a SECURITY DEFINER trigger on another table (``side``), both writing ``bc``. The application
role sets fencekit.bypass=on with a stale token or none and goes through each of them. An admin
session that did SET ROLE to the application role is refused too; an admin session as itself
may bypass, and that is counted ('bypassed').
"""

from __future__ import annotations

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import (
    APP,
    DML,
    FENCE,
    STALE,
    Conn,
    Findings,
    counts,
    fences,
    outcome,
    protect,
)

ADMIN = "sec_admin"

SCHEMA = """
CREATE TABLE bp (id int PRIMARY KEY);
CREATE TABLE bp2 (id int PRIMARY KEY);
CREATE TABLE bc (
  id int PRIMARY KEY,
  grp int NOT NULL,
  v text,
  pid int REFERENCES bp ON DELETE CASCADE ON UPDATE CASCADE,
  nid int REFERENCES bp2 ON DELETE SET NULL
);
CREATE TABLE side (x int);
INSERT INTO bp VALUES (1), (2), (3);
INSERT INTO bp2 VALUES (1), (2);
"""
SEED = "INSERT INTO bc VALUES (1, 1, 'a', 1, 1), (2, 2, 'b', 2, 2), (3, 1, 'c', 3, NULL)"
# After the roles exist: the admin owns bc, a definer function and a definer trigger on side.
ADMIN_OWNS = f"""
ALTER TABLE bc OWNER TO {ADMIN};
ALTER TABLE side OWNER TO {ADMIN};
CREATE FUNCTION admin_touch() RETURNS void LANGUAGE sql SECURITY DEFINER
  SET search_path = public, pg_temp AS $$ UPDATE bc SET v = 'definer' $$;
ALTER FUNCTION admin_touch() OWNER TO {ADMIN};
CREATE FUNCTION admin_side() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = public, pg_temp AS $$ BEGIN UPDATE bc SET v = 'trigger'; RETURN NEW; END $$;
ALTER FUNCTION admin_side() OWNER TO {ADMIN};
CREATE TRIGGER side_writes_bc AFTER INSERT ON side FOR EACH ROW EXECUTE FUNCTION admin_side();
GRANT {APP} TO {ADMIN};  -- an admin session may SET ROLE to the application role
"""

BORROWED = {
    "FK ON DELETE CASCADE into the admin's table": "DELETE FROM bp WHERE id = 1",
    "FK ON UPDATE CASCADE into the admin's table": "UPDATE bp SET id = 100 WHERE id = 2",
    "FK ON DELETE SET NULL into the admin's table": "DELETE FROM bp2 WHERE id = 1",
    "a SECURITY DEFINER function owned by the admin": "SELECT admin_touch()",
    "a SECURITY DEFINER trigger owned by the admin on another table": "INSERT INTO side VALUES (1)",
}
TOKENS = {f"stale token {STALE}": STALE, "no token": None}


def _state(db: Conn) -> tuple[object, ...]:
    db.rollback()
    state = (db.execute("SELECT * FROM bc ORDER BY id").fetchall(), fences(db, "public.bc"))
    db.rollback()
    return state


def _moved(db: Conn, before: dict[str, int], reason: str) -> int:
    return counts(db, "bc").get(reason, 0) - before.get(reason, 0)


def _refused(findings: Findings, db: Conn, label: str, conn: Conn, stmt: str, **kw) -> None:
    before = counts(db, "bc")
    start = _state(db)
    got = outcome(conn, stmt, bypass=True, **kw)
    conn.rollback()
    findings.expect(label, got, "YF005")
    findings.check(label, _state(db) == start, "the protected table or its fences changed")
    bypassed = _moved(db, before, "bypassed")
    findings.check(label, bypassed == 0, f"counted {bypassed} bypassed write(s)")


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_bypass_is_not_lent_by_an_admin(
    db: Conn, make_role, findings: Findings, scope: str
) -> None:
    db.execute(SCHEMA)
    table = TableName("public", "bc")
    protect(
        db,
        {
            "row": FenceSpec(table),
            "key": FenceSpec(table, scope=Scope.KEY, key=("grp",)),
            "table": FenceSpec(table, scope=Scope.TABLE),
        }[scope],
    )
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute(SEED)
    db.commit()
    app_dsn = make_role(APP, DML)
    admin_dsn = make_role(ADMIN, "fencekit_admin")
    db.execute(ADMIN_OWNS)
    db.commit()
    start = _state(db)
    with psycopg.connect(app_dsn) as app, psycopg.connect(admin_dsn) as admin:
        for path, stmt in BORROWED.items():
            for tname, token in TOKENS.items():
                label = f"{scope} fence, app role with bypass=on and {tname}, through {path}"
                _refused(findings, db, label, app, stmt, token=token)
        for tname, token in TOKENS.items():
            _refused(
                findings,
                db,
                f"{scope} fence, admin session after SET ROLE {APP}, bypass=on, {tname}, UPDATE",
                admin,
                "UPDATE bc SET v = 'x'",
                token=token,
                role=APP,
            )
            _refused(
                findings,
                db,
                f"{scope} fence, admin session after SET ROLE {APP}, bypass=on, {tname}, "
                "calling the admin's SECURITY DEFINER function",
                admin,
                "SELECT admin_touch()",
                token=token,
                role=APP,
            )
            _refused(
                findings,
                db,
                f"{scope} fence, superuser session after SET ROLE {APP}, bypass=on, {tname}",
                db,
                "UPDATE bc SET v = 'x'",
                token=token,
                role=APP,
            )
            # Control: the admin's own session may bypass, and it is counted.
            label = f"{scope} fence, admin session as itself, bypass=on, {tname}, UPDATE"
            before = counts(db, "bc")
            got = outcome(admin, "UPDATE bc SET v = 'admin'", token=token, bypass=True)
            admin.rollback()
            if findings.expect(label, got, None):
                moved = _moved(db, before, "bypassed")
                findings.check(label, moved >= 1, "the bypassed write was not counted")
    findings.check(f"{scope} fence, bc after every attack", _state(db) == start, "it changed")
    findings.assert_clean()
