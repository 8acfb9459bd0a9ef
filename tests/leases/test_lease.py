"""The Python lease API on the PostgreSQL issuer: waiting, renewal, loss, release, context."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from fencekit.context import current_token
from fencekit.leases import (
    AsyncLease,
    AsyncPostgresIssuer,
    Grant,
    Issuer,
    Lease,
    LeaseError,
    LeaseLostError,
    LeaseTimeoutError,
    PostgresIssuer,
)


@pytest.fixture
def issuer(dsn: str):
    with PostgresIssuer(dsn) as i:
        yield i


@pytest.fixture
def other(dsn: str):
    with PostgresIssuer(dsn) as i:
        yield i


class PausableIssuer:
    """Wraps an issuer; while ``paused`` is clear, renew() blocks like a frozen process."""

    name = "postgres"

    def __init__(self, inner: PostgresIssuer) -> None:
        self.inner = inner
        self.running = threading.Event()
        self.running.set()
        self.renewals = 0

    def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        return self.inner.try_acquire(resource, holder, ttl)

    def renew(self, grant: Grant) -> bool:
        self.running.wait(10)
        self.renewals += 1
        return self.inner.renew(grant)

    def release(self, grant: Grant) -> None:
        self.inner.release(grant)

    def close(self) -> None:
        self.inner.close()


def test_postgres_issuer_satisfies_the_protocol(issuer) -> None:
    assert isinstance(issuer, Issuer)
    assert issuer.name == "postgres"


def test_with_block_holds_renews_and_releases(issuer, other) -> None:
    with Lease(issuer, "billing:42", ttl=1.0, wait=1) as lease:
        first = lease.token
        assert current_token() == first  # writes inside carry the token
        assert lease.held
        time.sleep(2.2)  # well past the ttl: background renewal keeps it
        lease.check()
        assert other.try_acquire("billing:42", "intruder", 1) is None
    assert current_token() is None
    assert not lease.held
    with pytest.raises(LeaseError):
        _ = lease.token
    grant = other.try_acquire("billing:42", "next", 1)  # released: free at once
    assert grant is not None
    assert grant.token > first


def test_acquire_waits_with_backoff_then_times_out(issuer, other) -> None:
    held = Lease(other, "r", ttl=5, wait=0, fence=False).acquire()
    try:
        start = time.monotonic()
        with pytest.raises(LeaseTimeoutError):
            Lease(issuer, "r", ttl=1, wait=0.4, fence=False).acquire()
        assert 0.35 < time.monotonic() - start < 2
    finally:
        held.release()


def test_acquire_waits_until_the_holder_releases(issuer, other) -> None:
    held = Lease(other, "r", ttl=5, fence=False).acquire(wait=0)
    first = held.token
    threading.Timer(0.3, held.release).start()
    lease = Lease(issuer, "r", ttl=5, wait=5, fence=False).acquire()
    try:
        assert lease.token > first
    finally:
        lease.release()


def test_paused_renewal_reports_loss_and_successor_gets_next_token(issuer, other) -> None:
    pausable = PausableIssuer(issuer)
    lost: list[tuple[int, str]] = []
    lease = Lease(
        pausable,
        "r",
        ttl=0.3,
        wait=0,
        fence=False,
        on_lost=lambda grant, reason: lost.append((grant.token, reason)),
    )
    lease.acquire()
    first = lease.token
    pausable.running.clear()  # the renewal thread freezes, as in a GC pause
    assert lease.wait_lost(2), "the lease must report its loss at the deadline"
    assert lease.lost
    assert "expired" in (lease.lost_reason or "")
    with pytest.raises(LeaseLostError) as info:
        lease.check()
    assert info.value.grant.token == first
    time.sleep(0.05)
    successor = Lease(other, "r", ttl=5, wait=1, fence=False).acquire()
    assert successor.token > first
    pausable.running.set()  # the old renewal resumes: the issuer refuses it
    assert issuer.renew(lease.grant) is False
    with pytest.raises(LeaseLostError):
        lease.renew()
    assert lost == [(first, lease.lost_reason)]  # the callback ran exactly once
    lease.release()  # a lost lease is not given back: the successor keeps it
    assert successor.held
    successor.check()
    successor.release()


def test_renewal_refused_after_takeover_reports_loss(dsn: str, issuer) -> None:
    lease = Lease(issuer, "r", ttl=1.0, wait=0, fence=False, renew_fraction=0.5)
    lease.acquire()
    # Somebody with table rights (here: the superuser) ends the lease early, as an expiry
    # would, and a successor takes it before the next renewal.
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute("UPDATE fencekit.leases SET expires_at = clock_timestamp() WHERE resource='r'")
        row = su.execute("SELECT fencekit.acquire('r', 'next', '5 s')").fetchone()
        assert row is not None
        assert row[0] > lease.token
    assert lease.wait_lost(2)
    assert "refused" in (lease.lost_reason or "")
    lease.release()


def test_release_by_non_holder_is_refused(issuer, other) -> None:
    grant = issuer.try_acquire("r", "a", 5)
    assert grant is not None
    fake = Grant("r", "b", grant.token, 5, "postgres")
    assert other.release_checked(fake) is False
    assert other.try_acquire("r", "b", 5) is None  # still held by a
    assert issuer.release_checked(grant) is True


@pytest.mark.parametrize(
    ("resource", "ttl"),
    [("", 1.0), ("r", 0.0), ("r", -1.0), ("r", float("nan")), ("r", 1e9)],
)
def test_bad_input_raises_value_error(issuer, resource: str, ttl: float) -> None:
    with pytest.raises(ValueError):
        Lease(issuer, resource, ttl=ttl)
    with pytest.raises(ValueError):
        issuer.try_acquire(resource, "h", ttl)


def test_bad_holder_reaches_sql_and_comes_back_as_value_error(issuer) -> None:
    with pytest.raises(ValueError, match="holder must be a non-empty name"):
        issuer.try_acquire("r", "", 1)


def test_issuer_reconnects_after_its_connection_is_killed(dsn: str, issuer) -> None:
    grant = issuer.try_acquire("r", "a", 5)
    assert grant is not None
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert issuer.renew(grant) is True


async def test_async_lease_holds_renews_and_releases(dsn: str) -> None:
    async with AsyncPostgresIssuer(dsn) as issuer:
        async with AsyncLease(issuer, "billing:42", ttl=1.0, wait=1) as lease:
            first = lease.token
            assert current_token() == first
            await asyncio.sleep(2.2)
            lease.check()
            other = AsyncLease(issuer, "billing:42", ttl=1, wait=0.2, fence=False)
            with pytest.raises(LeaseTimeoutError):
                await other.acquire()
        assert current_token() is None
        again = await AsyncLease(issuer, "billing:42", ttl=1, wait=0, fence=False).acquire()
        assert again.token > first
        await again.release()


async def test_async_lease_on_a_sync_issuer_reports_loss(issuer) -> None:
    pausable = PausableIssuer(issuer)
    lease = AsyncLease(pausable, "r", ttl=0.3, wait=0, fence=False)
    await lease.acquire()
    pausable.running.clear()
    assert await lease.wait_lost(2)
    with pytest.raises(LeaseLostError):
        lease.check()
    pausable.running.set()
    await lease.release()
