"""Lease benchmarks: acquire+release throughput of the PostgreSQL issuer, beside a plain UPDATE.

Two cases: every pair on one resource (the hot-lock case), and pairs spread over 1,000
resources. The baseline is a plain single-row UPDATE in its own transaction on the same
connection, on one row or spread over 1,000 rows to match. Both sides run interleaved in small
batches, round by round; the ratio is the median of per-round ratios of throughput
(fenced / baseline). A pair is two transactions (acquire, release), each committed durably
(the lease functions raise synchronous_commit to 'on'), so expect well under 1x. Nothing here
asserts on time.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

__all__ = ["run"]

SCHEMA = "fencekit_bench_leases"
KEYS = 1000
TARGET = ">= 0.3x"  # a pair is 2 durable commits against 1 commit of the baseline


def _setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    conn.execute(f"CREATE TABLE {SCHEMA}.counters (id integer PRIMARY KEY, v bigint NOT NULL)")
    conn.execute(f"INSERT INTO {SCHEMA}.counters SELECT g, 0 FROM generate_series(0, {KEYS - 1}) g")


def _cleanup(conn: psycopg.Connection[Any], prefix: str) -> None:
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    # Lease rows are never deleted in production (tokens would restart); these names are
    # random and used once, so removing them is safe. Without the privilege, leave them.
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM fencekit.leases WHERE resource LIKE %s", (prefix + "%",))


def _case(
    conn: psycopg.Connection[Any],
    name: str,
    spread: int,
    pairs: int,
    rounds: int,
    prefix: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    ttl = timedelta(seconds=30)
    holder = f"bench:{secrets.token_hex(4)}"
    update = f"UPDATE {SCHEMA}.counters SET v = v + 1 WHERE id = %s"
    acquire = "SELECT fencekit.acquire(%s, %s, %s)"
    release = "SELECT fencekit.release(%s, %s, %s)"
    batch = 25
    seconds: dict[str, list[float]] = {"plain": [], "lease": []}
    n = 0
    for r in range(rounds):
        progress(f"leases, {name}: round {r + 1}/{rounds}")
        spent = {"plain": 0.0, "lease": 0.0}
        for b in range(pairs // batch):
            for side in ("plain", "lease") if b % 2 else ("lease", "plain"):
                start = time.perf_counter()
                for i in range(batch):
                    key = (n + i) % spread
                    if side == "plain":
                        conn.execute(update, (key,))
                    else:
                        resource = f"{prefix}{key}"
                        row = conn.execute(acquire, (resource, holder, ttl)).fetchone()
                        if row is None or row[0] is None:
                            raise RuntimeError(f"benchmark lease {resource} was not granted")
                        conn.execute(release, (resource, holder, row[0]))
                spent[side] += time.perf_counter() - start
            n += batch
        for side in spent:
            seconds[side].append(spent[side])
    done = (pairs // batch) * batch
    ratios = [p / f for p, f in zip(seconds["plain"], seconds["lease"], strict=True)]
    return {
        "name": f"lease acquire+release, {name} (vs plain single-row UPDATE)",
        "baseline": done / statistics.median(seconds["plain"]),
        "fenced": done / statistics.median(seconds["lease"]),
        "ratio": statistics.median(ratios),
        "unit": "ops/s",
        "target": TARGET,
    }


def run(
    dsn: str, *, quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Run the lease benchmarks against ``dsn`` (a database with fencekit's core installed).

    ``baseline``: plain UPDATEs per second; ``fenced``: acquire+release pairs per second.
    """
    pairs = 200 if quick else 1000
    rounds = 3 if quick else 5
    prefix = f"fencekit-bench:{secrets.token_hex(4)}:"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _setup(conn)
        try:
            return [
                _case(conn, "one resource", 1, pairs, rounds, prefix, progress),
                _case(conn, "1,000 resources", KEYS, pairs, rounds, prefix, progress),
            ]
        finally:
            _cleanup(conn, prefix)
