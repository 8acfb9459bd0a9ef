"""The etcd issuer against a real three-member etcd cluster on loopback."""

from __future__ import annotations

import base64
import threading
import time

import pytest

from fencekit.leases._external import Grant
from tests.issuers.contention import assert_strictly_increasing, run_contention
from tests.lab import IN_CI

if not IN_CI:  # in CI a missing client library must fail, not skip
    pytest.importorskip("etcd3gw")


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _keys_at(issuer, resource: str, revision: int) -> list[dict]:
    """The live keys under the resource's lock prefix at ``revision`` (history read)."""
    from fencekit.leases.etcd import _prefix_end

    prefix = issuer.lock_prefix(resource)
    resp = issuer._call(
        lambda c: c.post(
            c.get_url("/kv/range"),
            json={
                "key": _b64(prefix),
                "range_end": _b64(_prefix_end(prefix.encode())),
                "revision": revision,
            },
        ),
        "history read",
    )
    return resp.get("kvs", [])


def assert_issuer_view_exclusive(issuer, resource: str, grants: list[Grant]) -> None:
    """By etcd's own history: at the revision of every grant, its key was the only live key
    under the resource's prefix. A holder holds from its key's creation to its deletion, so
    a later grant made while an earlier holder's key was alive would see two keys."""
    for g in grants:
        kvs = _keys_at(issuer, resource, g.token)
        keys = [base64.b64decode(kv["key"]).decode() for kv in kvs]
        assert keys == [g.handle.key], f"at revision {g.token} live keys {keys}, granted {g}"


def test_tokens_increase_across_acquire_release(etcd_issuer, resource):
    a, b = etcd_issuer(), etcd_issuer()
    tokens = []
    for i in range(10):
        issuer = (a, b)[i % 2]
        g = issuer.try_acquire(resource, f"h{i % 2}", 5)
        assert g is not None
        assert g.issuer == "etcd"
        assert g.resource == resource
        assert g.ttl >= 5
        assert 0 < g.token < 2**63
        assert (b, a)[i % 2].try_acquire(resource, "other", 5) is None
        assert issuer.current_holder(resource) == (f"h{i % 2}", g.token)
        tokens.append(g.token)
        issuer.release(g)
        issuer.release(g)  # idempotent
        assert issuer.current_holder(resource) is None
    assert_strictly_increasing(tokens)


def test_resources_are_independent_and_names_escaped(etcd_issuer, resource):
    a = etcd_issuer()
    outer = a.try_acquire(resource, "A", 5)
    inner = a.try_acquire(resource + "/sub", "A", 5)  # "/" must not nest lock prefixes
    assert outer is not None
    assert inner is not None
    assert a.current_holder(resource) == ("A", outer.token)
    a.release(outer)
    assert a.current_holder(resource) is None
    assert a.current_holder(resource + "/sub") == ("A", inner.token)


def test_takeover_after_expiry_gives_larger_token_and_signals_loss(etcd_issuer, resource):
    a, b = etcd_issuer(), etcd_issuer()
    ga = a.try_acquire(resource, "A", 2)
    assert ga is not None
    lost = threading.Event()
    reasons: list[str] = []
    a.watch_loss(ga, lambda g, why: (reasons.append(why), lost.set()))
    # A stops renewing (a paused worker). B polls until the lease expires on etcd.
    t0 = time.monotonic()
    gb = None
    while gb is None and time.monotonic() - t0 < 10:
        gb = b.try_acquire(resource, "B", 5)
        if gb is None:
            time.sleep(0.1)
    assert gb is not None, "B never got the lock after A's lease expired"
    assert time.monotonic() - t0 >= 1.0  # not before the lease ran out
    assert gb.token > ga.token
    assert lost.wait(5), "A was not told it lost the lease"
    assert a.is_lost(ga)
    assert not a.renew(ga)
    # A's late release must not free B's lock.
    a.release(ga)
    assert b.current_holder(resource) == ("B", gb.token)
    assert b.renew(gb)
    assert_issuer_view_exclusive(b, resource, [ga, gb])


def test_renew_keeps_the_lease_past_its_ttl(etcd_issuer, resource):
    a, b = etcd_issuer(), etcd_issuer()
    g = a.try_acquire(resource, "A", 2)
    assert g is not None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5:  # 2.5 TTLs
        assert a.renew(g)
        assert b.try_acquire(resource, "B", 2) is None
        time.sleep(0.5)
    assert not a.is_lost(g)
    a.release(g)
    assert not a.renew(g)
    g2 = b.try_acquire(resource, "B", 2)
    assert g2 is not None
    assert g2.token > g.token


def test_deleted_key_is_signalled_promptly(etcd_issuer, resource):
    a = etcd_issuer()
    g = a.try_acquire(resource, "A", 10)
    assert g is not None
    lost = threading.Event()
    a.watch_loss(g, lambda *_: lost.set())
    time.sleep(0.3)  # let the watch start
    # An operator deletes the lock key (etcdctl del): the holder must hear of it.
    other = etcd_issuer()
    other._call(
        lambda c: c.post(c.get_url("/kv/deleterange"), json={"key": _b64(g.handle.key)}),
        "delete",
    )
    t0 = time.monotonic()
    assert lost.wait(5), "holder not told its key was deleted"
    assert time.monotonic() - t0 < 2.0
    assert not a.renew(g)


