"""The pause and the takeover: the test fencekit is built on, for the user's own worker.

``paused(worker, until_lease_expired="billing:42")`` stops the worker (SIGSTOP: every thread,
lease renewal included), lets it past the checkpoint it is held at (it reads the go-ahead only
once resumed), waits until the lease has expired by the issuer's clock, and resumes it
(SIGCONT) when the block ends, in a ``finally``: a failing test never leaves a stopped process.

``takeover(fn, *args, resource=..., table=...)`` is the whole scenario: worker A runs to its
checkpoint and is paused past its lease; worker B (the same code) takes the lease over and runs
to the end, so its write (or its claim at grant) has moved the fence before A resumes; A
resumes, and its write must be rejected as stale, and B's must survive. ``during_pause=``
changes the data while A is paused, before B starts (the late invoice A never saw). Nothing in
it sleeps for a guessed time. When B's token has not reached the fence by the time A resumes,
the failure names the grant-to-first-write gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fencekit.errors import FencingAssertionError
from fencekit.spec import TableName
from fencekit.testing.assertions import current_database, describe
from fencekit.testing.clocks import wait_lease_expired
from fencekit.testing.workers import Outcome, Worker

if TYPE_CHECKING:
    from fencekit.testing.database import FencedDatabase

__all__ = ["TakeoverResult", "atakeover", "paused", "takeover"]


@contextlib.contextmanager
def paused(
    worker: Worker,
    *,
    until_lease_expired: str | None = None,
    issuer: Any = None,
    db: FencedDatabase | None = None,
    timeout: float = 60.0,
) -> Iterator[Worker]:
    """SIGSTOP ``worker`` for the block; with ``until_lease_expired``, enter the block only
    once that lease has expired by its issuer's clock (``issuer``: an etcd or ZooKeeper
    issuer; default fencekit's, in the worker's database)."""
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    worker.stop()
    try:
        worker.release()  # buffered: the worker reads it when it runs again
        if until_lease_expired is not None:
            d = db or getattr(worker, "db", None) or current_database()
            wait_lease_expired(until_lease_expired, dsn=d.dsn, issuer=issuer, timeout=timeout)
        yield worker
    finally:
        worker.cont()


@dataclass
class TakeoverResult:
    """What happened: both workers, their outcomes, tokens, fences and the table's rows."""

    a: Worker
    b: Worker
    a_outcome: Outcome
    b_outcome: Outcome
    a_token: int | None
    b_token: int | None
    fence_after_b: int | None
    rows_after_b: list[str]
    rows_after_a: list[str]
    stale_rejections: int


def _token(db: FencedDatabase, resource: str, issuer: Any) -> int | None:
    if issuer is not None:
        return None
    lease = db.lease(resource)
    return None if lease is None else int(lease["token"])


def takeover(
    fn: Callable[..., Any],
    *args: Any,
    resource: str,
    table: str,
    at: str = "computing",
    db: FencedDatabase | None = None,
    issuer: Any = None,
    timeout: float = 60.0,
    during_pause: Callable[[FencedDatabase], Any] | None = None,
    **kwargs: Any,
) -> TakeoverResult:
    """Run the takeover scenario with ``fn(*args, **kwargs)`` as both workers; see the module
    docstring. ``resource``: the lease the worker takes; ``table``: the table it writes;
    ``at``: the checkpoint to pause A at (after the lease, before the write).
    ``during_pause(db)``: what happens to the data while A is paused (a late invoice arrives):
    called once A's lease has expired, before B starts, with the test's database."""
    __tracebackhide__ = True  # pytest: the failure is the message, not the kit's frames
    d = db or current_database()
    name = TableName.parse(table).dotted
    before = d.rejections(table) if d.spec_of(table) else {}
    a = d.spawn(fn, *args, name="A", pause_at=at, **kwargs)
    a.wait_for(at, timeout)
    a_token = _token(d, resource, issuer)
    with paused(a, until_lease_expired=resource, issuer=issuer, db=d, timeout=timeout):
        if during_pause is not None:
            during_pause(d)
        b = d.spawn(fn, *args, name="B", **kwargs)
        b_outcome = b.join(timeout)
        if not b_outcome.ok:
            raise FencingAssertionError(
                f"takeover: worker B, which took over {resource!r} while A was paused, failed: "
                f"{b_outcome.describe()}\n{describe(d, [table])}"
            )
        b_token = _token(d, resource, issuer)
        fence_b = d.fence(table)
        rows_b = d.snapshot(table)
    a_outcome = a.join(timeout)
    rows_a = d.snapshot(table)
    after = d.rejections(table) if d.spec_of(table) else {}
    stale = after.get("stale", 0) - before.get("stale", 0)
    result = TakeoverResult(a, b, a_outcome, b_outcome, a_token, b_token, fence_b, rows_b,
                            rows_a, stale)  # fmt: skip
    problems = _judge(d, result, name, resource)
    if problems:
        raise FencingAssertionError("\n".join(problems) + "\n" + describe(d, [table]))
    return result


def _judge(d: FencedDatabase, r: TakeoverResult, table: str, resource: str) -> list[str]:
    tokens = f"A held token {r.a_token}, B took over with token {r.b_token}"
    out: list[str] = []
    if r.rows_after_a != r.rows_after_b:
        out.append(
            f"LOST UPDATE: worker A resumed after its lease on {resource!r} had expired ({tokens}) "
            f"and its stale write to {table} was ACCEPTED, overwriting what B wrote."
        )
        spec = d.spec_of(table)
        if spec is None:
            out.append(
                f"  why: {table} is not protected by fencekit: nothing compares tokens "
                "there (protect it: fencekit protect, or op.create_fence in a migration)"
            )
        elif r.b_token is not None and (r.fence_after_b or 0) < r.b_token:
            out.append(
                f"  why: the grant-to-first-write gap: when A resumed, {table}'s fence was "
                f"{r.fence_after_b}, below B's token {r.b_token}: B had not written nor claimed "
                "under its token, so A's older token was not stale yet. Claim at grant "
                "(lease.claim(conn, table, key) / fencekit.claim) or write before anything else."
            )
        elif r.a_outcome.ok and not r.a.rejections:
            out.append(
                "  why: A's write passed the fence: did A send its token? "
                f"(A {r.a_outcome.describe()})"
            )
        diff = difflib.unified_diff(
            r.rows_after_b, r.rows_after_a, "after B", "after A", lineterm="", n=0
        )
        out.extend(f"  {line}" for line in list(diff)[:20])
    elif r.stale_rejections < 1:
        out.append(
            f"worker A's write was not rejected as stale ({tokens}; {r.stale_rejections} stale "
            f"rejections counted on {table}) although the rows did not change: did A write after "
            f"its checkpoint at all? (A lease.check() after the checkpoint makes A stop itself "
            f"before writing: check before the checkpoint.) A {r.a_outcome.describe()}"
        )
    return out


async def atakeover(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> TakeoverResult:
    """:func:`takeover` for async tests (runs it in a thread; the workers are processes)."""
    return await asyncio.to_thread(takeover, fn, *args, **kwargs)
