"""psycopg2 adapter: carry the fencing token into each transaction, as ``fencekit.psycopg`` does.

The same surface as the psycopg 3 adapter: :func:`install` (automatic mode: statements run inside
a :func:`fencekit.fencing` scope carry its token; also for a ``psycopg2.pool`` pool),
:func:`transaction` (a transaction block fenced with a token) and :func:`set_token`.

How the token travels, without a round trip of its own: psycopg2 sends each statement as one
simple query (parameters are interpolated on the client), and PostgreSQL runs the statements of
one simple query in one transaction. So the fenced cursor sends ``SET LOCAL fencekit.token =
'34'; <statement>`` as that statement's query (with ``SET LOCAL fencekit.issuer`` too when the
token is tagged, or the transaction set one before): in a transaction (psycopg2 opens one with
its own ``BEGIN`` before the first statement, as it always does), or in autocommit mode, where
they run as one implicit transaction. What is sent and when is :mod:`fencekit.wire`'s answer:
once per transaction, and a statement run after the scope ended, in the same transaction,
clears it first. ``executemany()``, ``callproc()``, ``copy_expert()``/``copy_from()``/
``copy_to()`` and named (server-side) cursors cannot take a prefix: the token goes as a
statement of its own (one round trip) before them, when the wire says one is needed.

Rejections are raised as fencekit's classes that are also ``psycopg2.DatabaseError``
(``pgcode``/``pgerror`` kept; psycopg2 has no way to register them, so the fenced cursor
translates): ``except fencekit.StaleTokenError`` and ``except psycopg2.Error`` both catch them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg2
import psycopg2.extensions as ext
from psycopg2 import pool as pg2_pool
from psycopg2 import sql as pg2_sql

from fencekit import errors, metrics, wire
from fencekit.errors import commit_outcome_unknown

__all__ = [
    "BypassRefusedError",
    "FenceUsageError",
    "FencedCursor",
    "IssuerMismatchError",
    "LeaseMismatchError",
    "MalformedTokenError",
    "MissingTokenError",
    "ReusedTokenError",
    "StaleTokenError",
    "install",
    "is_installed",
    "set_token",
    "transaction",
    "uninstall",
]

Connection = ext.connection
C = TypeVar("C", bound=ext.connection)
R = TypeVar("R")


# ---------------------------------------------------------------- errors


class _Psycopg2RejectionError(errors.FencekitError, psycopg2.DatabaseError):  # type: ignore[misc]
    """A fencekit rejection that is also a ``psycopg2.DatabaseError``."""


# fencekit's class first, so its fields, __str__ and as_dict() are the ones seen.
_CLASSES = errors.driver_classes(_Psycopg2RejectionError, __name__)
FenceUsageError = _CLASSES["FenceUsageError"]
StaleTokenError = _CLASSES["StaleTokenError"]
ReusedTokenError = _CLASSES["ReusedTokenError"]
MissingTokenError = _CLASSES["MissingTokenError"]
MalformedTokenError = _CLASSES["MalformedTokenError"]
BypassRefusedError = _CLASSES["BypassRefusedError"]
LeaseMismatchError = _CLASSES["LeaseMismatchError"]
IssuerMismatchError = _CLASSES["IssuerMismatchError"]
_BY_SQLSTATE = {cls.sqlstate: cls for cls in _CLASSES.values()}


def _rejection(exc: BaseException) -> BaseException:
    """``exc`` as fencekit's class that is also a psycopg2 error (counted), else ``exc``."""
    cls = _BY_SQLSTATE.get(getattr(exc, "pgcode", None) or "")
    if cls is None:
        return exc
    message, fields = errors.fields_of(exc)
    error = cls(message, orig=exc, **fields)
    # psycopg2 keeps these in C slots that only its pickling support sets.
    cast(Any, error).__setstate__({"pgerror": cast(Any, exc).pgerror, "pgcode": cls.sqlstate})
    metrics.record_rejection(error)
    return error


# ---------------------------------------------------------------- state


class _State(wire.Wire):
    __slots__ = ("installed", "previous_factory", "translate")

    def __init__(self) -> None:
        super().__init__()  # tracked: every statement and BEGIN goes through a cursor
        self.installed = False
        self.translate = True
        self.previous_factory: Any = None


# psycopg2's connections take no attributes: their state lives here, by id() (a dict read
# before every statement), for as long as the connection lives.
_states: dict[int, _State] = {}
_scope_now = wire.scope_now  # the current fencing() scope, read before every statement


def _state(conn: ext.connection) -> _State:
    state = _states.get(id(conn))
    if state is None:
        state = _states[id(conn)] = _State()
        weakref.finalize(conn, _states.pop, id(conn), None)  # before the id can be reused
    return state


def _sent(conn: ext.connection, value: wire.Value) -> None:
    _state(conn).sent(value, open_after=conn.get_transaction_status() != wire.IDLE)


