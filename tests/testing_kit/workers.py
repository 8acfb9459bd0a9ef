"""Worker functions the kit's tests start as processes (importable: spawn needs that)."""

from __future__ import annotations

import os

import psycopg

import fencekit.psycopg as fkp
from fencekit.leases import Lease, PostgresIssuer
from fencekit.testing import checkpoint


def write_job(dsn: str, job: int, *, only: str | None = None, ttl: float = 1.0) -> int:
    """Lease ``jobs:<job>``, checkpoint "computing", write the job row with the token.

    ``only``: write only in the worker of that name (the others take the lease and stop):
    a new holder that neither writes nor claims, the grant-to-first-write gap.
    """
    with (
        PostgresIssuer(dsn) as issuer,
        Lease(issuer, f"jobs:{job}", ttl=ttl, wait=30) as lease,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        checkpoint("computing")
        if only is not None and os.environ.get("FENCEKIT_TESTING_WORKER") != only:
            return lease.token
        with fkp.transaction(conn, lease.token):
            conn.execute(
                "INSERT INTO jobs VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                "SET state = excluded.state",
                (job, f"pid {os.getpid()}"),
            )
        return lease.token


def where_is_the_database() -> str | None:
    return os.environ.get("FENCEKIT_TEST_APP_DSN")


def broken_setup() -> None:
    """A framework setup (``FENCEKIT_TESTING_SETUP``) that fails."""
    raise RuntimeError("the framework setup failed")


def exit_early() -> None:
    print("giving up before any checkpoint")
    raise SystemExit(3)


def write_job_etcd(dsn: str, endpoints: list[str], job: int, *, ttl: float = 2.0) -> int:
    """:func:`write_job` with the lease from etcd (tokens: the lock key's create revision)."""
    from fencekit.leases.etcd import EtcdIssuer

    with (
        EtcdIssuer(endpoints, request_timeout=2.0) as issuer,
        Lease(issuer, f"jobs:{job}", ttl=ttl, wait=30) as lease,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        checkpoint("computing")
        with fkp.transaction(conn, lease.token, issuer="etcd"):
            conn.execute(
                "INSERT INTO jobs VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                "SET state = excluded.state",
                (job, f"pid {os.getpid()}"),
            )
        return lease.token


def write_job_zk(dsn: str, hosts: str, job: int) -> int:
    """:func:`write_job` with the lease from ZooKeeper (tokens: the lock node's czxid; the
    lease ends when the leader expires the session: 2 s without a heartbeat)."""
    from fencekit.leases.zookeeper import ZooKeeperIssuer

    with (
        ZooKeeperIssuer(hosts, session_timeout=2.0, op_timeout=5.0) as issuer,
        Lease(issuer, f"jobs:{job}", ttl=2.0, wait=30) as lease,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        checkpoint("computing")
        with fkp.transaction(conn, lease.token, issuer="zookeeper"):
            conn.execute(
                "INSERT INTO jobs VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                "SET state = excluded.state",
                (job, f"pid {os.getpid()}"),
            )
        return lease.token
