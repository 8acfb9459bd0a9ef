"""Short chaos runs: fenced (no violation) and unfenced (lost updates found), on a PostgreSQL
15 the run starts, crashes and restarts itself.

The long run is one command away: ``fencekit chaos --duration 600 --seed 1 --pgbouncer``.
"""

from __future__ import annotations

import io
import json

import pytest

from fencekit.chaos import ChaosConfig, run_chaos
from fencekit.chaos.server import bouncer_binary, find_bindir
from fencekit.cli import main
from tests.servers import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


@pytest.fixture(autouse=True)
def _needs_servers() -> None:
    missing = []
    if find_bindir() is None:
        missing.append("PostgreSQL binaries (apt-get install postgresql-15)")
    if bouncer_binary() is None:
        missing.append("pgbouncer (apt-get install pgbouncer)")
    if missing:
        reason = "chaos runs need " + " and ".join(missing)
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def test_fenced_run_through_pgbouncer_has_no_violation(capsys, tmp_path) -> None:
    history = tmp_path / "history.jsonl"
    argv = ["chaos", "--duration", "12", "--seed", "7", "--pgbouncer", "--json"]
    code = main([*argv, "--history", str(history)])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 0, out
    assert summary["violations"] == 0, out
    # The run proved something: faults happened and writes went through them.
    assert summary["acknowledged"] > 20, out
    assert summary["pauses"] >= 3, out
    assert summary["kills"] >= 1, out
    assert summary["crashes"] >= 1, out
    assert summary["bouncer_restarts"] >= 1, out
    assert summary["handovers"] >= 5, out
    # Unfenced writes are rejected as missing (or lost to a crash first), never accepted.
    assert summary["rejected"].get("missing", 0) <= summary["unfenced_attempts"], out
    assert summary["stale_accepted"] == 0, out
    lines = history.read_text().splitlines()
    assert {json.loads(line)["type"] for line in lines} >= {"acquire", "invoke", "ok", "crash"}


def test_unfenced_run_finds_lost_updates() -> None:
    out = io.StringIO()
    result = run_chaos(
        ChaosConfig(duration=12, seed=7, fence=False, crashes=False), out=out, progress=print
    )
    report = result.report
    assert result.ok, out.getvalue()
    assert report.lost_updates > 0, out.getvalue()
    assert "stale write accepted" in out.getvalue()
    assert "lost update" in out.getvalue()


def test_lease_bound_run_has_no_overlap() -> None:
    out = io.StringIO()
    result = run_chaos(
        ChaosConfig(duration=8, seed=3, scope="lease-bound", workers=3, resources=2),
        out=out,
        progress=print,
    )
    assert result.ok, out.getvalue()
    assert result.report.overlaps == 0, out.getvalue()
    assert result.report.acknowledged > 10, out.getvalue()
