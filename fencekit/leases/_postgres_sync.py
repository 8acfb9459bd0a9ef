"""The PostgreSQL issuer, sync form.

Generated from ``fencekit/leases/_postgres_async.py``
by ``scripts/async_to_sync.py``: edit that file, not this one.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, cast

import psycopg
from psycopg import errors as pg_errors

from fencekit.errors import IssuerUnavailableError, translate
from fencekit.leases._postgres_base import (
    ACQUIRE,
    EPOCH,
    RELEASE,
    RENEW,
    bad_input,
    failover_reason,
)
from fencekit.leases._postgres_base import connect_kwargs as connect_kwargs_for
from fencekit.leases.base import Grant, check_resource, check_ttl
from fencekit.leases.claim import conninfo as libpq_conninfo

__all__ = ["PostgresIssuer"]


class PostgresIssuer:
    """Leases from ``fencekit.acquire/renew/release`` over one owned connection.

    ``timeout`` bounds connecting and each call (seconds); keep it well below your lease ttl.
    Extra keyword arguments go to ``psycopg.connect``.
    """

    name = "postgres"

    def __init__(self, conninfo: Any = "", *, timeout: float = 5.0, **connect_kwargs: Any) -> None:
        # A conninfo, a URL in either spelling (postgresql://, postgresql+psycopg://...) or a
        # SQLAlchemy engine: the issuer opens its own autocommit connection from it.
        self.conninfo = libpq_conninfo(conninfo)
        self._kwargs = connect_kwargs_for(timeout, connect_kwargs)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise RuntimeError("PostgresIssuer is closed")
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, **self._kwargs)
        return self._conn

    def _scalar(self, query: str, params: tuple[Any, ...]) -> Any:
        with self._lock:
            # One retry on a broken connection (server restarted, idle connection dropped).
            # Safe: acquire by the same holder re-grants, renew extends again, release is
            # idempotent.
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                    cur = conn.execute(query, params)
                    row = cur.fetchone()
                    return None if row is None else row[0]
                except pg_errors.InvalidParameterValue as exc:
                    raise bad_input(exc) from exc
                except psycopg.OperationalError as exc:
                    broken = self._conn is None or self._conn.broken or self._conn.closed
                    if self._conn is not None and broken:
                        self._conn.close()
                        self._conn = None
                    if attempt == 2 or not broken:
                        raise IssuerUnavailableError(
                            f"PostgreSQL lease call failed: {exc}"
                        ) from exc
                except psycopg.Error as exc:
                    # fencekit's own refusals (class YF) as typed errors, e.g. a role outside
                    # fencekit_writer: FenceUsageError naming the role, hinting the GRANT.
                    refused: BaseException | None = translate(exc)
                    if refused is None or refused is cast(BaseException, exc):
                        raise  # not fencekit's, or psycopg raised fencekit's class itself
                    raise refused from exc
        raise AssertionError("unreachable")

    def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        check_resource(resource)
        ttl = check_ttl(ttl)
        token = self._scalar(ACQUIRE, (resource, holder, timedelta(seconds=ttl)))
        if token is None:
            return None
        return Grant(resource, holder, int(token), ttl, self.name)

    def renew(self, grant: Grant) -> bool:
        ok = self._scalar(
            RENEW, (grant.resource, grant.holder, grant.token, timedelta(seconds=grant.ttl))
        )
        return bool(ok)

    def release(self, grant: Grant) -> None:
        self._scalar(RELEASE, (grant.resource, grant.holder, grant.token))

    def release_checked(self, grant: Grant) -> bool:
        """Release and say whether this grant was still the resource's (False: not ours)."""
        return bool(self._scalar(RELEASE, (grant.resource, grant.holder, grant.token)))

    def epoch(self) -> int:
        """The epoch new tokens get on the server this issuer talks to now (its timeline)."""
        return int(self._scalar(EPOCH, ()))

    def refusal_reason(self, grant: Grant) -> str | None:
        """Why ``renew`` refused ``grant``, when a failover explains it (see docs/ha.md).

        A token's high bits are the epoch (timeline) it was granted in: a refusal by a server
        on a later timeline means a promotion happened since; whether the new primary lost the
        grant or another holder took it, the lease is gone. None when no failover is seen.
        """
        try:
            now = self.epoch()
        except Exception:  # best effort: the refusal itself stands
            return None
        return failover_reason(grant, now)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> PostgresIssuer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
