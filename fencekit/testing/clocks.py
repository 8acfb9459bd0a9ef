"""Waiting on the issuer's clock: until a lease has expired where it is decided.

A lease expires by the clock of whatever grants it, never by the test's: the PostgreSQL server's
for fencekit's built-in issuer (``fencekit.leases.expires_at`` against ``clock_timestamp()``),
the leader's for etcd (its lease TTL deletes the lock key) and ZooKeeper (the session expiry
deletes the lock node). So the kit asks the issuer, and sleeps only as long as the issuer says
is left.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from fencekit.errors import LeaseWaitError

__all__ = ["wait_lease_expired"]


def wait_lease_expired(
    resource: str,
    *,
    dsn: str | None = None,
    issuer: Any = None,
    timeout: float = 60.0,
) -> None:
    """Return once ``resource``'s current lease has expired by its issuer's clock.

    ``issuer``: an etcd or ZooKeeper issuer (anything with ``current_holder(resource)``): wait
    until the holder seen first is gone. Otherwise fencekit's built-in issuer in the database
    at ``dsn``.
    """
    deadline = time.monotonic() + timeout
    if issuer is not None and hasattr(issuer, "current_holder"):
        first = issuer.current_holder(resource)
        while first is not None and issuer.current_holder(resource) == first:
            if time.monotonic() > deadline:
                raise LeaseWaitError(
                    f"the lease on {resource!r} held by {first[0]} did not expire on the "
                    f"{getattr(issuer, 'name', 'issuer')} leader within {timeout:g}s"
                )
            time.sleep(0.05)
        return
    if dsn is None:
        raise ValueError("wait_lease_expired needs the database's dsn or an issuer")
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT holder, extract(epoch FROM expires_at - clock_timestamp())::float8 "
                "FROM fencekit.leases WHERE resource = %s",
                (resource,),
            ).fetchone()
            if row is None:
                raise LeaseWaitError(
                    f"nobody ever took the lease {resource!r} from fencekit's issuer in this "
                    "database: is that the resource name your worker leases?"
                )
            holder, left = row
            if holder is None or left is None or left <= 0:
                return
            if time.monotonic() + left > deadline:
                raise LeaseWaitError(
                    f"the lease on {resource!r} (holder {holder}) has {left:.1f}s left by the "
                    f"server's clock, beyond the {timeout:g}s allowed: renewed while paused? "
                    "(a paused worker cannot renew; another process holding it can)"
                )
            time.sleep(min(max(left, 0.005) + 0.005, 0.5))
