"""dramatiq: the billing task fenced, on the redis broker.

A redis worker that stops sending heartbeats for ``heartbeat_timeout`` (paused, or dead) has its
unacknowledged messages put back on the queue by another worker's maintenance: the same job
then runs twice at once, and only the fence keeps the paused one's writes out.

    python -m tests.tasks.recipes.dramatiq_app worker NAME
    python -m tests.tasks.recipes.dramatiq_app defer ACCOUNT HOLD READY_FILE
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from fencekit.tasks import fenced_task
from tests.tasks.recipes import billing

WORKER = os.environ.get("FK_WORKER", "?")

broker = RedisBroker(
    url=os.environ.get("FK_TASKS_BROKER", "redis://127.0.0.1:6379/0"),
    heartbeat_timeout=int(float(os.environ.get("FK_VISIBILITY", "60")) * 1000),
    maintenance_chance=1_000_000,  # every command looks for dead workers: fast requeues here
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="billing", max_retries=0)
@fenced_task(
    billing.issuer, "billing:{account_id}", ttl=billing.TTL, wait=60, claim=billing.claim_account
)
def recompute(account_id: int, hold: float, ready: str) -> None:
    billing.recompute(account_id, WORKER, hold, f"{ready}.{WORKER}")


def run_worker() -> None:
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    worker.stop()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        run_worker()
    else:
        _, account, hold, ready = sys.argv[1:]
        recompute.send(int(account), float(hold), ready)
