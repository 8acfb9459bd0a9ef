"""asyncpg adapter: carry the fencing token into each transaction.

- :func:`transaction`: an asyncpg transaction block fenced with a token (also a
  :func:`fencekit.fencing` scope).
- :func:`install`: automatic mode for a connection: statements and transactions run inside a
  :func:`fencekit.fencing` scope carry its token. For a pool, pass
  ``connection_class=fencekit.asyncpg.FencedConnection`` (or ``init=fencekit.asyncpg.init``) to
  ``asyncpg.create_pool()``.
- :func:`set_token`: fence the transaction already open (one statement).

How the token travels (docs/asyncpg.md has the measured costs):

- **With the BEGIN, no round trip of its own.** asyncpg opens a transaction with a simple query
  of its own (``BEGIN ISOLATION LEVEL ...``). A fenced connection sends ``BEGIN ...; SET LOCAL
  fencekit.token = '34'; SET LOCAL fencekit.issuer = ''`` as that one query instead. Every
  statement of the transaction, ``prepare()``, cursors and ``copy_*`` included, is then fenced.
- **A statement without arguments outside a transaction** (simple protocol) goes as ``SET LOCAL
  ...; <statement>``: one query, run by PostgreSQL as one implicit transaction.
- **Where asyncpg allows neither**, a cost: a statement with arguments outside a transaction is
  wrapped in a transaction (the BEGIN carries the token; two round trips more: BEGIN and COMMIT),
  and a scope entered inside an open transaction sends the token as a statement of its own (one
  round trip), as does leaving it (the token is cleared). asyncpg sends statements with
  arguments through the extended protocol, one statement per Sync, so nothing can ride them.

Rejections: importing this module registers fencekit's rejection classes with asyncpg (asyncpg
picks an error's class by its ``sqlstate``): asyncpg then raises errors that are both
fencekit's (``except fencekit.StaleTokenError``) and ``asyncpg.PostgresError``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from fencekit import errors, metrics
from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import commit_outcome_unknown, validate_token

__all__ = [
    "BypassRefusedError",
    "FenceUsageError",
    "FencedConnection",
    "IssuerMismatchError",
    "LeaseMismatchError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "StaleTokenError",
    "init",
    "install",
    "set_token",
    "transaction",
    "uninstall",
]

R = TypeVar("R")
_CLEAR = ("", "")
_ISSUER_TEXT = re.compile(r"[a-z0-9_-]{0,31}")  # fencing()'s issuer names, or '' (untagged)


# ---------------------------------------------------------------- errors
#
# asyncpg builds an error as ``cls(message)`` and then copies the server's fields into its
# ``__dict__`` (``message``, ``detail`` as text, ``schema_name``...). fencekit's fields are read
# from those, when first asked for: ``detail`` is fencekit's (the parsed JSON, a dict).


def _fields(error: Any) -> dict[str, Any]:
    cached: dict[str, Any] | None = vars(error).get("_fk_fields")
    if cached is None:
        _, cached = errors.fields_of(error)
        vars(error)["_fk_fields"] = cached
    return cached


def _field(name: str) -> Any:
    return property(lambda self: _fields(self)[name])


class _AsyncpgRejectionError(errors.FencekitError, asyncpg.PostgresError):  # type: ignore[misc]
    """A fencekit rejection that is also an ``asyncpg.PostgresError``."""

    def __init__(self, message: str = "", *args: Any) -> None:
        Exception.__init__(self, message, *args)
        self.orig: BaseException | None = self  # the driver's error, as for every FenceError

    table = _field("table")
    key = _field("key")
    token = _field("token")
    fence = _field("fence")
    resource = _field("resource")
    column = _field("column")
    constraint = _field("constraint")
    detail = _field("detail")


# _AsyncpgRejectionError first (its constructor and fields); ``sqlstate`` in the class body is
# what asyncpg's metaclass registers.
class FenceUsageError(_AsyncpgRejectionError, errors.FenceUsageError):
    __doc__ = errors.FenceUsageError.__doc__
    sqlstate = "YF000"


class StaleTokenError(_AsyncpgRejectionError, errors.StaleTokenError):
    __doc__ = errors.StaleTokenError.__doc__
    sqlstate = "YF001"


class ReusedTokenError(_AsyncpgRejectionError, errors.ReusedTokenError):
    __doc__ = errors.ReusedTokenError.__doc__
    sqlstate = "YF002"


class MissingTokenError(_AsyncpgRejectionError, errors.MissingTokenError):
    __doc__ = errors.MissingTokenError.__doc__
    sqlstate = "YF003"


class MalformedTokenError(_AsyncpgRejectionError, errors.MalformedTokenError):
    __doc__ = errors.MalformedTokenError.__doc__
    sqlstate = "YF004"


class BypassRefusedError(_AsyncpgRejectionError, errors.BypassRefusedError):
    __doc__ = errors.BypassRefusedError.__doc__
    sqlstate = "YF005"


class LeaseMismatchError(_AsyncpgRejectionError, errors.LeaseMismatchError):
    __doc__ = errors.LeaseMismatchError.__doc__
    sqlstate = "YF006"


class IssuerMismatchError(_AsyncpgRejectionError, errors.IssuerMismatchError):
    __doc__ = errors.IssuerMismatchError.__doc__
    sqlstate = "YF007"


# ---------------------------------------------------------------- state


class _State:
    __slots__ = ("dirty", "value")

    def __init__(self) -> None:
        self.value: tuple[str, str] | None = None  # sent in the open transaction
        self.dirty = False  # the open transaction holds a token that may need clearing


# asyncpg's connections have __slots__: their state lives here, as long as they do.
_states: weakref.WeakKeyDictionary[asyncpg.Connection, _State] = weakref.WeakKeyDictionary()


def _state(conn: asyncpg.Connection) -> _State:
    state = _states.get(conn)
    if state is None:
        state = _states[conn] = _State()
    return state


def _scope_value() -> tuple[str, str] | None:
    token = current_token()
    return None if token is None else (str(token), current_issuer() or "")


def set_local_sql(value: tuple[str, str]) -> str:
    """``SET LOCAL`` of ``value`` (token, issuer), built client-side: both are checked first."""
    token, issuer = value
    if not (token == "" or (token.isascii() and token.isdigit())):
        raise ValueError(f"not a validated token: {token!r}")
    if not _ISSUER_TEXT.fullmatch(issuer):  # fencing() checked it; spliced into SQL: again
        raise ValueError(f"not a validated issuer: {issuer!r}")
    # The issuer passed fencing()'s check ([a-z][a-z0-9_-]*): nothing to quote.
    return f"SET LOCAL fencekit.token = '{token}'; SET LOCAL fencekit.issuer = '{issuer}'"


def set_config_sql(value: tuple[str, str]) -> str:
    """One statement (for the extended protocol) that sets ``value`` for the transaction."""
    set_local_sql(value)  # the same checks
    token, issuer = value
    return (
        f"SELECT set_config('fencekit.token', '{token}', true), "
        f"set_config('fencekit.issuer', '{issuer}', true)"
    )


def _head(query: object) -> str:
    return query.lstrip()[:20].upper() if isinstance(query, str) else ""


def _is_begin(query: object) -> bool:
    return _head(query).startswith(("BEGIN", "START TRANSACTION"))


# Transaction control needs no token, and must run in a failed transaction, where nothing else
# can (asyncpg's rollback and release go through execute()).
_CONTROL = ("COMMIT", "ROLLBACK", "END", "ABORT", "RELEASE", "SAVEPOINT", "PREPARE TRANSACTION")


def to_send(conn: asyncpg.Connection) -> tuple[str, str] | None:
    """What must be set in the open transaction before the next statement (None: nothing).
    Outside a transaction: None (the statement's own path carries the token)."""
    state = _state(conn)
    if not conn.is_in_transaction():
        state.value, state.dirty = None, False
        return None
    value = _scope_value()
    if value is None:
        return _CLEAR if state.dirty else None
    return None if state.value == value else value


def sent(conn: asyncpg.Connection, value: tuple[str, str]) -> None:
    """Record that ``value`` was set in the open transaction."""
    state = _state(conn)
    state.value = value if value[0] else None
    state.dirty = bool(value[0])


async def _run(
    conn: asyncpg.Connection,
    call: Callable[[str], Awaitable[R]],
    query: str,
    simple: bool,
) -> R:
    """Run ``call(query)`` on ``conn`` with the scope's token set in its transaction.

    ``simple``: ``call`` sends ``query`` as a simple query (no arguments), so it may hold
    several statements.
    """
    if simple and _head(query).startswith(_CONTROL):
        return await call(query)
    try:
        value = to_send(conn)
        if value is not None:  # inside a transaction that does not have it yet
            await asyncpg.Connection.execute(conn, set_local_sql(value))
            sent(conn, value)
            return await call(query)
        scope = _scope_value()
        if scope is None or conn.is_in_transaction():
            return await call(query)
        if simple and _is_begin(query):  # asyncpg's own BEGIN, or the user's
            result = await call(query.rstrip().rstrip(";") + "; " + set_local_sql(scope))
            sent(conn, scope)
            return result
        if simple:  # one simple query: PostgreSQL runs it as one implicit transaction
            return await call(set_local_sql(scope) + "; " + query)
        async with conn.transaction():  # its BEGIN carries the token (the branch above)
            return await call(query)
    except errors.FenceError as exc:
        metrics.record_rejection(exc)
        raise


class FencedConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no types
    """An asyncpg connection whose transactions and statements carry the current
    :func:`fencekit.fencing` token (see :func:`install`, and the module's docstring for how)."""

    __slots__ = ()

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        parent: Any = super()
        result: str = await _run(
            self, lambda q: parent.execute(q, *args, timeout=timeout), query, not args
        )
        return result

    async def executemany(self, command: str, args: Any, *, timeout: float | None = None) -> None:
        parent: Any = super()
        await _run(self, lambda q: parent.executemany(q, args, timeout=timeout), command, False)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> list[Any]:
        parent: Any = super()
        rows: list[Any] = await _run(self, lambda q: parent.fetch(q, *args, **kwargs), query, False)
        return rows

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        return await _run(self, lambda q: parent.fetchval(q, *args, **kwargs), query, False)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        parent: Any = super()
        return await _run(self, lambda q: parent.fetchrow(q, *args, **kwargs), query, False)

    async def fetchmany(self, query: str, args: Any, **kwargs: Any) -> list[Any]:
        parent: Any = super()
        rows: list[Any] = await _run(
            self, lambda q: parent.fetchmany(q, args, **kwargs), query, False
        )
        return rows


# fenced class -> the class it fences (what uninstall() puts back)
_unfenced: dict[type[Any], type[Any]] = {}


def _fenced_class(cls: type[Any]) -> type[Any]:
    if issubclass(cls, FencedConnection):
        return cls
    if cls is asyncpg.Connection:
        return FencedConnection
    fenced = next((f for f, base in _unfenced.items() if base is cls), None)
    if fenced is None:
        # No new slots: the instance layout stays the connection's own, so its class can change.
        fenced = type(f"Fenced{cls.__name__}", (FencedConnection, cls), {"__slots__": ()})
        _unfenced[fenced] = cls
    return fenced


def install(conn: asyncpg.Connection) -> None:
    """Automatic mode: ``conn`` (an ``asyncpg.Connection``) carries the current
    :func:`fencing` token in its transactions and statements. Idempotent.

    asyncpg has no hook for this, so the connection becomes an instance of
    :class:`FencedConnection` (a subclass of its class that adds no state). For a pool, pass
    ``connection_class=FencedConnection`` or ``init=fencekit.asyncpg.init`` to
    ``asyncpg.create_pool()``; a connection acquired from a pool is installed there.
    """
    if not _is_connection(conn):
        if isinstance(conn, asyncpg.Pool | asyncpg.Connection):
            raise TypeError(
                "fencekit.asyncpg.install() takes a connection, not a pool or a pool's proxy: "
                "create the pool with asyncpg.create_pool(..., init=fencekit.asyncpg.init) or "
                "connection_class=fencekit.asyncpg.FencedConnection"
            )
        raise TypeError(
            f"fencekit.asyncpg.install() takes an asyncpg.Connection, not "
            f"{type(conn).__module__}.{type(conn).__name__}"
        )
    conn.__class__ = _fenced_class(type(conn))


async def init(conn: asyncpg.Connection) -> None:
    """:func:`install`, as ``asyncpg.create_pool(init=...)`` calls it for each new connection."""
    install(conn)


def uninstall(conn: asyncpg.Connection) -> None:
    """Undo :func:`install`."""
    cls = type(conn)
    if cls is FencedConnection:
        conn.__class__ = asyncpg.Connection
    elif cls in _unfenced:
        conn.__class__ = _unfenced[cls]


def is_installed(conn: object) -> bool:
    # Not isinstance(): asyncpg's connection metaclass answers True for every connection.
    return issubclass(type(conn), FencedConnection)


def _is_connection(conn: object) -> bool:
    """A real ``asyncpg.Connection`` (isinstance() also says so of a pool's proxies)."""
    return asyncpg.Connection in type(conn).__mro__


# ---------------------------------------------------------------- explicit API


def _resolve(token: int | None, issuer: str | None) -> fencing:
    if token is None:
        token = current_token()
        if token is None:
            raise errors.MissingTokenError()
        issuer = issuer or current_issuer()
    return fencing(validate_token(token), issuer)


@asynccontextmanager
async def transaction(
    conn: asyncpg.Connection,
    token: int | None = None,
    *,
    issuer: str | None = None,
    isolation: str | None = None,
    readonly: bool = False,
    deferrable: bool = False,
) -> AsyncIterator[asyncpg.Connection]:
    """``conn.transaction()`` whose statements carry ``token`` (default: the scope's).

    The token is validated before anything is sent and rides the transaction's BEGIN (no round
    trip of its own); nested in an open transaction (a savepoint) it is one statement, and the
    outer token is set again on exit. The block is also a :func:`fencing` scope, so everything
    run on ``conn`` inside it is fenced. A connection lost during the COMMIT raises
    :class:`~fencekit.errors.CommitOutcomeUnknownError` (docs/ha.md).
    """
    scope = _resolve(token, issuer)
    installed = is_installed(conn) or not _is_connection(conn)  # a proxy: its pool installs
    if not installed:
        install(conn)  # for the block only
    outer = _state(conn).value if conn.is_in_transaction() else None
    nested = conn.is_in_transaction()
    tx = conn.transaction(isolation=isolation, readonly=readonly, deferrable=deferrable)
    try:
        with scope:
            await tx.start()
            try:
                yield conn
            except BaseException:
                await tx.rollback()
                raise
            try:
                await tx.commit()
            except errors.FenceError as exc:  # a deferred check, at COMMIT
                metrics.record_rejection(exc)
                raise
            except Exception as exc:
                unknown = None if nested else commit_outcome_unknown(exc, scope.token, scope.issuer)
                if unknown is not None:
                    raise unknown from exc
                raise
    finally:
        try:
            if nested and not conn.is_closed() and conn.is_in_transaction():
                # A SET LOCAL made in a savepoint outlives its release: set the outer one again.
                restore = outer or _CLEAR
                await asyncpg.Connection.execute(conn, set_local_sql(restore))
                sent(conn, restore)
        finally:
            if not installed and not conn.is_closed():
                uninstall(conn)


async def set_token(
    conn: asyncpg.Connection, token: int | None = None, *, issuer: str | None = None
) -> None:
    """Fence the transaction open on ``conn``: one statement, so one round trip. Prefer
    :func:`transaction` or :func:`install`, whose BEGIN carries the token instead."""
    scope = _resolve(token, issuer)
    if not conn.is_in_transaction():
        raise asyncpg.InterfaceError(
            "set_token() needs an open transaction: outside one the setting would end with its "
            "own statement; use fencekit.asyncpg.transaction(conn, token) instead"
        )
    value = (str(scope.token), scope.issuer or "")
    await asyncpg.Connection.execute(conn, set_local_sql(value))
    sent(conn, value)
