"""The current fencing token, held in a context variable.

``with fencing(34):`` makes 34 the token of every psycopg or SQLAlchemy transaction opened by a
fencekit adapter inside the block: in this thread or task, and in threads and tasks that copy the
context (asyncio tasks created inside the block, ``asyncio.to_thread``,
``contextvars.copy_context().run``). A ``ContextVar`` rather than a ``threading.local`` so that
concurrent asyncio tasks on one thread never see each other's token.

``fencing(34, issuer="etcd")`` also names the issuer the token came from; the adapters send it as
``fencekit.issuer`` with the token, and a resource bound to another issuer rejects the write
(YF007): tokens of different issuers are never comparable. A ``Lease`` passes its grant's issuer.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Coroutine
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from fencekit import errors as _errors
from fencekit.errors import BIGINT_MAX, validate_token

__all__ = ["current_issuer", "current_token", "fencing"]

# One variable for the whole scope: entering and leaving a scope, and the adapters' read before
# every statement, each touch the context once.
_SCOPE: ContextVar[fencing | None] = ContextVar("fencekit.scope", default=None)
_ISSUER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,30}")  # as FenceSpec.issuer

P = ParamSpec("P")
R = TypeVar("R")


def current_token() -> int | None:
    """The token of the innermost active :func:`fencing` scope, or ``None``."""
    scope = _SCOPE.get()
    return None if scope is None else scope.token


# errors.MissingTokenError's hint tells "no token was current" from "the connection did not send
# it"; errors sits below this module, so this module hands it the reader.
_errors._current_token = current_token


def current_issuer() -> str | None:
    """The issuer named by the innermost active :func:`fencing` scope (None: untagged)."""
    scope = _SCOPE.get()
    return None if scope is None else scope.issuer


class fencing:  # lower case: reads as a function, `with fencing(34):`
    """Scope in which ``token`` is the current fencing token.

    Usable as ``with``/``async with`` block and as a decorator on sync or async functions.
    Scopes nest: leaving one restores the outer token (or none). The token is validated here,
    before anything reaches the database (:class:`~fencekit.errors.MalformedTokenError`).
    ``issuer`` names where the token came from (``"etcd"``, ``"zookeeper"``, ``"postgres"``);
    an inner scope without one is untagged, whatever the outer scope said.
    """

    __slots__ = ("_reset", "_resets", "_sent", "issuer", "token")

    def __init__(self, token: int, issuer: str | None = None) -> None:
        # A plain int in range is checked here; anything else by validate_token, which says why.
        self.token: int = (
            token if type(token) is int and 0 < token <= BIGINT_MAX else validate_token(token)
        )
        if issuer is not None and (
            not isinstance(issuer, str) or not _ISSUER_NAME.fullmatch(issuer)
        ):
            raise ValueError(f"issuer must be a short lower-case name like 'etcd', not {issuer!r}")
        self.issuer: str | None = issuer
        # (token, issuer) as the adapters send them (fencekit.wire.Value), made once per scope:
        # they read it before every statement.
        self._sent = (str(self.token), issuer or "")
        self._reset: Token[fencing | None] | None = None  # what leaving the scope restores
        self._resets: list[Token[fencing | None]] | None = None  # when entered again inside

    def __enter__(self) -> int:
        reset = _SCOPE.set(self)
        if self._reset is not None:
            self._resets = [*(self._resets or ()), self._reset]
        self._reset = reset
        return self.token

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        reset, self._reset = self._reset, self._resets.pop() if self._resets else None
        if reset is None:
            raise RuntimeError(f"{self!r} was left without being entered")
        _SCOPE.reset(reset)

    async def __aenter__(self) -> int:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Any]:
        token, issuer = self.token, self.issuer
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            # The body of a generator runs after the call returns, outside any scope we set.
            raise TypeError(
                f"@fencing cannot decorate generator {func.__qualname__}: "
                "use `with fencing(token):` inside it instead"
            )
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                # A fresh scope per call: concurrent calls must not share reset tokens.
                with fencing(token, issuer):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with fencing(token, issuer):
                return func(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        if self.issuer is None:
            return f"fencing({self.token})"
        return f"fencing({self.token}, issuer={self.issuer!r})"
