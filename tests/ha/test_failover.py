"""Fencing across a real failover: Patroni promotes the standby after the primary is killed.

Asynchronous replication loses what the standby had not received. The newest lease grant is
such a commit: before epoch tokens the new primary granted that very token again (its copy of
fencekit.leases and of the token sequence predate the grant), so the zombie holding it could
write after the failover. These tests lose a grant for real (the primary's WAL sender is
stopped while the grant commits, then the primary is killed) and check what the new primary
does. With synchronous replication nothing acknowledged is lost: the holder keeps its lease.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fencekit.errors import CommitOutcomeUnknownError, LeaseMismatchError, StaleTokenError
from fencekit.leases import Lease, PostgresIssuer
from fencekit.leases.claim import claim
from fencekit.psycopg import transaction
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements
from tests.lab.patroni import PatroniCluster

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def _protect(dsn: str) -> None:
    """billing_summary: a plain key fence; billing_bound: a lease-bound key fence."""
    with psycopg.connect(dsn) as conn:
        for table, bound in (("billing_summary", False), ("billing_bound", True)):
            conn.execute(f"CREATE TABLE {table} (account_id int PRIMARY KEY, total int)")
            spec = FenceSpec(
                table=TableName("public", table),
                scope=Scope.KEY,
                key=("account_id",),
                resource="bound" if bound else "billing",
                lease_bound=bound,
            )
            for stmt in protect_statements(spec):
                conn.execute(stmt.encode())


def _write(dsn: str, table: str, total: int, token: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, transaction(conn, token):
        conn.execute(
            f"INSERT INTO {table} VALUES (42, %s) "
            "ON CONFLICT (account_id) DO UPDATE SET total = EXCLUDED.total",
            (total,),
        )


def _total(dsn: str, table: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT total FROM {table} WHERE account_id = 42").fetchone()
    return None if row is None else int(row[0])


def test_async_failover_never_reissues_a_token_the_zombie_holds(
    cluster: PatroniCluster, ha_db: str
) -> None:
    dsn = cluster.dsn_for(ha_db)  # multi-host, read-write: whichever node leads
    _protect(dsn)
    cluster.wait_caught_up()
    before = cluster.timeline()

    zombie_issuer = PostgresIssuer(dsn, timeout=2)
    zombie = Lease(zombie_issuer, "billing:42", ttl=30, renew_fraction=0.05, holder="Z")
    zombie_bound = Lease(zombie_issuer, "bound:42", ttl=30, holder="Z")
    try:
        with cluster.replication_paused():
            # Granted, renewed and written on the old primary only: acknowledged, then lost.
            zombie.acquire(wait=0)
            zombie_bound.acquire(wait=0)
            _write(dsn, "billing_summary", 1, zombie.token)
            _write(dsn, "billing_bound", 1, zombie_bound.token)
            cluster.failover()
        assert cluster.timeline() == before + 1
        assert _total(dsn, "billing_summary") is None  # the async loss: bounded, not hidden

        with PostgresIssuer(dsn) as issuer, psycopg.connect(dsn, autocommit=True) as conn:
            b = issuer.try_acquire("billing:42", "B", 30)
            assert b is not None
            # Before epoch tokens the new primary granted the zombie's token again here.
            assert b.token != zombie.token, "the new primary re-issued the zombie's token"
            assert b.token > zombie.token
            assert b.token >> 40 == cluster.timeline()
            claim(conn, "billing_summary", [42], b.token, b.issuer)  # B claims at grant
            b_bound = issuer.try_acquire("bound:42", "B", 30)
            assert b_bound is not None
            assert b_bound.token > zombie_bound.token

        # The zombie wakes up and writes through the multi-host DSN, to the new primary.
        with pytest.raises(StaleTokenError) as stale:
            _write(dsn, "billing_summary", 666, zombie.token)  # B's claim holds it off
        assert stale.value.fence == b.token
        with pytest.raises(LeaseMismatchError):
            _write(dsn, "billing_bound", 666, zombie_bound.token)  # lease-bound: no claim needed
        _write(dsn, "billing_summary", 2, b.token)
        _write(dsn, "billing_bound", 2, b_bound.token)
        assert _total(dsn, "billing_summary") == 2

        # The zombie's lease notices: renewal on the new primary is refused, naming the failover.
        assert zombie.wait_lost(timeout=15)
        assert "failover" in (zombie.lost_reason or "")
        assert f"timeline {before}" in (zombie.lost_reason or "")
    finally:
        zombie.release()
        zombie_bound.release()
        zombie_issuer.close()


def _wait_syncrep(cluster: PatroniCluster, db: str, timeout: float = 10, count: int = 1) -> None:
    """Until ``count`` backends of the primary wait for the synchronous standby (their COMMITs
    are in flight: flushed locally, not yet acknowledged)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(cluster.primary().dsn_for(db), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.05)
    raise AssertionError("no COMMIT waited for the synchronous standby")


