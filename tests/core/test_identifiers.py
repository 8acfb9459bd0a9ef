"""Hostile identifiers: mixed case, spaces, quotes, reserved words, unicode, 63-byte names and
long names sharing a prefix give correct, collision-free SQL that parses and runs."""

from __future__ import annotations

from typing import Any

import pglast
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencekit import sqlgen
from fencekit.ident import object_tag, quote_ident
from fencekit.spec import DEFAULT_COLUMN, FenceSpec, Scope, TableName
from tests.core.helpers import STALE, Conn, detail, one, reject, rows, run_script, write

RESERVED = ["select", "user", "table", "order", "from", "end", "check", "Default", "ALL"]
ALPHABET = st.sampled_from([*list("abcXYZ019_ $-.'\""), "é", "ß", "Ω", "中", "文", "🦀", "\t"])


def _fits(name: str) -> bool:
    return 0 < len(name.encode()) <= 63


def _sixty_three_bytes(prefix: str) -> str:
    """Pad to exactly 63 bytes: PostgreSQL's limit, where truncation would start."""
    pad = 63 - len(prefix.encode())
    return prefix + "x" * pad


names = st.one_of(
    st.text(ALPHABET, min_size=1, max_size=20),
    st.sampled_from(RESERVED),
    st.text(ALPHABET, min_size=1, max_size=8).map(_sixty_three_bytes),
).filter(_fits)
# Schemas: not one that exists already, nor the reserved pg_ prefix.
schemas = names.filter(
    lambda s: s not in ("public", "fencekit", "information_schema") and not s.startswith("pg_")
)


@st.composite
def specs(draw: st.DrawFn) -> tuple[FenceSpec, str, str]:
    """A spec on a hostile table with hostile key, value and fence column names."""
    schema, table = draw(schemas), draw(names)
    key, value, fence_col = draw(st.lists(names, min_size=3, max_size=3, unique=True))
    scope = draw(st.sampled_from(list(Scope)))
    spec = FenceSpec(
        TableName(schema, table),
        scope=scope,
        key=(key,) if scope is Scope.KEY else (),
        column=fence_col if scope is Scope.ROW else DEFAULT_COLUMN,
        # A resource name must not be blank (SpecError); any other hostile text is fair game.
        resource=draw(st.none() | names.filter(str.strip)) if scope is not Scope.ROW else None,
    )
    return spec, key, value


def test_table_names_round_trip_through_their_sql() -> None:
    @given(schemas, names)
    @settings(max_examples=200, deadline=None, database=None)
    def check(schema: str, table: str) -> None:
        name = TableName(schema, table)
        assert TableName.parse(name.sql) == name

    check()


def test_object_tags_never_collide_and_stay_short() -> None:
    @given(st.lists(st.tuples(schemas, names), min_size=2, max_size=6, unique=True))
    @settings(max_examples=200, deadline=None, database=None)
    def check(tables: list[tuple[str, str]]) -> None:
        tags = [object_tag(s, t) for s, t in tables]
        assert len(set(tags)) == len(tags)
        # fencekit_<tag>_stmt, the longest object name, stays within 63 bytes.
        assert all(len(f"fencekit_{tag}_trunc".encode()) <= 63 for tag in tags)
        assert all(tag.isascii() for tag in tags)

    check()


