"""Bypass and privileges: only fencekit_admin members may bypass; an application role with DML
rights cannot bypass, disable or drop triggers, write fencekit's tables or counters, or hijack
fencekit's functions through a search_path and operators it controls. Both servers."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from tests.core.helpers import (
    BYPASS_REFUSED,
    MALFORMED,
    MISSING,
    STALE,
    Conn,
    key_fence,
    make_app_role,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    write,
)

pytestmark = pytest.mark.all_servers

DENIED = "42501"  # insufficient_privilege


@pytest.fixture
def fenced(db: Conn) -> Conn:
    """rowt (row fence), keyt (key fence on k), tabt (table fence), all written at 10."""
    db.execute("CREATE TABLE rowt (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE keyt (k int NOT NULL, v text)")
    db.execute("CREATE TABLE tabt (v text)")
    protect(db, "rowt")
    protect(db, "keyt", "key", key=("k",))
    protect(db, "tabt", "table")
    for stmt in (
        "INSERT INTO rowt VALUES (1, 'a')",
        "INSERT INTO keyt VALUES (1, 'a')",
        "INSERT INTO tabt VALUES ('a')",
    ):
        write(db, 10, stmt)
    return db


STALE_WRITES = [
    "UPDATE rowt SET v = 'stale'",
    "DELETE FROM rowt",
    "INSERT INTO keyt VALUES (1, 'stale')",
    "DELETE FROM keyt",
    "INSERT INTO tabt VALUES ('stale')",
]


def test_bypass_works_for_fencekit_admin_members_only(
    fenced: Conn, make_role: Callable[..., str]
) -> None:
    app_dsn = make_app_role(make_role, "sec_app")
    admin_dsn = make_app_role(make_role, "sec_admin", admin=True)
    with psycopg.connect(app_dsn) as app:
        for stmt in STALE_WRITES:
            reject(app, BYPASS_REFUSED, 5, stmt, bypass=True)
            reject(app, BYPASS_REFUSED, None, stmt, bypass=True)
            reject(app, BYPASS_REFUSED, 11, stmt, bypass=True)  # even with a fresh token
        # Session-wide SET is no way around it either.
        app.execute("SET fencekit.bypass = 'on'")
        app.commit()
        reject(app, BYPASS_REFUSED, 5, "UPDATE rowt SET v = 'stale'")
        app.execute("RESET fencekit.bypass")
        app.commit()
    assert rows(fenced, "SELECT v, fencekit_fence FROM rowt") == [("a", 10)]
    assert rejection_count(fenced, "rowt", "bypass_refused") == 7  # 2 statements x 3, + 1
    with psycopg.connect(admin_dsn) as admin:
        write(admin, 5, "UPDATE rowt SET v = 'repaired'", bypass=True)
        write(admin, None, "INSERT INTO keyt VALUES (1, 'repaired')", bypass=True)
        write(admin, 5, "INSERT INTO tabt VALUES ('repaired')", bypass=True)
        # Without the switch an admin is fenced like anyone else.
        reject(admin, STALE, 5, "UPDATE rowt SET v = 'stale'")
    # A bypassed write passes as written: it neither lowers nor raises the fences.
    assert rows(fenced, "SELECT v, fencekit_fence FROM rowt") == [("repaired", 10)]
    assert key_fence(fenced, "public.keyt", "1") == 10
    assert key_fence(fenced, "public.tabt") == 10
    for table in ("rowt", "keyt", "tabt"):
        assert rejection_count(fenced, table, "bypassed") == 1, table


def test_app_role_cannot_disable_or_remove_the_fence(
    fenced: Conn, make_role: Callable[..., str]
) -> None:
    app_dsn = make_app_role(make_role, "sec_app2")
    all_triggers = one(
        fenced,
        "SELECT count(*) FROM pg_trigger "
        "WHERE tgrelid = 'rowt'::regclass AND tgname LIKE 'fencekit%'",
    )
    trigger = one(
        fenced,
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'rowt'::regclass "
        "AND tgname LIKE 'fencekit%upd'",
    )
    function = one(
        fenced,
        "SELECT tgfoid::regprocedure::text FROM pg_trigger WHERE tgname = %s",
        (trigger,),
    )
    attempts = [
        "ALTER TABLE rowt DISABLE TRIGGER ALL",
        "ALTER TABLE rowt DISABLE TRIGGER USER",
        f'ALTER TABLE rowt DISABLE TRIGGER "{trigger}"',
        f'DROP TRIGGER "{trigger}" ON rowt',
        "ALTER TABLE rowt DROP COLUMN fencekit_fence",
        "ALTER TABLE rowt ALTER COLUMN fencekit_fence SET DEFAULT 999",
        f"DROP FUNCTION {function}",
        f"CREATE OR REPLACE FUNCTION {function} RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RETURN NEW; END $$",
        "CREATE FUNCTION fencekit.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "SET session_replication_role = replica",
        "SET ROLE fencekit_admin",
        "GRANT fencekit_admin TO sec_app2",
        "SELECT fencekit.drop_counters(tag) FROM fencekit.protected",
        "SELECT fencekit.create_counters('x')",
    ]
    with psycopg.connect(app_dsn) as app:
        for stmt in attempts:
            app.rollback()
            with pytest.raises(psycopg.Error) as info:
                app.execute(stmt)
            assert info.value.sqlstate in (DENIED, "0LP01"), (stmt, info.value)
        app.rollback()
        reject(app, STALE, 5, "UPDATE rowt SET v = 'still fenced'")
    assert rows(
        fenced,
        "SELECT count(*) FILTER (WHERE tgenabled = 'O') FROM pg_trigger "
        "WHERE tgrelid = 'rowt'::regclass AND tgname LIKE 'fencekit%'",
    ) == [(all_triggers,)]


def test_app_role_cannot_write_fencekit_tables_or_counters(
    fenced: Conn, make_role: Callable[..., str]
) -> None:
    app_dsn = make_app_role(make_role, "sec_app3")
    reject(fenced, STALE, 4, "DELETE FROM keyt")  # one stale count to protect
    tag = one(fenced, "SELECT tag FROM fencekit.protected WHERE table_name = 'keyt'")
    attempts = [
        "UPDATE fencekit.fences SET fence = 1",
        "DELETE FROM fencekit.fences",
        "TRUNCATE fencekit.fences",
        "INSERT INTO fencekit.fences (resource, key, fence) VALUES ('public.keyt', '2', 1)",
        "DELETE FROM fencekit.protected",
        "UPDATE fencekit.protected SET spec = '{}'",
        "UPDATE fencekit.meta SET value = '0'",
        "INSERT INTO fencekit.resources VALUES ('public.keyt', 'evil')",
        f"SELECT setval('fencekit.\"{tag}:stale\"', 1)",
        f'ALTER SEQUENCE fencekit."{tag}:stale" RESTART',
        "CREATE TABLE fencekit.mine (x int)",
    ]
    with psycopg.connect(app_dsn) as app:
        for stmt in attempts:
            app.rollback()
            with pytest.raises(psycopg.Error) as info:
                app.execute(stmt)
            assert info.value.sqlstate == DENIED, (stmt, info.value)
        app.rollback()
        # Only the key fence's own trigger function advances fences; no writer calls it.
        reject(
            app, DENIED, None,
            "SELECT fencekit.advance_fences('public.keyt', ARRAY['1'], 2, 'accept')",
        )  # fmt: skip
        # Writing the fence column with a token never sets anything but the token.
        write(app, 12, "UPDATE rowt SET fencekit_fence = 1")
    assert key_fence(fenced, "public.keyt", "1") == 10
    assert rows(fenced, "SELECT fencekit_fence FROM rowt") == [(12,)]
    assert rejection_count(fenced, "keyt", "stale") == 1


def _evil_schema(conn: Conn, owner: str) -> None:
    """Schema ``evil`` owned by the app role; the app role itself fills it with operators and
    functions that shadow pg_catalog's whenever ``evil`` comes first in search_path."""
    conn.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(sql.Identifier(owner)))
    conn.commit()