def test_watch_loss_with_keepalive_holds_then_reports_revocation(etcd_issuer, resource):
    a, b = etcd_issuer(), etcd_issuer()
    g = a.try_acquire(resource, "A", 2)
    assert g is not None
    lost = threading.Event()
    a.watch_loss(g, lambda *_: lost.set(), keepalive=True)
    time.sleep(4)  # two TTLs: the monitor's keep-alives hold the lease
    assert not lost.is_set()
    assert b.try_acquire(resource, "B", 2) is None
    a._revoke(g.handle.lease_id)  # the lease revoked behind the holder's back
    assert lost.wait(5)


def test_contention_mutual_exclusion(etcd_issuer, resource):
    result = run_contention(etcd_issuer, resource, workers=4, duration=3.0)
    assert not result.errors, result.errors
    assert not result.overlaps, result.overlaps
    assert len(result.acquisitions) >= 20, result
    assert result.handovers >= 5
    assert_strictly_increasing(result.tokens)
    assert_issuer_view_exclusive(etcd_issuer(), resource, [a.grant for a in result.acquisitions])


@pytest.mark.slow
def test_leader_killed_during_contention(etcd_issuer, etcd, resource):
    """SIGKILL the Raft leader mid-run: tokens stay strictly increasing, no overlap (by
    etcd's history and in process), and the run goes on under the new leader."""
    box: dict = {}

    def contend() -> None:
        box["result"] = run_contention(
            lambda: etcd_issuer(request_timeout=1.0, retry_deadline=8.0),
            resource,
            workers=3,
            duration=7.0,
        )

    runner = threading.Thread(target=contend, daemon=True)
    runner.start()
    time.sleep(1.5)
    killed = etcd.kill_leader()
    t_kill = time.monotonic()
    new_leader = etcd.leader(timeout=15)
    assert new_leader is not killed
    time.sleep(2.0)
    etcd.restart_member(killed)  # back in the middle of the run, as a follower
    runner.join(timeout=90)
    assert not runner.is_alive()
    result = box["result"]
    assert not result.errors, result.errors
    assert not result.overlaps, result.overlaps
    assert_strictly_increasing(result.tokens)
    before = [a for a in result.acquisitions if a.at < t_kill]
    after = [a for a in result.acquisitions if a.at > t_kill]
    assert len(before) >= 5, (len(before), len(after))
    assert len(after) >= 5, (len(before), len(after))
    assert result.handovers >= 5
    assert_issuer_view_exclusive(etcd_issuer(), resource, [a.grant for a in result.acquisitions])
    print(
        f"leader kill: {len(result.acquisitions)} acquisitions "
        f"({len(before)} before, {len(after)} after), {result.handovers} handovers, "
        f"{result.unavailable} unavailable attempts, killed {killed.name}, "
        f"new leader {new_leader.name}"
    )


def test_unreachable_cluster_raises_unavailable_quickly(etcd_issuer, resource):
    from fencekit.errors import IssuerUnavailableError
    from fencekit.leases.etcd import EtcdIssuer
    from tests.lab.ports import free_ports

    (port,) = free_ports(1)
    issuer = EtcdIssuer([f"127.0.0.1:{port}"], request_timeout=0.5, retry_deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(IssuerUnavailableError):
        issuer.try_acquire(resource, "A", 5)
    assert time.monotonic() - t0 < 5
    issuer.close()


def test_generic_lease_renews_and_reports_loss(etcd_issuer, resource):
    from fencekit.leases import Lease, LeaseTimeoutError

    a, b = etcd_issuer(), etcd_issuer()
    lease = Lease(a, resource, ttl=2, wait=5, fence=False)
    lease.acquire()
    time.sleep(4)  # two TTLs: the background renewal keeps it
    assert not lease.lost
    with pytest.raises(LeaseTimeoutError):
        Lease(b, resource, ttl=2, wait=0.5, fence=False).acquire()
    a._revoke(lease.grant.handle.lease_id)
    assert lease.wait_lost(5), "Lease not told that etcd revoked its lease"
    other = Lease(b, resource, ttl=2, wait=5, fence=False).acquire()
    assert other.token > lease.token
    other.release()


def test_server_version_is_the_clusters(etcd_issuer, etcd) -> None:
    """What the chaos checker's etcd contract depends on (docs/chaos.md): the version the
    cluster's members report, the binary's own."""
    import asyncio
    import subprocess

    from fencekit.leases.etcd import AsyncEtcdIssuer

    binary = subprocess.run(
        [str(etcd.binary), "--version"], capture_output=True, text=True, check=True
    ).stdout
    version = etcd_issuer().server_version()
    assert f"etcd Version: {version}\n" in binary

    async def from_async() -> str:
        issuer = AsyncEtcdIssuer(etcd.endpoints)
        try:
            return await issuer.server_version()
        finally:
            await issuer.close()

    assert asyncio.run(from_async()) == version
