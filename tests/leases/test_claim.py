"""Claim at grant (fencekit.claim, Lease.claim) and epoch tokens, on one server.

A plain key fence lets the previous holder write until the new holder's first write
(tests/leases/test_lease_bound.py shows the window); a claim at grant closes it. The failover
half (a zombie of a primary that lost the newest grants) is in tests/ha.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from fencekit.errors import (
    FenceUsageError,
    IssuerMismatchError,
    MalformedTokenError,
    StaleTokenError,
    translate,
)
from fencekit.leases import Lease, PostgresIssuer
from fencekit.leases.claim import claim
from fencekit.psycopg import transaction
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

EPOCH = 2**40


def _protect(dsn: str, scope: Scope, *, issuer: str | None = None) -> None:
    spec = FenceSpec(
        table=TableName("public", "billing_summary"),
        scope=scope,
        key=("account_id",) if scope is Scope.KEY else (),
        resource="billing" if scope is not Scope.ROW else None,
        issuer=issuer,
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE billing_summary (account_id int PRIMARY KEY, total int)")
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())


def _write(dsn: str, account: int, total: int, token: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, transaction(conn, token):
        conn.execute(
            "INSERT INTO billing_summary VALUES (%s, %s) "
            "ON CONFLICT (account_id) DO UPDATE SET total = EXCLUDED.total",
            (account, total),
        )


def _takeover(issuer: PostgresIssuer) -> tuple[int, int]:
    a = issuer.try_acquire("billing:42", "A", 0.2)
    assert a is not None
    time.sleep(0.3)  # A is paused past its lease
    b = issuer.try_acquire("billing:42", "B", 30)
    assert b is not None
    return a.token, b.token


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
def test_a_claim_at_grant_makes_the_old_token_stale_before_any_write(
    dsn: str, scope: Scope
) -> None:
    _protect(dsn, scope)
    with PostgresIssuer(dsn) as issuer:
        a, b = _takeover(issuer)
    _write(dsn, 42, 1, a)  # A wrote while it held the lease
    key = [42] if scope is Scope.KEY else []
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert claim(conn, "billing_summary", key, b) == a  # the fence before: A's token
    with pytest.raises(StaleTokenError) as info:
        _write(dsn, 42, 350, a)  # B has not written: without the claim this is accepted
    assert info.value.fence == b
    _write(dsn, 42, 425, b)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT total FROM billing_summary").fetchone() == (425,)


def test_lease_claim_and_its_refusals(dsn: str) -> None:
    _protect(dsn, Scope.KEY)
    with (
        PostgresIssuer(dsn) as issuer,
        psycopg.connect(dsn, autocommit=True) as conn,
        Lease(issuer, "billing:42", ttl=30, wait=0) as lease,
    ):
        assert lease.claim(conn, "public.billing_summary", 42) is None  # no fence yet
        assert lease.claim(conn, "billing_summary", 42) == lease.token  # idempotent
        with pytest.raises(StaleTokenError):
            claim(conn, "billing_summary", [42], lease.token - 1)  # lower than the fence
        with pytest.raises(psycopg.Error) as raw:
            conn.execute("SELECT fencekit.claim('billing_summary', '{42}', 0)")
        assert isinstance(translate(raw.value), MalformedTokenError)
        with pytest.raises(FenceUsageError, match="give 1 value"):
            claim(conn, "billing_summary", [], lease.token)
        with pytest.raises(FenceUsageError, match="not protected"):
            claim(conn, "fencekit.leases", [], lease.token)
        row = conn.execute(
            "SELECT fence FROM fencekit.fences WHERE resource = 'billing' AND key = '42'"
        ).fetchone()
        assert row == (lease.token,)


def test_row_fences_are_claimed_by_writing(dsn: str) -> None:
    _protect(dsn, Scope.ROW)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(FenceUsageError, match="row fence") as info:
            claim(conn, "billing_summary", [42], 5)
        assert "writing it" in (info.value.hint or "")


def test_a_claim_needs_write_privilege_and_the_resource_issuer(dsn: str, make_role) -> None:
    _protect(dsn, Scope.KEY, issuer="postgres")
    reader = make_role("claim_reader", "SELECT ON billing_summary")
    with (
        psycopg.connect(reader, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not write"),
    ):
        claim(conn, "billing_summary", [42], 2**62)
    writer = make_role("claim_writer", "INSERT, UPDATE ON billing_summary")
    with psycopg.connect(writer, autocommit=True) as conn:
        with pytest.raises(IssuerMismatchError):
            claim(conn, "billing_summary", [42], 7, "etcd")
        assert claim(conn, "billing_summary", [42], 7, "postgres") is None
        assert claim(conn, "billing_summary", [42], 8) == 7  # untagged passes, as a write does


def test_tokens_carry_the_timeline_epoch_and_old_tokens_stay_valid(dsn: str) -> None:
    """An upgrade over tokens granted by an older core (small numbers): the holder renews and
    writes as before, and the next grant is higher (epoch * 2^40 + n)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        epoch = conn.execute("SELECT fencekit.lease_epoch()").fetchone()
        assert epoch is not None
        assert epoch[0] >= 1
        # What an older core left behind: a live grant with a small token.
        conn.execute(
            "INSERT INTO fencekit.leases (resource, holder, token, acquired_at, renewed_at, "
            "expires_at, acquired_by) VALUES ('old:1', 'H', 33, now(), now(), "
            "now() + interval '30 s', session_user)"
        )
    _protect(dsn, Scope.KEY)
    _write(dsn, 1, 1, 33)
    with PostgresIssuer(dsn) as issuer:
        from fencekit.leases.base import Grant

        held = Grant("old:1", "H", 33, 30.0, "postgres")
        assert issuer.renew(held)  # the current holder keeps its lease over the upgrade
        g = issuer.try_acquire("new:1", "N", 30)
        assert g is not None
        assert g.token >> 40 == epoch[0]
        assert g.token % EPOCH >= 1
        issuer.release(held)
        again = issuer.try_acquire("old:1", "H2", 30)
        assert again is not None
        assert again.token > 33
        assert again.token >> 40 == epoch[0]
    _write(dsn, 1, 2, again.token)


def test_async_lease_claim(dsn: str) -> None:
    import asyncio

    from fencekit.leases import AsyncLease, AsyncPostgresIssuer

    _protect(dsn, Scope.TABLE)

    async def go() -> tuple[int | None, int]:
        async with (
            AsyncPostgresIssuer(dsn) as issuer,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
            AsyncLease(issuer, "billing", ttl=30, wait=0) as lease,
        ):
            return await lease.claim(conn, "billing_summary"), lease.token

    before, token = asyncio.run(go())
    assert before is None
    with pytest.raises(StaleTokenError):
        _write(dsn, 42, 1, token - 1)
    _write(dsn, 42, 1, token)
