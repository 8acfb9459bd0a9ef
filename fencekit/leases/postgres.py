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

import asyncio
import threading
from datetime import timedelta
from typing import Any, cast

import psycopg
from psycopg import errors as pg_errors

from fencekit.errors import IssuerUnavailableError, translate
from fencekit.leases.base import Grant, check_resource, check_ttl
from fencekit.leases.claim import conninfo as libpq_conninfo

__all__ = ["AsyncPostgresIssuer", "PostgresIssuer"]

_ACQUIRE = "SELECT fencekit.acquire(%s, %s, %s)"
_RENEW = "SELECT fencekit.renew(%s, %s, %s, %s)"
_RELEASE = "SELECT fencekit.release(%s, %s, %s)"
_EPOCH = "SELECT fencekit.lease_epoch()"
EPOCH_BITS = 40


def _failover_reason(grant: Grant, epoch_now: int) -> str | None:
    granted_in = grant.token >> EPOCH_BITS
    if granted_in == 0 or epoch_now <= granted_in:
        return None  # a token of an older core, or no promotion since the grant
    return (
        f"renewal refused after a failover: the grant was made on timeline {granted_in}, the "
        f"primary now writes timeline {epoch_now} and no longer has this grant live (lost "
        "with the newest commits of an asynchronous standby, expired or taken over meanwhile)"
    )


def _connect_kwargs(timeout: float, kwargs: dict[str, Any]) -> dict[str, Any]:
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


def _bad_input(exc: psycopg.Error) -> ValueError:
    diag = exc.diag
    return ValueError(diag.message_primary or str(exc))


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
        self._kwargs = _connect_kwargs(timeout, connect_kwargs)
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
                    row = self._connection().execute(query, params).fetchone()
                    return None if row is None else row[0]
                except pg_errors.InvalidParameterValue as exc:
                    raise _bad_input(exc) from exc
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
        token = self._scalar(_ACQUIRE, (resource, holder, timedelta(seconds=ttl)))
        if token is None:
            return None
        return Grant(resource, holder, int(token), ttl, self.name)

    def renew(self, grant: Grant) -> bool:
        ok = self._scalar(
            _RENEW, (grant.resource, grant.holder, grant.token, timedelta(seconds=grant.ttl))
        )
        return bool(ok)

    def release(self, grant: Grant) -> None:
        self._scalar(_RELEASE, (grant.resource, grant.holder, grant.token))

    def release_checked(self, grant: Grant) -> bool:
        """Release and say whether this grant was still the resource's (False: not ours)."""
        return bool(self._scalar(_RELEASE, (grant.resource, grant.holder, grant.token)))

    def epoch(self) -> int:
        """The epoch new tokens get on the server this issuer talks to now (its timeline)."""
        return int(self._scalar(_EPOCH, ()))

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
        return _failover_reason(grant, now)

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


class AsyncPostgresIssuer:
    """The asyncio form of :class:`PostgresIssuer` (psycopg ``AsyncConnection``)."""

    name = "postgres"

    def __init__(self, conninfo: Any = "", *, timeout: float = 5.0, **connect_kwargs: Any) -> None:
        # A conninfo, a URL in either spelling (postgresql://, postgresql+psycopg://...) or a
        # SQLAlchemy engine: the issuer opens its own autocommit connection from it.
        self.conninfo = libpq_conninfo(conninfo)
        self._kwargs = _connect_kwargs(timeout, connect_kwargs)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._closed:
            raise RuntimeError("AsyncPostgresIssuer is closed")
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs)
        return self._conn

    async def _scalar(self, query: str, params: tuple[Any, ...]) -> Any:
        async with self._lock:
            for attempt in (1, 2):
                try:
                    conn = await self._connection()
                    cur = await conn.execute(query, params)
                    row = await cur.fetchone()
                    return None if row is None else row[0]
                except pg_errors.InvalidParameterValue as exc:
                    raise _bad_input(exc) from exc
                except psycopg.OperationalError as exc:
                    broken = self._conn is None or self._conn.broken or self._conn.closed
                    if self._conn is not None and broken:
                        await self._conn.close()
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

    async def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        check_resource(resource)
        ttl = check_ttl(ttl)
        token = await self._scalar(_ACQUIRE, (resource, holder, timedelta(seconds=ttl)))
        if token is None:
            return None
        return Grant(resource, holder, int(token), ttl, self.name)

    async def renew(self, grant: Grant) -> bool:
        ok = await self._scalar(
            _RENEW, (grant.resource, grant.holder, grant.token, timedelta(seconds=grant.ttl))
        )
        return bool(ok)

    async def release(self, grant: Grant) -> None:
        await self._scalar(_RELEASE, (grant.resource, grant.holder, grant.token))

    async def release_checked(self, grant: Grant) -> bool:
        return bool(await self._scalar(_RELEASE, (grant.resource, grant.holder, grant.token)))

    async def epoch(self) -> int:
        return int(await self._scalar(_EPOCH, ()))

    async def refusal_reason(self, grant: Grant) -> str | None:
        """See :meth:`PostgresIssuer.refusal_reason`."""
        try:
            now = await self.epoch()
        except Exception:
            return None
        return _failover_reason(grant, now)

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    async def __aenter__(self) -> AsyncPostgresIssuer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
