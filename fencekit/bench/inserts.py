"""INSERT benchmarks: a bulk INSERT under a token into a protected table, beside the same INSERT
into an unprotected twin, interleaved round by round; reported as ratios, nothing asserted.

A row fence's INSERT costs its column default (the token as a bigint) and the WHEN clause that
skips its trigger when the row carries the token; a key fence's, reading the statement's keys
from the transition table; a table fence's, one statement check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from fencekit.bench.results import ratio_result
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

__all__: list[str] = []

SCHEMA = "fencekit_bench_inserts"
_TABLE = "CREATE TABLE {t} (id bigint PRIMARY KEY, account_id bigint NOT NULL, v integer NOT NULL)"
_INSERT = (
    "INSERT INTO {t} (id, account_id, v) "
    "SELECT g, g % 1000, 0 FROM generate_series({first}, {last}) g"
)


def _specs() -> dict[str, FenceSpec | None]:
    def name(n: str) -> TableName:
        return TableName(SCHEMA, n)

    return {
        "plain": None,
        "row fence": FenceSpec(name("row_fence")),
        "key fence (1,000 keys)": FenceSpec(
            name("key_fence"), scope=Scope.KEY, key=("account_id",)
        ),
        "table fence": FenceSpec(name("table_fence"), scope=Scope.TABLE),
    }


def _drop(conn: psycopg.Connection[Any]) -> None:
    # Unprotect first: dropping a protected table would leave its fences and counters behind.
    for (spec,) in conn.execute(
        "SELECT spec FROM fencekit.protected WHERE schema_name = %s", [SCHEMA]
    ).fetchall():
        for stmt in unprotect_statements(FenceSpec.from_dict(spec)):
            conn.execute(stmt)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def _timed(conn: psycopg.Connection[Any], token: int, statement: str) -> float:
    import time

    with conn.transaction():
        conn.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
        start = time.perf_counter()
        conn.execute(statement)
        return time.perf_counter() - start


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Bulk INSERT of ``rows`` new rows per round, under a new token each round."""
    rows = 10_000 if quick else 100_000
    rounds = 3 if quick else 7
    specs = _specs()
    tables = {label: f"{SCHEMA}.{label.split(' (')[0].replace(' ', '_')}" for label in specs}
    tables["plain"] = f"{SCHEMA}.plain"
    times: dict[str, list[float]] = {label: [] for label in specs}
    with psycopg.connect(dsn, autocommit=True) as conn:
        _drop(conn)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        try:
            for label, spec in specs.items():
                conn.execute(_TABLE.format(t=tables[label]))
                for stmt in protect_statements(spec) if spec is not None else []:
                    conn.execute(stmt)
            for r in range(rounds):
                progress(f"bulk INSERT: round {r + 1}/{rounds}")
                first = r * rows + 1
                for label in specs:
                    insert = _INSERT.format(t=tables[label], first=first, last=first + rows - 1)
                    times[label].append(_timed(conn, 1000 + r, insert))
        finally:
            _drop(conn)
    return [
        ratio_result(
            f"bulk INSERT: {label} ({rows:,} rows, new token)",
            times["plain"],
            times[label],
            "s",
            "-",
        )
        for label in specs
        if label != "plain"
    ]
