"""The lease benchmark runs, reports the agreed shape, and leaves nothing behind."""

from __future__ import annotations

import psycopg
import pytest

from fencekit.bench.leases import run


@pytest.mark.bench
def test_lease_benchmark_quick(dsn: str) -> None:
    results = run(dsn, quick=True)
    assert len(results) == 2
    assert "one resource" in results[0]["name"]
    assert "1,000 resources" in results[1]["name"]
    for r in results:
        assert set(r) == {"name", "baseline", "fenced", "ratio", "unit", "target"}
        assert r["baseline"] > 0
        assert r["fenced"] > 0
        assert 0 < r["ratio"] < 10
        assert r["unit"] == "ops/s"
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM fencekit.leases").fetchone() == (0,)
        gone = conn.execute("SELECT to_regnamespace('fencekit_bench_leases')").fetchone()
        assert gone == (None,)
