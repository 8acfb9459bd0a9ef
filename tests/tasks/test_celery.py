"""Celery on redis with acks_late and a visibility timeout: worker A is paused past its lease
and the message's visibility timeout, redis redelivers the job to worker B, which runs it under
a new lease; A's write is rejected when it resumes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Proc, billing_row, wait_until

pytestmark = [pytest.mark.multiproc]

VISIBILITY = 2.0


def celery_worker(workers: Callable[..., Proc], name: str, redis_url: str) -> Proc:
    return workers(
        name,
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.tasks.recipes.celery_app",
        "worker",
        "-P",
        "solo",
        "-Q",
        "billing",
        "-n",
        f"{name}@localhost",
        "-l",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        FK_WORKER=name,
        FK_TASKS_BROKER=redis_url,
        FK_VISIBILITY=str(VISIBILITY),
    )


def test_a_job_redelivered_past_the_visibility_timeout_is_fenced(
    billing_dsn: str, workers: Callable[..., Proc], tmp_path: Path, redis_url: str
) -> None:
    ready = tmp_path / "ready"
    defer = workers(
        "defer",
        sys.executable,
        "-m",
        "tests.tasks.recipes.celery_app",
        "42",
        "2",  # seconds of work: the pause comes first, the rest after the resume
        str(ready),
        FK_TASKS_BROKER=redis_url,
        FK_VISIBILITY=str(VISIBILITY),
    )
    assert defer.wait(30) == 0, defer.output()
    a = celery_worker(workers, "A", redis_url)
    ready_a = Path(f"{ready}.A")
    wait_until(ready_a.exists, 30, "worker A to start the job", a)
    a.pause()
    b = celery_worker(workers, "B", redis_url)
    ready_b = Path(f"{ready}.B")
    wait_until(ready_b.exists, 30, "redis to redeliver the job to worker B", b)
    wait_until(lambda: billing_row(billing_dsn)["written_by"] == "B", 15, "B's write", b)
    a.resume()
    # Celery logs the task's error by its nearest picklable class (LeaseLostError's constructor
    # takes a grant): the lease's loss, caused by the database's rejection of the write.
    wait_until(lambda: "raised unexpected" in a.output(), 15, "A's task to fail", a)
    assert billing_row(billing_dsn) == {"total": 1, "started_by": "B", "written_by": "B"}
    out = a.output()
    assert "fenced task on billing:42: lease on 'billing:42'" in out, out
    assert "StaleTokenError" in out, out
