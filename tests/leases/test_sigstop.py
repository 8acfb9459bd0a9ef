"""The paused worker, with real processes: SIGSTOP a worker past its lease, let another take
over and write, SIGCONT the first. Fenced: its write fails (YF001). Unfenced: the lost update.

Runs ``fencekit demo``'s story (fencekit.demo.run_demo), which starts the worker processes.
"""

from __future__ import annotations

import io
import subprocess
import sys

import psycopg
import pytest

from fencekit.demo import run_demo

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _demo_databases(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'fencekit\\_demo\\_%'"
        ).fetchall()
    return [r[0] for r in rows]


def test_stale_write_of_resumed_worker_is_rejected(pg_dsn: str) -> None:
    out = io.StringIO()
    result = run_demo(pg_dsn, fence=True, ttl=0.5, out=out)
    text = out.getvalue()
    assert result.a_token is not None
    assert result.b_token is not None
    assert result.b_token > result.a_token
    assert result.a_outcome == "rejected", text
    assert result.a_sqlstate == "YF001"
    assert result.a_error == "StaleTokenError"
    assert result.final_row is not None
    assert result.final_row["computed_by"] == "B"
    assert str(result.final_row["total"]) == "425.00"  # includes the invoice A never saw
    stale = [r for r in result.rejections if r["reason"] == "stale"]
    assert [r["count"] for r in stale] == [1]
    assert result.ok
    # The first token is explained once: why it is large and why B's skips numbers.
    assert text.count(f"token {result.a_token} = epoch {result.a_token >> 40} * 2^40 + ") == 1
    assert "skip the numbers other resources took" in text
    # A's own renewal thread noticed the loss, too late to stop the write.
    assert any(e["who"] == "A" and e["event"] == "lost" for e in result.events)
    assert _demo_databases(pg_dsn) == []  # cleaned up


def test_without_fencing_the_same_story_loses_an_update(pg_dsn: str) -> None:
    out = io.StringIO()
    result = run_demo(pg_dsn, fence=False, ttl=0.5, out=out)
    assert result.a_outcome == "written", out.getvalue()
    assert result.final_row is not None
    assert result.final_row["computed_by"] == "A"  # the stale summary won
    assert str(result.final_row["total"]) == "350.00"
    assert result.ok  # the outcome expected for --no-fence
    assert "LOST UPDATE" in out.getvalue()
    assert _demo_databases(pg_dsn) == []


def test_cli_demo_exit_status_and_help(pg_dsn: str) -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "fencekit.cli.demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "SIGSTOP" in help_text
    assert "--no-fence" in help_text
    proc = subprocess.run(
        [sys.executable, "-m", "fencekit.cli.demo", "--dsn", pg_dsn, "--ttl", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REJECTED" in proc.stdout
    assert "StaleTokenError" in proc.stdout
