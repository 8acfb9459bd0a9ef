"""etcd issuer: leases from etcd, tokens from etcd's global revision.

Needs the ``etcd`` extra (``etcd3gw``, OpenStack's client for etcd's gRPC-gateway JSON API;
etcd 3.3 and newer, the ``/v3/`` path discovered from the server's version).

How a grant works (etcd's own ``concurrency.Mutex`` recipe, non-blocking form):

1. grant an etcd lease of ``ttl`` seconds (whole seconds, rounded up; etcd may raise a tiny
   TTL to its minimum, and the grant records the TTL etcd actually granted);
2. one transaction: *if* ``<prefix><resource>/<lease-id-hex>`` does not exist, put it
   (value: the holder name) attached to the lease; in both branches read the key with the
   lowest ``create_revision`` under ``<prefix><resource>/``;
3. if that lowest key is ours, the lease holds the lock and **the token is our key's
   ``create_revision``**; otherwise revoke the lease (which deletes our key) and return None.

Why the token is safe: every write to etcd gets the next value of one cluster-wide, 64-bit
revision counter, assigned by the Raft leader in log order and never reused (compaction drops
history, not the counter; a leader change continues it). A holder is the live key with the
lowest ``create_revision`` under the resource's prefix; a key, once deleted, never returns
with the same revision. So when B holds after A, A's key was deleted before B became the
lowest, and B's key either existed then with a higher revision than A's (A was the lowest)
or was created later: either way B's token > A's token. All reads here are linearizable
(etcd's default; this module never asks for serializable reads), and the transaction reads
the owner in the same atomic step as it writes, so no holder decides on stale data.

The key layout is the one of etcd's ``concurrency.Mutex`` (Go ``clientv3/concurrency``,
``etcdctl lock``, the server's v3lock API) for a lock named ``<prefix><resource>``: a Go
service holding that mutex and a fencekit worker exclude each other, and the Go side's
fencing token (its key's create revision) is comparable with ours. Resource names are
escaped (``%`` -> ``%25``, ``/`` -> ``%2F``) so that one resource's prefix never contains
another's keys.

Loss: ``renew`` sends a lease keep-alive and re-reads the key; it answers False when the
lease expired, the key is gone (deleted by someone, or the lease revoked), or etcd could not
be reached before the lease's TTL ran out. ``watch_loss`` starts a monitor that watches the
key (etcd watch; prompt on deletion) and re-checks it periodically; ``is_lost`` also turns
True by the local clock once the last keep-alive's TTL has passed.
"""

from __future__ import annotations

import base64
import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fencekit.errors import IssuerError, IssuerUnavailableError
from fencekit.leases._external import Grant, LossCallback, LossTracker, check_resource, log
from fencekit.leases._threaded import ThreadedAsyncIssuer

try:
    import etcd3gw
    from etcd3gw import exceptions as etcd_exc
    from etcd3gw.watch import Watcher
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the etcd issuer needs the 'etcd' extra: pip install 'pg-fencekit[etcd]'"
    ) from exc

__all__ = ["DEFAULT_PREFIX", "AsyncEtcdIssuer", "EtcdHandle", "EtcdIssuer"]

DEFAULT_PREFIX = "fencekit/locks/"

T = TypeVar("T")

# Errors after which another attempt (maybe on another member) can succeed: connection
# refused/reset, timeouts, 503 (no leader, leader changed) and 500 (gateway-wrapped errors
# such as "etcdserver: request timed out").
_RETRYABLE = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.InternalServerError,
)


def _b64(value: str | bytes) -> str:
    raw = value.encode() if isinstance(value, str) else value
    return base64.b64encode(raw).decode("ascii")


def _unb64(value: str) -> bytes:
    return base64.b64decode(value)


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix``."""
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\x00"


def escape_resource(resource: str) -> str:
    return resource.replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class EtcdHandle:
    key: str
    lease_id: int


class _Members:
    """etcd3gw clients, one per endpoint; calls fail over to the next member on error."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float,
        api_path: str | None,
        ca_cert: str | None,
        cert_key: str | None,
        cert_cert: str | None,
    ) -> None:
        self.clients: list[Any] = []
        for ep in endpoints:
            url = urlsplit(ep if "://" in ep else f"http://{ep}")
            if not url.hostname:
                raise ValueError(f"bad etcd endpoint {ep!r}")
            self.clients.append(
                etcd3gw.client(
                    host=url.hostname,
                    port=url.port or 2379,
                    protocol=url.scheme,
                    timeout=timeout,
                    api_path=api_path,
                    ca_cert=ca_cert,
                    cert_key=cert_key,
                    cert_cert=cert_cert,
                )
            )
        if not self.clients:
            raise ValueError("no etcd endpoints")
        self._current = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> Any:
        return self.clients[self._current]

    def call(self, op: Callable[[Any], T], deadline: float, what: str) -> T:
        delay = 0.05
        last: Exception | None = None
        tried = 0
        while True:
            with self._lock:
                idx = self._current
            client = self.clients[idx]
            try:
                return op(client)
            except _RETRYABLE as exc:
                last = exc
                tried += 1
                with self._lock:
                    if self._current == idx:
                        self._current = (idx + 1) % len(self.clients)
            now = time.monotonic()
            if now >= deadline:
                raise IssuerUnavailableError(
                    f"etcd: {what} failed on every member for {tried} attempts: {last}"
                ) from last
            # One quick pass over the members, then back off.
            if tried % len(self.clients) == 0:
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 0.5)