def _with_prefix(cursor: ext.cursor, query: Any, prefix: str) -> Any:
    if isinstance(query, pg2_sql.Composable):
        query = query.as_string(cursor)
    if isinstance(query, bytes):
        return prefix.encode("ascii") + query
    return prefix + str(query)


def _sync(conn: ext.connection) -> None:
    """Before a path that cannot carry a prefix (executemany, callproc, COPY, a named
    cursor): set what the wire says, as a statement of its own (one round trip).

    In autocommit, outside a transaction, nothing is sent: a setting would end with its own
    statement, and the path runs with no token (a fenced table refuses it as unfenced)."""
    status = conn.get_transaction_status()
    if status == wire.IDLE and conn.autocommit:
        return
    value = _state(conn).next(status, wire.scope_value())
    if value is None:
        return
    with conn.cursor(cursor_factory=ext.cursor) as cur:
        cur.execute(wire.set_local(value, fresh=status == wire.IDLE))
    _sent(conn, value)


# ---------------------------------------------------------------- cursor


class FencedCursor(ext.cursor):  # type: ignore[misc]  # psycopg2 ships no types
    """A cursor whose statements carry :func:`fencekit.current_token` (see :func:`install`):
    ``execute`` as a prefix of its query; ``executemany``, ``callproc``, COPY and named
    (server-side) cursors with a statement of their own first."""

    def _guarded(self, call: Callable[[], R]) -> R:
        conn = self.connection
        try:
            return call()
        except psycopg2.Error as exc:
            if not _state(conn).translate:
                raise
            error = _rejection(exc)
            if error is exc:
                raise
            raise error from exc

    def _synced(self, call: Callable[[], R]) -> R:
        def run() -> R:
            _sync(self.connection)
            return call()

        return self._guarded(run)

    def execute(self, query: Any, vars: Any = None) -> Any:
        if self.name is not None:  # DECLARE ... FOR <query>: no room for a prefix
            return self._synced(lambda: super(FencedCursor, self).execute(query, vars))
        # Read before every statement, so kept short: no call of fencekit's when nothing is to
        # be sent, one (Wire.fresh) for the token of a fresh transaction.
        conn = self.connection
        state = _states.get(id(conn)) or _state(conn)
        scope = _scope_now()
        try:
            status = conn.get_transaction_status()
            if scope is None or status != wire.IDLE:
                if scope is not None and state.held is scope._sent and status == wire.INTRANS:
                    return super().execute(query, vars)  # the scope's token is in force
                value = state.next(status, None if scope is None else scope._sent)
                if value is None:  # nothing to send: the scope's token is in force, or none is
                    return super().execute(query, vars)
                prefix = wire.set_local(value) + "; "
            else:  # a fresh transaction: marked before it runs (it starts afresh if it fails)
                prefix = state.fresh(scope._sent) + "; "
                value = None
            # A str (the usual query) is prefixed here; bytes and sql.Composable by _with_prefix.
            super().execute(
                prefix + query if type(query) is str else _with_prefix(self, query, prefix), vars
            )
            if value is not None:
                state.sent(value, open_after=conn.get_transaction_status() != wire.IDLE)
        except psycopg2.Error as exc:
            if not state.translate:
                raise
            error = _rejection(exc)
            if error is exc:
                raise
            raise error from exc

    def executemany(self, query: Any, vars_list: Iterable[Any]) -> Any:
        return self._synced(lambda: super(FencedCursor, self).executemany(query, vars_list))

    def callproc(self, procname: Any, parameters: Any = None) -> Any:
        return self._synced(lambda: super(FencedCursor, self).callproc(procname, parameters))

    def copy_expert(self, sql: Any, file: Any, size: int = 8192) -> Any:
        return self._synced(lambda: super(FencedCursor, self).copy_expert(sql, file, size))

    def copy_from(self, file: Any, table: str, *args: Any, **kwargs: Any) -> Any:
        return self._synced(
            lambda: super(FencedCursor, self).copy_from(file, table, *args, **kwargs)
        )

    def copy_to(self, file: Any, table: str, *args: Any, **kwargs: Any) -> Any:
        return self._synced(lambda: super(FencedCursor, self).copy_to(file, table, *args, **kwargs))


_fenced_classes: dict[type[Any], type[Any]] = {}


def _fenced_class(base: type[Any]) -> type[Any]:
    if issubclass(base, FencedCursor):
        return base
    if base is ext.cursor:
        return FencedCursor
    cls = _fenced_classes.get(base)
    if cls is None:
        cls = _fenced_classes.setdefault(
            base, type(f"Fenced{base.__name__}", (FencedCursor, base), {})
        )
    return cls


# ---------------------------------------------------------------- install


