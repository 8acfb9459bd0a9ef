"""procrastinate with a fenced connector: a worker paused past its lease, another worker's job
for the same account takes over, and the first one's write is rejected when it resumes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from .conftest import TTL, Proc, billing_row, wait_until

pytestmark = [pytest.mark.multiproc]

APP = [sys.executable, "-m", "tests.tasks.recipes.procrastinate_app"]


def test_a_paused_procrastinate_worker_cannot_write_after_a_takeover(
    billing_dsn: str, workers: Callable[..., Proc], tmp_path: Path
) -> None:
    def run(*args: str) -> None:
        assert workers(f"cmd-{args[0]}-{len(args)}", *APP, *args).wait(60) == 0

    run("schema")
    ready_a, ready_b = tmp_path / "a.ready", tmp_path / "b.ready"
    run("defer", "42", "A", "2", str(ready_a))
    a = workers("A", *APP, "worker")
    wait_until(ready_a.exists, 20, "worker A to start its job", a)
    a.pause()
    run("defer", "42", "B", "0", str(ready_b))
    b = workers("B", *APP, "worker")
    assert b.wait(20 + TTL) == 0, b.output()
    assert ready_b.exists()
    a.resume()
    assert a.wait(20) == 0, a.output()
    assert billing_row(billing_dsn) == {"total": 1, "started_by": "B", "written_by": "B"}
    with psycopg.connect(billing_dsn) as conn:
        states = conn.execute(
            "SELECT args ->> 'who', status FROM procrastinate_jobs ORDER BY id"
        ).fetchall()
    assert states == [("A", "failed"), ("B", "succeeded")]
    out = a.output()
    assert "LeaseLostError" in out, out
    assert "StaleTokenError" in out, out
