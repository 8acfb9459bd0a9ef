"""The tables: invoices, and the billing summary each account's worker rebuilds.

The summary is key-fenced on ``account_id``: the lease ``billing:<account_id>`` hands out the
token, and PostgreSQL rejects a summary written with a token older than the last one accepted.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Integer, MetaData, Table, Text, func

from fencekit.declare import declare_fence

metadata = MetaData()

invoices = Table(
    "invoices",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("account_id", Integer, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
)

billing_summary = Table(
    "billing_summary",
    metadata,
    Column("account_id", Integer, primary_key=True),
    Column("total_cents", BigInteger, nullable=False),
    Column("invoice_count", Integer, nullable=False),
    Column("rebuilt_by", Text, nullable=False),
    Column("rebuilt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
declare_fence(billing_summary, scope="key", key=["account_id"])
