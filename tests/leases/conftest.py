"""Fixtures for the lease tests: a PostgreSQL 15 server the test may crash and restart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from fencekit.embedded import EmbeddedServer
from fencekit.sqlgen import render_install
from tests.lab import IN_CI
from tests.lab.postgres import (
    ServerUnavailable,
    _as_user_prefix,
    debian_bindir,
    start_debian_postgres,
)

# Test-only history of every change to fencekit.leases, written in the same transaction as the
# change (so it is exactly as durable): the contention test checks it against what clients saw.
HISTORY = """
CREATE TABLE public.lease_history (
    id          bigserial PRIMARY KEY,
    kind        text NOT NULL,
    resource    text NOT NULL,
    holder      text,
    token       bigint NOT NULL,
    at          timestamptz NOT NULL,
    acquired_at timestamptz,
    expires_at  timestamptz,
    released_at timestamptz
);
CREATE FUNCTION public.lease_history_log() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.lease_history
        (kind, resource, holder, token, at, acquired_at, expires_at, released_at)
    VALUES (
        CASE WHEN TG_OP = 'INSERT' OR NEW.token <> OLD.token THEN 'grant'
             WHEN NEW.holder IS NULL THEN 'release'
             ELSE 'renew' END,
        NEW.resource, COALESCE(NEW.holder, OLD.holder), NEW.token, clock_timestamp(),
        NEW.acquired_at, NEW.expires_at, NEW.released_at);
    RETURN NULL;
END $$;
CREATE TRIGGER lease_history AFTER INSERT OR UPDATE ON fencekit.leases
    FOR EACH ROW EXECUTE FUNCTION public.lease_history_log();
"""


@dataclass
class RestartableServer:
    """A Debian PostgreSQL 15 with durable commits that a test may crash and start again."""

    server: EmbeddedServer
    dsn: str  # the test database, fencekit core + lease_history installed

    def _pg_ctl(self, *args: str) -> None:
        assert self.server.datadir is not None
        cmd = [
            *_as_user_prefix("postgres"),
            str(debian_bindir(15) / "pg_ctl"),
            "-D",
            str(self.server.datadir),
            *args,
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=90)

    def crash(self) -> None:
        """Immediate shutdown: no checkpoint, recovery from WAL on the next start."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def start(self) -> None:
        assert self.server.datadir is not None
        log = Path(self.server.datadir).parent / "server.log"
        self._pg_ctl("-l", str(log), "-o", f"-p {self.server.port}", "-w", "-t", "60", "start")


@pytest.fixture
def restartable_pg() -> Iterator[RestartableServer]:
    try:
        server = start_debian_postgres(15)
    except ServerUnavailable as exc:
        if IN_CI:
            pytest.fail(f"{exc} (CI=true: a missing server is a failure, not a skip)")
        pytest.skip(str(exc))
    try:
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            # The harness turns durability off for speed; this test is about durability.
            admin.execute("ALTER SYSTEM SET synchronous_commit = on")
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("CREATE DATABASE leases_restart")
        dsn = server.dsn_for("leases_restart")
        with psycopg.connect(dsn) as conn:
            conn.execute(render_install().encode())
            conn.execute(HISTORY.encode())
        yield RestartableServer(server, dsn)
    finally:
        server.stop()
