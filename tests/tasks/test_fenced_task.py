"""fenced_task in one process: the resource from the arguments, the claim at grant inside the
token's scope, the token on the body's writes, and a lease lost while the body runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import fencekit.psycopg
from fencekit import StaleTokenError, current_token
from fencekit.leases import AsyncLease, Lease, LeaseLostError, PostgresIssuer
from fencekit.tasks import current_lease, fenced_task

from .conftest import billing_row


@pytest.fixture
def conn(billing_dsn: str) -> Any:
    with psycopg.connect(billing_dsn, autocommit=True) as c:
        fencekit.psycopg.install(c)
        yield c


@pytest.fixture
def issuer(billing_dsn: str) -> Any:
    with PostgresIssuer(billing_dsn) as made:
        yield made


def test_the_body_runs_under_the_lease_of_its_resource(conn: Any, issuer: Any) -> None:
    seen: dict[str, Any] = {}

    def claim(lease: Lease, account_id: int, who: str = "A") -> None:
        seen["claim_token"] = current_token()
        seen["fence_before"] = lease.claim(conn, "billing_summary", account_id)

    @fenced_task(issuer, "billing:{account_id}", ttl=5, claim=claim)
    def recompute(account_id: int, who: str = "A") -> int:
        lease = current_lease()
        assert lease is not None
        seen["resource"] = lease.resource
        conn.execute(
            "UPDATE billing_summary SET written_by = %s WHERE account_id = %s", (who, account_id)
        )
        return lease.token

    token = recompute(42)
    assert seen == {"claim_token": token, "fence_before": None, "resource": "billing:42"}
    assert current_token() is None
    assert current_lease() is None
    with conn.transaction():
        row = conn.execute(
            "SELECT fence FROM fencekit.fences WHERE resource = 'public.billing_summary'"
        ).fetchone()
    assert row == (token,)
    assert recompute.__name__ == "recompute"


def test_a_resource_function_and_the_context_manager_form(conn: Any, issuer: Any) -> None:
    @fenced_task(issuer, lambda account_id: f"acct/{account_id}", ttl=5)
    def touch(account_id: int) -> str:
        lease = current_lease()
        assert lease is not None
        return lease.resource

    assert touch(7) == "acct/7"
    with fenced_task(issuer, "billing:42", ttl=5) as lease:
        assert current_token() == lease.token
        conn.execute("UPDATE billing_summary SET written_by = 'cm' WHERE account_id = 42")
    assert billing_row_of(conn)["written_by"] == "cm"


def billing_row_of(conn: Any) -> dict[str, Any]:
    total, started, written = conn.execute(
        "SELECT total, started_by, written_by FROM billing_summary WHERE account_id = 42"
    ).fetchone()
    return {"total": total, "started_by": started, "written_by": written}


def test_a_lease_lost_while_the_body_runs_is_reported(
    conn: Any, issuer: Any, billing_dsn: str
) -> None:
    @fenced_task(issuer, "billing:{account_id}", ttl=1)
    def slow(account_id: int) -> None:
        # Another holder takes over meanwhile: the lease is ended in the database, a new one
        # granted and its claim made, as a worker that took over would.
        with psycopg.connect(billing_dsn, autocommit=True) as admin:
            admin.execute(
                "UPDATE fencekit.leases SET expires_at = clock_timestamp() WHERE resource = %s",
                (f"billing:{account_id}",),
            )
        with PostgresIssuer(billing_dsn) as other, Lease(other, "billing:42", ttl=5) as newer:
            newer.claim(conn, "billing_summary", 42)
        time.sleep(1.2)  # the renewal is refused: the lease is lost
        conn.execute("UPDATE billing_summary SET written_by = 'stale' WHERE account_id = 42")

    with pytest.raises(LeaseLostError) as info:
        slow(42)
    assert isinstance(info.value.__cause__, StaleTokenError)
    assert billing_row(billing_dsn)["written_by"] is None


async def test_a_coroutine_task_gets_an_async_lease(billing_dsn: str, issuer: Any) -> None:
    async with await psycopg.AsyncConnection.connect(billing_dsn, autocommit=True) as aconn:
        fencekit.psycopg.install(aconn)

        async def claim(lease: AsyncLease, account_id: int) -> None:
            await lease.claim(aconn, "billing_summary", account_id)

        @fenced_task(issuer, "billing:{account_id}", ttl=5, claim=claim)
        async def recompute(account_id: int) -> int:
            lease = current_lease()
            assert isinstance(lease, AsyncLease)
            await asyncio.sleep(0)
            await aconn.execute(
                "UPDATE billing_summary SET written_by = 'async' WHERE account_id = %s",
                (account_id,),
            )
            return lease.token

        token = await recompute(42)
        assert current_token() is None
        assert token > 0
    assert billing_row(billing_dsn)["written_by"] == "async"


async def test_the_async_context_manager_form(billing_dsn: str, issuer: Any) -> None:
    async with await psycopg.AsyncConnection.connect(billing_dsn, autocommit=True) as aconn:
        fencekit.psycopg.install(aconn)

        async def claim(lease: AsyncLease) -> None:
            await lease.claim(aconn, "billing_summary", 42)

        async with fenced_task(issuer, "billing:42", ttl=5, claim=claim) as lease:
            assert current_lease() is lease
            assert current_token() == lease.token
            await aconn.execute(
                "UPDATE billing_summary SET written_by = 'acm' WHERE account_id = 42"
            )
        assert current_lease() is None
    assert billing_row(billing_dsn)["written_by"] == "acm"
