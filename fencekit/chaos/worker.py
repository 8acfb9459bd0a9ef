"""A chaos worker process: take leases, read-modify-write under the token, record everything.

Run by the chaos run as ``python -m fencekit.chaos.worker ...``. Each round the worker takes the
lease ``chaos:<resource>`` from the PostgreSQL issuer (short ttl), then writes a few times: it
reads the register's value, "computes" for a moment (where the nemesis' SIGSTOP usually lands),
renews its lease (a careful worker's check, which a pause defeats), and writes ``observed + 1``
in a transaction that carries its token. The same transaction appends the write to
``chaos_log`` with the per-resource sequence number the register row's UPDATE assigned: the
row lock makes that sequence the commit order, and the client learns it from ``RETURNING``.

A small share of writes is sent with no token at all (a code path someone forgot to fence):
fenced tables must reject those too.

Issuers: ``--issuer postgres`` (fencekit's own), ``etcd`` or ``zookeeper`` (``--endpoints``), or
``--issuer-factory module:function`` (a function of the run's arguments returning an issuer:
the tests' deliberately broken issuers). A write whose COMMIT gets no answer within
``--commit-timeout`` (the pooler or a proxy is paused) is abandoned: its socket is shut down
and its outcome recorded as indeterminate (``info``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from fencekit import psycopg as fk_psycopg
from fencekit.chaos.history import HistoryWriter, true_time
from fencekit.errors import FenceError, IssuerError, translate
from fencekit.leases import Grant, Issuer, PostgresIssuer

__all__ = ["LEASE_PREFIX"]

LEASE_PREFIX = "chaos"  # lease of resource r: "chaos:r" (contracts: <resource>:<key text>)

_READ = "SELECT value FROM chaos_register WHERE resource = %s"
_UPDATE = "UPDATE chaos_register SET value = %s, seq = seq + 1 WHERE resource = %s RETURNING seq"
_LOG = (
    "INSERT INTO chaos_log (resource, seq, token, value, observed, write_id) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)
# Who the worker is connected as, recorded once per process (a "session" history event): the
# run's workers must be an application role, never a superuser.
_WHOAMI = (
    "SELECT session_user::text, r.rolsuper, r.rolcreaterole, r.rolcreatedb, "
    "ARRAY(SELECT g.rolname::text FROM pg_auth_members AS m JOIN pg_roles AS g "
    "ON g.oid = m.roleid WHERE m.member = r.oid ORDER BY 1) "
    "FROM pg_roles AS r WHERE r.rolname = session_user"
)
_CONNECT: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": 3,
    "prepare_threshold": None,  # pgbouncer 1.18 in transaction mode has no prepared statements
}


def make_issuer(args: argparse.Namespace) -> Issuer:
    """The issuer the worker takes its leases from (``args``: the worker's arguments)."""
    if args.issuer_factory:
        module, _, name = args.issuer_factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
        issuer: Issuer = factory(args)
        return issuer
    if args.issuer == "etcd":
        from fencekit.leases.etcd import EtcdIssuer

        return EtcdIssuer(args.endpoints, request_timeout=1.0, retry_deadline=2.0)
    if args.issuer == "zookeeper":
        from fencekit.leases.zookeeper import ZooKeeperIssuer

        return ZooKeeperIssuer(
            args.endpoints, session_timeout=args.ttl, connect_timeout=5.0, op_timeout=2.0
        )
    return PostgresIssuer(args.dsn, timeout=2, prepare_threshold=None)


class _Watchdog:
    """Shuts a connection's socket down when a call outlives ``seconds`` (a hung pooler):
    the blocked call then fails at once instead of waiting for the network to come back."""

    def __init__(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire, args=(conn.fileno(),))
        self._timer.daemon = True

    def _fire(self, fd: int) -> None:
        self.fired = True
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class _HistoryLog(logging.Handler):
    """The issuer client's log lines as ``log`` history events (not fsync'd: kazoo logs from
    its connection thread, which must not wait on the disk)."""

    def __init__(self, history: HistoryWriter) -> None:
        super().__init__(logging.INFO)
        self.history = history

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.history.note(
                "log", logger=record.name, level=record.levelname,
                thread=record.threadName, msg=_short(record.getMessage(), 300),
            )  # fmt: skip


#: Loggers whose lines explain an issuer's decisions: kazoo's connection states, and the
#: leases' own warnings (a grant declared lost, and why).
_LOGGED = ("kazoo", "fencekit.leases")


class _Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name: str = args.name
        self.dsn: str = args.dsn
        self.until: float = args.until
        self.ttl: float = args.ttl
        self.unfenced_rate: float = args.unfenced_rate
        self.resources: list[str] = args.resources.split(",")
        self.rng = random.Random(f"{args.seed}:{self.name}")
        self.commit_timeout: float = args.commit_timeout
        self.history = HistoryWriter(Path(args.history), self.name)
        handler = _HistoryLog(self.history)
        for name in _LOGGED:
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.addHandler(handler)
        self.issuer = make_issuer(args)
        # Why the issuer declared a grant lost (its watch_loss reason), by holder.
        self.loss_reasons: dict[str, str] = {}
        # Grants neither released nor reported lost (held, or abandoned): closing an etcd or
        # ZooKeeper issuer releases them, so close() records their release first.
        self.unreleased: dict[str, tuple[str, Grant]] = {}
        self.conn: psycopg.Connection[Any] | None = None
        self.writes = 0
        self.session_recorded = False

    def connection(self) -> psycopg.Connection[Any] | None:
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            return self.conn
        try:
            self.conn = psycopg.connect(self.dsn, **_CONNECT)
        except psycopg.Error:
            self.conn = None
            time.sleep(0.1)  # server down (crash-restart): try again next round
            return None
        if not self.session_recorded:
            with contextlib.suppress(psycopg.Error):  # a crash now: the next connection tells
                self.record_session(self.conn)
        return self.conn

    def record_session(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(_WHOAMI).fetchone()
        assert row is not None
        user, superuser, createrole, createdb, member_of = row
        self.history.append(
            "session",
            user=user,
            superuser=superuser,
            createrole=createrole,
            createdb=createdb,
            member_of=list(member_of),
        )
        self.session_recorded = True

    def run(self) -> None:
        rounds = 0
        # The deadline is read on the true clock: libfaketime may step this process' clock.
        while true_time() < self.until and rounds < 100_000:
            rounds += 1
            resource = self.rng.choice(self.resources)
            holder = f"{self.name}#{uuid.uuid4().hex[:8]}"  # one holder per grant
            t0 = true_time()
            try:
                grant = self.issuer.try_acquire(f"{LEASE_PREFIX}:{resource}", holder, self.ttl)
            except (IssuerError, psycopg.Error):
                time.sleep(0.1)
                continue
            if grant is None:
                time.sleep(self.rng.uniform(0.005, 0.03))
                continue
            self.history.append(
                "acquire", resource=resource, token=grant.token, holder=holder,
                t0=t0, ttl=grant.ttl, issuer=grant.issuer,
            )  # fmt: skip
            self.unreleased[holder] = (resource, grant)
            self.watch(resource, grant)
            self.hold(resource, grant)

    def watch(self, resource: str, grant: Grant) -> None:
        """Record the issuer's own loss signal (when it decided, and why) as a ``loss`` event.

        ZooKeeper's only: its signal costs nothing (kazoo's session state, a node watch),
        where etcd's starts a monitor thread per grant that would change what the run does.
        """
        if getattr(self.issuer, "name", None) != "zookeeper":
            return
        watch_loss = self.issuer.watch_loss  # type: ignore[attr-defined]

        def lost(g: Grant, reason: str) -> None:
            self.loss_reasons[g.holder] = reason
            self.history.note(
                "loss", resource=resource, holder=g.holder, token=g.token,
                reason=reason,
            )  # fmt: skip

        watch_loss(grant, lost)

    def hold(self, resource: str, grant: Grant) -> None:
        for _ in range(self.rng.randint(1, 4)):
            if true_time() >= self.until or self.write(resource, grant.token) != "ok":
                return
            t0 = true_time()
            try:
                if not self.issuer.renew(grant):
                    self.history.append(
                        "lost", resource=resource, holder=grant.holder, t0=t0,
                        reason=self.loss_reasons.get(grant.holder),
                    )  # fmt: skip
                    self.unreleased.pop(grant.holder, None)
                    return
            except (IssuerError, psycopg.Error):
                return
            self.history.append("renew", resource=resource, holder=grant.holder, t0=t0)
        if self.rng.random() < 0.8:  # else abandon it: a holder that went away
            self.release(resource, grant)

    def release(self, resource: str, grant: Grant) -> None:
        # Recorded before it is sent: from here on the lease may be gone.
        self.history.append("release", resource=resource, holder=grant.holder, t0=true_time())
        self.unreleased.pop(grant.holder, None)
        with contextlib.suppress(IssuerError, psycopg.Error):
            self.issuer.release(grant)

    def write(self, resource: str, token: int) -> str:
        conn = self.connection()
        if conn is None:
            return "down"
        try:
            row = conn.execute(_READ, (resource,)).fetchone()
        except psycopg.Error:
            return "down"
        assert row is not None
        observed = int(row[0])
        time.sleep(self.rng.uniform(0.005, 0.04))  # the computation a pause lands in
        fenced = self.rng.random() >= self.unfenced_rate
        self.writes += 1
        wid = f"{self.name}-{self.writes}"
        value = observed + 1
        self.history.append(
            "invoke",
            id=wid,
            resource=resource,
            token=token if fenced else None,
            observed=observed,
            value=value,
        )
        phase = "send"
        try:
            block = fk_psycopg.transaction(conn, token) if fenced else conn.transaction()
            with _Watchdog(conn, self.commit_timeout), block:
                got = conn.execute(_UPDATE, (value, resource)).fetchone()
                assert got is not None
                seq = int(got[0])
                conn.execute(_LOG, (resource, seq, token if fenced else None, value, observed, wid))
                phase = "commit"  # an error from here on came from the COMMIT itself
        except FenceError as exc:
            self.history.append(
                "fail",
                id=wid,
                reason=exc.reason,
                sqlstate=exc.sqlstate,
                fence=exc.fence,
            )
            return "rejected"
        except psycopg.Error as exc:
            err = translate(exc)
            if err is not None:  # a fence rejection raised without the adapter (unfenced path)
                self.history.append(
                    "fail", id=wid, reason=err.reason, sqlstate=err.sqlstate, fence=err.fence
                )
                return "rejected"
            lost = conn.closed or conn.broken or isinstance(exc, psycopg.OperationalError)
            if lost and phase == "commit":
                self.history.append("info", id=wid, error=_short(exc))
            else:
                # Lost before COMMIT was sent (the server rolls back) or an ordinary error.
                reason = "connection" if lost else f"error:{exc.sqlstate}"
                self.history.append("fail", id=wid, reason=reason, error=_short(exc))
            return "error"
        self.history.append("ok", id=wid, seq=seq)
        return "ok"

    def close(self) -> None:
        # Released explicitly, each recorded: a lease ended by closing the issuer without a
        # record would look, to the checker, like a lease still live under the next grant.
        for resource, grant in list(self.unreleased.values()):
            self.release(resource, grant)
        self.issuer.close()
        self.history.close()
        if self.conn is not None:
            self.conn.close()


def _short(what: object, limit: int = 200) -> str:
    return " ".join(str(what).split())[:limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fencekit.chaos.worker")
    p.add_argument("--name", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--resources", required=True, help="comma-separated resource names")
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--until", type=float, required=True, help="stop at this epoch time")
    p.add_argument("--seed", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--unfenced-rate", type=float, default=0.02)
    p.add_argument("--issuer", choices=("postgres", "etcd", "zookeeper"), default="postgres")
    p.add_argument("--endpoints", default="", help="etcd endpoints / ZooKeeper hosts")
    p.add_argument("--issuer-factory", default="", help="module:function(args) -> issuer")
    p.add_argument("--commit-timeout", type=float, default=1.0)
    worker = _Worker(p.parse_args(argv))
    try:
        worker.run()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
