"""Adapter benchmarks run end to end (quick mode); ratios are printed, never asserted on time."""

from __future__ import annotations

import pytest

from fencekit.bench.adapters import run


@pytest.mark.bench
def test_adapter_benchmarks_compare_each_adapter_three_ways_and_with_the_floor(dsn: str) -> None:
    results = run(dsn, quick=True)
    labels = {r["name"].split(" vs ")[0] for r in results}
    assert labels == {
        "psycopg transaction()",
        "psycopg install() + fencing()",
        "psycopg2 install() + fencing()",
        "asyncpg install() + fencing()",
        "SQLAlchemy on psycopg (Core, engine.begin())",
    }
    # unfenced, the least cost, the floor (the least cost in its scope), a conditional UPDATE
    assert len(results) == 4 * len(labels)
    for r in results:
        if " vs the least cost " in r["name"]:  # the best ratio an adapter can reach, beside it
            assert "the floor reaches " in r["name"], r["name"]
    for r in results:
        assert r["unit"] == "s CPU/tx"
        assert min(r["baseline"], r["fenced"], r["ratio"], r["wall_ratio"]) > 0
        trips = r["round_trips"]
        # BEGIN (with the token), UPDATE, COMMIT: as many as every other side (a stray packet
        # split by the proxy's timing may add a tenth)
        assert {round(n) for n in trips.values()} == {3}, r["name"]
        print(f"{r['name']}: {r['ratio']:.2f}x (target {r['target'] or '-'})")