class _Monitor(threading.Thread):
    """Watches one grant's key and re-checks it; marks the grant lost when the key goes."""

    def __init__(
        self, issuer: EtcdIssuer, grant: Grant, tracker: LossTracker, keepalive: bool
    ) -> None:
        super().__init__(name=f"fencekit-etcd-monitor-{grant.resource}", daemon=True)
        self.issuer = issuer
        self.grant = grant
        self.tracker = tracker
        self.keepalive = keepalive
        self.stop_event = threading.Event()
        self._watcher: Any = None
        self._watch_client: Any = None
        self.interval = max(0.2, min(1.0, grant.ttl / 4))

    def _on_event(self, event: Any) -> None:
        kv = event.get("kv", {})
        if event.get("type") == "DELETE":
            self.tracker.mark_lost("lock key deleted (lease expired or revoked)")
        elif int(kv.get("create_revision", self.grant.token)) != self.grant.token:
            self.tracker.mark_lost("lock key replaced")

    def _ensure_watch(self) -> None:
        client = self.issuer._members.current
        if self._watcher is not None and self._watch_client is client:
            return
        self._stop_watch()
        handle: EtcdHandle = self.grant.handle
        try:
            self._watcher = Watcher(
                client, handle.key, self._on_event, start_revision=self.grant.token + 1
            )
            self._watch_client = client
        except Exception as exc:  # a member down: the periodic check covers us
            log.debug("etcd watch on %s failed: %s", handle.key, exc)
            self._watcher = None

    def _stop_watch(self) -> None:
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                self._watcher.stop()
        self._watcher = None
        self._watch_client = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set() and not self.tracker.expire_if_due():
                self._ensure_watch()
                if self.keepalive:
                    self.issuer.renew(self.grant)
                else:
                    self.issuer._check_key(self.grant, self.tracker)
                self.tracker.expire_if_due()
                self.stop_event.wait(self.interval)
        except Exception as exc:  # never die silently: a dead monitor is a lost signal
            log.exception("etcd monitor for %s failed", self.grant.resource)
            self.tracker.mark_lost(f"monitor failed: {exc}")
        finally:
            self._stop_watch()

    def stop(self) -> None:
        self.stop_event.set()


