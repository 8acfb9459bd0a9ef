"""The paused-worker demo: two real worker processes, a lease, a SIGSTOP, and a stale write.

The story (docs/dev/design.md, "The problem"): worker A takes the lease on ``billing:42`` and starts
computing account 42's billing summary. A is frozen with SIGSTOP (think: a long GC pause, a
suspended VM) until its lease has expired by the database's clock. Meanwhile a new invoice
arrives; worker B takes the lease with the next token, computes the summary and writes it. A is
resumed with SIGCONT, finishes its now-outdated computation and writes. With fencing,
PostgreSQL rejects A's write (SQLSTATE YF001, StaleTokenError); with ``--no-fence`` A's stale
summary silently overwrites B's.

The table is protected with a KEY fence on ``account_id`` under the named resource ``billing``:
the fence for account 42 lives in ``fencekit.fences`` under ("billing", "42"), so it also
guards an account whose summary row does not exist yet or was deleted (a row fence lives in the
row and cannot), and ``billing:42`` is exactly the lease resource the contract pairs with that
key (``<resource>:<key>``), which lease-bound fences build on.

Workers are this module run as ``python -m fencekit.demo --worker A ...``; they report events
as JSON lines on stdout, and the parent prints the merged timeline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekit.errors import DemoError

__all__ = ["run_demo"]

RESOURCE = "billing"  # the named resource of the key fence
ACCOUNT = 42
LEASE = f"{RESOURCE}:{ACCOUNT}"  # contracts.md: lease resource of a key = <resource>:<key>
INVOICES = (Decimal("100.00"), Decimal("250.00"))
LATE_INVOICE = Decimal("75.00")

_SETUP = """
CREATE TABLE invoices (
    id         serial PRIMARY KEY,
    account_id integer NOT NULL,
    amount     numeric(12, 2) NOT NULL
);
CREATE TABLE billing_summary (
    account_id  integer PRIMARY KEY,
    total       numeric(12, 2) NOT NULL,
    invoices    integer NOT NULL,
    computed_by text NOT NULL,
    token       bigint NOT NULL
);
"""

_UPSERT = """
INSERT INTO billing_summary AS s (account_id, total, invoices, computed_by, token)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (account_id) DO UPDATE
   SET total = EXCLUDED.total, invoices = EXCLUDED.invoices,
       computed_by = EXCLUDED.computed_by, token = EXCLUDED.token
