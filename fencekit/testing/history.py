"""The opt-in write history of a test database, and its translation for the chaos checker.

Only the kit's test databases get it (the fixtures install it in their template; production
never runs any of this). Two row triggers record, in the schema ``fencekit_testing``:

- ``writes``: each row a protected table accepted (INSERT, UPDATE, DELETE), with the table, the
  key the table is fenced by (the key columns of a key fence, the primary key of a row fence,
  nothing for a table fence), the token the transaction carried, its transaction id and the
  writer's ``application_name`` (the kit names its workers' connections);
- ``grants``: each change of fencekit's built-in lease table (grant, renewal, release).

Rolled-back writes leave no row (the history is written in the writer's transaction), so
``writes`` is exactly what the database accepted. :func:`checker_events` turns both into the
events :mod:`fencekit.chaos.checker` reads: one fenced resource per table and key, whose
committed writes must carry tokens that never go down.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import psycopg
from psycopg import sql

from fencekit.chaos.history import Event
from fencekit.spec import FenceSpec, Scope

__all__ = ["SCHEMA", "checker_events", "install_statements", "track_statements"]

SCHEMA = "fencekit_testing"

_INSTALL = """
CREATE SCHEMA IF NOT EXISTS fencekit_testing;
GRANT USAGE ON SCHEMA fencekit_testing TO PUBLIC;
CREATE TABLE IF NOT EXISTS fencekit_testing.writes (
  seq        bigserial PRIMARY KEY,
  table_name text NOT NULL,
  key        text NOT NULL,
  op         text NOT NULL,
  token      text,
  xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
  app        text NOT NULL DEFAULT current_setting('application_name'),
  at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fencekit_testing.grants (
  seq         bigserial PRIMARY KEY,
  resource    text NOT NULL,
  holder      text,
  token       bigint NOT NULL,
  event       text NOT NULL,
  acquired_at timestamptz,
  renewed_at  timestamptz,
  expires_at  timestamptz,
  app         text NOT NULL DEFAULT current_setting('application_name'),
  at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT INSERT ON fencekit_testing.writes, fencekit_testing.grants TO PUBLIC;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA fencekit_testing TO PUBLIC;

-- Runs as the writer: the key columns come as trigger arguments, the token as the writer set it.
CREATE OR REPLACE FUNCTION fencekit_testing.record_write() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
  r jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
  k text := '';
  i int;
BEGIN
  FOR i IN 0 .. TG_NARGS - 1 LOOP
    k := k || CASE WHEN i > 0 THEN ',' ELSE '' END || COALESCE(r ->> TG_ARGV[i], '');
  END LOOP;
  INSERT INTO fencekit_testing.writes (table_name, key, op, token)
  VALUES (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, k, TG_OP,
          NULLIF(current_setting('fencekit.token', true), ''));
  RETURN NULL;
END
$fn$;

-- Runs inside fencekit.acquire/renew/release (their owner's rights): reads only the new row.
CREATE OR REPLACE FUNCTION fencekit_testing.record_grant() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO fencekit_testing.grants
    (resource, holder, token, event, acquired_at, renewed_at, expires_at)
  VALUES (NEW.resource, COALESCE(NEW.holder, OLD.holder), NEW.token,
          CASE WHEN NEW.holder IS NULL THEN 'release'
               WHEN TG_OP = 'INSERT' OR NEW.token <> OLD.token THEN 'acquire'
               ELSE 'renew' END,
          NEW.acquired_at, NEW.renewed_at, NEW.expires_at);
  RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS fencekit_testing_grants ON fencekit.leases;
CREATE TRIGGER fencekit_testing_grants AFTER INSERT OR UPDATE ON fencekit.leases
  FOR EACH ROW EXECUTE FUNCTION fencekit_testing.record_grant();
"""


def install_statements() -> list[str]:
    """The history's schema and the lease-table trigger (run once per template database)."""
    return [_INSTALL]


def _key_columns(conn: psycopg.Connection[Any], spec: FenceSpec) -> list[str]:
    if spec.scope is Scope.KEY:
        return list(spec.key)
    if spec.scope is Scope.TABLE:
        return []
    row = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY k.n) FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (spec.table.sql,),
    ).fetchone()
    return list(row[0]) if row and row[0] else []


def track_statements(conn: psycopg.Connection[Any], spec: FenceSpec) -> list[sql.Composable]:
    """The row trigger that records what ``spec``'s table accepts."""
    cols = _key_columns(conn, spec)
    trigger = sql.Identifier("fencekit_testing_history")
    return [
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, sql.SQL(spec.table.sql)),
        sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW "
            "EXECUTE FUNCTION fencekit_testing.record_write({})"
        ).format(trigger, sql.SQL(spec.table.sql), sql.SQL(", ").join(map(sql.Literal, cols))),
    ]


def _worker(app: str) -> str:
    return app.split(":", 1)[1] if app.startswith("fencekit-worker:") else (app or "?")


def _token(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def checker_events(conn: psycopg.Connection[Any]) -> list[Event]:
    """The database's history as checker events: grants, then each accepted transaction's
    write per resource (``table:key``) with its token, and the final state they imply."""
    events: list[Event] = []
    n = 0
    # Times are the server's (one clock for grants and writes); a renewal counts from when the
    # server extended the lease, exactly as its expiry is computed.
    for resource, holder, token, kind, acquired, renewed, expires, app, at in conn.execute(
        "SELECT resource, holder, token, event, extract(epoch FROM acquired_at)::float8, "
        "extract(epoch FROM renewed_at)::float8, extract(epoch FROM expires_at)::float8, app, "
        "extract(epoch FROM at)::float8 FROM fencekit_testing.grants ORDER BY seq"
    ):
        n += 1
        e: Event = {"t": at, "p": _worker(app), "n": n, "type": kind, "resource": resource,
                    "holder": holder, "t0": at}  # fmt: skip
        if kind == "acquire":
            e.update(token=token, ttl=(expires or at) - (acquired or at), t0=acquired or at)
        elif kind == "renew":
            e.update(t0=renewed or at)
        events.append(e)
    # One write per transaction and resource, at its last row's time.
    writes: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    for table, key, token, xid, app, at in conn.execute(
        "SELECT table_name, key, token, xid::text, app, extract(epoch FROM at)::float8 "
        "FROM fencekit_testing.writes ORDER BY seq"
    ):
        res = f"{table}:{key}" if key else table
        wid = f"{xid}@{res}"
        if (wid, res) not in writes:
            order.append((wid, res))
            writes[(wid, res)] = {"t0": at, "token": _token(token), "p": _worker(app)}
        writes[(wid, res)]["t"] = at
    seq: dict[str, int] = defaultdict(int)
    for wid, res in order:
        w = writes[(wid, res)]
        seq[res] += 1
        s = seq[res]
        n += 1
        events.append(
            {
                "t": w["t0"],
                "p": w["p"],
                "n": n,
                "type": "invoke",
                "id": wid,
                "resource": res,
                "token": w["token"],
                "observed": s - 1,
                "value": s,
            }
        )
        n += 1
        events.append({"t": w["t"], "p": w["p"], "n": n, "type": "ok", "id": wid, "seq": s})
        events.append(
            {
                "t": 0.0,
                "p": "final",
                "n": 0,
                "type": "committed",
                "resource": res,
                "seq": s,
                "token": w["token"],
                "value": s,
                "observed": s - 1,
                "id": wid,
            }
        )
    for res, count in seq.items():
        events.append({"t": 0.0, "p": "final", "n": 0, "type": "register", "resource": res,
                       "value": count, "count": count})  # fmt: skip
    return events
