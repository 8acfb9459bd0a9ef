"""asyncpg adapter: carry the fencing token into each transaction.

- :func:`transaction`: an asyncpg transaction block fenced with a token (also a scope).
- :func:`install`: automatic mode for a connection: statements and transactions run inside a
  :func:`fencekit.fencing` scope carry its token. For a pool: ``asyncpg.create_pool(...,
  connection_class=fencekit.asyncpg.FencedConnection)`` (or ``init=fencekit.asyncpg.init``).
- :func:`set_token`: fence the transaction already open (one statement).

How the token travels (docs/asyncpg.md has each way and its cost): in the query of asyncpg's own
``BEGIN`` (``BEGIN ...; SET LOCAL fencekit.token = '34'``), which fences every statement of the
transaction at no round trip of its own; else in a statement's simple query, or, where asyncpg
allows neither, in a statement or a transaction of its own.

Rejections: importing this module registers fencekit's rejection classes with asyncpg (asyncpg
picks an error's class by its ``sqlstate``): asyncpg then raises errors that are both
fencekit's (``except fencekit.StaleTokenError``) and ``asyncpg.PostgresError``.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg
from asyncpg.cursor import CursorFactory
from asyncpg.prepared_stmt import PreparedStatement

from fencekit import errors, metrics, wire
from fencekit.errors import commit_outcome_unknown

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
    "is_installed",
    "set_token",
    "transaction",
    "uninstall",
]

R = TypeVar("R")


# ---------------------------------------------------------------- errors
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


class _ServerFields(dict[str, Any]):
    """A rejection's ``__dict__``: it counts the rejection (:func:`fencekit.metrics`), once,
    when asyncpg has copied the server's fields into it. Counted where asyncpg builds the error,
    no statement needs a coroutine of fencekit's around it to see the error pass."""

    __slots__ = ("error",)
    error: errors.FenceError | None

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        error, self.error = self.error, None
        if isinstance(error, errors.FenceError):
            metrics.record_rejection(error)


class _AsyncpgRejectionError(errors.FencekitError, asyncpg.PostgresError):  # type: ignore[misc]
    """A fencekit rejection that is also an ``asyncpg.PostgresError``."""

    def __init__(self, message: str = "", *args: Any) -> None:
        Exception.__init__(self, message, *args)
        fields = self.__dict__ = _ServerFields()
        fields.error = self
        self.orig: BaseException | None = self  # the driver's error, as for every FenceError


for _name in ("table", "key", "token", "fence", "resource", "column", "constraint", "detail"):
    setattr(_AsyncpgRejectionError, _name, _field(_name))


# _AsyncpgRejectionError first (its constructor and fields); the ``sqlstate`` in each class's
# body is what asyncpg's metaclass registers.
_CLASSES = errors.driver_classes(_AsyncpgRejectionError, __name__, driver_first=True)
FenceUsageError = _CLASSES["FenceUsageError"]
StaleTokenError = _CLASSES["StaleTokenError"]
ReusedTokenError = _CLASSES["ReusedTokenError"]
MissingTokenError = _CLASSES["MissingTokenError"]
MalformedTokenError = _CLASSES["MalformedTokenError"]
BypassRefusedError = _CLASSES["BypassRefusedError"]
LeaseMismatchError = _CLASSES["LeaseMismatchError"]
IssuerMismatchError = _CLASSES["IssuerMismatchError"]


# ---------------------------------------------------------------- state
# asyncpg's connections have __slots__: their state lives here, by id(), while they live.
_states: dict[int, wire.Wire] = {}
_scope_now = wire.scope_now  # the current fencing() scope, read before every statement


def _state(conn: asyncpg.Connection) -> wire.Wire:
    state = _states.get(id(conn))
    if state is None:
        # Tracked: asyncpg's BEGIN, COMMIT and ROLLBACK go through execute().
        state = _states[id(conn)] = wire.Wire()
        weakref.finalize(conn, _states.pop, id(conn), None)  # before the id can be reused
    return state


