"""Shared pieces of the external issuers (etcd, ZooKeeper).

The protocol types (``Grant``, the errors, ``check_resource``) are ``fencekit.leases.base``'s,
re-exported here; ``LossTracker`` is the issuers' own per-grant loss state (the issuer-side
counterpart of the ``Lease``'s ``LeaseState``).

An issuer grants leases on *resources* (names) to *holders*; each grant carries a *token*, a
positive 64-bit integer that, per resource, only ever increases (across release, expiry,
takeover and issuer restarts). Tokens of different issuers are never compared: a named
resource is bound to one issuer.
"""

from __future__ import annotations

import logging
import threading
import time

from fencekit.leases.base import Grant, LossCallback, check_resource

log = logging.getLogger("fencekit.leases")

__all__ = ["Grant", "LossCallback", "LossTracker", "check_resource"]


class LossTracker:
    """Per-grant loss state: a flag, a local deadline and callbacks fired once.

    ``valid_until`` is a local monotonic deadline: the lease was last shown alive at some
    instant and will not outlive ``that instant + ttl`` on the issuer. After it passes, the
    holder must assume it lost the lease even if nobody told it (it may be partitioned).
    """

    def __init__(self, grant: Grant, shown_alive_at: float) -> None:
        self.grant = grant
        self.valid_until = shown_alive_at + grant.ttl
        self.lost_reason: str | None = None
        self.callbacks: list[LossCallback] = []
        self._lock = threading.Lock()
        self.released = False

    def alive_at(self, instant: float) -> None:
        with self._lock:
            if self.lost_reason is None:
                self.valid_until = max(self.valid_until, instant + self.grant.ttl)

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None or time.monotonic() > self.valid_until

    def expire_if_due(self) -> bool:
        """Mark lost if the local deadline passed; return whether the grant is lost."""
        if self.lost_reason is None and time.monotonic() > self.valid_until:
            self.mark_lost("lease TTL passed without a successful keep-alive")
        return self.lost

    def add_callback(self, callback: LossCallback) -> None:
        with self._lock:
            fire_now = self.lost_reason
            if fire_now is None:
                self.callbacks.append(callback)
        if fire_now is not None:
            _safe_call(callback, self.grant, fire_now)

    def mark_lost(self, reason: str) -> None:
        with self._lock:
            if self.lost_reason is not None:
                return
            self.lost_reason = reason
            callbacks, self.callbacks = self.callbacks, []
        if not self.released:
            log.warning(
                "lease lost: %s holder=%s token=%s (%s)",
                self.grant.resource,
                self.grant.holder,
                self.grant.token,
                reason,
            )
        for cb in callbacks:
            _safe_call(cb, self.grant, reason)


def _safe_call(cb: LossCallback, grant: Grant, reason: str) -> None:
    try:
        cb(grant, reason)
    except Exception:  # a callback must not kill the issuer's thread
        log.exception("lease-loss callback failed for %s", grant.resource)