def _fill_evil(app: Conn, verdict: bool) -> None:
    lit = "true" if verdict else "false"
    types = ["bigint", "integer", "text", "name"]
    numeric = ("bigint", "integer")
    pairs = [(a, b) for a in types for b in types if (a in numeric) == (b in numeric)]
    ops = ["=", "<>", "<", ">", "<=", ">=", "~", "!~"]
    n = 0
    for left, right in pairs:
        for op in ops:
            n += 1
            fn = f"evil.op{n}"
            app.execute(
                f"CREATE FUNCTION {fn}({left}, {right}) RETURNS boolean "
                f"LANGUAGE sql IMMUTABLE AS 'SELECT {lit}'"
            )
            app.execute(
                f"CREATE OPERATOR evil.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn})"
            )
    # Functions with pg_catalog's names: only an unqualified call could reach them.
    app.execute(
        "CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text "
        "LANGUAGE sql AS $$ SELECT '9223372036854775807' $$"
    )
    app.execute(
        "CREATE FUNCTION evil.pg_has_role(name, text, text) RETURNS boolean "
        "LANGUAGE sql AS 'SELECT true'"
    )
    app.execute("CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE sql AS 'SELECT 1'")
    app.execute(
        "CREATE FUNCTION evil.max(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'"
    )
    app.execute("SET search_path = evil, pg_catalog, public")
    app.commit()


