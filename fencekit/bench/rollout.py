"""Rollout mode's cost: a write without a token beside the same write with one.

Under ``on_missing = allow`` (rolling fencing out: every existing writer still writes without a
token) each tokenless write is judged and counted as ``unfenced``. This measures what that
costs: one-row transactions of the same shape (set ``fencekit.token``, empty or a token; UPDATE
one row; COMMIT) on the same table, tokenless against the same holder's token, interleaved in
small batches, for each scope. Then the same while another session holds 1,000 locks: the cost
of an unfenced write must not depend on what other sessions do.

The floor is what any counted tokenless write must add to the token's path in this design: the
token path's row trigger plus one call of a PL/pgSQL function with a pinned search_path that
reads the bypass setting and increments a sequence (fencekit's counters are sequences, so that
a count survives a rollback), hand-written on a plain table beside the same trigger without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__ = ["run"]

SCHEMA = "fencekit_bench_rollout"
ROWS = 1000
TOKEN = "4242"

_TABLE = """
CREATE TABLE {t} (
  id          bigint PRIMARY KEY,
  account_id  bigint NOT NULL,
  total       numeric(12, 2) NOT NULL DEFAULT 0,
  status      text NOT NULL DEFAULT 'open',
  payload     jsonb NOT NULL DEFAULT '{{}}',
  updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {t} (id, account_id, payload)
SELECT g, g % 100, jsonb_build_object('note', repeat('x', 60)) FROM generate_series(1, {rows}) g;
"""

# The floor (see the module's docstring): a row trigger doing what the row fence's token path
# does, and the same trigger that, with no token, calls a pinned PL/pgSQL function reading the
# bypass setting and counting with nextval().
_FLOOR = f"""
CREATE SEQUENCE {SCHEMA}.floor_count;
CREATE FUNCTION {SCHEMA}.floor_count() RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF COALESCE(pg_catalog.current_setting('fencekit.bypass', true), '') <> '' THEN
    RAISE EXCEPTION 'no bypass in the floor';
  END IF;
  PERFORM pg_catalog.nextval('{SCHEMA}.floor_count'::pg_catalog.regclass);
END $$;
CREATE FUNCTION {SCHEMA}.floor_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  raw pg_catalog.text := pg_catalog.current_setting('fencekit.token', true);
BEGIN
  IF raw ~ '^[1-9][0-9]{{0,17}}$' AND raw::pg_catalog.int8 >= COALESCE(OLD.fence, 1) THEN
    NEW.fence := raw::pg_catalog.int8;
    RETURN NEW;
  END IF;
  IF raw IS NULL OR raw = '' THEN
    PERFORM {SCHEMA}.floor_count();
    NEW.fence := OLD.fence;
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'stale';
END $$;
"""


@contextmanager
def _schema(conn: psycopg.Connection[Any]) -> Iterator[None]:
    def drop() -> None:
        # Unprotect first: dropping a protected table would leave its fences and counters.
        for (spec,) in conn.execute(
            "SELECT spec FROM fencekit.protected WHERE schema_name = %s", [SCHEMA]
        ).fetchall():
            for stmt in unprotect_statements(FenceSpec.from_dict(spec)):
                conn.execute(stmt)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))

    drop()
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    try:
        yield
    finally:
        drop()


def _table(conn: psycopg.Connection[Any], name: str, spec: FenceSpec | None) -> str:
    t = f"{SCHEMA}.{name}"
    conn.execute(_TABLE.format(t=t, rows=ROWS))
    if spec is not None:
        for stmt in protect_statements(spec):
            conn.execute(stmt)
    return t


def _tables(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """(label, table) for each scope under on_missing=allow, and the floor's table."""
    out = []
    for scope in (Scope.ROW, Scope.KEY, Scope.TABLE):
        name = f"allow_{scope.value}"
        key = ("account_id",) if scope is Scope.KEY else ()
        spec = FenceSpec(TableName(SCHEMA, name), scope=scope, key=key, on_missing="allow")
        out.append((f"{scope.value} fence", _table(conn, name, spec)))
    conn.execute(_FLOOR)
    floor = _table(conn, "floor", None)
    conn.execute(f"ALTER TABLE {floor} ADD COLUMN fence bigint")
    conn.execute(
        f"CREATE TRIGGER t BEFORE UPDATE ON {floor} FOR EACH ROW "
        f"EXECUTE FUNCTION {SCHEMA}.floor_row()"
    )
    out.append(("floor", floor))
    for _, t in out:
        conn.execute(f"VACUUM ANALYZE {t}")
    return out


@contextmanager
def _locks_held(dsn: str, n: int) -> Iterator[None]:
    """Another session holding ``n`` locks (advisory: they sit in the shared lock table, which
    pg_locks reads in full) for as long as the block runs."""
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(g) FROM generate_series(1, %s) g", [n])
        try:
            yield
        finally:
            other.rollback()


def _measure(
    conn: psycopg.Connection[Any],
    tables: list[tuple[str, str]],
    transactions: int,
    rounds: int,
    progress: Callable[[str], None],
    what: str,
) -> dict[str, list[float]]:
    """Seconds per one-row transaction, one figure per batch, per (label, setting). Same shape
    both ways: set the setting (a token, or empty), UPDATE, COMMIT. Each table's two batches
    run back to back, so that the i-th figures of both sides saw the same machine load (these
    machines are shared and noisy); the tables rotate."""
    seconds: dict[str, list[float]] = {
        f"{label}|{tok}": [] for label, _ in tables for tok in (TOKEN, "")
    }
    batch = 20
    for r in range(rounds):
        progress(f"{what}: round {r + 1}/{rounds}")
        for b in range(transactions // batch):
            k = b % len(tables)
            for label, t in tables[k:] + tables[:k]:
                stmt = f"UPDATE {t} SET total = total + 1, updated_at = now() WHERE id = %s"
                for tok in (TOKEN, "") if b % 2 else ("", TOKEN):
                    start = time.perf_counter()
                    for i in range(batch):
                        with conn.transaction():
                            conn.execute("SELECT set_config('fencekit.token', %s, true)", [tok])
                            conn.execute(stmt, [(b * batch + i) % ROWS + 1])
                    seconds[f"{label}|{tok}"].append((time.perf_counter() - start) / batch)
    return seconds


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Tokenless against token one-row transactions per scope, idle and with 1,000 locks held
    elsewhere; ratios of seconds per transaction (tokenless / token)."""
    transactions = 200 if quick else 1000
    rounds = 3 if quick else 5
    results: list[dict[str, Any]] = []
    with psycopg.connect(dsn, autocommit=True) as conn, _schema(conn):
        tables = _tables(conn)
        with conn.transaction():  # the holder's first write on each table
            conn.execute("SELECT set_config('fencekit.token', %s, true)", [TOKEN])
            for _, t in tables:
                conn.execute(f"UPDATE {t} SET total = total")
        for held in (0, 1000):
            what = "idle server" if not held else f"another session holding {held:,} locks"
            if held:
                with _locks_held(dsn, held):
                    seconds = _measure(conn, tables, transactions, rounds, progress, what)
            else:
                seconds = _measure(conn, tables, transactions, rounds, progress, what)
            for label, _ in tables:
                name = (
                    "floor: token path + a pinned function counting with nextval()"
                    if label == "floor"
                    else f"{label}, on_missing=allow: one-row transaction without a token vs "
                    "with one"
                )
                results.append(
                    ratio_result(
                        f"{name} ({what})",
                        seconds[f"{label}|{TOKEN}"],
                        seconds[f"{label}|"],
                        "s",
                        "-" if label == "floor" else "<= 1.05x",
                    )
                )
    return results
