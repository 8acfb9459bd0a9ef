"""AsyncEtcdIssuer / AsyncZooKeeperIssuer (thread-backed) with AsyncLease and the async adapter."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fk
from fencekit.context import current_issuer, current_token
from fencekit.errors import IssuerMismatchError, StaleTokenError
from fencekit.leases import AsyncLease, LeaseTimeoutError
from tests.issuers.pgfence import make_counter, state
from tests.lab import IN_CI

# async_issuer starts its cluster through getfixturevalue, which the fast tier cannot see.
pytestmark = [pytest.mark.server, pytest.mark.slow]

if not IN_CI:
    pytest.importorskip("etcd3gw")
    pytest.importorskip("kazoo")


@pytest.fixture(params=["etcd", "zookeeper"])
def async_issuer(request: pytest.FixtureRequest) -> Any:
    """``make() -> Async*Issuer`` on the running cluster (closed by the test)."""
    if request.param == "etcd":
        from fencekit.leases.etcd import AsyncEtcdIssuer

        endpoints = request.getfixturevalue("etcd").endpoints
        return lambda: AsyncEtcdIssuer(endpoints, request_timeout=2.0)
    from fencekit.leases.zookeeper import AsyncZooKeeperIssuer

    hosts = request.getfixturevalue("zk").hosts
    return lambda: AsyncZooKeeperIssuer(hosts, session_timeout=2.0, op_timeout=5.0)


async def test_async_lease_writes_with_its_token_and_issuer(
    async_issuer: Any, resource: str, db: Any, dsn: str
) -> None:
    a, b = async_issuer(), async_issuer()
    name = (await a.connect()).name
    make_counter(db, name)
    make_counter(db, "postgres", table="other", resource="other_res")
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            lease = AsyncLease(a, resource, ttl=2, wait=10)
            async with lease:
                assert lease.grant.issuer == name
                old = lease.token
                assert (current_token(), current_issuer()) == (lease.token, name)
                with pytest.raises(LeaseTimeoutError):
                    await AsyncLease(b, resource, ttl=2, wait=0.3, fence=False).acquire()
                await asyncio.sleep(2.5)  # past one ttl: renewal (in threads) keeps it
                assert not lease.lost
                async with fk.async_transaction(conn):
                    await conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
                with pytest.raises(IssuerMismatchError):
                    async with fk.async_transaction(conn):
                        await conn.execute("UPDATE other SET value = 1 WHERE id = 1")
            async with AsyncLease(b, resource, ttl=2, wait=10) as newer:
                assert newer.token > old
                async with fk.async_transaction(conn):
                    await conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
            with pytest.raises(StaleTokenError):
                async with fk.async_transaction(conn, old, issuer=name):
                    await conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
    finally:
        await a.close()
        await b.close()
    value, _, rejections = await asyncio.to_thread(state, dsn)
    assert value == 2
    assert rejections.get("stale") == 1


async def test_async_lease_is_told_of_the_loss(async_issuer: Any, resource: str) -> None:
    a = async_issuer()
    try:
        lease = await AsyncLease(a, resource, ttl=2, wait=10, fence=False).acquire()
        sync = a.sync_issuer
        assert sync is not None
        # The lock taken away behind the holder's back: etcd revokes the lease, ZooKeeper
        # loses the node.
        if sync.name == "etcd":
            await asyncio.to_thread(sync._revoke, lease.grant.handle.lease_id)
        else:
            await asyncio.to_thread(sync.client.delete, lease.grant.handle.node)
        assert await lease.wait_lost(8), "AsyncLease not told of the loss"
        await lease.release()
    finally:
        await a.close()