def install(target: C | pg2_pool.AbstractConnectionPool, *, translate_errors: bool = True) -> None:
    """Automatic mode: statements on ``target`` carry the current :func:`fencing` token.

    ``target`` is a psycopg2 connection, or a ``psycopg2.pool`` pool: then every connection it
    hands out is installed. Puts the fenced variant of the connection's ``cursor_factory`` in
    place (idempotent); cursors made with an explicit ``cursor_factory=`` argument (other than
    ``None``) are not fenced. With ``translate_errors=False`` (the SQLAlchemy plugin, which
    translates itself) rejections stay psycopg2's plain ``DatabaseError``.
    """
    if isinstance(target, pg2_pool.AbstractConnectionPool):
        _install_pool(target, translate_errors)
        return
    if not isinstance(target, ext.connection):
        raise TypeError(
            f"fencekit.psycopg2.install() takes a psycopg2 connection or pool, not "
            f"{type(target).__module__}.{type(target).__name__}"
        )
    state = _state(target)
    state.translate = translate_errors
    factory = target.cursor_factory or ext.cursor
    fenced = _fenced_class(factory)
    if factory is not fenced:
        if not state.installed:
            state.previous_factory = target.cursor_factory
        target.cursor_factory = fenced
    state.installed = True


def _install_pool(pool: pg2_pool.AbstractConnectionPool, translate_errors: bool) -> None:
    # psycopg2's pools have no configure hook: wrap getconn (an instance attribute, removed by
    # uninstall). A connection given back mid-transaction is rolled back by putconn(), and the
    # token is transaction-local: nothing carries over to the next borrower.
    if "getconn" in vars(pool):
        return
    original = type(pool).getconn

    def getconn(key: Any = None) -> ext.connection:
        conn = cast(ext.connection, original(pool, key))
        if not _state(conn).installed:
            install(conn, translate_errors=translate_errors)
        return conn

    pool.getconn = getconn


def uninstall(target: ext.connection | pg2_pool.AbstractConnectionPool) -> None:
    """Undo :func:`install` (on a pool: connections it already handed out stay fenced)."""
    if isinstance(target, pg2_pool.AbstractConnectionPool):
        vars(target).pop("getconn", None)  # the instance attribute _install_pool set
        return
    state = _state(target)
    if state.installed:
        target.cursor_factory = state.previous_factory
    state.installed = False
    state.previous_factory = None


def is_installed(conn: object) -> bool:
    """Whether ``conn`` (a psycopg2 connection) is in automatic mode."""
    state = _states.get(id(conn)) if isinstance(conn, ext.connection) else None
    return state is not None and state.installed


# ---------------------------------------------------------------- explicit API


@contextmanager
def _fenced_factory(conn: ext.connection) -> Iterator[None]:
    if is_installed(conn):
        yield
        return
    factory = conn.cursor_factory
    conn.cursor_factory = _fenced_class(factory or ext.cursor)
    try:
        yield
    finally:
        conn.cursor_factory = factory


@contextmanager
def transaction(conn: C, token: int | None = None, *, issuer: str | None = None) -> Iterator[C]:
    """A transaction on ``conn`` whose statements carry ``token`` (default: the scope's).

    The token is validated before anything is sent, and rides the transaction's first
    statement. Commits when the block ends, rolls back when it raises; the block is also a
    :func:`fencing` scope. ``conn`` must be idle (no transaction open): psycopg2 has no
    savepoint blocks, so nesting is refused. An autocommit connection runs the block as one
    transaction (autocommit is off for the block). A connection lost during the COMMIT raises
    :class:`~fencekit.errors.CommitOutcomeUnknownError` (docs/ha.md).
    """
    scope = wire.resolve(token, issuer)
    if conn.get_transaction_status() != wire.IDLE:
        raise psycopg2.ProgrammingError(
            "fencekit.psycopg2.transaction() needs an idle connection: commit or roll back "
            "first, or use set_token() to fence the transaction already open"
        )
    autocommit = conn.autocommit
    if autocommit:
        conn.autocommit = False
    try:
        with scope, _fenced_factory(conn):
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            try:
                conn.commit()
            except psycopg2.Error as exc:
                unknown = commit_outcome_unknown(exc, scope.token, scope.issuer)
                if unknown is not None:
                    raise unknown from exc
                error = _rejection(exc)  # a deferred check that failed at COMMIT
                if error is exc:
                    raise
                raise error from exc
    finally:
        _state(conn).ended()
        if autocommit and not conn.closed:
            conn.autocommit = True


def set_token(conn: ext.connection, token: int | None = None, *, issuer: str | None = None) -> None:
    """Fence the transaction open on ``conn`` (or the one psycopg2 opens for this statement).

    One statement, so one round trip; prefer :func:`transaction` or :func:`install`, which ride
    the next statement instead.
    """
    scope = wire.resolve(token, issuer)
    if conn.autocommit:
        raise psycopg2.ProgrammingError(
            "set_token() needs a transaction: in autocommit mode the setting would end with "
            "its own statement; use fencekit.psycopg2.transaction(conn, token) instead"
        )
    value = scope._sent  # as fencing() validated it
    with conn.cursor(cursor_factory=ext.cursor) as cur:
        cur.execute(wire.set_local(value))
    _sent(conn, value)