# asyncpg's execute() of a simple query without query loggers (0.29 to 0.32), run directly:
_SLOTS = set(asyncpg.Connection.__slots__)  # _check_open(), then _protocol.query()
_DIRECT = hasattr(asyncpg.Connection, "_check_open") and {"_protocol", "_query_loggers"} <= _SLOTS

_OTHER, _BEGIN, _CONTROL_KIND = 0, 1, 2
_BEGIN_WORDS = ("BEGIN", "START TRANSACTION")
# Transaction control needs no token, and must run in a failed transaction (asyncpg's own too).
_CONTROL = ("COMMIT", "ROLLBACK", "END", "ABORT", "RELEASE", "SAVEPOINT", "PREPARE TRANSACTION")


@functools.lru_cache(maxsize=256)  # asyncpg's own BEGIN and COMMIT come every transaction
def _kind(query: str) -> tuple[int, str, str]:
    """What a simple query is, once per text: transaction control, any other statement, or a
    BEGIN with the texts a SET LOCAL goes between (a BEGIN has no literal: ';' ends it)."""
    head = query.lstrip()[:20].upper()
    if head.startswith(_CONTROL):
        return _CONTROL_KIND, query, ""
    if head.startswith(_BEGIN_WORDS):
        begin, _, rest = query.partition(";")
        return _BEGIN, begin.rstrip() + "; ", "; " + rest.strip() if rest.strip() else ""
    return _OTHER, query, ""


async def _send(conn: asyncpg.Connection, state: wire.Wire, value: wire.Value) -> None:
    """In an open transaction: ``value`` as a statement of its own (one round trip)."""
    await asyncpg.Connection.execute(conn, wire.set_local(value))
    state.sent(value, open_after=True)


async def _sync_open(conn: asyncpg.Connection) -> None:
    """In an open transaction: send what the wire says (only when the scope changed)."""
    if conn.is_in_transaction():
        state = _states.get(id(conn)) or _state(conn)
        value = state.next(wire.INTRANS, wire.scope_value())
        if value is not None:
            await _send(conn, state, value)


def _run(
    conn: asyncpg.Connection,
    call: Callable[[], Awaitable[R]],
    prefixed: Callable[[str], Awaitable[R]] | None = None,
) -> Awaitable[R]:
    """``call()`` on ``conn`` with exactly the scope's token (or none) in force. ``prefixed(p)``
    runs the statement as one simple query behind ``p`` (PostgreSQL runs it as one transaction);
    without it (the extended protocol: no room for a prefix) a statement outside a transaction
    is wrapped in one."""
    state = _states.get(id(conn)) or _state(conn)
    status = wire.INTRANS if conn.is_in_transaction() else wire.IDLE
    value = state.next(status, wire.scope_value())
    if value is None:
        return call()
    if status == wire.IDLE and prefixed is not None:
        return prefixed(wire.set_local(value, True) + "; ")
    return _sent_first(conn, value, call)


async def _sent_first(conn: Any, value: wire.Value, call: Callable[[], Awaitable[R]]) -> R:
    if conn.is_in_transaction():
        await _send(conn, _state(conn), value)
        return await call()
    async with conn.transaction():  # its BEGIN carries the token (FencedConnection.execute)
        return await call()


