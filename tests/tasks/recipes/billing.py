"""The work every recipe fences: recompute one account's billing summary.

``billing_summary`` has a key fence on ``account_id``. The task takes the lease
``billing:<account_id>``, claims the account's fence at grant, marks the row as started, lets
the test know (``ready``: a file it waits for), works ``hold`` seconds (where the test pauses the
worker), then writes the result. Settings come from the environment the test gives the worker:
``FK_TASKS_DSN`` (the database) and ``FK_TASKS_TTL`` (the lease, seconds).
"""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path
from typing import Any

import psycopg

import fencekit.psycopg
from fencekit.leases import Lease, PostgresIssuer
from fencekit.tasks import fenced_task

DSN = os.environ.get("FK_TASKS_DSN", "")
TTL = float(os.environ.get("FK_TASKS_TTL", "30"))


@cache
def connection() -> psycopg.Connection[Any]:
    """This worker process's connection; statements in a fencing() scope carry the token."""
    conn = psycopg.connect(DSN, autocommit=True)
    fencekit.psycopg.install(conn)
    return conn


def issuer() -> PostgresIssuer:
    return PostgresIssuer(DSN)


def claim_account(lease: Lease, account_id: int, *args: object, **kwargs: object) -> None:
    # Claim at grant: from here on, every token older than this lease's is stale for the
    # account, before this task has written anything.
    lease.claim(connection(), "billing_summary", account_id)


def recompute(account_id: int, who: str, hold: float, ready: str) -> None:
    conn = connection()
    conn.execute(
        "UPDATE billing_summary SET started_by = %s WHERE account_id = %s", (who, account_id)
    )
    Path(ready).touch()
    time.sleep(hold)  # the long part; the test pauses the worker here
    conn.execute(
        "UPDATE billing_summary SET total = total + 1, written_by = %s WHERE account_id = %s",
        (who, account_id),
    )


fenced_recompute = fenced_task(
    issuer, "billing:{account_id}", ttl=TTL, wait=60, claim=claim_account
)(recompute)
