"""A worker PROCESS that takes a lease from etcd or ZooKeeper and writes to PostgreSQL with its
token, for the SIGSTOP and leader-kill tests. Run as ``python -m tests.issuers.fence_worker``.

It reports events as JSON lines on stdout (``{"who", "event", ...}``) and takes its orders on
stdin, so the test decides when it writes and can freeze it (SIGSTOP) at a known point.

The table it writes (created by the test): ``counter(id int PRIMARY KEY, value int)`` with row
``id = 1``, and an unfenced log ``writes(id serial, worker text, token bigint, value int)``.
A holder first *claims*: it reads the counter with a fenced no-op update, which raises the
fence to its token (a read alone would not: an older holder could still write what it computed
before). Later it writes ``value + 1`` (from that read) plus a ``writes`` row, in ONE
transaction carrying the lease's token (``fencekit.psycopg.transaction``, token and issuer from
the lease's context scope). When PostgreSQL rejects the update, the log row goes too.

Modes:

- ``once``: acquire, claim-and-read the counter, report ``read``, then wait for ``write`` on
  stdin (the test may SIGSTOP the worker meanwhile), write with the token held since, report
  the outcome, then whether the lease noticed its loss, and exit.
- ``loop``: until ``--duration`` passes (or ``--max-rounds``): acquire (bounded wait), report
  ``holding``, check the lease, claim-and-read, "compute" for ``--compute`` seconds (the test may
  SIGSTOP it right there: between the check and the write, where no check can help), write,
  report, release.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import psycopg


def emit(who: str, event: str, **data: Any) -> None:
    print(json.dumps({"who": who, "event": event, "t": time.time(), **data}), flush=True)


def make_issuer(kind: str, endpoints: str, session_timeout: float) -> Any:
    if kind == "etcd":
        from fencekit.leases.etcd import EtcdIssuer

        return EtcdIssuer(endpoints, request_timeout=1.0, retry_deadline=8.0)
    if kind == "zookeeper":
        from fencekit.leases.zookeeper import ZooKeeperIssuer

        return ZooKeeperIssuer(endpoints, session_timeout=session_timeout, op_timeout=5.0)
    raise SystemExit(f"unknown issuer {kind!r}")


def grant_info(lease: Any) -> dict[str, Any]:
    handle = lease.grant.handle
    info: dict[str, Any] = {"token": lease.token, "issuer": lease.grant.issuer}
    if hasattr(handle, "key"):
        info.update(key=handle.key, lease_id=handle.lease_id)
    if hasattr(handle, "node"):
        info.update(node=handle.node)
    return info


def _fenced(fn: Any) -> dict[str, Any]:
    from fencekit.errors import FenceError

    try:
        return dict(fn())
    except FenceError as err:
        return {"outcome": "rejected", "sqlstate": err.sqlstate, "error": type(err).__name__}


def claim(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Read the counter in a fenced WRITE (a no-op update): it raises the fence to our token,
    so that a holder older than us can no longer write what it computed before we read."""
    from fencekit.psycopg import transaction

    def run() -> dict[str, Any]:
        with transaction(conn):
            row = conn.execute(
                "UPDATE counter SET value = value WHERE id = 1 RETURNING value"
            ).fetchone()
        assert row is not None
        return {"outcome": "claimed", "value": int(row[0])}

    return _fenced(run)


def write(conn: psycopg.Connection[Any], name: str, token: int, value: int) -> dict[str, Any]:
    """Write ``value`` (computed from an earlier read) and log it, in one fenced transaction."""
    from fencekit.psycopg import transaction

    def run() -> dict[str, Any]:
        with transaction(conn):
            conn.execute("UPDATE counter SET value = %s WHERE id = 1", (value,))
            conn.execute(
                "INSERT INTO writes (worker, token, value) VALUES (%s, %s, %s)",
                (name, token, value),
            )
        return {"outcome": "written", "value": value}

    return _fenced(run)


def run_once(args: argparse.Namespace) -> int:
    from fencekit.leases import Lease

    name = args.name
    with (
        make_issuer(args.issuer, args.endpoints, args.ttl) as issuer,
        Lease(issuer, args.resource, ttl=args.ttl, wait=args.wait, holder=name) as lease,
        psycopg.connect(args.dsn, autocommit=True) as conn,
    ):
        emit(name, "acquired", **grant_info(lease))
        read = claim(conn)
        emit(name, "read", token=lease.token, **read)
        if read["outcome"] != "claimed":
            return 3
        order = sys.stdin.readline().strip()  # the test may freeze us before sending it
        if order != "write":
            emit(name, "skipped", order=order)
            return 0
        emit(name, "writing", token=lease.token)
        result = write(conn, name, lease.token, read["value"] + 1)
        emit(name, "result", token=lease.token, **result)
        told = lease.wait_lost(args.lost_wait)
        emit(name, "lease", lost=told, reason=lease.lost_reason)
    return 0


def run_loop(args: argparse.Namespace) -> int:
    from fencekit.leases import Lease, LeaseLostError, LeaseTimeoutError

    name = args.name
    deadline = time.monotonic() + args.duration
    with (
        make_issuer(args.issuer, args.endpoints, args.ttl) as issuer,
        psycopg.connect(args.dsn, autocommit=True) as conn,
    ):
        for _ in range(args.max_rounds):
            if time.monotonic() >= deadline:
                break
            lease = Lease(issuer, args.resource, ttl=args.ttl, wait=args.wait, holder=name)
            try:
                lease.acquire()
            except LeaseTimeoutError:
                continue
            except Exception as exc:  # issuer unavailable during an election: try again
                emit(name, "acquire_failed", error=repr(exc))
                time.sleep(0.1)
                continue
            try:
                with lease:  # already acquired: enters the token's context scope
                    emit(name, "holding", **grant_info(lease))
                    try:
                        lease.check()
                    except LeaseLostError as exc:
                        emit(name, "lost_before_write", token=lease.token, reason=exc.reason)
                        continue
                    read = claim(conn)
                    emit(name, "read", token=lease.token, **read)
                    if read["outcome"] != "claimed":
                        continue
                    time.sleep(args.compute)  # <- SIGSTOP lands here
                    result = write(conn, name, lease.token, read["value"] + 1)
                    emit(name, "result", token=lease.token, lost=lease.lost, **result)
            except Exception as exc:
                emit(name, "error", error=repr(exc))
                time.sleep(0.1)
            time.sleep(args.gap)
    emit(name, "done")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.issuers.fence_worker")
    p.add_argument("--name", required=True)
    p.add_argument("--issuer", required=True, choices=["etcd", "zookeeper"])
    p.add_argument("--endpoints", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--resource", required=True)
    p.add_argument("--mode", choices=["once", "loop"], default="once")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--wait", type=float, default=20.0)
    p.add_argument("--lost-wait", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--max-rounds", type=int, default=500)
    p.add_argument("--compute", type=float, default=0.15)
    p.add_argument("--gap", type=float, default=0.02)
    args = p.parse_args(argv)
    if args.mode == "once":
        return run_once(args)
    return run_loop(args)


if __name__ == "__main__":
    sys.exit(main())