class EtcdIssuer:
    """Leases and fencing tokens from an etcd cluster (3.3+; tested with 3.4).

    ``endpoints``: ``host:port`` or URLs of the cluster's members (a list or a comma-separated
    string). Calls go to one member and move to the next when it fails.
    ``request_timeout`` bounds one HTTP request; ``retry_deadline`` bounds the failover loop
    of ``try_acquire`` and ``release`` (``renew`` retries until the lease's TTL would run out).
    """

    name = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str] | str = "127.0.0.1:2379",
        *,
        prefix: str = DEFAULT_PREFIX,
        request_timeout: float = 2.0,
        retry_deadline: float = 10.0,
        api_path: str | None = None,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        self._members = _Members(
            endpoints,
            timeout=request_timeout,
            api_path=api_path,
            ca_cert=ca_cert,
            cert_key=cert_key,
            cert_cert=cert_cert,
        )
        self.prefix = prefix
        self.retry_deadline = retry_deadline
        self._trackers: dict[int, LossTracker] = {}
        self._monitors: dict[int, _Monitor] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ helpers

    def _deadline(self) -> float:
        return time.monotonic() + self.retry_deadline

    def _call(self, op: Callable[[Any], T], what: str, deadline: float | None = None) -> T:
        return self._members.call(op, self._deadline() if deadline is None else deadline, what)

    def lock_prefix(self, resource: str) -> str:
        """The etcd key prefix whose lowest-revision key holds ``resource``'s lock."""
        return f"{self.prefix}{escape_resource(resource)}/"

    def _tracker(self, grant: Grant) -> LossTracker | None:
        if grant.issuer != self.name or not isinstance(grant.handle, EtcdHandle):
            raise ValueError(f"not an etcd grant: {grant!r}")
        with self._lock:
            return self._trackers.get(grant.handle.lease_id)

    def _revoke(self, lease_id: int, deadline: float | None = None) -> None:
        def op(c: Any) -> None:
            try:
                c.post(c.get_url("/kv/lease/revoke"), json={"ID": lease_id})
            except etcd_exc.Etcd3Exception as exc:
                if isinstance(exc, _RETRYABLE):
                    raise
                # "requested lease not found": already expired or revoked.

        self._call(op, "lease revoke", deadline)

    # ------------------------------------------------------------ the issuer protocol

    def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        """One non-blocking attempt. Returns a Grant, or None when another holder has it.

        Raises IssuerUnavailableError when etcd cannot be reached within ``retry_deadline`` (the
        lease granted for the attempt, if any, is revoked or left to expire).
        """
        check_resource(resource)
        if self._closed:
            raise IssuerError("issuer is closed")
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        deadline = self._deadline()
        t0 = time.monotonic()
        granted = self._call(
            lambda c: c.post(c.get_url("/lease/grant"), json={"TTL": math.ceil(ttl), "ID": 0}),
            "lease grant",
            deadline,
        )
        lease_id = int(granted["ID"])
        granted_ttl = float(granted.get("TTL", math.ceil(ttl)))
        lock_prefix = self.lock_prefix(resource)
        key = f"{lock_prefix}{lease_id:x}"
        owner_range = {
            "request_range": {
                "key": _b64(lock_prefix),
                "range_end": _b64(_prefix_end(lock_prefix.encode())),
                "sort_order": "ASCEND",
                "sort_target": "CREATE",
                "limit": 1,
            }
        }
        txn = {
            "compare": [
                {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}
            ],
            "success": [
                {"request_put": {"key": _b64(key), "value": _b64(holder), "lease": lease_id}},
                owner_range,
            ],
            "failure": [{"request_range": {"key": _b64(key)}}, owner_range],
        }
        try:
            resp = self._call(lambda c: c.transaction(txn), "lock transaction", deadline)
            responses = resp.get("responses", [])
            if not resp.get("succeeded"):
                # A retried transaction whose first try went through (its reply was lost, e.g.
                # in a leader change). Whether our key was the only live one at its creation
                # revision, the token, is unknown: another holder may still have held the lock
                # then, so the key would have been a waiter's. Withdraw; the caller tries again
                # with a fresh key, whose revision is read in the same transaction.
                with contextlib.suppress(IssuerUnavailableError):
                    self._revoke(lease_id, deadline)
                return None
            my_rev = int(resp["header"]["revision"])
            owners = responses[1]["response_range"].get("kvs", [])
        except BaseException:
            with contextlib.suppress(IssuerError):
                self._revoke(lease_id, time.monotonic() + 1.0)
            raise
        if owners and int(owners[0]["create_revision"]) != my_rev:
            # Someone else holds it: withdraw (revoking the lease deletes our key).
            with contextlib.suppress(IssuerUnavailableError):
                self._revoke(lease_id, deadline)
            return None
        grant = Grant(
            resource=resource,
            holder=holder,
            token=my_rev,
            ttl=granted_ttl,
            issuer=self.name,
            handle=EtcdHandle(key=key, lease_id=lease_id),
        )
        with self._lock:
            self._trackers[lease_id] = LossTracker(grant, shown_alive_at=t0)
        return grant

    def renew(self, grant: Grant) -> bool:
        """Keep the lease alive; False once it is lost (expired, key gone, unreachable)."""
        tracker = self._tracker(grant)
        if tracker is None or tracker.released:
            return False
        if tracker.expire_if_due():
            return False
        handle: EtcdHandle = grant.handle
        t0 = time.monotonic()
        try:
            result = self._call(
                lambda c: c.post(c.get_url("/lease/keepalive"), json={"ID": handle.lease_id}),
                "lease keep-alive",
                deadline=max(tracker.valid_until, t0 + 0.5),
            )
        except IssuerUnavailableError as exc:
            tracker.mark_lost(f"etcd unreachable until the lease's TTL ran out: {exc}")
            return False
        left = int(result.get("result", {}).get("TTL", -1))
        if left <= 0:
            tracker.mark_lost("lease expired")
            return False
        tracker.alive_at(t0)
        return self._check_key(grant, tracker)

    def _check_key(self, grant: Grant, tracker: LossTracker) -> bool:
        """Linearizable read of the grant's key: still there with our create revision?"""
        handle: EtcdHandle = grant.handle
        try:
            resp = self._call(
                lambda c: c.post(c.get_url("/kv/range"), json={"key": _b64(handle.key)}),
                "lock key read",
                deadline=max(tracker.valid_until, time.monotonic() + 0.5),
            )
        except IssuerUnavailableError as exc:
            if tracker.lost:
                tracker.mark_lost(f"etcd unreachable until the lease's TTL ran out: {exc}")
                return False
            return not tracker.lost
        kvs = resp.get("kvs", [])
        if not kvs:
            tracker.mark_lost("lock key deleted (lease expired or revoked)")
            return False
        if int(kvs[0]["create_revision"]) != grant.token:
            tracker.mark_lost("lock key replaced")
            return False
        return not tracker.lost

    def release(self, grant: Grant) -> None:
        """Give the lease up. Idempotent; touches only this grant's own key and lease."""
        tracker = self._tracker(grant)
        handle: EtcdHandle = grant.handle
        if tracker is not None:
            tracker.released = True
        self._stop_monitor(handle.lease_id)
        txn = {
            "compare": [
                {
                    "key": _b64(handle.key),
                    "result": "EQUAL",
                    "target": "CREATE",
                    "create_revision": grant.token,
                }
            ],
            "success": [{"request_delete_range": {"key": _b64(handle.key)}}],
            "failure": [],
        }
        try:
            self._call(lambda c: c.transaction(txn), "unlock transaction")
            self._revoke(handle.lease_id)
        except IssuerUnavailableError as exc:
            log.warning(
                "etcd release of %s failed (the lease expires by its TTL): %s", grant.resource, exc
            )
        finally:
            with self._lock:
                self._trackers.pop(handle.lease_id, None)

    def server_version(self) -> str:
        """The etcd version of the member answering (its maintenance status): what lease
        contract the cluster keeps depends on it (docs/chaos.md)."""
        return str(self._call(lambda c: c.status(), "status")["version"])

    def is_lost(self, grant: Grant) -> bool:
        tracker = self._tracker(grant)
        return tracker is None or tracker.lost

    def watch_loss(self, grant: Grant, callback: LossCallback, *, keepalive: bool = False) -> None:
        """Call ``callback(grant, reason)`` once, from a monitor thread, when the lease is lost.

        The monitor watches the lock key (etcd watch, prompt on deletion) and re-reads it
        about every ``min(1 s, ttl/4)``; with ``keepalive=True`` it also renews the lease
        (for use without the generic Lease object, which renews by itself).
        """
        tracker = self._tracker(grant)
        if tracker is None:
            callback(grant, "not held")
            return
        tracker.add_callback(callback)
        lease_id = grant.handle.lease_id
        with self._lock:
            if lease_id in self._monitors or self._closed:
                return
            mon = _Monitor(self, grant, tracker, keepalive)
            self._monitors[lease_id] = mon
        mon.start()

    def _stop_monitor(self, lease_id: int) -> None:
        with self._lock:
            mon = self._monitors.pop(lease_id, None)
        if mon is not None:
            mon.stop()
            if mon is not threading.current_thread():
                mon.join(timeout=5)

    def current_holder(self, resource: str) -> tuple[str, int] | None:
        """(holder, token) of the lock's current holder by a linearizable read, or None."""
        lock_prefix = self.lock_prefix(resource)
        resp = self._call(
            lambda c: c.post(
                c.get_url("/kv/range"),
                json={
                    "key": _b64(lock_prefix),
                    "range_end": _b64(_prefix_end(lock_prefix.encode())),
                    "sort_order": "ASCEND",
                    "sort_target": "CREATE",
                    "limit": 1,
                },
            ),
            "owner read",
        )
        kvs = resp.get("kvs", [])
        if not kvs:
            return None
        return _unb64(kvs[0].get("value", "")).decode(errors="replace"), int(
            kvs[0]["create_revision"]
        )

    def close(self) -> None:
        """Stop monitors and release every grant this issuer still holds (best effort)."""
        with self._lock:
            self._closed = True
            trackers = list(self._trackers.values())
        for tracker in trackers:
            with contextlib.suppress(Exception):
                self.release(tracker.grant)
        with self._lock:
            ids = list(self._monitors)
        for lease_id in ids:
            self._stop_monitor(lease_id)
        for client in self._members.clients:
            with contextlib.suppress(Exception):
                client.session.close()

    def __enter__(self) -> EtcdIssuer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEtcdIssuer(ThreadedAsyncIssuer[EtcdIssuer]):
    """The asyncio form of :class:`EtcdIssuer` (same arguments), for ``AsyncLease``.

    A thin wrapper: each call runs the sync issuer in a worker thread (``asyncio.to_thread``),
    so the grant, token and loss semantics are exactly :class:`EtcdIssuer`'s.
    """

    def __init__(self, endpoints: Sequence[str] | str = "127.0.0.1:2379", **kwargs: Any) -> None:
        super().__init__(lambda: EtcdIssuer(endpoints, **kwargs), EtcdIssuer.name)

    async def server_version(self) -> str:
        """The etcd version of the member answering (:meth:`EtcdIssuer.server_version`)."""
        return str(await self._run("server_version"))
