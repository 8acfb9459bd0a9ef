"""SQL injection through the names given to the generator.

A DBA protects a table whose name, column name or resource name somebody else chose (a
tenant, an application that creates tables). Whatever the name, ``protect_statements`` must
either refuse it up front (``SpecError``) or protect exactly that table: no other SQL runs,
the canaries (a table, a sequence, the set of roles) are untouched, the registry records the
exact name, stale writes are rejected, and ``unprotect_statements`` removes everything.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from fencekit.spec import FenceSpec, Scope, SpecError, TableName
from fencekit.sqlgen import protect_statements, render_protect, unprotect_statements

NAMES: dict[str, str] = {
    "double_quote": 'x"; DROP TABLE canary; --',
    "single_quote": "o'brien'); DROP TABLE canary; --",
    "semicolon": "a;b",
    "block_comment": "t/* x */; DROP TABLE canary; /*",
    "line_comment": "t -- DROP TABLE canary",
    "backslash": "t\\'; DROP TABLE canary; --\\",
    "unicode": "ünï\u2010cødé 🚀 名前",  # with a unicode hyphen
    "format_specifiers": "t%s%I%L%%",
    "reserved_word": "select",
    "plain_dollars": "$$; DROP TABLE canary; $$",
    "dollar_fn": "t$fn$x",
    "dollar_do": "t$do$x",
    "newline": "t\nx",
}

# (scope, where the hostile name goes)
PLACES = [
    ("row", "table"),
    ("row", "column"),
    ("key", "table"),
    ("key", "column"),
    ("key", "resource"),
    ("table", "table"),
    ("table", "resource"),
]


def _canaries(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    conn.rollback()
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_class WHERE relname = 'canary'), "
        "(SELECT last_value::text || is_called::text FROM canary_seq), "
        "(SELECT count(*) FROM pg_roles), "
        "(SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace), "
        "(SELECT count(*) FROM canary)"
    ).fetchone()
    conn.rollback()
    assert row is not None
    return tuple(row)


def _spec(name: str, scope: str, where: str) -> tuple[FenceSpec, str, str]:
    table = name if where == "table" else "victim"
    column = name if where == "column" else "k"
    kw: dict[str, Any] = {}
    if scope == "key":
        kw["key"] = (column,)
    if scope == "row" and where == "column":
        kw["column"] = name
        column = "k"
    if where == "resource":
        kw["resource"] = name
    return FenceSpec(TableName("public", table), scope=Scope(scope), **kw), table, column


def _protect_and_probe(conn: psycopg.Connection[Any], name: str, scope: str, where: str) -> None:
    try:
        spec, table, column = _spec(name, scope, where)
    except SpecError:
        return  # refused up front: acceptable
    t = sql.Identifier("public", table)
    conn.execute(sql.SQL("CREATE TABLE {} ({} int PRIMARY KEY, v int NOT NULL)").format(
        t, sql.Identifier(column)))  # fmt: skip
    conn.commit()
    before = _canaries(conn)
    try:
        with conn.transaction():
            for stmt in protect_statements(spec):
                conn.execute(stmt.encode())
    finally:
        assert _canaries(conn) == before, f"protect ran other SQL for {name!r}"
    registered = conn.execute(
        "SELECT table_name, resource FROM fencekit.protected WHERE schema_name = 'public'"
    ).fetchone()
    assert registered is not None
    assert registered[0] == table
    if scope != "row":
        assert registered[1] == spec.resource_name
    conn.commit()
    # The protection works on exactly this table.
    ins = sql.SQL("INSERT INTO {} VALUES (1, 0)").format(t)
    upd = sql.SQL("UPDATE {} SET v = v + 1").format(t)
    conn.execute("SELECT set_config('fencekit.token', '10', true)")
    conn.execute(ins)
    conn.commit()
    conn.execute("SELECT set_config('fencekit.token', '5', true)")
    with pytest.raises(psycopg.Error) as info:
        conn.execute(upd)
    conn.rollback()
    assert info.value.sqlstate == "YF001", info.value
    # And unprotect removes every trigger and registry row.
    with conn.transaction():
        for stmt in unprotect_statements(spec):
            conn.execute(stmt.encode())
    left = conn.execute(
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass "
        "AND NOT tgisinternal), (SELECT count(*) FROM fencekit.protected)",
        (t.as_string(conn),),
    ).fetchone()
    assert left == (0, 0)
    conn.execute(sql.SQL("DROP TABLE {}").format(t))
    conn.commit()
    assert _canaries(conn) == before


def _setup(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE canary (x int); INSERT INTO canary VALUES (1);")
    db.execute("CREATE SEQUENCE canary_seq")
    db.commit()


@pytest.mark.parametrize(
    "label",
    list(NAMES),
)
def test_hostile_names_are_protected_exactly(db, label) -> None:
    _setup(db)
    failures = []
    for scope, where in PLACES:
        try:
            _protect_and_probe(db, NAMES[label], scope, where)
        except (AssertionError, psycopg.Error) as exc:
            db.rollback()
            failures.append(f"{scope} fence, name as {where}: {type(exc).__name__}: {exc}")
            # Leave a clean slate for the next place.
            with db.transaction():
                db.execute("DELETE FROM fencekit.protected")
                for (rel,) in db.execute(
                    "SELECT oid::regclass::text FROM pg_class WHERE relnamespace = "
                    "'public'::regnamespace AND relkind = 'r' AND relname <> 'canary'"
                ).fetchall():
                    db.execute(f"DROP TABLE {rel} CASCADE")
    assert not failures, "\n".join(failures)


def test_a_table_name_cannot_run_sql(db) -> None:
    """A 54-byte table name that closes the $fn$ body of the statement-check function, runs a
    statement, and reopens a dollar quote that the name's next occurrence closes again."""
    _setup(db)
    name = "\nBEGIN END$fn$;SELECT nextval('canary_seq');SELECT $fn$"
    spec = FenceSpec(TableName("public", name))
    db.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY, v int)").format(sql.Identifier(name)))
    db.commit()
    with db.transaction():
        for stmt in protect_statements(spec):
            db.execute(stmt.encode())
    called = db.execute("SELECT is_called FROM canary_seq").fetchone()
    db.rollback()
    assert called == (False,), "SQL from the table name ran during protect"


