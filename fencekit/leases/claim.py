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

from collections.abc import Sequence
from typing import Any

from fencekit.errors import translate, validate_token

__all__ = ["CLAIM_SQL", "async_claim", "claim", "key_texts"]

CLAIM_SQL = "SELECT fencekit.claim(%s::regclass, %s::text[], %s, %s)"


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


def claim(
    conn: Any, table: str, key: Sequence[object], token: int, issuer: str | None = None
) -> int | None:
    """Run ``fencekit.claim`` on a psycopg (or DB-API-like) connection; the fence before it.

    ``table`` may be schema-qualified; ``key`` the key values in key-column order (empty for a
    table fence). Fencekit's refusals are raised as :class:`~fencekit.errors.FenceError`
    (``StaleTokenError`` when a newer token already holds the resource). The caller's
    transaction is used as it is: in autocommit mode the claim commits at once.
    """
    params = _params(table, key, token, issuer)
    try:
        row = conn.execute(CLAIM_SQL, params).fetchone()
    except Exception as exc:
        refused = translate(exc)
        if refused is None:
            raise
        raise refused from exc
    return None if row is None or row[0] is None else int(row[0])


async def async_claim(
    conn: Any, table: str, key: Sequence[object], token: int, issuer: str | None = None
) -> int | None:
    """Async twin of :func:`claim` (psycopg ``AsyncConnection``)."""
    params = _params(table, key, token, issuer)
    try:
        cur = await conn.execute(CLAIM_SQL, params)
        row = await cur.fetchone()
    except Exception as exc:
        refused = translate(exc)
        if refused is None:
            raise
        raise refused from exc
    return None if row is None or row[0] is None else int(row[0])
