"""The ZooKeeper issuer against a real three-server ZooKeeper ensemble on loopback."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.issuers.contention import assert_strictly_increasing, run_contention
from tests.lab import IN_CI

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

if not IN_CI:  # in CI a missing client library must fail, not skip
    pytest.importorskip("kazoo")


def expire_session(issuer) -> None:
    """Make the server expire the issuer's session, for real: a second client attaches to
    the same session id and password and closes it (the classic ZooKeeper test trick); the
    issuer's client learns of it from the server (SESSION_EXPIRED -> LOST)."""
    from kazoo.client import KazooClient

    session_id, password = issuer.client.client_id
    hosts = ",".join(f"{h}:{p}" for h, p in issuer.client.hosts)
    twin = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=2)
    twin.start(timeout=10)
    twin.stop()
    twin.close()


def test_tokens_are_zxids_and_increase(zk_issuer, resource):
    a, b = zk_issuer(), zk_issuer()
    tokens = []
    for i in range(10):
        issuer = (a, b)[i % 2]
        g = issuer.try_acquire(resource, f"h{i % 2}", 2)
        assert g is not None
        assert g.issuer == "zookeeper"
        assert g.resource == resource
        assert g.ttl == pytest.approx(issuer.session_timeout)
        # A zxid: epoch in the high 32 bits (>= 1 once a leader was elected).
        assert g.token >> 32 >= 1
        assert g.token < 2**63
        assert (b, a)[i % 2].try_acquire(resource, "other", 2) is None
        assert issuer.current_holder(resource) == (f"h{i % 2}", g.token)
        assert issuer.renew(g)
        tokens.append(g.token)
        issuer.release(g)
        issuer.release(g)  # idempotent
        assert not issuer.renew(g)
        assert issuer.current_holder(resource) is None
    assert_strictly_increasing(tokens)


def test_session_expiry_tells_the_holder(zk_issuer, resource):
    a, b = zk_issuer(), zk_issuer()
    ga = a.try_acquire(resource, "A", 2)
    assert ga is not None
    lost = threading.Event()
    reasons: list[str] = []
    a.watch_loss(ga, lambda g, why: (reasons.append(why), lost.set()))
    expire_session(a)
    assert lost.wait(10), "holder not told that its session expired"
    assert "expired" in reasons[0] or "deleted" in reasons[0]
    assert a.is_lost(ga)
    assert not a.renew(ga)
    gb = b.try_acquire(resource, "B", 2)
    assert gb is not None
    assert gb.token > ga.token
    # A's late release must not free B's lock; A can take part again with a new session.
    a.release(ga)
    assert b.current_holder(resource) == ("B", gb.token)
    assert a.try_acquire(resource, "A", 2) is None
    b.release(gb)
    ga2 = a.try_acquire(resource, "A", 2)
    assert ga2 is not None
    assert ga2.token > gb.token


def test_ensemble_unreachable_past_session_timeout_counts_as_lost(zk_issuer, zk, resource):
    """All servers frozen (SIGSTOP): the client cannot hear the expiry, so after the session
    timeout of disconnection it must consider the lease lost by itself."""
    a = zk_issuer()
    ga = a.try_acquire(resource, "A", 2)
    assert ga is not None
    lost = threading.Event()
    a.watch_loss(ga, lambda *_: lost.set())
    with zk.paused():
        t0 = time.monotonic()
        assert lost.wait(3 * a.session_timeout + 2), "no loss signal while cut off"
        elapsed = time.monotonic() - t0
        assert a.is_lost(ga)
    assert elapsed >= a.session_timeout * 0.9
    assert not a.renew(ga)
    zk.wait_healthy(timeout=60)
    b = zk_issuer()
    t1 = time.monotonic()
    gb = None
    while gb is None and time.monotonic() - t1 < 15:  # until the server expires A's session
        gb = b.try_acquire(resource, "B", 2)
        if gb is None:
            time.sleep(0.2)
    assert gb is not None
    assert gb.token > ga.token


