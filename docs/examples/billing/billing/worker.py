"""The worker: rebuild one account's billing summary under the lease ``billing:<account_id>``.

Two forms of the same job: ``rebuild_summary`` (SQLAlchemy, threads) and
``rebuild_summary_async`` (psycopg's asyncio connection). Both take the lease from fencekit's
built-in issuer, read the invoices, compute (``checkpoint("computing")``: where a test pauses
the worker; nothing at all in production), then write the summary with the lease's token.
"""

from __future__ import annotations

import os
import socket

import psycopg
from sqlalchemy import create_engine, func, select
from sqlalchemy.dialects.postgresql import insert

import fencekit.psycopg
import fencekit.sqlalchemy
from billing.models import billing_summary, invoices
from fencekit.leases import AsyncLease, AsyncPostgresIssuer, Lease, PostgresIssuer
from fencekit.testing import checkpoint

TTL = 1.5  # seconds: short, so that a test's pause outlives it quickly


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def rebuild_summary(url: str, account_id: int, *, ttl: float = TTL) -> int:
    """Rebuild the summary of ``account_id`` (SQLAlchemy URL ``url``); returns the total."""
    engine = create_engine(url)
    fencekit.sqlalchemy.install(engine)  # writes inside the lease's scope carry its token
    try:
        with (
            PostgresIssuer(url) as issuer,  # takes the SQLAlchemy URL as it is
            Lease(issuer, f"billing:{account_id}", ttl=ttl, wait=30),
            engine.begin() as conn,
        ):
            total, count = conn.execute(
                select(func.coalesce(func.sum(invoices.c.amount_cents), 0), func.count()).where(
                    invoices.c.account_id == account_id
                )
            ).one()
            checkpoint("computing")
            row = {
                "account_id": account_id,
                "total_cents": total,
                "invoice_count": count,
                "rebuilt_by": _me(),
                "rebuilt_at": func.clock_timestamp(),
            }
            stmt = insert(billing_summary).values(row)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["account_id"], set_={k: stmt.excluded[k] for k in row}
                )
            )
        return int(total)
    finally:
        engine.dispose()


UPSERT = """
INSERT INTO billing_summary AS s (account_id, total_cents, invoice_count, rebuilt_by, rebuilt_at)
VALUES (%s, %s, %s, %s, clock_timestamp())
ON CONFLICT (account_id) DO UPDATE SET total_cents = excluded.total_cents,
  invoice_count = excluded.invoice_count, rebuilt_by = excluded.rebuilt_by,
  rebuilt_at = excluded.rebuilt_at
"""


async def rebuild_summary_async(dsn: str, account_id: int, *, ttl: float = TTL) -> int:
    """The same job with psycopg's AsyncConnection (libpq DSN ``dsn``)."""
    async with (
        AsyncPostgresIssuer(dsn) as issuer,
        AsyncLease(issuer, f"billing:{account_id}", ttl=ttl, wait=30) as lease,
        await psycopg.AsyncConnection.connect(dsn) as conn,
    ):
        cur = await conn.execute(
            "SELECT coalesce(sum(amount_cents), 0), count(*) FROM invoices WHERE account_id = %s",
            (account_id,),
        )
        total, count = await cur.fetchone()  # type: ignore[misc]
        checkpoint("computing")
        async with fencekit.psycopg.async_transaction(conn, lease.token):
            await conn.execute(UPSERT, (account_id, total, count, _me()))
        return int(total)