def test_render_protect_script_is_one_transaction_with_exact_names(db) -> None:
    """The psql script form: hostile (but well-formed) names round-trip through the registry."""
    _setup(db)
    name = 'Mixed "Case"; -- /* x */ ünï'
    db.execute(sql.SQL("CREATE TABLE {} (k int PRIMARY KEY)").format(sql.Identifier(name)))
    db.commit()
    script = render_protect(FenceSpec(TableName("public", name), scope=Scope.TABLE))
    assert script.startswith("-- ")
    assert "BEGIN;" in script
    assert script.rstrip().endswith("COMMIT;")
    before = _canaries(db)
    db.autocommit = True
    try:
        db.execute(script.encode())
    finally:
        db.autocommit = False
    assert _canaries(db) == before
    got = db.execute("SELECT table_name FROM fencekit.protected").fetchone()
    db.rollback()
    assert got == (name,)


@pytest.mark.parametrize(
    "text",
    ["a.b.c", '"unterminated', "x y", "t;", "", '""', "s.", ".t", "a\x00b"],
)
def test_table_name_parse_refuses_malformed_names(text) -> None:
    with pytest.raises(SpecError):
        TableName.parse(text)


def test_names_that_truncate_or_hold_nul_are_refused() -> None:
    with pytest.raises(SpecError):
        TableName("public", "x" * 64)
    with pytest.raises(SpecError):
        TableName("public", "é" * 32)  # 64 bytes
    with pytest.raises(SpecError):
        FenceSpec(TableName("public", "t"), column="a\x00b")
    with pytest.raises(SpecError):
        FenceSpec(TableName("public", "t"), scope=Scope.KEY, key=("k",), resource=" ")
