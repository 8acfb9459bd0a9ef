"""The issuer-specific part of ``fencekit demo --issuer postgres|etcd|zookeeper``.

The demo's story is the same with every issuer; only three things differ, and live here:

- which issuer the workers take their lease from (:func:`make_issuer`);
- where an external server is (:func:`endpoints_for`: ``--issuer-endpoints``, else the
  environment variable ``FENCEKIT_ETCD_ENDPOINTS`` / ``FENCEKIT_ZOOKEEPER_HOSTS``, else the
  server's default port on loopback) and whether it answers (:func:`check_reachable`, which
  raises :class:`IssuerNotReachableError` with a message saying how to start one);
- how the demo knows that the paused worker's lease is gone (:func:`wait_released`): for the
  built-in issuer the database's lease table says so; for etcd and ZooKeeper the issuer's
  own view (a linearizable read of the lock's current holder) says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from fencekit.errors import IssuerNotReachableError
from fencekit.leases.base import Issuer

__all__ = ["check_reachable", "endpoints_for", "make_issuer", "wait_released"]

ISSUERS = ("postgres", "etcd", "zookeeper")
ENDPOINTS_ENV = {"etcd": "FENCEKIT_ETCD_ENDPOINTS", "zookeeper": "FENCEKIT_ZOOKEEPER_HOSTS"}
DEFAULT_ENDPOINTS = {"etcd": "127.0.0.1:2379", "zookeeper": "127.0.0.1:2181"}
_HOW_TO_START = {
    "etcd": "start one (e.g. Debian's etcd-server package: `etcd` listens on 127.0.0.1:2379)",
    "zookeeper": "start one (e.g. Debian's zookeeper package, or "
    "`zkServer.sh start`; it listens on 127.0.0.1:2181)",
}


def _check_kind(kind: str) -> None:
    if kind not in ISSUERS:
        raise ValueError(f"unknown issuer {kind!r}: choose one of {', '.join(ISSUERS)}")


def endpoints_for(kind: str, given: str | None = None) -> str | None:
    """Where the ``kind`` server is: ``given``, else its environment variable, else loopback.

    None for the built-in PostgreSQL issuer (it uses the demo's database).
    """
    _check_kind(kind)
    if kind == "postgres":
        return None
    return given or os.environ.get(ENDPOINTS_ENV[kind]) or DEFAULT_ENDPOINTS[kind]


def make_issuer(kind: str, dsn: str, endpoints: str | None, ttl: float) -> Issuer:
    """The issuer a demo worker takes its lease from (a context manager; close it)."""
    _check_kind(kind)
    if kind == "postgres":
        from fencekit.leases.postgres import PostgresIssuer

        return PostgresIssuer(dsn)
    endpoints = endpoints_for(kind, endpoints)
    assert endpoints is not None
    try:
        if kind == "etcd":
            from fencekit.leases.etcd import EtcdIssuer

            return EtcdIssuer(endpoints, request_timeout=2.0, retry_deadline=5.0)
        from fencekit.leases.zookeeper import ZooKeeperIssuer

        # The lease length is the session timeout; the server may raise it to its minimum.
        return ZooKeeperIssuer(endpoints, session_timeout=ttl, connect_timeout=5.0)
    except ImportError as exc:
        raise IssuerNotReachableError(str(exc)) from exc


def check_reachable(kind: str, endpoints: str | None, timeout: float = 3.0) -> str:
    """Raise :class:`IssuerNotReachableError` unless the ``kind`` server answers; describe it."""
    _check_kind(kind)
    if kind == "postgres":
        return "the built-in PostgreSQL issuer"
    where = endpoints_for(kind, endpoints)
    assert where is not None
    hint = (
        f"--issuer {kind}: no {kind} server answers at {where}. "
        f"Give its address with --issuer-endpoints (or {ENDPOINTS_ENV[kind]}), or "
        f"{_HOW_TO_START[kind]}; `fencekit demo` without --issuer needs no server."
    )
    try:
        if kind == "etcd":
            from fencekit.leases.etcd import EtcdIssuer

            with EtcdIssuer(where, request_timeout=timeout, retry_deadline=timeout) as etcd:
                etcd.current_holder("fencekit-demo-probe")
        else:
            from fencekit.leases.zookeeper import ZooKeeperIssuer

            # kazoo logs every refused connection attempt: not news while probing.
            kazoo_log = logging.getLogger("kazoo")
            level = kazoo_log.level
            kazoo_log.setLevel(logging.CRITICAL)
            try:
                with ZooKeeperIssuer(where, connect_timeout=timeout) as zk:
                    zk.current_holder("fencekit-demo-probe")
            finally:
                kazoo_log.setLevel(level)
    except ImportError as exc:
        raise IssuerNotReachableError(f"--issuer {kind}: {exc}") from exc
    except Exception as exc:  # unreachable, refused, timed out, not that kind of server
        raise IssuerNotReachableError(f"{hint} ({type(exc).__name__}: {exc})") from exc
    return f"{kind} at {where}"


def wait_released(
    kind: str, endpoints: str | None, resource: str, holder_prefix: str, timeout: float
) -> None:
    """Block until no holder whose name starts with ``holder_prefix`` holds ``resource``, by the
    external issuer's own (linearizable) view; TimeoutError after ``timeout`` seconds."""
    _check_kind(kind)
    if kind == "postgres":
        raise ValueError("the built-in issuer's leases expire by the database clock: ask it")
    issuer: Any = make_issuer(kind, "", endpoints, ttl=10.0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            holder = issuer.current_holder(resource)
            if holder is None or not holder[0].startswith(holder_prefix):
                return
            time.sleep(0.1)
    finally:
        with contextlib.suppress(Exception):
            issuer.close()
    raise TimeoutError(f"the lease on {resource!r} was still held after {timeout:g}s")
