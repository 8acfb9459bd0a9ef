"""Claim a resource at grant: raise its fence to the new lease's token before working.

A key or table fence rejects tokens lower than the highest it has accepted. Until the new
holder's first write, the previous holder's token still passes: a paused worker, or a zombie of
a primary that failed over before the newest fence advance reached the standby. A claim closes
that window at grant time (``fencekit.claim`` in SQL, see docs/leases.md#claim-at-grant)::

    with Lease(issuer, "billing:42", ttl=30) as lease:
        lease.claim(conn, "billing_summary", 42)    # every older token is stale from here on

Lease-bound fences need no claim (they accept only the live lease's token). Row fences have a
fence per row: a row is claimed by writing it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NoReturn

from fencekit.errors import FenceError, translate, validate_token

__all__ = ["async_claim", "claim", "conninfo"]

CLAIM_SQL = "SELECT fencekit.claim(%s::regclass, %s::text[], %s, %s)"
_CLAIM_NUMBERED = "SELECT fencekit.claim($1::regclass, $2::text[], $3, $4)"  # asyncpg
_CLAIM_NAMED = "SELECT fencekit.claim(CAST(:t AS regclass), CAST(:k AS text[]), :token, :issuer)"
_URL = re.compile(r"(?i)^(postgres(?:ql)?)(\+[a-z0-9_]+)?://")


def conninfo(target: Any) -> str:
    """A libpq connection string for ``target``: a conninfo or a URL in either spelling
    (``postgresql://``, SQLAlchemy's ``postgresql+psycopg://``, ``+psycopg2``, ``+asyncpg``), or
    a SQLAlchemy ``Engine``/``AsyncEngine``/``URL`` (its password included)."""
    url = getattr(target, "url", target)  # an Engine's URL
    if hasattr(url, "render_as_string"):
        url = url.render_as_string(hide_password=False)
    if not isinstance(url, str):
        raise TypeError(
            f"expected a connection string, URL or SQLAlchemy engine, got {type(target).__name__}"
        )
    return _URL.sub("postgresql://", url, count=1) if _URL.match(url) else url


def key_texts(key: Sequence[object]) -> list[str]:
    """Key values as the text ``fencekit.key_text`` casts to each key column's type."""
    out: list[str] = []
    for value in key:
        if value is None:
            raise ValueError("a key value must not be None (a NULL key has no fence)")
        if isinstance(value, bytes | bytearray | memoryview):
            out.append("\\x" + bytes(value).hex())
        elif hasattr(value, "isoformat"):
            out.append(value.isoformat())
        else:
            out.append(str(value))
    return out


def _params(
    table: str, key: Sequence[object], token: int, issuer: str | None
) -> tuple[str, list[str], int, str | None]:
    return table, key_texts(key), validate_token(token), issuer


def _kind(conn: Any) -> str:
    """Which API ``conn`` speaks: by the modules of its class (and SQLAlchemy's types)."""
    if isinstance(conn, str) or hasattr(conn, "render_as_string"):
        return "url"
    modules = {cls.__module__ for cls in type(conn).__mro__}
    if any(m.startswith("sqlalchemy") for m in modules):
        name = type(conn).__name__
        if "Engine" in name:
            return "sqlalchemy-engine"
        return "sqlalchemy"  # Connection, Session, AsyncConnection, AsyncSession
    if any(m.startswith("psycopg2") for m in modules):
        return "psycopg2"
    if any(m.startswith("asyncpg") for m in modules):
        return "asyncpg"
    return "psycopg"  # psycopg 3, or anything with its execute(...).fetchone()


def _refused(exc: BaseException) -> BaseException:
    refused = translate(exc)
    return exc if refused is None else refused


def _raise(exc: BaseException) -> NoReturn:
    refused = _refused(exc)
    if refused is exc:
        raise exc
    raise refused from exc


def _fence(value: object) -> int | None:
    return None if value is None else int(str(value))


def _named(params: tuple[str, list[str], int, str | None]) -> dict[str, Any]:
    table, key, token, issuer = params
    return {"t": table, "k": key, "token": token, "issuer": issuer}


def claim(
    conn: Any, table: str, key: Sequence[object], token: int, issuer: str | None = None
) -> int | None:
    """Run ``fencekit.claim``; return the fence before it.

    ``conn`` is what you have: a psycopg 3 or psycopg2 connection, a SQLAlchemy ``Connection``
    or ``Session`` (their transaction is used as it is: in autocommit mode the claim commits
    at once), a SQLAlchemy ``Engine`` or a URL / conninfo (a transaction of its own, committed).
    ``table`` may be schema-qualified; ``key`` the key values in key-column order (empty for a
    table fence). Fencekit's refusals are raised as :class:`~fencekit.errors.FenceError`
    (``StaleTokenError`` when a newer token already holds the resource).
    """
    params = _params(table, key, token, issuer)
    kind = _kind(conn)
    try:
        if kind == "url":
            import psycopg

            with psycopg.connect(conninfo(conn), autocommit=True) as own:
                return claim(own, table, key, token, issuer)
        if kind == "sqlalchemy-engine":
            with conn.begin() as connection:
                return claim(connection, table, key, token, issuer)
        if kind == "sqlalchemy":
            from sqlalchemy import text

            return _fence(conn.execute(text(_CLAIM_NAMED), _named(params)).scalar())
        if kind == "psycopg2":
            with conn.cursor() as cur:
                cur.execute(CLAIM_SQL, params)
                row = cur.fetchone()
            return _fence(None if row is None else row[0])
        if kind == "asyncpg":
            raise TypeError("an asyncpg connection is async: use await async_claim(...)")
        row = conn.execute(CLAIM_SQL, params).fetchone()
        return _fence(None if row is None else row[0])
    except FenceError:
        raise
    except Exception as exc:
        _raise(exc)


async def async_claim(
    conn: Any, table: str, key: Sequence[object], token: int, issuer: str | None = None
) -> int | None:
    """Async twin of :func:`claim`: a psycopg ``AsyncConnection``, an asyncpg connection (or
    pool), a SQLAlchemy ``AsyncConnection``/``AsyncSession``/``AsyncEngine``, or a URL."""
    params = _params(table, key, token, issuer)
    kind = _kind(conn)
    try:
        if kind == "url":
            import psycopg

            async with await psycopg.AsyncConnection.connect(
                conninfo(conn), autocommit=True
            ) as own:
                return await async_claim(own, table, key, token, issuer)
        if kind == "sqlalchemy-engine":
            async with conn.begin() as connection:
                return await async_claim(connection, table, key, token, issuer)
        if kind == "sqlalchemy":
            from sqlalchemy import text

            result = await conn.execute(text(_CLAIM_NAMED), _named(params))
            return _fence(result.scalar())
        if kind == "asyncpg":
            return _fence(await conn.fetchval(_CLAIM_NUMBERED, *params))
        cur = await conn.execute(CLAIM_SQL, params)
        row = await cur.fetchone()
        return _fence(None if row is None else row[0])
    except FenceError:
        raise
    except Exception as exc:
        _raise(exc)
