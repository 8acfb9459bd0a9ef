"""Leases and fencing tokens: issuers (postgres built in; etcd, zookeeper behind extras).

    from fencekit.leases import Lease, PostgresIssuer

    with PostgresIssuer(dsn) as issuer, Lease(issuer, "billing:42", ttl=30, wait=10) as lease:
        ...  # writes through fencekit's adapters carry lease.token

The etcd and ZooKeeper issuers live in ``fencekit.leases.etcd`` / ``fencekit.leases.zookeeper``
and are not imported here (they need extras).
"""

from fencekit.errors import (
    IssuerError,
    IssuerUnavailableError,
    LeaseError,
    LeaseLostError,
    LeaseTimeoutError,
)
from fencekit.leases.base import AsyncIssuer, Backoff, Grant, Issuer, LossCallback
from fencekit.leases.claim import async_claim, claim
from fencekit.leases.lease import AsyncLease, Lease
from fencekit.leases.postgres import AsyncPostgresIssuer, PostgresIssuer

__all__ = [
    "AsyncIssuer",
    "AsyncLease",
    "AsyncPostgresIssuer",
    "Backoff",
    "Grant",
    "Issuer",
    "IssuerError",
    "IssuerUnavailableError",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LeaseTimeoutError",
    "LossCallback",
    "PostgresIssuer",
    "async_claim",
    "claim",
]
