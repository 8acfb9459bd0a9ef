"""ZooKeeper issuer: kazoo's lock recipe, tokens from ZooKeeper's transaction ids.

Needs the ``zookeeper`` extra (``kazoo``). ZooKeeper 3.5 and newer (tested with 3.8).

How a grant works: kazoo's ``Lock`` recipe, non-blocking. The contender creates an
ephemeral sequential znode ``<prefix>/<resource>/<uuid>__lock__<seq>`` in its session; the
contender whose node has the lowest sequence number holds the lock; a contender that is not
lowest deletes its node and the attempt returns None. (The attempt is written with kazoo's
primitives rather than ``Lock.acquire(blocking=False)``, which retries a lost connection
without a time bound and reads the node's stat in a second round trip; node names and order
are kazoo's, so kazoo ``Lock`` users on the same path and fencekit exclude each other.)

**The token is the holder's lock node's ``czxid``**: the zxid of the transaction that created
it. A zxid is ZooKeeper's 64-bit transaction id, ``epoch << 32 | counter``, assigned by the
leader in the total order of all writes and strictly increasing across leader elections (a
new epoch starts above every zxid of the last). It is *not* the sequential-node suffix: that
suffix is the parent's signed 32-bit ``cversion`` and wraps after 2^31 children.

Why the token is safe: the holder is the lowest-sequence node among the live contenders. The
sequence number and the czxid of the children of one parent are both assigned in the same
order (the leader's write order), so lower sequence means lower czxid. When B holds after A,
A's node was deleted before B became lowest, and B's node was either there already with a
higher sequence (A was lowest) or created later: either way B's czxid > A's czxid.

Reads: ZooKeeper serves reads from the member the client is connected to, which may lag. The
recipe does not need ``sync`` for safety: a session sees its own writes, so the children list
read after creating our node reflects at least every change up to our create; a lower node
absent from it was deleted, and deletions are final. ``renew`` calls ``sync`` before reading
so that its verdict is current.

Lease length: ZooKeeper leases are sessions. A grant's ``ttl`` is the *negotiated session
timeout* of the issuer's session (set by ``session_timeout``; the server clamps it between 2
and 20 ticks); the ``ttl`` argument of ``try_acquire`` is only checked against it. All grants
of one issuer share its session and are lost together when it expires.

Loss: the session's ``LOST`` state (the server expired it), the lock node's deletion, and a
client-side rule (as in Curator): disconnected (``SUSPENDED``) for longer than the session
timeout counts as lost, because the server will normally have expired the session by then
although the client cannot hear it. If the session survives after all (an ensemble that was
down as a whole restarts its session timers), the issuer deletes the lock nodes of the grants
it declared lost as soon as it reconnects, so that no lock stays held by a holder that was
told it lost it.

The rule reads the client's real state, not the issuer's record of it: kazoo sets its state
before it runs its listeners, so a reconnection whose ``CONNECTED`` callback has not run yet
still counts as connected. It applies only to grants last shown alive before the disconnection
began, and only when that disconnection (not an earlier one) has lasted a session timeout: a
grant is never declared lost, nor its node deleted, sooner than a session timeout after its
last proof of life. A connection lost in the middle of ``try_acquire`` is no loss either: the
issuer asks again once kazoo has reconnected.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fencekit.errors import IssuerError, IssuerUnavailableError
from fencekit.leases._external import Grant, LossCallback, LossTracker, check_resource, log
from fencekit.leases._threaded import ThreadedAsyncIssuer

try:
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException, NoNodeError, SessionExpiredError
    from kazoo.handlers.threading import KazooTimeoutError
    from kazoo.protocol.states import EventType, KazooState
    from kazoo.retry import KazooRetry, RetryFailedError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the ZooKeeper issuer needs the 'zookeeper' extra: pip install 'pg-fencekit[zookeeper]'"
    ) from exc

__all__ = ["DEFAULT_PREFIX", "AsyncZooKeeperIssuer", "ZooKeeperHandle", "ZooKeeperIssuer"]

DEFAULT_PREFIX = "/fencekit/locks"

_NODE_NAME = "__lock__"
_CONTENDER = re.compile(r"__lock__(-?\d{10})$")


def _sequence(child: str) -> int | None:
    m = _CONTENDER.search(child)
    return int(m.group(1)) if m else None


def escape_resource(resource: str) -> str:
    """A resource name as one znode name (no '/', not '.' or '..')."""
    escaped = resource.replace("%", "%25").replace("/", "%2F")
    if escaped in (".", "..", "zookeeper"):
        escaped = escaped.replace(".", "%2E").replace("z", "%7A", 1)
    return escaped


@dataclass(frozen=True)
class ZooKeeperHandle:
    node: str  # full path of the holder's lock node
    session_id: int  # the session the node belongs to


class ZooKeeperIssuer:
    """Leases and fencing tokens from a ZooKeeper ensemble through kazoo.

    ``hosts``: kazoo's connection string (``"h1:2181,h2:2181,h3:2181"``, optional chroot).
    ``session_timeout``: seconds; the lease length of every grant (see the module doc).
    ``client``: an already-configured ``KazooClient`` to use instead (not stopped by close()).
    """

    name = "zookeeper"

    def __init__(
        self,
        hosts: str = "127.0.0.1:2181",
        *,
        prefix: str = DEFAULT_PREFIX,
        session_timeout: float = 10.0,
        connect_timeout: float = 15.0,
        op_timeout: float = 10.0,
        client: Any = None,
    ) -> None:
        self.prefix = "/" + prefix.strip("/")
        self.op_timeout = op_timeout
        self._owns_client = client is None
        self.client = client or KazooClient(hosts=hosts, timeout=session_timeout)
        self._trackers: dict[str, LossTracker] = {}
        self._lock = threading.RLock()
        self._suspended_since: float | None = None
        self._suspend_timer: threading.Timer | None = None
        # Lock nodes of grants the disconnection rule declared lost (decided under _lock, before
        # their holders are told in other threads): given up if the session survives.
        self._declared_lost: set[str] = set()
        self._closed = False
        self.client.add_listener(self._on_state)
        if self._owns_client:
            try:
                self.client.start(timeout=connect_timeout)
            except KazooTimeoutError as exc:
                with contextlib.suppress(Exception):
                    self.client.stop()
                    self.client.close()
                raise IssuerUnavailableError(f"ZooKeeper not reachable at {hosts}: {exc}") from exc

    # ------------------------------------------------------------ session state

    @property
    def session_timeout(self) -> float:
        """The negotiated session timeout in seconds (the lease length)."""
        return float(self.client._session_timeout) / 1000.0

    def _on_state(self, state: str) -> None:
        # Runs in kazoo's connection thread: never block here.
        if state == KazooState.LOST:
            self._mark_all_lost("ZooKeeper session expired")
        elif state == KazooState.SUSPENDED:
            with self._lock:
                if self._suspended_since is None:
                    since = time.monotonic()
                    self._suspended_since = since
                    timer = threading.Timer(
                        self.session_timeout, self._suspend_expired, args=(since,)
                    )
                    timer.daemon = True
                    self._suspend_timer = timer
                    timer.start()
        elif state == KazooState.CONNECTED:
            with self._lock:
                self._suspended_since = None
                if self._suspend_timer is not None:
                    self._suspend_timer.cancel()
                    self._suspend_timer = None
                given_up = [
                    node_tracker.grant
                    for node, node_tracker in self._trackers.items()
                    if not node_tracker.released
                    and (node_tracker.lost_reason is not None or node in self._declared_lost)
                ]
            if given_up:
                # We told the holders they lost these grants while cut off; if the session
                # survived after all, their nodes still hold the locks: give them up now.
                threading.Thread(
                    target=self._release_all,
                    args=(given_up,),
                    daemon=True,
                    name="fencekit-zk-giveup",
                ).start()

    def _release_all(self, grants: list[Grant]) -> None:
        for grant in grants:
            with contextlib.suppress(Exception):
                self.release(grant)

    def _suspend_expired(self, since: float) -> None:
        """The timer of the disconnection that began at ``since`` (monotonic) ran out."""
        with self._lock:
            # Decided and recorded under the lock the CONNECTED callback takes: either the
            # callback runs first (nothing is lost) or it finds the nodes to give up.
            if self._suspended_since != since or self.client.state == KazooState.CONNECTED:
                return  # reconnected (perhaps cut off again since: that has its own timer)
            # Only grants last shown alive before the disconnection: a lease outlives its last
            # proof of life by a session timeout, and this one may be younger than that.
            due = [
                t
                for t in self._trackers.values()
                if t.lost_reason is None and not t.released and t.valid_until - t.grant.ttl <= since
            ]
            self._declared_lost.update(t.grant.handle.node for t in due)
        self._tell_lost(due, "disconnected from ZooKeeper for longer than the session timeout")

    def _mark_all_lost(self, reason: str) -> None:
        with self._lock:
            trackers = list(self._trackers.values())
        self._tell_lost(trackers, reason)

    def _tell_lost(self, trackers: list[LossTracker], reason: str) -> None:
        for t in trackers:
            # Callbacks may block; do not run them in kazoo's thread.
            threading.Thread(
                target=t.mark_lost, args=(reason,), daemon=True, name="fencekit-zk-loss"
            ).start()

    # ------------------------------------------------------------ the issuer protocol

    def lock_path(self, resource: str) -> str:
        return f"{self.prefix}/{escape_resource(resource)}"

    def _tracker(self, grant: Grant) -> LossTracker | None:
        if grant.issuer != self.name or not isinstance(grant.handle, ZooKeeperHandle):
            raise ValueError(f"not a ZooKeeper grant: {grant!r}")
        with self._lock:
            return self._trackers.get(grant.handle.node)

    def try_acquire(self, resource: str, holder: str, ttl: float | None = None) -> Grant | None:
        """One non-blocking attempt; None when another holder has the lock.

        Raises IssuerUnavailableError when ZooKeeper cannot be reached within ``op_timeout``.
        """
        check_resource(resource)
        if self._closed:
            raise IssuerError("issuer is closed")
        if ttl is not None and ttl < self.session_timeout:
            # The lease length is the session's; a shorter wish cannot be honoured.
            log.debug(
                "ZooKeeper lease length is the session timeout %.1fs (asked %.1fs)",
                self.session_timeout,
                ttl,
            )
        path = self.lock_path(resource)
        # kazoo's Lock naming, so kazoo Lock users on the same path exclude us and we them.
        prefix = uuid.uuid4().hex + _NODE_NAME
        t0 = time.monotonic()
        state = {"tried": False}
        retry = KazooRetry(
            max_tries=None,
            deadline=self.op_timeout,
            max_delay=0.5,
            sleep_func=self.client.handler.sleep_func,
        )
        try:
            found = retry(self._attempt, path, prefix, holder, state)
        except (RetryFailedError, KazooException, KazooTimeoutError) as exc:
            self._cleanup_attempt(path, prefix)
            raise IssuerUnavailableError(
                f"ZooKeeper: lock attempt on {path} failed: {exc}"
            ) from exc
        if found is None:
            return None
        node, stat = found
        grant = Grant(
            resource=resource,
            holder=holder,
            token=int(stat.czxid),
            ttl=self.session_timeout,
            issuer=self.name,
            handle=ZooKeeperHandle(node=node, session_id=int(stat.ephemeralOwner)),
        )
        tracker = LossTracker(grant, shown_alive_at=t0)
        with self._lock:
            self._trackers[node] = tracker
        # Prompt signal when the node goes (session expiry, or someone deleting it), and a
        # check that it is still ours. A connection lost here says nothing about the session:
        # ask again once kazoo has reconnected instead of guessing.
        # Within what is left of op_timeout.
        retry.deadline = max(0.1, self.op_timeout - (time.monotonic() - t0))
        try:
            still = retry(self.client.exists, node, watch=lambda ev: self._node_event(node, ev))
        except SessionExpiredError:
            still = None
        except (RetryFailedError, KazooException, KazooTimeoutError):
            # Still cut off: the session's own signals (LOST, the disconnection rule) decide.
            still = None if self.client.state == KazooState.LOST else stat
        if still is None or still.czxid != stat.czxid:
            tracker.mark_lost("lock node gone right after the grant (session expired or deleted)")
        return grant

    def _attempt(
        self, path: str, prefix: str, holder: str, state: dict[str, bool]
    ) -> tuple[str, Any] | None:
        """Create our contender node (once), then hold iff it has the lowest sequence."""
        self.client.ensure_path(path)
        node_name: str | None = None
        stat = None
        if state["tried"]:
            # A create may have succeeded without us hearing the answer: find it by uuid.
            for child in self.client.get_children(path):
                if child.startswith(prefix):
                    node_name = child
                    stat = self.client.exists(f"{path}/{child}")
                    break
        state["tried"] = True
        if node_name is None or stat is None:
            created, stat = self.client.create(
                f"{path}/{prefix}",
                holder.encode(),
                ephemeral=True,
                sequence=True,
                include_data=True,
            )
            node_name = created[len(path) + 1 :]
        my_seq = _sequence(node_name)
        lower = [
            c
            for c in self.client.get_children(path)
            if (seq := _sequence(c)) is not None and my_seq is not None and seq < my_seq
        ]
        node = f"{path}/{node_name}"
        if lower:
            with contextlib.suppress(NoNodeError):
                self.client.delete(node)
            return None
        return node, stat

    def _cleanup_attempt(self, path: str, prefix: str) -> None:
        with contextlib.suppress(Exception):
            for child in self.client.get_children(path):
                if child.startswith(prefix):
                    self.client.delete(f"{path}/{child}")

    def _node_event(self, node: str, event: Any) -> None:
        if event.type == EventType.DELETED:
            with self._lock:
                tracker = self._trackers.get(node)
            if tracker is not None and not tracker.released:
                threading.Thread(
                    target=tracker.mark_lost,
                    args=("lock node deleted",),
                    daemon=True,
                    name="fencekit-zk-loss",
                ).start()
        elif event.type != EventType.NONE:
            # Data changes: re-arm the one-shot watch.
            with contextlib.suppress(KazooException):
                self.client.exists(node, watch=lambda ev: self._node_event(node, ev))

    def renew(self, grant: Grant) -> bool:
        """True while the session is alive and the lock node is ours (read after ``sync``).

        ZooKeeper keeps the session alive by itself; this only checks. While disconnected it
        waits (at most until the session would time out) for the connection to come back.
        """
        tracker = self._tracker(grant)
        if tracker is None or tracker.released:
            return False
        if tracker.lost_reason is not None:
            return False
        handle: ZooKeeperHandle = grant.handle
        deadline = time.monotonic() + self.session_timeout
        while self.client.state != KazooState.CONNECTED:
            if self.client.state == KazooState.LOST or time.monotonic() > deadline:
                tracker.mark_lost("ZooKeeper session expired or unreachable")
                return False
            time.sleep(0.05)
        t0 = time.monotonic()
        try:
            self.client.sync(handle.node)
            stat = self.client.exists(handle.node)
        except (SessionExpiredError, NoNodeError):
            stat = None
        except KazooException as exc:
            log.debug("ZooKeeper renew check failed: %s", exc)
            return not tracker.lost
        if stat is None or stat.czxid != grant.token or stat.ephemeralOwner != handle.session_id:
            tracker.mark_lost("lock node gone (session expired or node deleted)")
            return False
        # The session was alive at t0 and its server-side timeout restarts with our ping.
        tracker.alive_at(t0)
        return True

    def release(self, grant: Grant) -> None:
        """Delete our lock node if it is still ours. Idempotent."""
        tracker = self._tracker(grant)
        if tracker is not None:
            tracker.released = True
        handle: ZooKeeperHandle = grant.handle
        try:
            stat = self.client.exists(handle.node)
            if stat is not None and stat.czxid == grant.token:
                self.client.delete(handle.node, version=stat.version)
        except NoNodeError:
            pass
        except KazooException as exc:
            log.warning(
                "ZooKeeper release of %s failed (the node goes with the session): %s",
                grant.resource,
                exc,
            )
        finally:
            with self._lock:
                self._trackers.pop(handle.node, None)
                self._declared_lost.discard(handle.node)

    def is_lost(self, grant: Grant) -> bool:
        tracker = self._tracker(grant)
        if tracker is None:
            return True
        if tracker.lost_reason is not None:
            return True
        if self.client.state == KazooState.CONNECTED:
            # kazoo pings well within the session timeout: connected means alive.
            tracker.alive_at(time.monotonic())
            return False
        with self._lock:
            since = self._suspended_since
        return since is not None and time.monotonic() - since > self.session_timeout

    def watch_loss(self, grant: Grant, callback: LossCallback) -> None:
        """Call ``callback(grant, reason)`` once, from a helper thread, when the lease is lost."""
        tracker = self._tracker(grant)
        if tracker is None:
            callback(grant, "not held")
            return
        tracker.add_callback(callback)

    def current_holder(self, resource: str) -> tuple[str, int] | None:
        """(holder, token) of the current holder (after a sync), or None."""
        path = self.lock_path(resource)
        try:
            self.client.sync(path)
            contenders = sorted(
                (c for c in self.client.get_children(path) if _sequence(c) is not None),
                key=lambda c: _sequence(c) or 0,
            )
        except NoNodeError:
            return None
        for child in contenders:
            try:
                data, stat = self.client.get(f"{path}/{child}")
            except NoNodeError:
                continue
            return data.decode(errors="replace"), int(stat.czxid)
        return None

    def close(self) -> None:
        """Release every grant still held and stop the session (if this issuer owns it)."""
        with self._lock:
            self._closed = True
            trackers = list(self._trackers.values())
            if self._suspend_timer is not None:
                self._suspend_timer.cancel()
        for t in trackers:
            with contextlib.suppress(Exception):
                self.release(t.grant)
        self.client.remove_listener(self._on_state)
        if self._owns_client:
            with contextlib.suppress(Exception):
                self.client.stop()
                self.client.close()

    def __enter__(self) -> ZooKeeperIssuer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncZooKeeperIssuer(ThreadedAsyncIssuer[ZooKeeperIssuer]):
    """The asyncio form of :class:`ZooKeeperIssuer` (same arguments), for ``AsyncLease``.

    A thin wrapper: the session is opened in a worker thread by the first call (or by
    ``await issuer.connect()``), and every call runs the sync issuer there
    (``asyncio.to_thread``); kazoo keeps the session alive in its own thread as usual.
    """

    def __init__(self, hosts: str = "127.0.0.1:2181", **kwargs: Any) -> None:
        super().__init__(lambda: ZooKeeperIssuer(hosts, **kwargs), ZooKeeperIssuer.name)
