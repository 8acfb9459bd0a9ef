"""``Lease`` (threads) and ``AsyncLease`` (asyncio) on any issuer.

    issuer = PostgresIssuer(dsn)
    with Lease(issuer, "billing:42", ttl=30, wait=10) as lease:
        ...                      # fencekit.context.current_token() == lease.token here
        lease.check()            # raises LeaseLostError once renewal failed or the lease expired

Renewal runs in the background every ``renew_fraction * ttl`` seconds; transient issuer errors
are retried with backoff until the local deadline, after which the lease counts as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import threading
import time
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from fencekit.errors import FenceError, IssuerUnavailableError, LeaseError, LeaseTimeoutError
from fencekit.leases.base import (
    AsyncIssuer,
    Backoff,
    Grant,
    Issuer,
    LeaseState,
    LossCallback,
    check_resource,
    check_ttl,
    default_holder,
)

__all__ = ["AsyncLease", "Lease"]

log = logging.getLogger("fencekit.leases")


def _refused(exc: FenceError) -> str:
    """The loss reason for a renewal the issuer refused outright (its message and hint)."""
    return "renewal refused: " + str(exc).replace("\n", "; ")


_REFUSED = "renewal refused: the lease expired or another holder took it"


class _Unset(enum.Enum):
    UNSET = 0


_UNSET = _Unset.UNSET  # "use the wait given to the constructor"


class _LeaseBase:
    """Settings and read-only state shared by the sync and async leases."""

    def __init__(
        self,
        resource: str,
        *,
        ttl: float,
        holder: str | None,
        wait: float | None,
        renew_fraction: float,
        on_lost: LossCallback | None,
        backoff: Backoff | None,
        fence: bool,
    ) -> None:
        check_resource(resource)
        if wait is not None and wait < 0:
            raise ValueError(f"wait must be >= 0 seconds or None (forever), got {wait!r}")
        if not 0 < renew_fraction < 1:
            raise ValueError(f"renew_fraction must be between 0 and 1, got {renew_fraction!r}")
        self.resource = resource
        self.ttl = check_ttl(ttl)
        self.holder = holder or default_holder()
        self.wait = wait
        self.renew_fraction = renew_fraction
        self.on_lost = on_lost
        self.backoff = backoff or Backoff()
        self.fence = fence
        self._state: LeaseState | None = None
        self._scope: AbstractContextManager[Any] | None = None

    # -- state

    @property
    def grant(self) -> Grant:
        if self._state is None or self._state.released:
            raise LeaseError(f"lease on {self.resource!r} is not held: acquire it first")
        return self._state.grant

    @property
    def token(self) -> int:
        """The fencing token of the current grant."""
        return self.grant.token

    @property
    def held(self) -> bool:
        return self._state is not None and not self._state.released and not self._state.is_lost()

    @property
    def lost(self) -> bool:
        """True once renewal was refused, or the lease outlived its local deadline."""
        return self._state is not None and self._state.is_lost()

    @property
    def lost_reason(self) -> str | None:
        return None if self._state is None else self._state.lost_reason

    def remaining(self) -> float:
        """Seconds the lease is known to stay valid (<= 0 once it may have expired)."""
        return 0.0 if self._state is None else self._state.remaining()

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease is lost, LeaseError if never held."""
        if self._state is None or self._state.released:
            raise LeaseError(f"lease on {self.resource!r} is not held")
        self._state.check()

    def _renew_interval(self) -> float:
        assert self._state is not None
        return self._state.grant.ttl * self.renew_fraction

    def _enter_scope(self) -> None:
        if self.fence:
            from fencekit.context import fencing

            # The issuer travels with the token (fencekit.issuer): a resource bound to
            # another issuer rejects it, since tokens of different issuers never compare.
            grant = self.grant
            self._scope = fencing(grant.token, issuer=grant.issuer)
            self._scope.__enter__()

    def _exit_scope(self, exc: tuple[Any, Any, Any]) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(*exc)

    def __repr__(self) -> str:
        st = self._state
        if st is None:
            state = "idle"
        else:
            state = "released" if st.released else "lost" if st.is_lost() else "held"
        token = "" if st is None else f" token={st.grant.token}"
        return f"<{type(self).__name__} {self.resource!r} {state}{token} holder={self.holder!r}>"