@pytest.mark.parametrize("verdict", [True, False], ids=["ops-say-true", "ops-say-false"])
def test_search_path_and_operators_cannot_hijack_the_fence(
    fenced: Conn, make_role: Callable[..., str], verdict: bool
) -> None:
    role = f"sec_evil_{str(verdict).lower()}"
    app_dsn = make_app_role(make_role, role)
    fenced.execute(f"GRANT TRUNCATE ON rowt, keyt, tabt TO {role}")
    fenced.commit()
    _evil_schema(fenced, role)
    with psycopg.connect(app_dsn) as app:
        _fill_evil(app, verdict)
        # The evil operators are really the ones this session resolves first.
        assert one(app, "SELECT 1::bigint > 2::bigint") is verdict
        for stmt in [*STALE_WRITES, "TRUNCATE rowt", "TRUNCATE keyt", "TRUNCATE tabt"]:
            reject(app, STALE, 5, stmt)
            reject(app, MISSING, None, stmt)
            reject(app, MALFORMED, "5x", stmt)
            reject(app, BYPASS_REFUSED, 5, stmt, bypass=True)
        write(app, 11, "UPDATE rowt SET v = 'fresh', fencekit_fence = 1")
        write(app, 11, "INSERT INTO keyt VALUES (1, 'fresh')")
        write(app, 11, "INSERT INTO tabt VALUES ('fresh')")
    assert rows(fenced, "SELECT v, fencekit_fence FROM rowt") == [("fresh", 11)]
    assert key_fence(fenced, "public.keyt", "1") == 11
    assert key_fence(fenced, "public.tabt") == 11


def test_role_without_table_rights_cannot_raise_a_fence(
    fenced: Conn, make_role: Callable[..., str]
) -> None:
    outsider_dsn = make_role("sec_outsider")  # CONNECT and USAGE on public only
    with psycopg.connect(outsider_dsn) as outsider:
        reject(outsider, DENIED, None, "INSERT INTO keyt VALUES (1, 'no rights')")
        reject(
            outsider,
            DENIED,
            None,
            "SELECT fencekit.advance_fences('public.keyt', ARRAY['1'], "
            "9223372036854775807, 'accept')",
        )
        # Nor forge the rejection counters, nor lock lease rows.
        for call in (
            "SELECT fencekit.count_event('x', 'public.keyt'::regclass, 'stale')",
            "SELECT fencekit.reject('stale', 'x', 0, NULL, NULL, NULL, NULL, 1, 2)",
            "SELECT fencekit.lease_mismatch('billing', ARRAY['1'], 1)",
        ):
            reject(outsider, DENIED, None, call)
    assert key_fence(fenced, "public.keyt", "1") == 10
