"""The paused worker with etcd and ZooKeeper tokens, real processes, a fenced PostgreSQL table.

Worker A (a process) takes the lease from the issuer, claims and reads the counter, and is
frozen with SIGSTOP. Its lease runs out on the issuer (etcd: the lease TTL without keep-alives;
ZooKeeper: the session timeout without pings). Worker B (another process) acquires with a
higher token, claims, writes. A is resumed and writes what it computed before the pause:
PostgreSQL rejects it (YF001, StaleTokenError). Without the fence the same flow loses B's update.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.issuers.pgfence import RESOURCE, make_counter, state
from tests.issuers.procs import Events, Worker, workers
from tests.lab import IN_CI

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

if not IN_CI:
    pytest.importorskip("etcd3gw")
    pytest.importorskip("kazoo")


@pytest.fixture(params=["etcd", "zookeeper"])
def issuer_kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(issuer name, endpoints) of a running cluster of that kind."""
    if request.param == "etcd":
        cluster = request.getfixturevalue("etcd")
        return "etcd", ",".join(cluster.endpoints)
    ensemble = request.getfixturevalue("zk")
    return "zookeeper", ensemble.hosts


def _paused_worker_story(issuer: str, endpoints: str, dsn: str, lease: str) -> dict[str, Any]:
    events = Events()
    common = ["--issuer", issuer, "--endpoints", endpoints, "--dsn", dsn, "--resource", lease]
    common += ["--ttl", "2"]
    with workers() as made:
        a = Worker("A", events, [*common, "--wait", "10", "--lost-wait", "15"])
        made.append(a)
        acquired_a = events.wait_for("A", "acquired", 60)
        read_a = events.wait_for("A", "read", 30)
        assert read_a["outcome"] == "claimed", read_a
        a.stop()  # SIGSTOP: keep-alives / session pings stop with it

        b = Worker("B", events, [*common, "--wait", "30", "--lost-wait", "0"])
        made.append(b)
        acquired_b = events.wait_for("B", "acquired", 60)  # only once A's lease ran out
        read_b = events.wait_for("B", "read", 30)
        assert read_b["outcome"] == "claimed", read_b
        b.send("write")
        result_b = events.wait_for("B", "result", 30)
        events.wait_for("B", "exit", 30)

        a.cont()  # A resumes, unaware, and writes the value it computed before the pause
        a.send("write")
        result_a = events.wait_for("A", "result", 30)
        told = events.wait_for("A", "lease", 30)
        events.wait_for("A", "exit", 30)
    return {
        "a": acquired_a,
        "b": acquired_b,
        "result_a": result_a,
        "result_b": result_b,
        "told_a": told,
        "stderr": a.stderr + b.stderr,
    }


def test_paused_worker_write_is_rejected_by_postgres(
    issuer_kind: tuple[str, str], db: Any, dsn: str
) -> None:
    issuer, endpoints = issuer_kind
    make_counter(db, issuer)
    story = _paused_worker_story(issuer, endpoints, dsn, f"{RESOURCE}:1")
    a, b = story["a"], story["b"]
    assert a["issuer"] == b["issuer"] == issuer
    assert b["token"] > a["token"], story
    assert story["result_b"]["outcome"] == "written", story
    assert story["result_a"] == {**story["result_a"], "outcome": "rejected", "sqlstate": "YF001"}
    assert story["result_a"]["error"] == "StaleTokenError"
    # A's lease object learnt it lost the lease (too late to stop the write: only PostgreSQL can).
    assert story["told_a"]["lost"] is True, story
    value, writes, rejections = state(dsn)
    assert value == 1
    assert writes == [("B", b["token"], 1)]
    assert rejections.get("stale") == 1
    print(f"{issuer}: A token {a['token']} rejected after B token {b['token']} wrote")


def test_without_the_fence_the_paused_worker_loses_an_update(
    issuer_kind: tuple[str, str], db: Any, dsn: str
) -> None:
    issuer, endpoints = issuer_kind
    make_counter(db, issuer, fenced=False)
    story = _paused_worker_story(issuer, endpoints, dsn, f"{RESOURCE}:1")
    assert story["b"]["token"] > story["a"]["token"]
    assert story["result_b"]["outcome"] == "written"
    assert story["result_a"]["outcome"] == "written", story  # nothing stopped A
    value, writes, _ = state(dsn)
    # Two increments were "done", the counter moved by one: B's update is lost.
    assert [w[0] for w in writes] == ["B", "A"]
    assert value == 1


def test_zookeeper_session_expiry_tells_the_holder_and_its_later_write_is_rejected(
    zk_issuer: Any, resource: str, db: Any, dsn: str
) -> None:
    """The server expires A's session for real (a twin client closes it): A's Lease is told it
    lost the lock; B takes it and writes; A's write afterwards is rejected by PostgreSQL."""
    import psycopg

    import fencekit.psycopg as fk
    from fencekit.errors import StaleTokenError
    from fencekit.leases import Lease
    from tests.issuers.test_zookeeper_issuer import expire_session

    make_counter(db, "zookeeper")
    a_issuer, b_issuer = zk_issuer(), zk_issuer()
    reasons: list[str] = []
    with (
        psycopg.connect(dsn) as conn,
        Lease(a_issuer, resource, ttl=2, wait=10, on_lost=lambda g, r: reasons.append(r)) as a,
    ):
        with fk.transaction(conn):  # A claims: the fence becomes A's token
            conn.execute("UPDATE counter SET value = value + 1 WHERE id = 1")
        expire_session(a_issuer)
        assert a.wait_lost(10), "A was not told that its ZooKeeper session expired"
        assert a.lost
        assert reasons, "the on_lost callback did not run"
        assert "expired" in reasons[0] or "deleted" in reasons[0], reasons
        with Lease(b_issuer, resource, ttl=2, wait=10) as b:
            assert b.token > a.token
            with fk.transaction(conn):
                conn.execute("UPDATE counter SET value = value + 10 WHERE id = 1")
        # Back in A's scope (its token, tagged zookeeper): the write it still makes fails.
        with pytest.raises(StaleTokenError) as info, fk.transaction(conn):
            conn.execute("UPDATE counter SET value = value + 100 WHERE id = 1")
        assert info.value.sqlstate == "YF001"
    value, _, rejections = state(dsn)
    assert value == 11
    assert rejections.get("stale") == 1
