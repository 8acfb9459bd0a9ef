"""A job table of your own, fenced: a stalled worker never marks a job done after it was retried.

``jobs`` has a row fence. Each job is run under the lease ``job:<id>``: a worker that gets it
(without waiting) either starts a new job or retries one whose worker lost its lease. Its first
write, the claim, marks the row running under the new token, which moves the row's fence past
every older token: the stalled worker's "done", written with its old token when it wakes up, is
rejected by PostgreSQL. Run as a worker: ``python -m tests.tasks.recipes.jobqueue NAME HOLD
READY_FILE`` (the environment of recipes/billing.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fencekit.leases import LeaseTimeoutError
from fencekit.tasks import fenced_task
from tests.tasks.recipes.billing import TTL, connection, issuer


class AlreadyDone(Exception):
    """Another worker finished the job between our look and our claim."""


def start_job(lease: object, job_id: int, worker: str, *args: object) -> None:
    # The claim: the row written under this lease's token, so older tokens are stale for it.
    cur = connection().execute(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1, worker = %s"
        " WHERE id = %s AND state <> 'done'",
        (worker, job_id),
    )
    if cur.rowcount == 0:
        raise AlreadyDone(job_id)


@fenced_task(issuer, "job:{job_id}", ttl=TTL, wait=0, claim=start_job)
def run_job(job_id: int, worker: str, hold: float, ready: str) -> None:
    Path(ready).touch()
    time.sleep(hold)  # the work; the test pauses the worker here
    connection().execute(
        "UPDATE jobs SET state = 'done', result = %s WHERE id = %s",
        (f"done by {worker}", job_id),
    )


def work(worker: str, hold: float, ready: str, until_empty: float) -> None:
    """Run the jobs not done whose lease is free, until none is left for ``until_empty`` s."""
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < until_empty:
        rows = connection().execute("SELECT id FROM jobs WHERE state <> 'done' ORDER BY id")
        for (job_id,) in rows.fetchall():
            try:
                run_job(job_id, worker, hold, ready)
                print(f"{worker}: job {job_id} done", flush=True)
            except (LeaseTimeoutError, AlreadyDone):
                continue  # another worker holds it, or finished it
            except Exception as exc:
                print(f"{worker}: job {job_id} failed: {exc!r} <- {exc.__cause__!r}", flush=True)
            idle_since = time.monotonic()
        time.sleep(0.1)


if __name__ == "__main__":
    work(sys.argv[1], float(sys.argv[2]), sys.argv[3], until_empty=float(sys.argv[4]))
