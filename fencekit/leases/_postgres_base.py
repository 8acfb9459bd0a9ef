"""What the PostgreSQL issuer's sync and async forms share: its calls and how it reads them."""

from __future__ import annotations

from typing import Any

import psycopg

from fencekit.leases.base import Grant

__all__ = [
    "ACQUIRE",
    "EPOCH",
    "EPOCH_BITS",
    "RELEASE",
    "RENEW",
    "bad_input",
    "connect_kwargs",
    "failover_reason",
]

ACQUIRE = "SELECT fencekit.acquire(%s, %s, %s)"
RENEW = "SELECT fencekit.renew(%s, %s, %s, %s)"
RELEASE = "SELECT fencekit.release(%s, %s, %s)"
EPOCH = "SELECT fencekit.lease_epoch()"
EPOCH_BITS = 40


def failover_reason(grant: Grant, epoch_now: int) -> str | None:
    granted_in = grant.token >> EPOCH_BITS
    if granted_in == 0 or epoch_now <= granted_in:
        return None  # a token of an older core, or no promotion since the grant
    return (
        f"renewal refused after a failover: the grant was made on timeline {granted_in}, the "
        f"primary now writes timeline {epoch_now} and no longer has this grant live (lost "
        "with the newest commits of an asynchronous standby, expired or taken over meanwhile)"
    )


def connect_kwargs(timeout: float, kwargs: dict[str, Any]) -> dict[str, Any]:
    # A hung server must not hold a renewal past the lease's deadline: bound every statement.
    ms = max(1, int(timeout * 1000))
    options = f"-c statement_timeout={ms} -c lock_timeout={ms}"
    if kwargs.get("options"):
        options = f"{kwargs['options']} {options}"
    return {
        "connect_timeout": max(1, round(timeout)),
        **kwargs,
        "options": options,
        "autocommit": True,
    }


def bad_input(exc: psycopg.Error) -> ValueError:
    diag = exc.diag
    return ValueError(diag.message_primary or str(exc))