def test_deleted_node_is_signalled(zk_issuer, resource):
    a, admin = zk_issuer(), zk_issuer()
    g = a.try_acquire(resource, "A", 2)
    assert g is not None
    lost = threading.Event()
    a.watch_loss(g, lambda *_: lost.set())
    admin.client.delete(g.handle.node)
    assert lost.wait(5)
    assert not a.renew(g)


def test_contention_mutual_exclusion(zk_issuer, resource):
    result = run_contention(zk_issuer, resource, workers=4, duration=3.0)
    assert not result.errors, result.errors
    assert not result.overlaps, result.overlaps
    assert len(result.acquisitions) >= 20
    assert result.handovers >= 5
    assert_strictly_increasing(result.tokens)
    print(
        f"zookeeper contention: {len(result.acquisitions)} acquisitions, "
        f"{result.handovers} handovers, {result.refused} refused attempts"
    )


def test_kazoo_lock_users_and_fencekit_exclude_each_other(zk_issuer, resource):
    a = zk_issuer()
    kazoo_lock = a.client.Lock(a.lock_path(resource), "kazoo-user")
    assert kazoo_lock.acquire(timeout=5)
    try:
        assert zk_issuer().try_acquire(resource, "B", 2) is None
    finally:
        kazoo_lock.release()
    g = zk_issuer().try_acquire(resource, "B", 2)
    assert g is not None
    other = a.client.Lock(a.lock_path(resource), "kazoo-user")
    assert not other.acquire(blocking=False)


def test_unreachable_ensemble_raises_unavailable():
    from fencekit.errors import IssuerUnavailableError
    from fencekit.leases.zookeeper import ZooKeeperIssuer
    from tests.lab.ports import free_ports

    (port,) = free_ports(1)
    t0 = time.monotonic()
    with pytest.raises(IssuerUnavailableError):
        ZooKeeperIssuer(f"127.0.0.1:{port}", connect_timeout=1.0)
    assert time.monotonic() - t0 < 10


def test_generic_lease_renews_and_reports_session_expiry(zk_issuer, resource):
    from fencekit.leases import Lease, LeaseTimeoutError

    a, b = zk_issuer(), zk_issuer()
    lease = Lease(a, resource, ttl=2, wait=5, fence=False)
    lease.acquire()
    time.sleep(4)  # two session timeouts
    assert not lease.lost
    with pytest.raises(LeaseTimeoutError):
        Lease(b, resource, ttl=2, wait=0.5, fence=False).acquire()
    expire_session(a)
    assert lease.wait_lost(10), "Lease not told that its ZooKeeper session expired"
    other = Lease(b, resource, ttl=2, wait=5, fence=False).acquire()
    assert other.token > lease.token
    other.release()


# ------------------------------------------------- connection lost, session alive: no loss


def _ordered_issuer(zk, first, cls=None, session_timeout: float = 4.0):
    """An issuer whose client connects to ``first`` and, when cut off from it, moves on to the
    next server in order (kazoo shuffles the hosts unless told not to). A 4 s session (the
    ensemble's maximum) leaves the client time to reconnect before the server expires it."""
    from kazoo.client import KazooClient

    from fencekit.leases.zookeeper import ZooKeeperIssuer

    order = [first] + [s for s in zk.servers if s is not first]
    client = KazooClient(
        hosts=",".join(s.endpoint for s in order),
        timeout=session_timeout,
        randomize_hosts=False,
    )
    client.start(timeout=15)
    return (cls or ZooKeeperIssuer)(client=client, op_timeout=10.0)


def _a_follower(zk):
    leader = zk.leader()
    return next(s for s in zk.servers if s.running and s is not leader)


def _close(issuer) -> None:
    issuer.close()
    issuer.client.stop()
    issuer.client.close()