"""


@dataclass
class DemoResult:
    fenced: bool
    ok: bool = False  # the outcome expected for the mode happened
    a_token: int | None = None
    b_token: int | None = None
    a_outcome: str | None = None  # "written" or "rejected"
    a_sqlstate: str | None = None
    a_error: str | None = None
    final_row: dict[str, Any] | None = None
    rejections: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------- worker process


def _emit(who: str, event: str, **data: Any) -> None:
    print(json.dumps({"who": who, "event": event, **data}, default=str), flush=True)


def _worker(
    name: str,
    dsn: str,
    ttl: float,
    compute: float,
    issuer_kind: str = "postgres",
    endpoints: str | None = None,
) -> int:
    from fencekit.context import current_token
    from fencekit.demo.issuers import make_issuer
    from fencekit.errors import FenceError
    from fencekit.leases import Lease
    from fencekit.psycopg import transaction as fenced_transaction

    def on_lost(_grant: Any, reason: str) -> None:
        _emit(name, "lost", reason=reason)

    holder = f"worker-{name}:pid{os.getpid()}"
    with (
        contextlib.closing(make_issuer(issuer_kind, dsn, endpoints, ttl)) as issuer,
        Lease(issuer, LEASE, ttl=ttl, wait=3 * ttl + 10, holder=holder, on_lost=on_lost) as lease,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        _emit(name, "acquired", token=lease.token, holder=holder)
        row = conn.execute(
            "SELECT coalesce(sum(amount), 0), count(*) FROM invoices WHERE account_id = %s",
            (ACCOUNT,),
        ).fetchone()
        assert row is not None
        total, count = row
        _emit(name, "computing", total=str(total), invoices=count)
        # The "long computation": the parent freezes worker A somewhere in here.
        steps = 20
        for _ in range(steps):
            time.sleep(compute / steps)
        token = current_token()  # put there by the Lease: the token writes carry
        assert token is not None
        _emit(name, "writing", token=token, total=str(total))
        try:
            # The psycopg adapter sends the lease's token with the transaction's first
            # statement (set_config('fencekit.token', ..., true)): nothing to pass by hand.
            with fenced_transaction(conn):
                conn.execute(_UPSERT, (ACCOUNT, total, count, name, token))
        except FenceError as err:
            _emit(
                name,
                "rejected",
                sqlstate=err.sqlstate,
                error=type(err).__name__,
                message=err.message,
            )
            return 3
        _emit(name, "written", token=token)
    _emit(name, "done")
    return 0


# ---------------------------------------------------------------- parent: orchestration


class _Worker:
    """A worker process and a thread turning its JSON lines into queued events."""

    def __init__(
        self,
        name: str,
        dsn: str,
        ttl: float,
        compute: float,
        events: queue.Queue[Any],
        issuer: str = "postgres",
        endpoints: str | None = None,
    ):
        self.name = name
        cmd = [sys.executable, "-m", "fencekit.demo", "--worker", name, "--dsn", dsn]
        cmd += ["--ttl", str(ttl), "--compute", str(compute), "--issuer", issuer]
        cmd += ["--issuer-endpoints", endpoints] if endpoints else []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._reader = threading.Thread(target=self._read, args=(events,), daemon=True)
        self._reader.start()

    def _read(self, events: queue.Queue[Any]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                events.put(json.loads(line))
        events.put({"who": self.name, "event": "exit"})

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-2000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def token_anatomy(token: int) -> str:
    """Why a token of fencekit's issuer is a large number that skips values (docs/leases.md,
    "How tokens stay monotonic")."""
    epoch, n = token >> 40, token & ((1 << 40) - 1)
    return (
        f"(token {token} = epoch {epoch} * 2^40 + {n}: the epoch is the server's WAL timeline, "
        "raised by every failover, so tokens granted after one are higher than all before it; "
        "the rest is a sequence shared by every resource, so one resource's tokens only grow "
        "but skip the numbers other resources took)"
    )


class _Story:
    def __init__(
        self, out: TextIO, fenced: bool, issuer: str = "postgres", endpoints: str | None = None
    ) -> None:
        self.out = out
        self.issuer = issuer
        self.endpoints = endpoints
        self.t0 = time.monotonic()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.result = DemoResult(fenced=fenced)
        self.explained = False  # the first token of fencekit's issuer is explained once

    def say(self, who: str, text: str) -> None:
        at = time.monotonic() - self.t0
        print(f"  {at:6.2f}s  {who:<8} {text}", file=self.out, flush=True)

    def wait_for(self, worker: _Worker, event: str, timeout: float) -> dict[str, Any]:
        """Print events as they come until ``worker`` reports ``event``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DemoError(f"worker {worker.name} did not report {event!r} in {timeout:g}s")
            try:
                ev = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            self.result.events.append(ev)
            self.narrate(ev)
            if ev["who"] == worker.name and ev["event"] == event:
                return ev
            if ev["who"] == worker.name and ev["event"] == "exit":
                raise DemoError(f"worker {worker.name} exited early:\n{worker.stderr()}")

    def narrate(self, ev: dict[str, Any]) -> None:
        who, kind = f"worker {ev['who']}", ev["event"]
        if kind == "acquired":
            self.say(who, f"acquired the lease on {LEASE!r}: token {ev['token']}")
            if self.issuer == "postgres" and not self.explained:
                self.explained = True
                self.say("", "  " + token_anatomy(int(ev["token"])))
        elif kind == "computing":
            self.say(who, f"read {ev['invoices']} invoices (total {ev['total']}), computing...")
        elif kind == "writing":
            self.say(who, f"writes the summary (total {ev['total']}) with token {ev['token']}")
        elif kind == "written":
            self.say(who, "write committed")
        elif kind == "rejected":
            self.say(
                who, f"write REJECTED by PostgreSQL: {ev['error']} (SQLSTATE {ev['sqlstate']})"
            )
            self.say("", f"  {ev['message']}")
        elif kind == "lost":
            self.say(who, f"renewal thread: lease lost ({ev['reason']})")
        elif kind == "done":
            self.say(who, "finished")


def _db_dsn(dsn: str, dbname: str) -> str:
    return make_conninfo(dsn, dbname=dbname)


