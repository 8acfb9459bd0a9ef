"""Short chaos runs: fenced (no violation) and unfenced (lost updates found), on a PostgreSQL
15 the run starts, crashes and restarts itself.

The long run is one command away: ``fencekit chaos --duration 600 --seed 1 --pgbouncer``.
"""

from __future__ import annotations

import io
import json

import psycopg
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
    # Through pgbouncer too, the workers were the run's application role, not a superuser.
    _assert_workers_were_the_app_role([json.loads(line) for line in lines], summary["worker_role"])


def _assert_workers_were_the_app_role(events: list[dict], role: str) -> None:
    """Every worker recorded its session: the run's role, no superuser, fencekit_writer only."""
    assert role.startswith("fencekit_chaos_worker_"), role
    workers = {e["p"] for e in events if e["type"] == "invoke"}
    sessions = {e["p"]: e for e in events if e["type"] == "session"}
    assert workers, "no worker wrote anything"
    assert workers <= set(sessions), f"workers without a session event: {workers - set(sessions)}"
    for e in sessions.values():
        assert e["user"] == role, e
        assert e["superuser"] is False, e
        assert e["createrole"] is False, e
        assert e["createdb"] is False, e
        assert e["member_of"] == ["fencekit_writer"], e


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


def test_lease_bound_run_has_no_overlap(tmp_path) -> None:
    out = io.StringIO()
    history = tmp_path / "history.jsonl"
    result = run_chaos(
        ChaosConfig(
            duration=8, seed=3, scope="lease-bound", workers=3, resources=2, history=history
        ),
        out=out,
        progress=print,
    )
    assert result.ok, out.getvalue()
    assert result.report.overlaps == 0, out.getvalue()
    assert result.report.acknowledged > 10, out.getvalue()
    events = [json.loads(line) for line in history.read_text().splitlines()]
    _assert_workers_were_the_app_role(events, result.worker_role)
    assert f"workers: role {result.worker_role} (not a superuser" in out.getvalue()


def test_run_on_your_server_creates_and_drops_the_worker_role(pg_dsn: str, tmp_path) -> None:
    """--dsn: the run creates its workers' role on the given server and drops it after."""
    history = tmp_path / "history.jsonl"
    result = run_chaos(
        ChaosConfig(duration=4, seed=5, workers=2, resources=2, dsn=pg_dsn, history=history),
        out=io.StringIO(),
        progress=lambda _s: None,
    )
    assert result.ok
    events = [json.loads(line) for line in history.read_text().splitlines()]
    _assert_workers_were_the_app_role(events, result.worker_role)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'fencekit\\_chaos\\_worker\\_%'"
        ).fetchall()
        dbs = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'fencekit\\_chaos\\_%'"
        ).fetchall()
    assert left == []
    assert dbs == []
