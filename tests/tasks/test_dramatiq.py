"""dramatiq on redis: worker A is paused past its lease and its heartbeat timeout, redis
requeues the job and worker B runs it under a new lease; A's write is rejected when it resumes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Proc, billing_row, wait_until

pytestmark = [pytest.mark.multiproc]

APP = [sys.executable, "-m", "tests.tasks.recipes.dramatiq_app"]
VISIBILITY = 2.0


def test_a_job_requeued_from_a_silent_worker_is_fenced(
    billing_dsn: str, workers: Callable[..., Proc], tmp_path: Path, redis_url: str
) -> None:
    env = {"FK_TASKS_BROKER": redis_url, "FK_VISIBILITY": str(VISIBILITY)}
    ready = tmp_path / "ready"
    defer = workers("defer", *APP, "defer", "42", "2", str(ready), **env)
    assert defer.wait(30) == 0, defer.output()
    a = workers("A", *APP, "worker", FK_WORKER="A", **env)
    wait_until(Path(f"{ready}.A").exists, 30, "worker A to start the job", a)
    a.pause()
    b = workers("B", *APP, "worker", FK_WORKER="B", **env)
    wait_until(Path(f"{ready}.B").exists, 30, "redis to requeue the job for worker B", b)
    wait_until(lambda: billing_row(billing_dsn)["written_by"] == "B", 15, "B's write", b)
    a.resume()
    wait_until(lambda: "LeaseLostError" in a.output(), 15, "A's task to fail", a)
    assert billing_row(billing_dsn) == {"total": 1, "started_by": "B", "written_by": "B"}
    assert "StaleTokenError" in a.output(), a.output()