@contextlib.contextmanager
def _demo_database(admin_dsn: str) -> Iterator[str]:
    """A fresh database for the demo, dropped afterwards (nothing is left on your server)."""
    name = f"fencekit_demo_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        try:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise DemoError(
                f"the demo creates (and drops) a database of its own, and the role of --dsn "
                f"may not: {exc.diag.message_primary}. Use a role with CREATEDB, or run the "
                "demo without --dsn on a throwaway embedded server."
            ) from exc
    try:
        yield _db_dsn(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _setup(dsn: str, fenced: bool, issuer: str = "postgres") -> None:
    from fencekit.spec import FenceSpec, Scope, TableName
    from fencekit.sqlgen import protect_statements, render_install

    with psycopg.connect(dsn) as conn:
        conn.execute(render_install().encode())
        conn.execute(_SETUP.encode())
        for amount in INVOICES:
            conn.execute(
                "INSERT INTO invoices (account_id, amount) VALUES (%s, %s)", (ACCOUNT, amount)
            )
        if fenced:
            spec = FenceSpec(
                table=TableName("public", "billing_summary"),
                scope=Scope.KEY,
                key=("account_id",),
                resource=RESOURCE,
                # An external issuer's tokens are bound to the resource (others get YF007).
                issuer=None if issuer == "postgres" else issuer,
            )
            for stmt in protect_statements(spec):
                conn.execute(stmt.encode())


def _wait_expired(dsn: str, timeout: float) -> None:
    """Poll until the lease has expired by the DATABASE clock (the only clock that counts)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM fencekit.leases_current WHERE resource = %s", (LEASE,)
            ).fetchone()
            if row == (0,):
                return
            time.sleep(0.05)
    raise DemoError(f"the lease on {LEASE!r} did not expire within {timeout:g}s")


def _report(story: _Story, dsn: str) -> None:
    out, res = story.out, story.result
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT account_id, total, invoices, computed_by, token FROM billing_summary"
        )
        cols = [d.name for d in cur.description or ()]
        rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        res.final_row = rows[0] if rows else None
        cur = conn.execute("SELECT * FROM fencekit.rejections ORDER BY 1, 2, 3")
        cols = [d.name for d in cur.description or ()]
        res.rejections = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    print("\nFinal row of billing_summary:", file=out)
    if res.final_row is None:
        print("  (none)", file=out)
    else:
        print("  " + ", ".join(f"{k}={v}" for k, v in res.final_row.items()), file=out)
    print("\nRejection counters (SELECT * FROM fencekit.rejections WHERE count > 0):", file=out)
    counted = [r for r in res.rejections if r.get("count")]
    if not counted:
        print("  (none)", file=out)
    for r in counted:
        print(
            f"  {r['schema_name']}.{r['table_name']}  reason={r['reason']}  count={r['count']}",
            file=out,
        )


def _story(dsn: str, story: _Story, ttl: float) -> None:
    res = story.result
    workers: list[_Worker] = []
    try:
        kind, endpoints = story.issuer, story.endpoints
        a = _Worker("A", dsn, ttl, 1.0, story.events, kind, endpoints)
        workers.append(a)
        res.a_token = story.wait_for(a, "acquired", 30)["token"]
        story.wait_for(a, "computing", 30)
        os.kill(a.proc.pid, signal.SIGSTOP)
        story.say("demo", "SIGSTOP worker A mid-computation (a GC pause, a frozen VM...)")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO invoices (account_id, amount) VALUES (%s, %s)",
                (ACCOUNT, LATE_INVOICE),
            )
        story.say("demo", f"a new invoice of {LATE_INVOICE} arrives for account {ACCOUNT}")
        if kind == "postgres":
            _wait_expired(dsn, 3 * ttl + 10)
            story.say("demo", f"A's lease (ttl {ttl:g}s) has expired by the database clock")
        else:
            from fencekit.demo.issuers import wait_released

            try:
                wait_released(kind, endpoints, LEASE, "worker-A", 3 * ttl + 20)
            except TimeoutError as exc:
                raise DemoError(str(exc)) from exc
            story.say("demo", f"A's lease has expired by {kind} (its keep-alives stopped)")

        b = _Worker("B", dsn, ttl, 0.2, story.events, kind, endpoints)
        workers.append(b)
        res.b_token = story.wait_for(b, "acquired", 30)["token"]
        story.wait_for(b, "exit", 30)

        os.kill(a.proc.pid, signal.SIGCONT)
        story.say("demo", "SIGCONT worker A: it resumes, unaware that its lease is gone")
        story.say("", "  (a lease.check() before writing would only narrow the window: a pause")
        story.say("", "   can land between the check and the write; the database check cannot)")
        end = story.wait_for(a, "exit", 30)
        del end
        for ev in res.events:
            if ev["who"] == "A" and ev["event"] in ("written", "rejected"):
                res.a_outcome = ev["event"]
                res.a_sqlstate = ev.get("sqlstate")
                res.a_error = ev.get("error")
        if res.a_outcome is None:
            raise DemoError(f"worker A neither wrote nor was rejected:\n{a.stderr()}")
    finally:
        for w in workers:
            w.kill()


def _verdict(story: _Story) -> None:
    res, out = story.result, story.out
    row = res.final_row or {}
    b_kept = row.get("computed_by") == "B" and row.get("token") == res.b_token
    a_won = row.get("computed_by") == "A" and row.get("token") == res.a_token
    if res.fenced:
        res.ok = res.a_outcome == "rejected" and res.a_sqlstate == "YF001" and b_kept
        good = "PostgreSQL rejected A's stale write; B's summary (with the late invoice) stands."
    else:
        res.ok = res.a_outcome == "written" and a_won
        good = (
            "LOST UPDATE: A's stale summary silently overwrote B's (the late invoice is gone).\n"
            "Run without --no-fence to see PostgreSQL reject it."
        )
    print(file=out)
    if res.ok:
        print(good, file=out)
    else:
        print(f"UNEXPECTED outcome for this mode: A {res.a_outcome}, final row {row}", file=out)


def run_demo(
    dsn: str | None = None,
    *,
    fence: bool = True,
    ttl: float = 1.0,
    out: TextIO | None = None,
    issuer: str = "postgres",
    issuer_endpoints: str | None = None,
) -> DemoResult:
    """Run the story on ``dsn`` (a fresh database is created and dropped there) or on a
    throwaway embedded server. Returns what happened; ``result.ok`` says whether the outcome
    is the one expected for the mode. ``issuer``: where the leases come from (postgres, etcd,
    zookeeper; see fencekit.demo.issuers for how an external server is found)."""
    from fencekit.demo.issuers import check_reachable, endpoints_for
    from fencekit.errors import IssuerNotReachableError

    out = out or sys.stdout
    try:
        issuer_endpoints = endpoints_for(issuer, issuer_endpoints)
        source = check_reachable(issuer, issuer_endpoints)
    except (IssuerNotReachableError, ValueError) as exc:
        raise DemoError(str(exc)) from exc
    story = _Story(out, fence, issuer, issuer_endpoints)
    mode = "fenced" if fence else "NOT fenced (--no-fence)"
    print(f"fencekit demo: two workers, one lease on {LEASE!r}, table {mode}", file=out)
    print(f"leases and tokens from {source}\n", file=out)
    server = None
    try:
        if dsn is None:
            from fencekit.embedded import start_embedded

            story.say("demo", "starting a throwaway embedded PostgreSQL...")
            server = start_embedded()
            dsn = server.dsn
        with _demo_database(dsn) as demo_dsn:
            _setup(demo_dsn, fence, issuer)
            fence_txt = f"key fence on account_id, resource {RESOURCE!r}" if fence else "no fence"
            story.say("demo", f"billing_summary created ({fence_txt}); 2 invoices for {ACCOUNT}")
            _story(demo_dsn, story, ttl)
            _report(story, demo_dsn)
        _verdict(story)
    finally:
        if server is not None:
            server.stop()
    story.result.seconds = time.monotonic() - story.t0
    print(f"\n(demo took {story.result.seconds:.1f}s; its database was dropped)", file=out)
    return story.result


def _check_dsn(dsn: str) -> str:
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise argparse.ArgumentTypeError(f"not a valid connection string: {exc}") from exc
    return dsn


def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of a demo worker process (``python -m fencekit.demo``)."""
    p = argparse.ArgumentParser(prog="python -m fencekit.demo", description="demo worker")
    p.add_argument("--worker", required=True)
    p.add_argument("--dsn", required=True, type=_check_dsn)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--compute", type=float, default=1.0)
    p.add_argument("--issuer", default="postgres")
    p.add_argument("--issuer-endpoints")
    args = p.parse_args(argv)
    return _worker(
        args.worker, args.dsn, args.ttl, args.compute, args.issuer, args.issuer_endpoints
    )