class _FencedCursorFactory(CursorFactory):  # type: ignore[misc]
    """A cursor whose every fetch runs with the scope's token (cursors need a transaction)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, Any]:
        yield from _sync_open(self._connection).__await__()
        return (yield from super().__await__())

    def __aiter__(self) -> _FencedIterator:
        return _FencedIterator(self._connection, super().__aiter__())


class _FencedIterator:
    __slots__ = ("_conn", "_it")

    def __init__(self, conn: asyncpg.Connection, it: Any) -> None:
        self._conn, self._it = conn, it

    def __aiter__(self) -> _FencedIterator:
        return self

    async def __anext__(self) -> Any:
        await _sync_open(self._conn)  # each fetch runs the query further, under today's token
        return await self._it.__anext__()


def _fenced_cursor(factory: Any) -> Any:
    factory.__class__ = _FencedCursorFactory
    return factory


def _fence_calls(owner: type[Any], names: tuple[str, ...]) -> None:
    """Make each of ``owner``'s ``names`` run with exactly the scope's token (see :func:`_run`):
    the next class in the MRO does the work (a user's subclass of the connection included)."""

    def fenced(name: str) -> Callable[..., Awaitable[Any]]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Awaitable[Any]:
            unfenced = getattr(super(owner, self), name)
            conn = self if isinstance(self, asyncpg.Connection) else self._connection
            return _run(conn, lambda: unfenced(*args, **kwargs))

        call.__name__ = call.__qualname__ = name
        return call

    for name in names:
        setattr(owner, name, fenced(name))


class _FencedStatement(PreparedStatement):  # type: ignore[misc]
    """A prepared statement that runs, each time, with the scope's token (see :func:`_run`)."""

    __slots__ = ()

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return _fenced_cursor(super().cursor(*args, **kwargs))


class FencedConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no types
    """An asyncpg connection whose transactions and statements carry the current
    :func:`fencekit.fencing` token (see :func:`install`, and the module's docstring for how):
    ``execute``/``fetch*``, prepared statements, cursors and every ``copy_*``."""

    __slots__ = ()

    # super().execute, looked up once per class (__init_subclass__), not on every statement;
    # _fk_direct: it is asyncpg's, and asyncpg's internals are as _DIRECT expects.
    _fk_execute: Callable[..., Awaitable[str]] = asyncpg.Connection.execute
    _fk_direct = _DIRECT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fk_execute = super().execute
        cls._fk_direct = _DIRECT and cls._fk_execute is asyncpg.Connection.execute

    def execute(self, query: str, *args: Any, timeout: float | None = None) -> Awaitable[str]:
        # A plain function: when nothing is to be sent it returns the driver's own awaitable,
        # with no frame of fencekit's around it. Run before each statement, so kept short.
        if args or not isinstance(query, str):  # the extended protocol: no room for a prefix
            scope, state = _scope_now(), _states.get(id(self))
            # The common case: the scope's token rode this transaction's BEGIN.
            held = scope is not None and state is not None and state.held is scope._sent
            if held and self._protocol.is_in_transaction():  # is_in_transaction(), no frame
                return self._fk_execute(query, *args, timeout=timeout)
            return _run(self, lambda: self._fk_execute(query, *args, timeout=timeout))
        kind, text, tail = _kind(query)  # a simple query: it may hold several statements
        if kind == _BEGIN and not self._protocol.is_in_transaction():  # asyncpg's BEGIN, or yours
            scope, state = _scope_now(), _states.get(id(self)) or _state(self)
            if scope is None:
                state.next(wire.IDLE, None)  # a fresh transaction, outside any scope
            else:  # the token rides the BEGIN (marked first: a failed BEGIN leaves it idle)
                query = text + state.fresh(scope._sent) + tail
        elif kind != _CONTROL_KIND:
            return _run(
                self,
                lambda: self._fk_execute(query, timeout=timeout),
                lambda p: self._fk_execute(p + query, timeout=timeout),
            )
        # A BEGIN, COMMIT or ROLLBACK (nothing to send in these): as asyncpg's execute() runs it.
        if self._fk_direct and not self._query_loggers:
            self._check_open()
            return self._protocol.query(query, timeout)  # type: ignore[no-any-return]
        return self._fk_execute(query, timeout=timeout)

    async def prepare(self, query: str, **kwargs: Any) -> Any:
        statement = await super().prepare(query, **kwargs)  # Parse only: nothing runs yet
        statement.__class__ = _FencedStatement
        return statement

    def cursor(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return _fenced_cursor(super().cursor(query, *args, **kwargs))


_FETCH = ("executemany", "fetch", "fetchval", "fetchrow", "fetchmany")
_COPY = ("copy_from_table", "copy_from_query", "copy_to_table", "copy_records_to_table")
_fence_calls(_FencedStatement, (*_FETCH, "explain"))
_fence_calls(FencedConnection, (*_FETCH, *_COPY))


# fenced class -> the class it fences (what uninstall() puts back)
_unfenced: dict[type[Any], type[Any]] = {}


def _fenced_class(cls: type[Any]) -> type[Any]:
    if issubclass(cls, FencedConnection):
        return cls
    if cls is asyncpg.Connection:
        return FencedConnection
    fenced = next((f for f, base in _unfenced.items() if base is cls), None)
    if fenced is None:
        # No new slots, so the class can change; a class with a __dict__ keeps its layout only
        # as the first base (its own execute() then reaches fencekit's through super()).
        bases = (FencedConnection, cls) if not cls.__dictoffset__ else (cls, FencedConnection)
        fenced = type(f"Fenced{cls.__name__}", bases, {"__slots__": ()})
        _unfenced[fenced] = cls
    return fenced


def install(conn: asyncpg.Connection, *, translate_errors: bool = True) -> None:
    """Automatic mode: ``conn`` carries the current :func:`fencing` token in its transactions
    and statements. Idempotent.

    The connection becomes an instance of :class:`FencedConnection` (a subclass of its class
    that adds no state: asyncpg's one hook). For a pool, pass ``connection_class=
    FencedConnection`` or ``init=fencekit.asyncpg.init`` to ``asyncpg.create_pool()``.
    ``translate_errors`` (every adapter's flag) changes nothing here: fencekit's classes are
    raised on every connection, each rejection counted once, where asyncpg builds it."""
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
    _state(conn)


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
    """Whether ``conn`` (an asyncpg connection) is in automatic mode."""
    # Not isinstance(): asyncpg's connection metaclass answers True for every connection.
    return issubclass(type(conn), FencedConnection)


def _is_connection(conn: object) -> bool:
    """A real ``asyncpg.Connection`` (isinstance() also says so of a pool's proxies)."""
    return asyncpg.Connection in type(conn).__mro__


# ---------------------------------------------------------------- explicit API


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
    scope = wire.resolve(token, issuer)
    installed = is_installed(conn) or not _is_connection(conn)  # a proxy: its pool installs
    if not installed:
        install(conn)  # for the block only
    nested = conn.is_in_transaction()
    outer = _state(conn).held if nested else None
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
                await tx.commit()  # a deferred check's rejection is counted where asyncpg built it
            except Exception as exc:
                unknown = None if nested else commit_outcome_unknown(exc, scope.token, scope.issuer)
                if unknown is not None:
                    raise unknown from exc
                raise
    finally:
        try:
            if nested and not conn.is_closed() and conn.is_in_transaction():
                # A SET LOCAL made in a savepoint outlives its release: set the outer one again.
                restore = outer or wire.CLEAR
                await asyncpg.Connection.execute(conn, wire.set_local(restore))
                _state(conn).sent(restore, open_after=True)
        finally:
            if not installed and not conn.is_closed():
                uninstall(conn)


async def set_token(
    conn: asyncpg.Connection, token: int | None = None, *, issuer: str | None = None
) -> None:
    """Fence the transaction open on ``conn``: one statement, so one round trip. Prefer
    :func:`transaction` or :func:`install`, whose BEGIN carries the token instead."""
    scope = wire.resolve(token, issuer)
    if not conn.is_in_transaction():
        raise asyncpg.InterfaceError(
            "set_token() needs an open transaction: outside one the setting would end with its "
            "own statement; use fencekit.asyncpg.transaction(conn, token) instead"
        )
    value = scope._sent  # as fencing() validated it
    await asyncpg.Connection.execute(conn, wire.set_local(value))
    _state(conn).sent(value, open_after=True)
