"""Celery: the billing task fenced, late acknowledgement and a visibility timeout on redis.

With ``acks_late`` a message stays unacknowledged while its task runs; once the visibility
timeout passes without an ack (the worker is paused, or died), redis hands it to another worker,
which runs the task again: two workers on one job, which only the fence keeps apart.

    celery -A tests.tasks.recipes.celery_app worker -P solo -Q billing -n NAME@%h
    python -m tests.tasks.recipes.celery_app defer ACCOUNT HOLD READY_FILE
"""

from __future__ import annotations

import os
import sys

from celery import Celery

from fencekit.tasks import fenced_task
from tests.tasks.recipes import billing

WORKER = os.environ.get("FK_WORKER", "?")

app = Celery("billing", broker=os.environ.get("FK_TASKS_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_acks_late=True,  # ack when the task ends, so a stalled task's message comes back
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("FK_VISIBILITY", "3600")),
        # How often a worker looks for messages past their visibility timeout (seconds, and
        # every how many looks it scans): fast here so the test's redelivery comes quickly.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    task_default_queue="billing",
)


@app.task(name="billing.recompute")
@fenced_task(
    billing.issuer, "billing:{account_id}", ttl=billing.TTL, wait=60, claim=billing.claim_account
)
def recompute(account_id: int, hold: float, ready: str) -> None:
    billing.recompute(account_id, WORKER, hold, f"{ready}.{WORKER}")


if __name__ == "__main__":
    account, hold, ready = sys.argv[1:]
    recompute.apply_async((int(account), float(hold), ready))
