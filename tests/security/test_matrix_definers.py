"""The attack matrix, privileged side: every definer entry point x role x hostile object x scope.

A function that runs with more rights than its
caller (SECURITY DEFINER in schema fencekit, core or generated; and the admin's repair and
inspection functions, which an admin runs on a user's table) never evaluates code the caller
or the table's owner controls with those rights.

The table owner (see tests/security/_matrix.py) plants code in every place PostgreSQL runs it
on its behalf: a domain CHECK on the key or primary key column's type, a cast from text to its
enum key type, an ``=`` operator on that type (in schema public and its own), BEFORE/AFTER
triggers, a forced row-level security policy, a column DEFAULT. Each calls ``evil.payload``,
which reports (a NOTICE, delivered even when the call fails and rolls back) the role it runs
as, and tries to make the owner a superuser and an admin and to lower every fence.

Each entry point is then called by app, owner and admin on a row, key and table fence of each
hostile kind. A cell fails when the payload ran as a role it may not run as (for fencekit's
functions: anything but the owner and a non-admin caller; for a plain write: anything but the
writer), when a role became superuser or an admin, or when a fence went down. A control test
shows the payload fires and reports when PostgreSQL runs it for the owner.

Which definer functions exist is read from pg_proc: one that has no entry in ``CALLS`` fails
``test_every_definer_function_is_in_the_matrix``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from fencekit.embedded import EmbeddedServer
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements
from tests.security._matrix import MatrixDB, grant_tables, matrix_database

SCOPES = ("row", "key", "table")
KINDS = ("domain", "cast", "operator", "trigger", "policy", "default")
FENCE = 10


@dataclass(frozen=True)
class Target:
    """One hostile table as an entry point sees it."""

    scope: str
    kind: str
    table: str  # unqualified, in schema public
    tag: str
    resource: str
    key: str  # the key text of row 1's key ('' for a table fence)


# Entry point -> SQL calling it on a target (None: it does not apply to that scope). Each
# generated definer trigger function is reached by the writes that fire it.
CALLS: dict[str, Callable[[Target], str | None]] = {
    "claim": lambda t: (
        f"SELECT fencekit.claim('{t.table}'::regclass, "
        f"{'ARRAY[]::text[]' if t.scope == 'table' else 'ARRAY[' + repr('1') + ']'}, 50)"
    ),
    "set_fence": lambda t: (
        f"SELECT fencekit.set_fence('{t.table}'::regclass, "
        f"{'ARRAY[]::text[]' if t.scope == 'table' else 'ARRAY[' + repr('1') + ']'}, 60)"
    ),
    "set_resource_fence": lambda t: (
        None
        if t.scope == "row"
        else f"SELECT fencekit.set_resource_fence('{t.resource}', '{t.key}', 60)"
    ),
    "key_text": lambda t: (
        f"SELECT fencekit.key_text('{t.table}'::regclass, ARRAY['1'])" if t.scope == "key" else None
    ),
    "acquire": lambda t: f"SELECT fencekit.acquire('{t.resource}', 'mx', '1 minute')",
    "renew": lambda t: f"SELECT fencekit.renew('{t.resource}', 'mx', 1, '1 minute')",
    "release": lambda t: f"SELECT fencekit.release('{t.resource}', 'mx', 1)",
    "lease_token": lambda t: f"SELECT fencekit.lease_token('{t.resource}')",
    "advance_fences": lambda t: (
        f"SELECT * FROM fencekit.advance_fences('{t.resource}', ARRAY['{t.key}'], 1, 'accept')"
    ),
    "count_event": lambda t: (
        f"SELECT fencekit.count_event('{t.tag}', '{t.table}'::regclass, 'stale')"
    ),
    "reject": lambda t: (
        f"SELECT fencekit.reject('stale', '{t.tag}', '{t.table}'::regclass, 'x', NULL, NULL, "
        "NULL, 1, 2, NULL)"
    ),
    "lease_mismatch": lambda t: (
        f"SELECT * FROM fencekit.lease_mismatch('{t.resource}', ARRAY['{t.key}'], 1)"
    ),
    "counter_value": lambda t: f"SELECT fencekit.counter_value('{t.tag}', 'stale')",
    "record_unfenced_writer": lambda t: (
        f"SELECT fencekit.record_unfenced_writer('{t.tag}', '{t.table}'::regclass, 1)"
    ),
    # The record's row dated at commit: its deferred trigger, fired here at once.
    "record-then-commit-time": lambda t: (
        f"SELECT fencekit.record_unfenced_writer('{t.tag}', '{t.table}'::regclass, 1);"
        " SET CONSTRAINTS ALL IMMEDIATE"
    ),
    # 51 writers (application names) of the table: the last one past the cap (50), in its
    # overflow row, dated at commit.
    "record-over-the-cap-then-commit-time": lambda t: (
        "DO $$ BEGIN FOR i IN 1..51 LOOP"
        " PERFORM set_config('application_name', 'mx-' || i, true);"
        f" PERFORM fencekit.record_unfenced_writer('{t.tag}', '{t.table}'::regclass, 1);"
        " END LOOP; END $$; SET CONSTRAINTS ALL IMMEDIATE"
    ),
    # In a REPEATABLE READ transaction (REPEATABLE_READ below) a record appends to the log;
    # its commit marker, fired here at once.
    "record-at-repeatable-read-then-commit": lambda t: (
        f"SELECT fencekit.record_unfenced_writer('{t.tag}', '{t.table}'::regclass, 1);"
        " SET CONSTRAINTS ALL IMMEDIATE"
    ),
    "current_fence": lambda t: f"SELECT fencekit.current_fence('{t.resource}', '{t.key}')",
    "max_fence": lambda t: f"SELECT fencekit.max_fence('{t.resource}')",
    "judge_fences": lambda t: (
        f"SELECT fencekit.judge_fences('{t.tag}', '{t.table}'::regclass, 'x', '{t.resource}', "
        f"ARRAY['{t.key}'], 1, 'accept', false)"
    ),
    # Writes (token 50): they fire the generated definer functions <tag>_ins/_upd/_del (key
    # fences) and <tag>_stmt (table fences), and the row fences' invoker triggers beside them.
    "write-insert": lambda t: f"INSERT INTO {t.table} (id, k) VALUES ('2', '1')",
    "write-update": lambda t: f"UPDATE {t.table} SET v = v + 1 WHERE id = '1'",
    "write-delete": lambda t: f"DELETE FROM {t.table} WHERE id = '1'",
    "write-truncate": lambda t: f"TRUNCATE {t.table}",
    # A MERGE that moves row 1 to another partition (key fences' tables are partitioned).
    "write-move": lambda t: (
        f"MERGE INTO {t.table} USING (VALUES (1)) AS s(x) ON {t.table}.id = '1'"
        " WHEN MATCHED THEN UPDATE SET v = v + 1"
        if t.scope == "key"
        else None
    ),
    # Fires the sql_drop event trigger fencekit_forget_dropped (as the installer).
    "drop-table": lambda t: f"DROP TABLE {t.table}",
}
# CALLS entries run in a REPEATABLE READ transaction (the others: READ COMMITTED).
REPEATABLE_READ = {"record-at-repeatable-read-then-commit"}
# Which CALLS entry reaches each SECURITY DEFINER function (generated ones as <tag>_<suffix>).
# count_event, counter_value and lease_mismatch run as their callers: still attacked through
# CALLS, though they are not definers.
DEFINERS = {
    "acquire": "acquire",
    "advance_fences": "advance_fences",
    "claim_fence": "claim",  # reached through fencekit.claim, which runs as the caller
    "current_fence": "current_fence",
    "lease_token": "lease_token",
    "max_fence": "max_fence",
    "reject": "reject",
    "release": "release",
    "renew": "renew",
    "<tag>_ins": "write-insert",
    "<tag>_upd": "write-update",
    "<tag>_del": "write-delete",
    "<tag>_cross_in": "write-move",  # a partitioned key fence's rows crossing partitions
    "<tag>_cross_out": "write-move",
    "<tag>_stmt": "write-update",
    "<tag>_trunc": "write-truncate",  # a row fence's TRUNCATE check (reads every row's fence)
    "judge_fences": "judge_fences",
    "forget_dropped_tables": "drop-table",
    "record_unfenced_writer": "record_unfenced_writer",
    "unfenced_writer_at_commit": "record-then-commit-time",
    "unfenced_overflow_at_commit": "record-over-the-cap-then-commit-time",
    "unfenced_log_commit_marker": "record-at-repeatable-read-then-commit",
}

_PAYLOAD = re.compile(r"fk-payload (\w+) as (\S+)(?: (escalated: .*))?$")


def _spec(scope: str, table: str) -> FenceSpec:
    name = TableName("public", table)
    if scope == "row":
        return FenceSpec(name)
    if scope == "key":
        return FenceSpec(name, scope=Scope.KEY, key=("k",))
    return FenceSpec(name, scope=Scope.TABLE)


def _hostile_objects(m: MatrixDB) -> str:
    owner = m.role("owner")
    return f"""
