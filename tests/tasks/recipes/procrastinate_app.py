"""procrastinate: the billing task fenced, its queries on procrastinate's own (fenced) pool.

python -m tests.tasks.recipes.procrastinate_app schema
python -m tests.tasks.recipes.procrastinate_app defer ACCOUNT WHO HOLD READY_FILE
python -m tests.tasks.recipes.procrastinate_app worker     # until the queue is empty
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import procrastinate

from fencekit.leases import AsyncLease
from fencekit.tasks import fenced_task
from fencekit.tasks.procrastinate import fenced_connector
from tests.tasks.recipes.billing import DSN, TTL, issuer

app = procrastinate.App(connector=fenced_connector(conninfo=DSN))


async def claim_account(lease: AsyncLease, account_id: int, **task_args: object) -> None:
    async with app.connector.pool.connection() as conn:  # procrastinate's pool
        await lease.claim(conn, "billing_summary", account_id)


@app.task(name="recompute", queue="billing")
@fenced_task(issuer, "billing:{account_id}", ttl=TTL, wait=60, claim=claim_account)
async def recompute(account_id: int, who: str, hold: float, ready: str) -> None:
    await app.connector.execute_query_async(
        "UPDATE billing_summary SET started_by = %(who)s WHERE account_id = %(account_id)s",
        who=who,
        account_id=account_id,
    )
    Path(ready).touch()
    await asyncio.sleep(hold)  # the test pauses the worker here
    await app.connector.execute_query_async(
        "UPDATE billing_summary SET total = total + 1, written_by = %(who)s"
        " WHERE account_id = %(account_id)s",
        who=who,
        account_id=account_id,
    )


def main(command: str, *args: str) -> None:
    if command == "worker":
        app.run_worker(queues=["billing"], wait=False, concurrency=1)
        return
    with app.open():
        if command == "schema":
            app.schema_manager.apply_schema()
        elif command == "defer":
            account, who, hold, ready = args
            recompute.defer(account_id=int(account), who=who, hold=float(hold), ready=ready)


if __name__ == "__main__":
    main(*sys.argv[1:])
