"""The rollout benchmark runs, reports the agreed shape, and leaves nothing behind."""

from __future__ import annotations

import psycopg
import pytest

from fencekit.bench.results import server_cpu_ns
from fencekit.bench.rollout import run


@pytest.mark.bench
def test_rollout_benchmark_quick(dsn: str) -> None:
    results = run(dsn, quick=True)
    # One-row tokenless vs token for row, key and table fence, idle and with locks held; per
    # scope: token on allow vs reject, attribution's own cost, bulk, eight writers.
    assert len(results) == 6 + 4 * 3
    assert sum("1,000 locks" in r["name"] for r in results) == 3
    assert sum("eight connections" in r["name"] and r["unit"] == "tx/s" for r in results) == 3
    assert sum("UPDATE of 1,000 rows" in r["name"] for r in results) == 3
    assert sum("on_missing=allow vs reject" in r["name"] for r in results) == 3
    for r in results:
        assert set(r) == {"name", "baseline", "fenced", "ratio", "unit", "target"}
        assert r["baseline"] > 0
        assert r["fenced"] > 0
        assert 0 < r["ratio"] < 20
        assert r["unit"] in ("s", "tx/s")
    with psycopg.connect(dsn, autocommit=True) as conn:
        local = server_cpu_ns(conn.info.backend_pid) > 0
        assert conn.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (0,)
        gone = conn.execute("SELECT to_regnamespace('fencekit_bench_rollout')").fetchone()
        assert gone == (None,)
    # A server on this machine: each time ratio names the backend's CPU ratio beside it, and
    # each eight-writer throughput ratio the eight backends' CPU per transaction.
    timed = [r["name"] for r in results if r["unit"] == "s" or "eight connections" in r["name"]]
    assert all(("(server CPU " in n) == local for n in timed), timed
