"""The current fencing token, held in a context variable.

``with fencing(34):`` makes 34 the token of every psycopg or SQLAlchemy transaction opened by a
fencekit adapter inside the block: in this thread or task, and in threads and tasks that copy the
context (asyncio tasks created inside the block, ``asyncio.to_thread``,
``contextvars.copy_context().run``). A ``ContextVar`` rather than a ``threading.local`` so that
concurrent asyncio tasks on one thread never see each other's token.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from fencekit.errors import validate_token

__all__ = ["current_token", "fencing"]

_TOKEN: ContextVar[int | None] = ContextVar("fencekit.token", default=None)

P = ParamSpec("P")
R = TypeVar("R")


def current_token() -> int | None:
    """The token of the innermost active :func:`fencing` scope, or ``None``."""
    return _TOKEN.get()


class fencing:  # lower case: reads as a function, `with fencing(34):`
    """Scope in which ``token`` is the current fencing token.

    Usable as ``with``/``async with`` block and as a decorator on sync or async functions.
    Scopes nest: leaving one restores the outer token (or none). The token is validated here,
    before anything reaches the database (:class:`~fencekit.errors.InvalidTokenError`).
    """

    __slots__ = ("_resets", "token")

    def __init__(self, token: int) -> None:
        self.token: int = validate_token(token)
        self._resets: list[Token[int | None]] = []

    def __enter__(self) -> int:
        self._resets.append(_TOKEN.set(self.token))
        return self.token

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _TOKEN.reset(self._resets.pop())

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
        token = self.token
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
                with fencing(token):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with fencing(token):
                return func(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"fencing({self.token})"
