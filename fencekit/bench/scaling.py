"""Scaling benchmarks: how fencing's cost grows with the table and with the number of fences.

- Row fence, bulk UPDATE of every row with a new token, for 1k, 10k, 100k and 1M rows: time
  per row, protected table vs an identical unprotected twin.
- Key fence, single-row write transactions (set token, UPDATE one row, COMMIT) while the number
  of fenced keys grows from 1k to 1M: time per write vs the unprotected twin of the same size.
- Key fence, bulk UPDATE of 100k rows over 1,000 keys while the resource's fenced keys grow
  from 1k to 1M.

Both sides run interleaved round by round; ratios are medians of per-round ratios. Nothing here
asserts on time. ``quick`` stops at 100k.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__: list[str] = []

SCHEMA = "fencekit_bench_scaling"
Progress = Callable[[str], None]


def _reset(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT spec FROM fencekit.protected WHERE schema_name = %s", [SCHEMA]
    ).fetchall()
    for (spec,) in rows:
        for stmt in unprotect_statements(FenceSpec.from_dict(spec)):
            conn.execute(stmt.encode())
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def _table(conn: psycopg.Connection[Any], name: str, rows: int, spec: FenceSpec | None) -> str:
    t = f"{SCHEMA}.{name}"
    conn.execute(
        f"CREATE TABLE {t} (id bigint PRIMARY KEY, account_id bigint NOT NULL, v int NOT NULL)"
        "".encode()
    )
    if spec is not None:
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())
    with conn.transaction():
        conn.execute("SELECT set_config('fencekit.token', '1', true)")
        conn.execute(f"INSERT INTO {t} SELECT g, g, 0 FROM generate_series(1, {rows}) g".encode())
    conn.execute(f"VACUUM ANALYZE {t}".encode())
    return t


def _timed(conn: psycopg.Connection[Any], token: int, statement: str) -> float:
    with conn.transaction():
        conn.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
        start = time.perf_counter()
        conn.execute(statement.encode())
        return time.perf_counter() - start


def _row(n: float) -> str:
    return f"{n:,.0f}" if n < 1_000_000 else f"{n / 1_000_000:g}M"


def _rows_scaling(
    conn: psycopg.Connection[Any], sizes: list[int], progress: Progress
) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        rounds = 5 if n <= 10_000 else 3 if n <= 100_000 else 2
        progress(f"scaling: row fence, {_row(n)} rows ({rounds} rounds)")
        plain = _table(conn, f"rows_plain_{n}", n, None)
        fenced = _table(conn, f"rows_row_{n}", n, FenceSpec(TableName(SCHEMA, f"rows_row_{n}")))
        base: list[float] = []
        fen: list[float] = []
        for r in range(rounds):
            token = 100 + r
            for t, acc in (
                ((plain, base), (fenced, fen)) if r % 2 else ((fenced, fen), (plain, base))
            ):
                conn.execute(f"VACUUM {t}".encode())
                acc.append(_timed(conn, token, f"UPDATE {t} SET v = v + 1") / n)
        out.append(
            ratio_result(
                f"row fence, bulk UPDATE, {_row(n)} rows", base, fen, "s/row", "flat", size=n
            )
        )
        for stmt in unprotect_statements(FenceSpec(TableName(SCHEMA, f"rows_row_{n}"))):
            conn.execute(stmt.encode())
        conn.execute(f"DROP TABLE {plain}; DROP TABLE {fenced}".encode())
    return out


def _keys_scaling(
    conn: psycopg.Connection[Any], sizes: list[int], writes: int, progress: Progress
) -> list[dict[str, Any]]:
    out = []
    rng = random.Random(7)
    # Commit without waiting for the WAL flush: on a shared machine the fsync is most of a
    # one-row transaction and all of its noise, and it is the same on both sides.
    conn.execute("SET synchronous_commit = off")
    for n in sizes:
        progress(f"scaling: key fence, {_row(n)} fenced keys ({writes} writes x 3 rounds)")
        spec = FenceSpec(TableName(SCHEMA, f"keys_{n}"), scope=Scope.KEY, key=("account_id",))
        plain = _table(conn, f"keys_plain_{n}", n, None)
        fenced = _table(conn, f"keys_{n}", n, spec)  # the load's token 1 fences all n keys
        conn.execute("VACUUM ANALYZE fencekit.fences")
        base: list[float] = []
        fen: list[float] = []
        for r in range(3):
            token = 100 + r
            ids = [rng.randint(1, n) for _ in range(writes)]
            for t, acc in (
                ((plain, base), (fenced, fen)) if r % 2 else ((fenced, fen), (plain, base))
            ):
                update = f"UPDATE {t} SET v = v + 1 WHERE id = %s".encode()
                start = time.perf_counter()
                for i in ids:
                    with conn.transaction():
                        conn.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
                        conn.execute(update, [i])
                acc.append((time.perf_counter() - start) / writes)
        out.append(
            ratio_result(
                f"key fence, 1-row write, {_row(n)} fenced keys",
                base,
                fen,
                "s/write",
                "flat",
                size=n,
            )
        )
        conn.execute(f"DROP TABLE {plain}".encode())
        for undo in unprotect_statements(spec):
            conn.execute(undo.encode())
        conn.execute(f"DROP TABLE {fenced}".encode())
    return out


def _keys_bulk_scaling(
    conn: psycopg.Connection[Any], sizes: list[int], rows: int, progress: Progress
) -> list[dict[str, Any]]:
    """A bulk UPDATE of ``rows`` rows over 1,000 keys, new token each round, while the resource
    holds 1k to 1M fenced keys (the others are fences of keys the table no longer has)."""
    out = []
    spec = FenceSpec(TableName(SCHEMA, "bulk_keys"), scope=Scope.KEY, key=("account_id",))
    plain = f"{SCHEMA}.bulk_plain"
    for t, s in ((plain, None), (spec.table.sql, spec)):
        conn.execute(
            f"CREATE TABLE {t} (id bigint PRIMARY KEY, account_id bigint NOT NULL, v int NOT "
            f"NULL); INSERT INTO {t} SELECT g, g % 1000, 0 FROM generate_series(1, {rows}) g"
            "".encode()
        )
        for stmt in protect_statements(s) if s is not None else ():
            conn.execute(stmt.encode())
    token = 100
    for n in sizes:
        # Fences of keys 1000..n-1 (beyond the table's 0..999): the resource has n fenced keys.
        conn.execute(
            "INSERT INTO fencekit.fences (resource, key, fence) "
            "SELECT %s, g::text, 1 FROM generate_series(1000, %s - 1) g "
            "ON CONFLICT DO NOTHING",
            [spec.resource_name, n],
        )
        conn.execute("VACUUM ANALYZE fencekit.fences")
        progress(f"scaling: key fence, bulk UPDATE of {_row(rows)} rows, {_row(n)} fenced keys")
        base: list[float] = []
        fen: list[float] = []
        for r in range(3):
            token += 1
            for t, acc in (
                ((plain, base), (spec.table.sql, fen))
                if r % 2
                else ((spec.table.sql, fen), (plain, base))
            ):
                conn.execute(f"VACUUM {t}".encode())
                acc.append(_timed(conn, token, f"UPDATE {t} SET v = v + 1"))
        out.append(
            ratio_result(
                f"key fence, bulk UPDATE of {_row(rows)} rows over 1,000 keys, "
                f"{_row(n)} fenced keys",
                base,
                fen,
                "s",
                "flat, <= 1.3x",
                size=n,
            )
        )
    for undo in unprotect_statements(spec):
        conn.execute(undo.encode())
    conn.execute(f"DROP TABLE {plain}; DROP TABLE {spec.table.sql}".encode())
    return out


def run(
    dsn: str, *, quick: bool = False, progress: Progress = lambda _: None
) -> list[dict[str, Any]]:
    """Run the scaling benchmarks against ``dsn`` (a database with fencekit's core installed)."""
    sizes = [1_000, 10_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    with psycopg.connect(dsn, autocommit=True) as conn:
        _reset(conn)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        try:
            results = _rows_scaling(conn, sizes, progress)
            results += _keys_scaling(conn, sizes, 100 if quick else 400, progress)
            results += _keys_bulk_scaling(conn, sizes, 20_000 if quick else 100_000, progress)
        finally:
            _reset(conn)
    return results
