"""The issuer protocol, grants, and the generic ``Lease`` built on any issuer.

An issuer (PostgreSQL, etcd, ZooKeeper) grants leases on named *resources* to *holders*; each
grant carries a *token* that, per resource, only ever increases. ``Lease`` adds what every
issuer needs on the client: waiting with backoff, background renewal, a loss signal, release,
and putting the token in the context scope so that writes carry it.

The lease is for efficiency; the token checked by PostgreSQL is for correctness. A paused
process cannot notice that its lease ran out, so nothing here is a safety guarantee on its own.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fencekit.errors import (
    LeaseLostError,
)

log = logging.getLogger("fencekit.leases")

MAX_TOKEN = 2**63 - 1
MAX_TTL = 86400.0  # the SQL issuer's limit too: renew a short lease rather than hold a long one

__all__ = [
    "MAX_TOKEN",
    "AsyncIssuer",
    "Backoff",
    "Grant",
    "Issuer",
    "LeaseState",
    "LossCallback",
    "check_resource",
    "check_ttl",
    "default_holder",
]


@dataclass(frozen=True)
class Grant:
    """One lease grant: who holds which resource, with which token, for how long (seconds)."""

    resource: str
    holder: str
    token: int
    ttl: float
    issuer: str
    #: issuer-specific handle (etcd lease id and key, ZooKeeper node path, ...); opaque.
    handle: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (0 < self.token <= MAX_TOKEN):
            raise ValueError(f"token {self.token!r} is not a positive signed 64-bit integer")


#: ``callback(grant, reason)``: called once when a lease is known to be lost.
LossCallback = Callable[[Grant, str], None]


@runtime_checkable
class Issuer(Protocol):
    """What grants leases and tokens. Implementations: postgres, etcd, zookeeper.

    ``try_acquire`` never waits for a holder to go away: it returns None when the resource is
    held. ``renew`` answers False once the lease is lost (expired, released, taken over).
    ``release`` is best effort and never raises for a lease that is already gone.

    Optional: ``watch_loss(grant, callback)``, for issuers that learn of a loss by themselves
    (a ZooKeeper session expiry): ``Lease`` registers its loss handler there when present.
    """

    name: str

    def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None: ...
    def renew(self, grant: Grant) -> bool: ...
    def release(self, grant: Grant) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class AsyncIssuer(Protocol):
    """The asyncio form of :class:`Issuer` (same meaning, coroutine methods)."""

    name: str

    async def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None: ...
    async def renew(self, grant: Grant) -> bool: ...
    async def release(self, grant: Grant) -> None: ...
    async def close(self) -> None: ...


# ---------------------------------------------------------------- input checks


def check_resource(resource: str) -> None:
    if not isinstance(resource, str) or not resource:
        raise ValueError("resource must be a non-empty string, e.g. 'billing:42'")
    if "\x00" in resource:
        raise ValueError("resource must not contain NUL")
    if len(resource.encode()) > 1024:
        raise ValueError("resource name is longer than 1024 bytes")


def check_ttl(ttl: float) -> float:
    ttl = float(ttl)
    if not ttl > 0:  # also catches NaN
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if ttl > MAX_TTL:
        raise ValueError(
            f"ttl {ttl:g}s is longer than the {MAX_TTL:g}s limit: use a short ttl and renew"
        )
    return ttl


def default_holder() -> str:
    """A holder name unique to this lease instance: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- shared state machine


@dataclass
class Backoff:
    """Exponential backoff with full jitter, never sleeping past a deadline."""

    initial: float = 0.05
    maximum: float = 1.0
    multiplier: float = 2.0
    _current: float = field(default=0.0, init=False, repr=False)

    def reset(self) -> None:
        self._current = 0.0

    def next_delay(self, remaining: float | None = None) -> float:
        grown = min(self.maximum, self._current * self.multiplier)
        self._current = self.initial if self._current == 0 else grown
        delay = random.uniform(self._current / 2, self._current)
        if remaining is not None:
            delay = max(0.0, min(delay, remaining))
        return delay


class LeaseState:
    """The client's view of one grant: a local deadline, a loss reason, callbacks.

    ``valid_until`` is measured on the local monotonic clock from the moment the last successful
    acquire/renew request was SENT: the issuer started its ttl after that, so the lease does
    not outlive the local deadline on the issuer (up to clock-rate differences; the token covers
    those). Shared by the sync and async leases; thread-safe.
    """

    def __init__(self, grant: Grant, sent_at: float, on_lost: LossCallback | None) -> None:
        self.grant = grant
        self.valid_until = sent_at + grant.ttl
        self.lost_reason: str | None = None
        self.released = False
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def alive_at(self, sent_at: float) -> None:
        with self._lock:
            if self.lost_reason is None:
                self.valid_until = max(self.valid_until, sent_at + self.grant.ttl)

    def remaining(self) -> float:
        return self.valid_until - time.monotonic()

    def is_lost(self) -> bool:
        if self.lost_reason is None and not self.released and self.remaining() <= 0:
            self.mark_lost("expired: not renewed within its ttl")
        return self.lost_reason is not None

    def mark_lost(self, reason: str) -> None:
        with self._lock:
            if self.lost_reason is not None or self.released:
                return
            self.lost_reason = reason
        log.warning(
            "lease lost: %s holder=%s token=%s (%s)",
            self.grant.resource,
            self.grant.holder,
            self.grant.token,
            reason,
        )
        for fn in self._listeners:
            fn()
        if self._on_lost is not None:
            try:
                self._on_lost(self.grant, reason)
            except Exception:  # a user callback must not kill the renewal thread
                log.exception("lease-loss callback failed for %s", self.grant.resource)

    def check(self) -> None:
        if self.is_lost():
            assert self.lost_reason is not None
            raise LeaseLostError(self.grant, self.lost_reason)
