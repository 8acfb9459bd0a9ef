"""A job table fenced per row: the worker paused past its lease, the job retried by another
worker, and the first worker's "done" rejected when it resumes (SIGSTOP/SIGCONT)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, TableName

from .conftest import TTL, Proc, wait_until

pytestmark = [pytest.mark.multiproc]

JOBS = FenceSpec(TableName("public", "jobs"))


def test_a_stalled_worker_cannot_mark_a_retried_job_done(
    billing_dsn: str, workers: Callable[..., Proc], tmp_path: Path
) -> None:
    with psycopg.connect(billing_dsn) as conn:
        conn.execute(
            "CREATE TABLE jobs (id bigint PRIMARY KEY, state text NOT NULL DEFAULT 'queued',"
            " attempts int NOT NULL DEFAULT 0, worker text, result text)"
        )
        for statement in sqlgen.protect_statements(JOBS):
            conn.execute(statement.encode())
        conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
        conn.execute("INSERT INTO jobs (id) VALUES (1)")
    ready_a, ready_b = tmp_path / "a.ready", tmp_path / "b.ready"
    run = [sys.executable, "-m", "tests.tasks.recipes.jobqueue"]
    a = workers("A", *run, "A", "3", str(ready_a), "0.5")
    wait_until(ready_a.exists, 15, "worker A to start job 1")
    a.pause()
    b = workers("B", *run, "B", "0", str(ready_b), "1")
    wait_until(ready_b.exists, 15 + TTL, "worker B to retry job 1 once A's lease expired")
    assert b.wait(15) == 0
    a.resume()
    assert a.wait(15) == 0
    with psycopg.connect(billing_dsn) as conn:
        row = conn.execute("SELECT state, attempts, worker, result FROM jobs").fetchone()
    assert row == ("done", 2, "B", "done by B")
    out = a.output()
    assert "A: job 1 failed: LeaseLostError" in out, out
    assert "StaleTokenError" in out, out
    assert "job 1 done" not in out