CREATE TABLE evil.marker (what text, by_role text);
GRANT INSERT ON evil.marker TO PUBLIC;
-- Armed only inside a cell: building the tables as superuser must not run it.
CREATE FUNCTION evil.payload(what text) RETURNS boolean LANGUAGE plpgsql AS $p$
DECLARE
  done text := '';
BEGIN
  IF COALESCE(current_setting('mx.armed', true), '') <> 'on' THEN
    RETURN true;
  END IF;
  BEGIN
    ALTER ROLE {owner} SUPERUSER;
    done := done || ' superuser';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  BEGIN
    GRANT fencekit_admin TO {owner};
    done := done || ' admin';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  BEGIN
    UPDATE fencekit.fences SET fence = 1;
    IF FOUND THEN
      done := done || ' lowered-fences';
    END IF;
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  BEGIN
    INSERT INTO evil.marker VALUES (what, current_user);
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  IF done <> '' THEN
    RAISE NOTICE 'fk-payload % as % escalated:%', what, current_user, done;
  ELSE
    RAISE NOTICE 'fk-payload % as %', what, current_user;
  END IF;
  RETURN true;
END
$p$;
CREATE FUNCTION evil.payload_int(what text) RETURNS int LANGUAGE sql
  AS $p$ SELECT CASE WHEN evil.payload(what) THEN 0 END $p$;
