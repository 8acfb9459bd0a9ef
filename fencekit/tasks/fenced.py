"""``fenced_task``: a task body that runs under a lease on the resource it works on.

    issuer = lambda: PostgresIssuer(DSN)          # made once per worker process

    @fenced_task(issuer, "billing:{account_id}", ttl=30,
                 claim=lambda lease, account_id: lease.claim(conn(), "billing_summary", account_id))
    def recompute(account_id: int) -> None:
        ...                                      # every fenced write carries the lease's token

For each call: the resource is computed from the call's arguments (a ``str.format`` template
over the bound arguments, or a function of them); a :class:`~fencekit.leases.Lease` is taken on
it (waiting up to ``wait``); the body runs inside ``fencing(token, issuer=...)``, after
``claim(lease, *args, **kwargs)`` raised the resource's fence to the new token (claim at grant:
docs/leases.md#claim-at-grant); the lease is renewed in the background while the body runs and
released after. A lease lost while the body ran is reported: the call raises
:class:`~fencekit.leases.LeaseLostError` (chained to what the body raised, typically the
``StaleTokenError`` of a write the database refused), and ``on_lost`` runs when the loss is
noticed. Coroutine functions get an :class:`~fencekit.leases.AsyncLease`.

As a context manager (``with`` or ``async with``) the resource is a plain string:
``with fenced_task(issuer, "billing:42", claim=...) as lease:``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from fencekit.errors import LeaseLostError
from fencekit.leases.base import AsyncIssuer, Issuer, LossCallback
from fencekit.leases.lease import AsyncLease, Lease

__all__ = ["current_lease", "fenced_task"]

log = logging.getLogger("fencekit.tasks")

P = ParamSpec("P")
R = TypeVar("R")

IssuerSource = Issuer | AsyncIssuer | Callable[[], Issuer | AsyncIssuer]
Resource = str | Callable[..., str]
Claim = Callable[..., Any]

_LEASE: ContextVar[Lease | AsyncLease | None] = ContextVar("fencekit.task_lease", default=None)


def current_lease() -> Lease | AsyncLease | None:
    """The lease of the innermost running fenced task (``lease.check()`` in long loops)."""
    return _LEASE.get()


class _IssuerPerProcess:
    """An issuer made on first use in each process: a worker pool forks after import, and a
    connection must never be shared across a fork."""

    def __init__(self, source: IssuerSource) -> None:
        self.source = source
        self.made: tuple[int, Issuer | AsyncIssuer] | None = None

    def get(self) -> Issuer | AsyncIssuer:
        if isinstance(self.source, Issuer | AsyncIssuer):
            return self.source
        pid = os.getpid()
        if self.made is None or self.made[0] != pid:
            self.made = (pid, self.source())
        return self.made[1]


def _lost(lease: Lease | AsyncLease, exc: BaseException | None) -> LeaseLostError:
    reason = lease.lost_reason or "the lease expired while the task ran"
    error = LeaseLostError(lease.grant, reason)
    # Said here as well as chained: a task queue may log only the error it can pickle.
    then = "" if exc is None else f"; the task then failed with {exc!r}"
    log.warning("fenced task on %s: %s%s", lease.resource, error, then)
    if exc is not None:
        error.__cause__ = exc
    return error


class fenced_task:  # lower case: reads as a decorator, `@fenced_task(...)`
    """Run a task body under a lease on a resource computed from its arguments (see the
    module docstring). ``ttl``, ``wait``, ``holder`` and ``renew_fraction`` are the
    :class:`~fencekit.leases.Lease`'s."""

    def __init__(
        self,
        issuer: IssuerSource,
        resource: Resource,
        *,
        ttl: float = 30.0,
        wait: float | None = None,
        claim: Claim | None = None,
        on_lost: LossCallback | None = None,
        holder: str | None = None,
        renew_fraction: float = 1 / 3,
    ) -> None:
        self._issuer = _IssuerPerProcess(issuer)
        self.resource = resource
        self.ttl = ttl
        self.wait = wait
        self.claim = claim
        self.on_lost = on_lost
        self.holder = holder
        self.renew_fraction = renew_fraction
        self._open: list[tuple[Lease, Any]] = []
        self._open_async: list[tuple[AsyncLease, Any]] = []

    # ------------------------------------------------------------ resource and lease

    def _resource(self, func: Callable[..., Any] | None, args: Any, kwargs: Any) -> str:
        if callable(self.resource):
            return self.resource(*args, **kwargs)
        if func is None or ("{" not in self.resource):
            return self.resource
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        return self.resource.format(**bound.arguments)

    def _lease(self, resource: str, asynchronous: bool) -> Lease | AsyncLease:
        options: dict[str, Any] = {
            "ttl": self.ttl,
            "wait": self.wait,
            "on_lost": self.on_lost,
            "holder": self.holder,
            "renew_fraction": self.renew_fraction,
        }
        issuer = self._issuer.get()
        if asynchronous:
            return AsyncLease(issuer, resource, **options)
        if not isinstance(issuer, Issuer):
            raise TypeError(f"a sync task needs a sync issuer, not {issuer!r}")
        return Lease(issuer, resource, **options)

    # ------------------------------------------------------------ decorator

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                lease = self._lease(self._resource(func, args, kwargs), asynchronous=True)
                assert isinstance(lease, AsyncLease)
                async with lease:
                    reset = _LEASE.set(lease)
                    try:
                        if self.claim is not None:
                            claimed = self.claim(lease, *args, **kwargs)
                            if inspect.isawaitable(claimed):
                                await claimed
                        result = await func(*args, **kwargs)
                    except BaseException as exc:
                        if lease.lost:
                            raise _lost(lease, exc) from exc
                        raise
                    finally:
                        _LEASE.reset(reset)
                    if lease.lost:
                        raise _lost(lease, None)
                    return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            lease = self._lease(self._resource(func, args, kwargs), asynchronous=False)
            assert isinstance(lease, Lease)
            with lease:
                reset = _LEASE.set(lease)
                try:
                    if self.claim is not None:
                        self.claim(lease, *args, **kwargs)
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    if lease.lost:
                        raise _lost(lease, exc) from exc
                    raise
                finally:
                    _LEASE.reset(reset)
                if lease.lost:
                    raise _lost(lease, None)
                return result

        return run

    # ------------------------------------------------------------ context manager

    def __enter__(self) -> Lease:
        if callable(self.resource):
            raise TypeError("as a context manager, fenced_task takes the resource as a string")
        lease = self._lease(self._resource(None, (), {}), asynchronous=False)
        assert isinstance(lease, Lease)
        lease.__enter__()
        reset = _LEASE.set(lease)
        self._open.append((lease, reset))
        try:
            if self.claim is not None:
                self.claim(lease)
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, reset = self._open.pop()
        _LEASE.reset(reset)
        lost = lease.lost
        lease.__exit__(exc_type, exc, tb)
        if lost:
            raise _lost(lease, exc) from exc

    async def __aenter__(self) -> AsyncLease:
        if callable(self.resource):
            raise TypeError("as a context manager, fenced_task takes the resource as a string")
        lease = self._lease(self._resource(None, (), {}), asynchronous=True)
        assert isinstance(lease, AsyncLease)
        await lease.__aenter__()
        reset = _LEASE.set(lease)
        self._open_async.append((lease, reset))
        try:
            if self.claim is not None:
                claimed = self.claim(lease)
                if inspect.isawaitable(claimed):
                    await claimed
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, reset = self._open_async.pop()
        _LEASE.reset(reset)
        lost = lease.lost
        await lease.__aexit__(exc_type, exc, tb)
        if lost:
            raise _lost(lease, exc) from exc
