"""A real HA cluster for the failover tests: two PostgreSQL 15 nodes under Patroni with etcd.

One cluster for the package (one per xdist worker; bootstrapping takes about 10 s here). Each
test gets a database of its own on it with fencekit's core installed; the next test's setup
rejoins a node a failover killed and turns replication back to asynchronous. Patroni comes from
the virtualenv ``scripts/_patroni.sh`` builds (``./scripts/test`` builds it); without it the
tests skip, and fail under CI=true.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest

from fencekit.sqlgen import render_install
from tests.lab.patroni import ClusterError, PatroniCluster, patroni_binary

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
_names = itertools.count()


@pytest.fixture(scope="package")
def cluster() -> Iterator[PatroniCluster]:
    try:
        patroni_binary()
    except ClusterError as exc:
        if IN_CI:
            pytest.fail(f"{exc} (CI=true: a missing Patroni is a failure, not a skip)")
        pytest.skip(str(exc))
    c = PatroniCluster.start_new()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ha_db(cluster: PatroniCluster) -> str:
    """A fresh database with the core installed, replicated to the standby; its name."""
    # Whatever the previous test did, start with a primary, a streaming standby, async.
    for node in cluster.nodes:
        if not node.running:
            cluster.rejoin(node)
    cluster.set_synchronous(False)
    name = f"ha_{os.getpid()}_{next(_names)}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(cluster.dsn_for(name)) as conn:
        conn.execute(render_install().encode())
    cluster.wait_caught_up()
    return name