CREATE DOMAIN evil.dkey AS int CHECK (evil.payload('domain'));
CREATE TYPE evil.ekey AS ENUM ('1', '2');
CREATE FUNCTION evil.to_ekey(text) RETURNS evil.ekey LANGUAGE plpgsql AS $p$
BEGIN
  PERFORM evil.payload('cast');
  RETURN (SELECT e FROM unnest(enum_range(NULL::evil.ekey)) e WHERE e::text = $1);
END
$p$;
CREATE CAST (text AS evil.ekey) WITH FUNCTION evil.to_ekey(text) AS ASSIGNMENT;
CREATE TYPE evil.okey AS ENUM ('1', '2');
CREATE FUNCTION evil.op_eq(evil.okey, evil.okey) RETURNS boolean LANGUAGE sql AS
  $p$ SELECT evil.payload('operator') AND $1::text = $2::text $p$;
CREATE OPERATOR evil.= (LEFTARG = evil.okey, RIGHTARG = evil.okey, FUNCTION = evil.op_eq);
CREATE OPERATOR public.= (LEFTARG = evil.okey, RIGHTARG = evil.okey, FUNCTION = evil.op_eq);
CREATE FUNCTION evil.trg() RETURNS trigger LANGUAGE plpgsql AS $p$
BEGIN
  PERFORM evil.payload('trigger');
  IF TG_LEVEL = 'ROW' THEN
    RETURN COALESCE(NEW, OLD);
  END IF;
  RETURN NULL;
