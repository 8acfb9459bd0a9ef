"""The asyncio form of a thread-based issuer: every call runs in a worker thread.

The etcd and ZooKeeper clients fencekit uses (etcd3gw over ``requests``, kazoo) are blocking
libraries. :class:`ThreadedAsyncIssuer` gives such an issuer the :class:`AsyncIssuer` shape by
running each call with :func:`asyncio.to_thread`, so the event loop never blocks on the
network. The issuer itself is created lazily, in a thread too, by the first call (the
ZooKeeper issuer connects in its constructor).

This is a thin wrapper, not a second implementation: the semantics (tokens, loss signal,
retries and their time bounds) are the sync issuer's. ``watch_loss`` stays synchronous, as
``AsyncLease`` expects: its callback runs in the issuer's own thread, and ``AsyncLease`` hands
the signal over to the loop thread-safely.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fencekit.errors import IssuerError
from fencekit.leases.base import Grant, Issuer, LossCallback

__all__ = ["ThreadedAsyncIssuer"]

S = TypeVar("S", bound=Issuer)


class ThreadedAsyncIssuer(Generic[S]):
    """An :class:`~fencekit.leases.base.AsyncIssuer` running a sync issuer in threads.

    ``factory`` builds the sync issuer; it is called once, in a worker thread, on first use.
    ``sync_issuer`` is that issuer (None before the first call).
    """

    name: str

    def __init__(self, factory: Callable[[], S], name: str) -> None:
        self.name = name
        self._factory = factory
        self._issuer: S | None = None
        self._make_lock = threading.Lock()
        self._closed = False

    @property
    def sync_issuer(self) -> S | None:
        return self._issuer

    def _get(self) -> S:
        with self._make_lock:
            if self._closed:
                raise IssuerError(f"{self.name} issuer is closed")
            if self._issuer is None:
                self._issuer = self._factory()
            return self._issuer

    async def _run(self, method: str, *args: Any) -> Any:
        def call() -> Any:
            return getattr(self._get(), method)(*args)

        return await asyncio.to_thread(call)

    async def connect(self) -> S:
        """Create the sync issuer now (it is otherwise created by the first call)."""
        return await asyncio.to_thread(self._get)

    async def try_acquire(self, resource: str, holder: str, ttl: float) -> Grant | None:
        grant: Grant | None = await self._run("try_acquire", resource, holder, ttl)
        return grant

    async def renew(self, grant: Grant) -> bool:
        return bool(await self._run("renew", grant))

    async def release(self, grant: Grant) -> None:
        await self._run("release", grant)

    async def current_holder(self, resource: str) -> tuple[str, int] | None:
        """(holder, token) of the resource's current holder, or None."""
        holder: tuple[str, int] | None = await self._run("current_holder", resource)
        return holder

    def watch_loss(self, grant: Grant, callback: LossCallback) -> None:
        """Synchronous on purpose: ``callback`` runs in the issuer's thread (see module doc)."""
        issuer = self._issuer
        if issuer is None:
            callback(grant, "not held")
            return
        watch = getattr(issuer, "watch_loss", None)
        if callable(watch):
            watch(grant, callback)

    async def close(self) -> None:
        with self._make_lock:
            self._closed = True
            issuer, self._issuer = self._issuer, None
        if issuer is not None:
            await asyncio.to_thread(issuer.close)

    async def __aenter__(self) -> ThreadedAsyncIssuer[S]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
