"""Shared helpers for the core behaviour tests: protect tables, write under a token, expect
a rejection by SQLSTATE. Every helper talks to a real server through psycopg."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

Conn = psycopg.Connection[Any]
Token = int | str | None

STALE, REUSED, MISSING, MALFORMED, BYPASS_REFUSED = "YF001", "YF002", "YF003", "YF004", "YF005"
ISSUER_MISMATCH, USAGE = "YF007", "YF000"


def run_script(conn: Conn, script: str) -> None:
    """Run a whole psql-style script (it has its own BEGIN/COMMIT) as one simple query."""
    conn.commit()
    was = conn.autocommit
    conn.autocommit = True
    try:
        conn.execute(script)  # no parameters: psycopg sends it as is, % included
    except psycopg.Error:
        conn.rollback()  # the script's own BEGIN left a failed transaction block open
        raise
    finally:
        conn.autocommit = was


def protect(conn: Conn, table: str, scope: str = "row", **kw: Any) -> FenceSpec:
    """Protect ``table`` (as SQL writes it) with the generator's own script."""
    spec = FenceSpec(TableName.parse(table), scope=Scope(scope), **kw)
    run_script(conn, sqlgen.render_protect(spec))
    return spec


def unprotect(conn: Conn, spec: FenceSpec) -> None:
    run_script(conn, sqlgen.render_unprotect(spec))


def begin(
    conn: Conn, token: Token, *, bypass: bool = False, settings: dict[str, str] | None = None
) -> None:
    """Start a transaction and set the token, bypass and any other setting, all
    transaction-locally."""
    conn.rollback()
    if token is not None:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    if bypass:
        conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
    for name, value in (settings or {}).items():
        conn.execute("SELECT set_config(%s, %s, true)", (name, value))


def write(
    conn: Conn, token: Token, stmt: str, params: Sequence[Any] | None = None, **kw: Any
) -> int:
    """Run one statement under ``token`` and commit; returns the row count."""
    begin(conn, token, **kw)
    cur = conn.execute(stmt, params)
    n = cur.rowcount
    conn.commit()
    return int(n)


def reject(
    conn: Conn,
    sqlstate: str,
    token: Token,
    stmt: str,
    params: Sequence[Any] | None = None,
    **kw: Any,
) -> psycopg.Error:
    """Run one statement under ``token``; it must fail with ``sqlstate``. Rolls back."""
    begin(conn, token, **kw)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(stmt, params)
    conn.rollback()
    err = info.value
    assert err.sqlstate == sqlstate, f"expected {sqlstate}, got {err.sqlstate}: {err}"
    return err


def one(conn: Conn, query: str, params: Sequence[Any] | None = None) -> Any:
    """The single value of a one-row, one-column query, read in its own transaction."""
    row = conn.execute(query, params).fetchone()
    conn.commit()
    assert row is not None, query
    return row[0]


def rows(conn: Conn, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    out = conn.execute(query, params).fetchall()
    conn.commit()
    return out


def key_fence(conn: Conn, resource: str, key: str = "") -> int | None:
    """The fence of one key of a resource ('' for a table fence), as fencekit stores it."""
    value = one(conn, "SELECT fencekit.current_fence(%s, %s)", (resource, key))
    return None if value is None else int(value)


def rejection_count(conn: Conn, table: str, reason: str, schema: str = "public") -> int:
    return int(
        one(
            conn,
            "SELECT count FROM fencekit.rejections "
            "WHERE schema_name = %s AND table_name = %s AND reason = %s",
            (schema, table, reason),
        )
    )


def detail(err: psycopg.Error) -> dict[str, Any]:
    """The DETAIL of a rejection, parsed: contracts.md makes it a one-line JSON object."""
    text = err.diag.message_detail
    assert text is not None
    assert "\n" not in text, text
    parsed: dict[str, Any] = json.loads(text)
    return parsed


DML = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"


def make_app_role(make_role: Any, name: str, *, dml: bool = True, admin: bool = False) -> str:
    """An application login role: DML on public's tables (optional) and, as a writer of
    key- and table-fenced tables needs, membership of fencekit_writer; nothing else."""
    grants = [DML, "fencekit_writer"] if dml else []
    if admin:
        grants.append("fencekit_admin")
    dsn: str = make_role(name, *grants)
    return dsn


def rollout_tables(conn: Conn, prefix: str, rows: int = 2) -> dict[str, dict[str, Any]]:
    """``<prefix>_row``, ``_key`` (on ``k``) and ``_table``: ``(id, k, v)`` tables protected in
    rollout mode (on_missing = allow), each with ``rows`` rows written under token 10. Returns
    each table's protect options."""
    scopes: dict[str, dict[str, Any]] = {
        f"{prefix}_row": {"scope": "row"},
        f"{prefix}_key": {"scope": "key", "key": ("k",)},
        f"{prefix}_table": {"scope": "table"},
    }
    for name, kw in scopes.items():
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v text)")
        conn.commit()
        protect(conn, name, on_missing="allow", **kw)
        write(conn, 10, f"INSERT INTO {name} SELECT g, g, 'a' FROM generate_series(1, {rows}) g")
    return scopes
