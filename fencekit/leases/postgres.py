"""The built-in issuer: leases and tokens from fencekit's core SQL (``fencekit.acquire`` & co).

When the data already lives in PostgreSQL, PostgreSQL is the natural issuer: a token is a
committed row, as durable as the writes it fences. Each issuer owns one autocommit connection
(every call is its own transaction, so a token is committed before the caller sees it) and
reconnects after the server went away. Calls are serialized: the renewal thread and the caller
may share one issuer.

    issuer = PostgresIssuer("postgresql://app@db/billing")
    with Lease(issuer, "billing:42", ttl=30, wait=10) as lease:
        ...

The connecting role (its ``SET ROLE`` role, if any) must be a member of ``fencekit_writer``:
the SQL functions refuse anyone else before taking any lock, and the issuer raises that refusal
as :class:`fencekit.errors.FenceUsageError`, whose message names the role and whose hint is the
missing ``GRANT fencekit_writer TO <role>;``.
"""

from __future__ import annotations

from fencekit.leases._postgres_async import AsyncPostgresIssuer
from fencekit.leases._postgres_base import EPOCH_BITS
from fencekit.leases._postgres_sync import PostgresIssuer

__all__ = ["EPOCH_BITS", "AsyncPostgresIssuer", "PostgresIssuer"]
