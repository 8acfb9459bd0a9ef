"""Fixtures for the fenced-task recipes: the protected ``billing_summary`` table, a redis
server on loopback, and worker processes the tests pause (SIGSTOP) and resume (SIGCONT)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName
from tests.lab import IN_CI
from tests.lab.redis import RedisUnavailable, redis_server

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.0  # the leases of the recipes' tasks: short, so the pause outlives one quickly

BILLING = FenceSpec(TableName("public", "billing_summary"), Scope.KEY, key=("account_id",))


@pytest.fixture
def billing_dsn(db: psycopg.Connection[Any], dsn: str) -> str:
    """``dsn``'s database with ``billing_summary`` protected (key fence) and account 42."""
    db.execute(
        "CREATE TABLE billing_summary (account_id int PRIMARY KEY, total int NOT NULL DEFAULT 0,"
        " started_by text, written_by text)"
    )
    for statement in sqlgen.protect_statements(BILLING):
        db.execute(statement.encode())
    db.execute("SELECT set_config('fencekit.bypass', 'on', true)")
    db.execute("INSERT INTO billing_summary (account_id) VALUES (42)")
    db.commit()
    return dsn


def billing_row(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT total, started_by, written_by FROM billing_summary WHERE account_id = 42"
        ).fetchone()
    assert row is not None
    return {"total": row[0], "started_by": row[1], "written_by": row[2]}


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            said = "" if proc is None else f"; its output:\n{proc.output()}"
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{said}")
        time.sleep(0.05)


class Proc:
    """A worker process of a recipe, its output in a file; killed at the end of the test."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(  # noqa: S603  # fixed argv
            argv,
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


@pytest.fixture
def workers(tmp_path: Path, billing_dsn: str) -> Iterator[Callable[..., Proc]]:
    """``workers(name, *argv, **env) -> Proc``: a worker with the recipe's environment."""
    started: list[Proc] = []

    def start(name: str, *argv: str, **env: str) -> Proc:
        environ = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "FK_TASKS_DSN": billing_dsn,
            "FK_TASKS_TTL": str(TTL),
            **env,
        }
        proc = Proc(list(argv), environ, tmp_path / f"{name}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's redis-server on loopback, no persistence (the Celery and dramatiq broker)."""
    try:
        with redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url
    except RedisUnavailable as exc:
        if IN_CI:
            pytest.fail(f"{exc} (scripts/_system.sh installs it)")
        pytest.skip(str(exc))