class Lease(_LeaseBase):
    """A lease on one resource from any :class:`Issuer`, renewed by a background thread.

    ``wait``: how long ``acquire()`` waits for a busy resource (None: forever; 0: one try).
    ``on_lost(grant, reason)`` runs once, in the renewal thread, when the lease is lost.
    ``fence``: on ``with``, put the token and its issuer in ``fencekit.context``: writes carry both.
    """

    def __init__(
        self,
        issuer: Issuer,
        resource: str,
        *,
        ttl: float = 30.0,
        holder: str | None = None,
        wait: float | None = None,
        renew_fraction: float = 1 / 3,
        on_lost: LossCallback | None = None,
        backoff: Backoff | None = None,
        fence: bool = True,
    ) -> None:
        super().__init__(
            resource,
            ttl=ttl,
            holder=holder,
            wait=wait,
            renew_fraction=renew_fraction,
            on_lost=on_lost,
            backoff=backoff,
            fence=fence,
        )
        self.issuer = issuer
        self.lost_event = threading.Event()  # set when the lease is lost; wait() on it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None

    def _refusal(self, grant: Grant) -> str:
        """The loss reason of a refused renewal; the issuer's own when it knows more (the
        built-in issuer names a failover: docs/ha.md)."""
        explain = getattr(self.issuer, "refusal_reason", None)
        reason = explain(grant) if callable(explain) else None
        return reason or _REFUSED

    def try_acquire(self) -> bool:
        """One attempt; True when granted (and renewal started)."""
        if self._state is not None and not self._state.released:
            raise LeaseError(f"lease on {self.resource!r} is already acquired")
        sent = time.monotonic()
        grant = self.issuer.try_acquire(self.resource, self.holder, self.ttl)
        if grant is None:
            return False
        self._start(grant, sent)
        return True

    def acquire(self, wait: float | _Unset | None = _UNSET) -> Lease:
        """Acquire, waiting up to ``wait`` seconds with backoff; raise LeaseTimeoutError after."""
        wait = self.wait if isinstance(wait, _Unset) else wait
        deadline = None if wait is None else time.monotonic() + wait
        self.backoff.reset()
        while True:
            try:
                if self.try_acquire():
                    return self
            except IssuerUnavailableError as exc:
                log.info("lease %s: issuer unavailable, retrying: %s", self.resource, exc)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LeaseTimeoutError(
                    f"lease on {self.resource!r} still held by another holder after {wait:g}s"
                )
            time.sleep(self.backoff.next_delay(remaining))

    def _start(self, grant: Grant, sent: float) -> None:
        self._state = LeaseState(grant, sent, self.on_lost)
        self._state.add_listener(self.lost_event.set)
        self.lost_event.clear()
        self._stop.clear()
        watch = getattr(self.issuer, "watch_loss", None)
        if callable(watch):
            state = self._state
            watch(grant, lambda _g, reason: state.mark_lost(reason))
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"fencekit-lease:{self.resource}", daemon=True
        )
        self._thread.start()
        # The renewal thread can hang inside a call to the issuer (a frozen network, a stuck
        # server); the watchdog still signals the loss at the local deadline.
        self._watchdog = threading.Thread(
            target=self._watch, name=f"fencekit-lease-watchdog:{self.resource}", daemon=True
        )
        self._watchdog.start()

    def _watch(self) -> None:
        state = self._state
        assert state is not None
        while not self._stop.wait(max(0.0, state.remaining()) + 0.001):
            if state.is_lost():
                return

    def _renew_loop(self) -> None:
        state = self._state
        assert state is not None
        backoff = Backoff(initial=min(0.05, self._renew_interval() / 4), maximum=1.0)
        delay = self._renew_interval()
        while not state.is_lost():
            # Wake for the next renewal or at the deadline, whichever is first.
            if self._stop.wait(max(0.0, min(delay, state.remaining()))):
                return
            if state.is_lost():  # the deadline passed (this sets the loss reason)
                return
            sent = time.monotonic()
            try:
                ok = self.issuer.renew(state.grant)
            except FenceError as exc:  # refused for good (fencekit_writer revoked): no retry
                state.mark_lost(_refused(exc))
                return
            except Exception as exc:  # transient: retry until the deadline
                log.info("lease %s: renewal failed, retrying: %s", self.resource, exc)
                delay = backoff.next_delay(state.remaining())
                continue
            if self._stop.is_set():
                return
            if not ok:
                state.mark_lost(self._refusal(state.grant))
                return
            state.alive_at(sent)
            backoff.reset()
            delay = self._renew_interval()

    def renew(self) -> None:
        """Renew now (the background thread does this by itself); raise if lost."""
        state = self._state
        if state is None or state.released:
            raise LeaseError(f"lease on {self.resource!r} is not held")
        state.check()
        sent = time.monotonic()
        if self.issuer.renew(state.grant):
            state.alive_at(sent)
        else:
            state.mark_lost("renewal refused: the lease expired or another holder took it")
            state.check()

    def release(self) -> None:
        """Stop renewing and give the lease back (best effort: it expires anyway)."""
        state = self._state
        if state is None or state.released:
            return
        self._stop.set()
        for thread in (self._thread, self._watchdog):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=max(5.0, state.grant.ttl))
        self._thread = self._watchdog = None
        was_lost = state.is_lost()
        state.released = True
        if was_lost:
            return  # another holder may have it: nothing of ours to give back
        try:
            self.issuer.release(state.grant)
        except Exception as exc:
            log.warning("lease %s: release failed (it will expire): %s", self.resource, exc)

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost (True) or ``timeout`` passes (False)."""
        return self.lost_event.wait(timeout)

    def claim(self, conn: Any, table: str, *key: object) -> int | None:
        """Raise ``table``'s fence (of key ``key``; none for a table fence) to this lease's
        token now, so that every older token is stale there before the first write: what a
        new holder does at grant (docs/leases.md#claim-at-grant). Runs ``fencekit.claim`` on
        ``conn``: a psycopg 3 or psycopg2 connection, a SQLAlchemy Connection, Session or
        Engine, or a URL (:func:`fencekit.leases.claim`); returns the fence before the claim.
        Raises ``StaleTokenError`` when a newer token already holds the resource,
        ``LeaseLostError`` when lost."""
        from fencekit.leases.claim import claim

        self.check()
        grant = self.grant
        return claim(conn, table, key, grant.token, grant.issuer)

    def __enter__(self) -> Lease:
        if self._state is None or self._state.released:
            self.acquire()
        try:
            self._enter_scope()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._exit_scope((exc_type, exc, tb))
        finally:
            self.release()


class AsyncLease(_LeaseBase):
    """The asyncio form of :class:`Lease`; renewal runs in a task.

    Takes an :class:`AsyncIssuer`, or a sync :class:`Issuer` whose calls then run in a thread
    (``asyncio.to_thread``), so the etcd and ZooKeeper issuers work here too.
    """

    def __init__(
        self,
        issuer: AsyncIssuer | Issuer,
        resource: str,
        *,
        ttl: float = 30.0,
        holder: str | None = None,
        wait: float | None = None,
        renew_fraction: float = 1 / 3,
        on_lost: LossCallback | None = None,
        backoff: Backoff | None = None,
        fence: bool = True,
    ) -> None:
        super().__init__(
            resource,
            ttl=ttl,
            holder=holder,
            wait=wait,
            renew_fraction=renew_fraction,
            on_lost=on_lost,
            backoff=backoff,
            fence=fence,
        )
        self.issuer = issuer
        self.lost_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _call(self, method: str, *args: Any) -> Any:
        fn = getattr(self.issuer, method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def _refusal(self, grant: Grant) -> str:
        explain = getattr(self.issuer, "refusal_reason", None)
        if not callable(explain):
            return _REFUSED
        reason = await explain(grant) if inspect.iscoroutinefunction(explain) else explain(grant)
        return str(reason) if reason else _REFUSED

    async def try_acquire(self) -> bool:
        if self._state is not None and not self._state.released:
            raise LeaseError(f"lease on {self.resource!r} is already acquired")
        sent = time.monotonic()
        grant = await self._call("try_acquire", self.resource, self.holder, self.ttl)
        if grant is None:
            return False
        self._start(grant, sent)
        return True

    async def acquire(self, wait: float | _Unset | None = _UNSET) -> AsyncLease:
        """Acquire, waiting up to ``wait`` seconds with backoff; raise LeaseTimeoutError after."""
        wait = self.wait if isinstance(wait, _Unset) else wait
        deadline = None if wait is None else time.monotonic() + wait
        self.backoff.reset()
        while True:
            try:
                if await self.try_acquire():
                    return self
            except IssuerUnavailableError as exc:
                log.info("lease %s: issuer unavailable, retrying: %s", self.resource, exc)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LeaseTimeoutError(
                    f"lease on {self.resource!r} still held by another holder after {wait:g}s"
                )
            await asyncio.sleep(self.backoff.next_delay(remaining))

    def _start(self, grant: Grant, sent: float) -> None:
        self._state = LeaseState(grant, sent, self.on_lost)
        loop = asyncio.get_running_loop()
        event = self.lost_event
        event.clear()

        def _set_event() -> None:  # mark_lost may run in a thread (watch_loss, to_thread)
            try:
                if asyncio.get_running_loop() is loop:
                    event.set()
                    return
            except RuntimeError:
                pass
            loop.call_soon_threadsafe(event.set)

        self._state.add_listener(_set_event)
        watch = getattr(self.issuer, "watch_loss", None)
        if callable(watch) and not inspect.iscoroutinefunction(watch):
            state = self._state
            watch(grant, lambda _g, reason: state.mark_lost(reason))
        self._task = loop.create_task(self._renew_loop(), name=f"fencekit-lease:{self.resource}")

    async def _renew_loop(self) -> None:
        state = self._state
        assert state is not None
        backoff = Backoff(initial=min(0.05, self._renew_interval() / 4), maximum=1.0)
        delay = self._renew_interval()
        while not state.is_lost():
            await asyncio.sleep(max(0.0, min(delay, state.remaining())))
            if state.is_lost() or state.released:
                return
            sent = time.monotonic()
            try:
                # Bounded by the deadline: a hung issuer call must not hide the loss.
                ok = await asyncio.wait_for(
                    self._call("renew", state.grant), max(0.001, state.remaining())
                )
            except FenceError as exc:  # refused for good (fencekit_writer revoked): no retry
                state.mark_lost(_refused(exc))
                return
            except Exception as exc:
                log.info("lease %s: renewal failed, retrying: %s", self.resource, exc)
                delay = backoff.next_delay(state.remaining())
                continue
            if not ok:  # (release() cancels this task: no released check needed)
                state.mark_lost(await self._refusal(state.grant))
                return
            state.alive_at(sent)
            backoff.reset()
            delay = self._renew_interval()

    async def renew(self) -> None:
        state = self._state
        if state is None or state.released:
            raise LeaseError(f"lease on {self.resource!r} is not held")
        state.check()
        sent = time.monotonic()
        if await self._call("renew", state.grant):
            state.alive_at(sent)
        else:
            state.mark_lost("renewal refused: the lease expired or another holder took it")
            state.check()

    async def release(self) -> None:
        state = self._state
        if state is None or state.released:
            return
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        was_lost = state.is_lost()
        state.released = True
        if was_lost:
            return
        try:
            await self._call("release", state.grant)
        except Exception as exc:
            log.warning("lease %s: release failed (it will expire): %s", self.resource, exc)

    async def claim(self, conn: Any, table: str, *key: object) -> int | None:
        """Async twin of :meth:`Lease.claim`: a psycopg ``AsyncConnection``, an asyncpg
        connection or pool, a SQLAlchemy ``AsyncConnection``, ``AsyncSession`` or
        ``AsyncEngine``, or a URL (:func:`fencekit.leases.async_claim`)."""
        from fencekit.leases.claim import async_claim

        self.check()
        grant = self.grant
        return await async_claim(conn, table, key, grant.token, grant.issuer)

    async def wait_lost(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self.lost_event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def __aenter__(self) -> AsyncLease:
        if self._state is None or self._state.released:
            await self.acquire()
        try:
            self._enter_scope()
        except BaseException:
            await self.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._exit_scope((exc_type, exc, tb))
        finally:
            await self.release()