END
$p$;
"""


_TYPES = {"domain": "evil.dkey", "cast": "evil.ekey", "operator": "evil.okey"}


def _table_sql(kind: str, table: str) -> str:
    typ = _TYPES.get(kind, "int")
    default = " DEFAULT evil.payload_int('default')" if kind == "default" else " DEFAULT 0"
    if table.startswith("key_"):
        # Partitioned by v: "write-update" and "write-move" move row 1 to the other partition,
        # which fires a partitioned key fence's row checks of crossing rows.
        out = (
            f"CREATE TABLE {table} (id {typ} NOT NULL, k {typ} NOT NULL, v int{default},"
            f" PRIMARY KEY (id, v)) PARTITION BY LIST (v);"
            f"CREATE TABLE {table}_0 PARTITION OF {table} FOR VALUES IN (0);"
            f"CREATE TABLE {table}_rest PARTITION OF {table} DEFAULT;"
        )
    else:
        out = f"CREATE TABLE {table} (id {typ} PRIMARY KEY, k {typ} NOT NULL, v int{default});"
    if kind == "trigger":
        out += (
            f"CREATE TRIGGER evil_b BEFORE INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION evil.trg();"
            f"CREATE TRIGGER evil_a AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION evil.trg();"
            f"CREATE TRIGGER evil_s AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION evil.trg();"
        )
    if kind == "policy":
        out += (
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;"
            f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY;"
            f"CREATE POLICY evil_p ON {table} USING (evil.payload('policy')) "
            "WITH CHECK (evil.payload('policy'));"
        )
    return out


@dataclass
class World:
    m: MatrixDB
    targets: dict[tuple[str, str], Target]
    refused: dict[tuple[str, str], str]  # protect refused the hostile table: why
    notices: list[str]


def _build(m: MatrixDB) -> World:
    conn = m.conn
    conn.execute(f'SET ROLE "{m.role("owner")}"')
    conn.execute(_hostile_objects(m))
    for s in SCOPES:
        for kind in KINDS:
            conn.execute(_table_sql(kind, f"{s}_{kind}"))
    conn.execute("RESET ROLE")
    conn.commit()
    targets: dict[tuple[str, str], Target] = {}
    refused: dict[tuple[str, str], str] = {}
    for s in SCOPES:
        for kind in KINDS:
            table = f"{s}_{kind}"
            try:
                for stmt in protect_statements(_spec(s, table)):
                    conn.execute(stmt.encode())
                conn.commit()
            except psycopg.Error as exc:
                conn.rollback()
                refused[(s, kind)] = str(exc).splitlines()[0]
                continue
            tag, resource = conn.execute(
                "SELECT tag, resource FROM fencekit.protected WHERE table_name = %s", (table,)
            ).fetchone() or ("", "")
            targets[(s, kind)] = Target(s, kind, table, tag, resource, "" if s == "table" else "1")
    grant_tables(m)
    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    for target in targets.values():
        conn.execute(f"INSERT INTO {target.table} (id, k) VALUES ('1', '1')")
    conn.commit()
    world = World(m, targets, refused, [])

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary and diag.message_primary.startswith("fk-payload"):
            world.notices.append(diag.message_primary)

    conn.add_notice_handler(collect)
    return world


@pytest.fixture(scope="module")
def world(pg_server: EmbeddedServer) -> Iterator[World]:
    with matrix_database(pg_server, "mxd") as m:
        yield _build(m)


def _cells() -> list[Any]:
    cells = []
    for entry in CALLS:
        for s in SCOPES:
            for kind in KINDS:
                if CALLS[entry](Target(s, kind, "t", "tag", "r", "")) is None:
                    continue  # the entry point does not apply to this scope
                for role in ("app", "owner", "admin"):
                    cells.append(
                        pytest.param(entry, s, kind, role, id=f"{entry}-{s}-{kind}-{role}")
                    )
    return cells


def _fences(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    return {
        (r, k): int(f)
        for r, k, f in conn.execute("SELECT resource, key, fence FROM fencekit.fences").fetchall()
    }


def _escalation(conn: psycopg.Connection[Any], m: MatrixDB) -> list[str]:
    """What the transaction (still open, as superuser) shows of an escalation."""
    names = list(m.roles.values())
    supers = conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolsuper AND rolname = ANY(%s)", (names,)
    ).fetchall()
    admins = conn.execute(
        "SELECT member::regrole::text FROM pg_auth_members "
        "WHERE roleid = 'fencekit_admin'::regrole AND member::regrole::text = ANY(%s)",
        ([m.role("app"), m.role("owner")],),
    ).fetchall()
    return [f"{r} is superuser" for (r,) in supers] + [f"{r} is an admin" for (r,) in admins]


@pytest.mark.parametrize(("entry", "scope", "kind", "role"), _cells())
def test_definer_entry_point_runs_no_caller_code(
    world: World, entry: str, scope: str, kind: str, role: str
) -> None:
    if (scope, kind) in world.refused:
        pytest.skip(f"protect refuses it: {world.refused[(scope, kind)]}")
    target = world.targets[(scope, kind)]
    call = CALLS[entry](target)
    if call is None:
        pytest.skip(f"{entry} does not apply to a {scope} fence")
    m = world.m
    conn = m.conn
    # An admin that writes a table runs its owner's triggers, policies, defaults and domain
    # checks with the admin's own rights, which include writing fencekit.fences: PostgreSQL's
    # rule for every writer, not fencekit code lending rights. docs/dev/threat-model.md names
    # it as a limit (an admin session must not write tables of owners it does not trust);
    # such a cell still fails if the owner gains a role or the code runs as anyone else.
    own_rights = entry.startswith("write-") and role == "admin"
    conn.rollback()
    before = _fences(conn)
    conn.rollback()
    world.notices.clear()
    problems: list[str] = []
    level = conn.isolation_level
    if entry in REPEATABLE_READ:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        conn.execute("SELECT set_config('mx.armed', 'on', true)")
        if entry.startswith("write-"):
            conn.execute("SELECT set_config('fencekit.token', '50', true)")
        conn.execute(f'SET LOCAL ROLE "{m.role(role)}"')
        try:
            conn.execute("SAVEPOINT call")
            conn.execute(call)
        except psycopg.Error:
            conn.execute("ROLLBACK TO SAVEPOINT call")
        conn.execute("RESET ROLE")
        problems += _escalation(conn, m)
        after = _fences(conn)
        if not own_rights:
            problems += [
                f"fence {key} lowered {before[key]} -> {after[key]}"
                for key in before
                if key in after and after[key] < before[key]
            ]
    finally:
        conn.rollback()
        conn.isolation_level = level
    # The payload may run as the table's owner (its author), as a non-admin caller (its own
    # rights) and, for a plain write, as the writer: never as the installer or an admin that
    # did not choose to write the table.
    allowed = {m.role("owner")}
    if entry.startswith("write-") or role != "admin":
        allowed.add(m.role(role))
    for notice in world.notices:
        match = _PAYLOAD.match(notice)
        assert match is not None, notice
        what, as_role, escalated = match.groups()
        if escalated and own_rights and as_role == m.role(role):
            # Within the admin's own rights (see own_rights): only a new role counts.
            rest = escalated.removeprefix("escalated:").replace("lowered-fences", "").split()
            escalated = f"escalated: {' '.join(rest)}" if rest else None
        if as_role not in allowed or escalated:
            problems.append(f"the owner's {what} ran as {as_role} {escalated or ''}".rstrip())
    assert not problems, f"{entry} on {target.table} as {role}: {problems}"


def test_the_payload_reports_when_it_runs(world: World) -> None:
    """Control: PostgreSQL runs the owner's code when a table is written; the payload
    reports it with the role it ran as (the writer), and can act with that role's rights."""
    m = world.m
    conn = m.conn
    seen: dict[str, set[str]] = {}
    for (_scope, kind), target in world.targets.items():
        conn.rollback()
        world.notices.clear()
        try:
            conn.execute("SELECT set_config('mx.armed', 'on', true)")
            conn.execute("SELECT set_config('fencekit.token', '50', true)")
            conn.execute(f'SET LOCAL ROLE "{m.role("app")}"')
            conn.execute(f"INSERT INTO {target.table} (id, k) VALUES ('2', '1')")
            typ = _TYPES.get(kind, "int")
            conn.execute(f"SELECT count(*) FROM {target.table} WHERE k = '1'::text::{typ}")
        finally:
            conn.rollback()
        for notice in world.notices:
            match = _PAYLOAD.match(notice)
            assert match is not None
            seen.setdefault(match.group(1), set()).add(match.group(2))
    for kind in ("domain", "cast", "trigger", "policy", "default"):
        assert seen.get(kind) == {m.role("app")}, (kind, seen)
    # As superuser (armed), the payload does escalate: the detection can fail.
    conn.rollback()
    world.notices.clear()
    try:
        conn.execute("SELECT set_config('mx.armed', 'on', true)")
        conn.execute("SELECT evil.payload('control')")
        assert _escalation(conn, m) == [
            f"{m.role('owner')} is superuser",
            f"{m.role('owner')} is an admin",
        ]
    finally:
        conn.rollback()
    assert any("escalated: superuser admin" in n for n in world.notices), world.notices


def test_every_definer_function_is_in_the_matrix(world: World) -> None:
    """A new SECURITY DEFINER function fails here until CALLS and DEFINERS reach it."""
    conn = world.m.conn
    conn.rollback()
    tags = {t.tag for t in world.targets.values()}
    names = set()
    for (proname,) in conn.execute(
        "SELECT proname FROM pg_proc WHERE prosecdef AND pronamespace = 'fencekit'::regnamespace"
    ).fetchall():
        for tag in tags:
            if proname.startswith(tag + "_"):
                proname = "<tag>_" + proname[len(tag) + 1 :]
        names.add(proname)
    conn.rollback()
    assert names == set(DEFINERS), (
        f"not in the matrix: {sorted(names - set(DEFINERS))}; "
        f"gone (remove): {sorted(set(DEFINERS) - names)}"
    )
    assert set(DEFINERS.values()) <= set(CALLS)
