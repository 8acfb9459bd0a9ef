"""Adapter benchmarks run end to end (quick mode); ratios are printed, never asserted on time."""

from __future__ import annotations

import pytest

from fencekit.bench.adapters import run


@pytest.mark.bench
def test_adapter_benchmarks_report_ratios(dsn: str) -> None:
    results = run(dsn, quick=True)
    assert len(results) == 9
    names = [r["name"] for r in results]
    assert any(n.startswith("SQLAlchemy ORM unit of work") for n in names)
    # Each new driver's one-row transaction against the same driver unfenced, in this run.
    assert any(n.startswith("psycopg2: single-row transaction") for n in names)
    assert any(n.startswith("asyncpg: single-row transaction") for n in names)
    anatomy = [r for r in results if r["name"].startswith("psycopg anatomy")]
    assert len(anatomy) == 3
    assert all(r["target"] == "" for r in anatomy)
    for r in results:
        assert set(r) == {"name", "baseline", "fenced", "ratio", "unit", "target"}
        assert min(r["baseline"], r["fenced"], r["ratio"]) > 0
        rates = f"{r['fenced']:.0f} vs {r['baseline']:.0f} {r['unit']}"
        print(f"{r['name']}: {r['ratio']:.2f}x ({rates}, target {r['target']})")