@pytest.mark.all_servers
def test_hostile_specs_parse_run_fence_and_unprotect(db: Conn) -> None:
    @given(specs())
    @settings(
        max_examples=25,
        database=None,  # no .hypothesis/ example store in the work tree
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    def check(drawn: tuple[FenceSpec, str, str]) -> None:
        spec, key, value = drawn
        protect_sql = sqlgen.render_protect(spec)
        unprotect_sql = sqlgen.render_unprotect(spec)
        pglast.parse_sql(protect_sql)  # raises on any syntax error
        pglast.parse_sql(unprotect_sql)
        _exercise(db, spec, key, value, protect_sql, unprotect_sql)

    check()


def _exercise(
    db: Conn, spec: FenceSpec, key: str, value: str, protect_sql: str, unprotect_sql: str
) -> None:
    t = spec.table
    schema = quote_ident(t.schema)
    db.rollback()
    db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    db.execute(f"CREATE SCHEMA {schema}")
    db.execute(f"CREATE TABLE {t.sql} ({quote_ident(key)} int NOT NULL, {quote_ident(value)} text)")
    db.commit()
    try:
        run_script(db, protect_sql)
        run_script(db, protect_sql)  # idempotent under hostile names too
        write(db, 5, f"INSERT INTO {t.sql} VALUES (1, 'a')")
        err = reject(db, STALE, 4, f"UPDATE {t.sql} SET {quote_ident(value)} = 'stale'")
        d = detail(err)
        assert d["table"] == f"{t.schema}.{t.name}"
        assert (err.diag.schema_name, err.diag.table_name) == (t.schema, t.name)
        if spec.scope is Scope.KEY:
            assert d["key"] == {key: "1"}
            assert err.diag.column_name == key
        if spec.scope is Scope.ROW:
            assert err.diag.column_name == spec.column
        write(db, 6, f"UPDATE {t.sql} SET {quote_ident(value)} = 'fresh'")
        if spec.scope is Scope.ROW:
            fence = one(db, f"SELECT {quote_ident(spec.column)} FROM {t.sql}")
        else:
            k = "1" if spec.scope is Scope.KEY else ""
            fence = one(db, "SELECT fencekit.current_fence(%s, %s)", (spec.resource_name, k))
        assert fence == 6
    finally:
        run_script(db, unprotect_sql)
    assert one(db, f"SELECT count(*) FROM pg_trigger WHERE tgrelid = {_regclass(t)}") == 0
    assert rows(db, "SELECT count(*) FROM fencekit.protected") == [(0,)]
    assert rows(db, "SELECT count(*) FROM fencekit.fences") == [(0,)]
    write(db, None, f"UPDATE {t.sql} SET {quote_ident(value)} = 'plain again'")
    db.execute(f"DROP SCHEMA {schema} CASCADE")
    db.commit()


def _regclass(t: TableName) -> str:
    return "'" + t.sql.replace("'", "''") + "'::regclass"


@pytest.mark.all_servers
@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_long_names_sharing_a_prefix_are_fenced_independently(db: Conn, scope: str) -> None:
    # 63 bytes each, equal but for the last one: truncation or a prefix-based name collides.
    base = _sixty_three_bytes("Ledger entries for the Ωmega account, quarter ")[:-1]
    first, second = base + "1", base + "2"
    assert len(first.encode()) == len(second.encode()) == 63
    specs_ = []
    for name in (first, second):
        kw: dict[str, Any] = {"key": ("k",)} if scope == "key" else {}
        spec = FenceSpec(TableName("public", name), scope=Scope(scope), **kw)
        db.execute(f"CREATE TABLE {spec.table.sql} (k int NOT NULL, v text)")
        db.commit()
        run_script(db, sqlgen.render_protect(spec))
        specs_.append(spec)
    a, b = (s.table.sql for s in specs_)
    write(db, 10, f"INSERT INTO {a} VALUES (1, 'a')")
    write(db, 3, f"INSERT INTO {b} VALUES (1, 'b')")  # its own fence, not a's
    reject(db, STALE, 9, f"UPDATE {a} SET v = 'stale'")
    write(db, 4, f"UPDATE {b} SET v = 'fresh'")
    tags = rows(db, "SELECT tag FROM fencekit.protected ORDER BY table_name")
    assert len({tag for (tag,) in tags}) == 2
    triggers = rows(db, "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'fencekit%'")
    assert len(triggers) == len({name for (name,) in triggers})
    run_script(db, sqlgen.render_unprotect(specs_[0]))
    reject(db, STALE, 3, f"UPDATE {b} SET v = 'stale'")  # the other one is still protected
    write(db, None, f"UPDATE {a} SET v = 'unprotected'")
    with pytest.raises(psycopg.Error):
        db.execute(f"UPDATE {b} SET v = 'no token'")
    db.rollback()