def test_connection_lost_while_taking_the_lock_does_not_lose_the_grant(zk, zk_issuer, resource):
    """The server the issuer talks to freezes right after the lock node is created: the
    issuer's next call fails with a lost connection, kazoo reconnects to another server in the
    same session, and the grant is as good as ever. It must not be declared lost (nor its node
    deleted on reconnecting, which would end the lease before its session did)."""
    from kazoo.retry import KazooRetry

    from fencekit.leases.zookeeper import ZooKeeperIssuer

    follower = _a_follower(zk)
    frozen: list[int] = []

    class FreezesItsServer(ZooKeeperIssuer):
        def _attempt(self, *args):  # type: ignore[no-untyped-def]
            found = super()._attempt(*args)
            if found is not None and not frozen:
                os.kill(follower.proc.pid, signal.SIGSTOP)
                frozen.append(follower.proc.pid)
            return found

    a = _ordered_issuer(zk, follower, FreezesItsServer)
    try:
        g = a.try_acquire(resource, "A", 2)
        assert frozen, "the server was not frozen mid-acquisition"
        assert g is not None
        reasons: list[str] = []
        a.watch_loss(g, lambda _g, why: reasons.append(why))
        deadline = time.monotonic() + 3 * a.session_timeout
        while a.client.client_id is None:
            assert time.monotonic() < deadline, "the client did not reconnect"
            time.sleep(0.02)
        assert a.client.client_id[0] == g.handle.session_id  # the same session, reconnected
        assert not a.is_lost(g), reasons
        assert a.renew(g), reasons
        time.sleep(0.5)  # a give-up on reconnecting would have deleted the node by now
        assert zk_issuer().try_acquire(resource, "B", 2) is None
        # On a busy machine the client may miss a ping and reconnect once more (same session):
        # the read is retried across such a drop, as an application's would be.
        read = KazooRetry(max_tries=10, delay=0.2, ignore_expire=False)
        assert read(a.current_holder, resource) == ("A", g.token)
        assert a.renew(g)
        assert reasons == []
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        _close(a)


def test_reconnected_before_the_disconnection_rule_fires_loses_nothing(zk, zk_issuer, resource):
    """Cut off, then reconnected in the same session; the disconnection rule's timer fires
    before the issuer's own CONNECTED callback has run (a callback thread the scheduler has not
    run yet; here held back on purpose). The rule must go by the client's real state: no grant
    is lost, neither the one held since before the disconnection nor one taken after it."""
    from kazoo.protocol.states import KazooState

    follower = _a_follower(zk)
    a = _ordered_issuer(zk, follower)
    gate = threading.Event()
    suspended_at: list[float] = []
    on_state = a._on_state

    def held_back(state: str) -> None:
        if state == KazooState.SUSPENDED:
            suspended_at.append(time.monotonic())
            on_state(state)
        elif state == KazooState.CONNECTED:
            # Kazoo goes on (pings, requests); the issuer hears of it only when the gate opens.
            threading.Thread(target=lambda: (gate.wait(60), on_state(state)), daemon=True).start()
        else:
            on_state(state)

    a.client.remove_listener(on_state)
    a.client.add_listener(held_back)
    frozen = False
    try:
        g1 = a.try_acquire(resource, "A1", 2)
        assert g1 is not None
        reasons: list[str] = []
        a.watch_loss(g1, lambda _g, why: reasons.append(f"g1: {why}"))
        os.kill(follower.proc.pid, signal.SIGSTOP)
        frozen = True
        deadline = time.monotonic() + 3 * a.session_timeout
        while a.client.state != KazooState.CONNECTED or not suspended_at:
            assert time.monotonic() < deadline, "the client did not reconnect"
            time.sleep(0.02)
        assert a.client.client_id[0] == g1.handle.session_id  # the session survived
        g2 = a.try_acquire(resource + "-2", "A2", 2)  # taken after the disconnection began
        assert g2 is not None
        a.watch_loss(g2, lambda _g, why: reasons.append(f"g2: {why}"))
        # Past the disconnection rule's deadline, the CONNECTED callback still held back.
        time.sleep(max(0.0, suspended_at[0] + a.session_timeout + 0.5 - time.monotonic()))
        gate.set()
        time.sleep(0.5)  # the callback's give-up of declared-lost grants would run by now
        assert reasons == []
        assert a.renew(g1)
        assert a.renew(g2)
        assert a.current_holder(resource) == ("A1", g1.token)
        assert a.current_holder(resource + "-2") == ("A2", g2.token)
    finally:
        gate.set()
        if frozen:
            os.kill(follower.proc.pid, signal.SIGCONT)
        _close(a)