def test_sync_failover_keeps_acknowledged_work_and_a_commit_in_flight_is_outcome_unknown(
    cluster: PatroniCluster, ha_db: str
) -> None:
    """Synchronous replication: every grant and write acknowledged before the failover is on
    the new primary; the holder renews there and keeps writing. A fenced COMMIT cut off by the
    failover (psycopg and SQLAlchemy) raises CommitOutcomeUnknownError, not a stale-write error
    and not a success; the documented recovery (read back on the new primary, retry the
    idempotent write under the same token) works. (One failover for both: each costs a rejoin.)"""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    from fencekit import fencing
    from fencekit.sqlalchemy import install

    dsn = cluster.dsn_for(ha_db)
    _protect(dsn)
    cluster.set_synchronous(True)
    issuer = PostgresIssuer(dsn, timeout=2)
    lease = Lease(issuer, "billing:42", ttl=60, holder="A").acquire(wait=0)
    grant = lease.grant
    with psycopg.connect(dsn, autocommit=True) as conn, transaction(conn, grant.token):
        conn.execute("INSERT INTO billing_summary VALUES (1, 1)")  # acknowledged before
    # A multi-host libpq DSN: SQLAlchemy's URL has one host, so psycopg connects by itself.
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    install(engine)
    outcomes: dict[str, BaseException | None] = {}

    def raw() -> None:
        try:
            _write(dsn, "billing_summary", 1, grant.token)
            outcomes["psycopg"] = None
        except BaseException as exc:
            outcomes["psycopg"] = exc

    def orm() -> None:
        try:
            with fencing(grant.token), engine.begin() as conn:
                conn.execute(text("INSERT INTO billing_summary VALUES (7, 1)"))
            outcomes["orm"] = None
        except BaseException as exc:
            outcomes["orm"] = exc

    with cluster.replication_paused():
        workers = [threading.Thread(target=raw), threading.Thread(target=orm)]
        for w in workers:
            w.start()
        # Both writers' COMMITs in flight, not just the first: a kill while the other is still
        # in its INSERT is a different story (the statement fails, nothing was committed).
        _wait_syncrep(cluster, ha_db, count=2)
        time.sleep(0.2)
        cluster.failover()
        for w in workers:
            w.join(30)
    try:
        # Nothing acknowledged is lost: the grant (renewed on the new primary) and the write.
        lease.renew()
        assert lease.held
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT total FROM billing_summary WHERE account_id = 1").fetchone()
        with PostgresIssuer(dsn) as other:
            assert other.try_acquire("billing:42", "B", 30) is None  # still A's
            c = other.try_acquire("billing:43", "C", 30)
            assert c is not None
            assert c.token > grant.token
            assert c.token >> 40 == cluster.timeline()
        raw_error, orm_error = outcomes["psycopg"], outcomes["orm"]
        assert isinstance(raw_error, CommitOutcomeUnknownError), repr(raw_error)
        assert raw_error.token == grant.token
        assert "may or may not" in str(raw_error)
        assert isinstance(orm_error, CommitOutcomeUnknownError), repr(orm_error)
        assert isinstance(orm_error, OperationalError)  # SQLAlchemy's except clauses still see it
        # Here the standby never received it: the outcome was "not committed".
        assert _total(dsn, "billing_summary") is None
        # The write is an idempotent upsert: retrying under the same token is safe.
        _write(dsn, "billing_summary", 1, grant.token)
        assert _total(dsn, "billing_summary") == 1
    finally:
        engine.dispose()
        lease.release()
        issuer.close()
