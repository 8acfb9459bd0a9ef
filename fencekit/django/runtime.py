"""The token on every Django connection, through Django's own execute wrappers.

:func:`install` puts :func:`fence_statement` first in a connection's ``execute_wrappers`` and
fences its cursors' ``callproc()`` and COPY; the ``fencekit`` app does that for every PostgreSQL
connection Django opens (``connection_created``). What to send and when is
:mod:`fencekit.wire`'s answer, read from libpq's transaction status
(``connection.info.transaction_status``, the same numbers in psycopg 3 and psycopg2).

Inside a :func:`fencekit.fencing` scope, before a statement:

- **In a transaction** (``transaction.atomic()``, or autocommit off): the token is set once per
  transaction (``SET LOCAL``, one statement on a plain cursor of the driver's connection), and
  again after anything that may have undone it (a ``ROLLBACK TO SAVEPOINT``, which Django sends
  through the same wrappers when an inner ``atomic()`` fails) or when the scope's token changes.
- **In autocommit**: the statement would be its own transaction. With client-side binding
  (psycopg2, and Django's default on psycopg 3) the token goes in the statement's own query,
  ``SET LOCAL fencekit.token = '34'; <statement>``, which PostgreSQL runs as one implicit
  transaction: no round trip of its own. Otherwise (server-side binding, ``executemany``) the
  statement runs in ``transaction.atomic()`` with the token set first. A ``SELECT`` carries the
  token like any statement: a function it calls may write.

Outside any scope, a statement, ``callproc()`` or COPY in a transaction that an earlier
statement fenced clears the token first: leaving ``with fencing(...)`` inside ``atomic()``
leaves no token in force for what follows.

Rejections arrive as fencekit's class that is also Django's ``DatabaseError`` (the class Django
would have raised): ``except fencekit.StaleTokenError`` and ``except django.db.DatabaseError``
both catch them, the driver's error chained as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db import utils as db_utils
from django.db.backends import utils as backend_utils
from django.db.backends.base.base import BaseDatabaseWrapper

from fencekit import errors, metrics, wire

__all__ = ["fence_statement", "install", "is_installed", "uninstall"]

_STATE = "_fencekit_django"
# Statements that only move between savepoints or end the transaction: the token set in the
# transaction stays (or is reset by the rollback, which _forgets() notes).
_CONTROL = frozenset(("SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK", "BEGIN"))


class _State(wire.Wire):
    __slots__ = ("translate",)

    def __init__(self) -> None:
        super().__init__()  # tracked: Django's BEGINs are implicit, seen as an idle status
        self.translate = True


def _state(connection: BaseDatabaseWrapper) -> _State:
    state: _State | None = getattr(connection, _STATE, None)
    if state is None:
        state = _State()
        setattr(connection, _STATE, state)
    return state


def _status(connection: BaseDatabaseWrapper) -> int:
    return int(connection.connection.info.transaction_status)


def _first_word(sql: object) -> str:
    text = sql if isinstance(sql, str) else str(sql)
    words = text.lstrip().split(None, 1)
    return words[0].upper() if words else ""


def _forgets(sql: object) -> bool:
    """A statement after which the token set in the transaction may be gone."""
    text = sql if isinstance(sql, str) else str(sql)
    return text.lstrip()[:40].upper().startswith(("ROLLBACK", "RESET", "DISCARD"))


# ---------------------------------------------------------------- errors

_CLASSES = errors.driver_classes(db_utils.DatabaseError, __name__)
FenceUsageError = _CLASSES["FenceUsageError"]
StaleTokenError = _CLASSES["StaleTokenError"]
ReusedTokenError = _CLASSES["ReusedTokenError"]
MissingTokenError = _CLASSES["MissingTokenError"]
MalformedTokenError = _CLASSES["MalformedTokenError"]
BypassRefusedError = _CLASSES["BypassRefusedError"]
LeaseMismatchError = _CLASSES["LeaseMismatchError"]
IssuerMismatchError = _CLASSES["IssuerMismatchError"]
_BY_SQLSTATE = {cls.sqlstate: cls for cls in _CLASSES.values()}


@contextmanager
def _rejections(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Django's ``DatabaseError`` for a fence rejection becomes fencekit's class, also a
    ``DatabaseError``; the driver's error stays its ``__cause__``."""
    try:
        yield
    except db_utils.DatabaseError as exc:
        if isinstance(exc, errors.FenceError) or not _state(connection).translate:
            raise
        cause = exc.__cause__
        fence = errors.translate(cause) if cause is not None else None
        if fence is None or cause is None:
            raise
        message, fields = errors.fields_of(cause)
        error = _BY_SQLSTATE[fence.sqlstate](message, orig=fence.orig or cause, **fields)
        metrics.record_rejection(error)
        raise error from cause


# ---------------------------------------------------------------- the wire


def _send(connection: BaseDatabaseWrapper, value: wire.Value, status: int) -> None:
    # A plain cursor of the driver's connection: not Django's (its wrappers would run this
    # function again), and not the statement's own, which may be a named server-side cursor
    # (.iterator()) that would only DECLARE it. Errors still become django.db's.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        cursor.execute(wire.set_local(value, fresh=status == wire.IDLE))
    _state(connection).sent(value, open_after=_status(connection) != wire.IDLE)


def _sync(connection: BaseDatabaseWrapper) -> None:
    """In a transaction (or about to open one): send what the wire says, as a statement."""
    status = _status(connection)
    if status == wire.IDLE and connection.get_autocommit():
        return  # it would end with its own statement: see _autocommit()
    value = _state(connection).next(status, wire.scope_value())
    if value is not None:
        _send(connection, value, status)


def _send_value(connection: BaseDatabaseWrapper, value: wire.Value) -> None:
    _send(connection, value, _status(connection))


def _prefixable(connection: BaseDatabaseWrapper, context: dict[str, Any], many: bool) -> bool:
    """The statement's query can hold the token's SET LOCAL in front: it is sent as a simple
    query with client-side binding (psycopg2; Django's default cursor on psycopg 3)."""
    if many:
        return False
    cursor = getattr(context.get("cursor"), "cursor", None)
    module = type(cursor).__module__
    if module.startswith("psycopg2"):
        return True
    import psycopg

    return isinstance(cursor, psycopg.ClientCursor) and not isinstance(cursor, psycopg.ServerCursor)


def _prefixed(
    execute: Callable[..., Any],
    sql: str,
    params: Any,
    many: bool,
    context: dict[str, Any],
    prefix: str,
) -> Any:
    """The statement behind ``prefix`` (``SET LOCAL``s) in one simple query: no round trip of
    its own. The caller checked :func:`_prefixable`."""
    result = execute(f"{prefix}; {sql}", params, many, context)
    driver_cursor = context["cursor"].cursor
    if not type(driver_cursor).__module__.startswith("psycopg2"):
        for _ in range(prefix.count(";") + 1):  # psycopg 3 keeps every result: skip the SETs
            driver_cursor.nextset()
    return result


def _autocommit(
    execute: Callable[..., Any],
    sql: Any,
    params: Any,
    many: bool,
    context: dict[str, Any],
    value: wire.Value,
) -> Any:
    """A statement in autocommit, inside a scope: it is its own transaction, with the token."""
    connection: BaseDatabaseWrapper = context["connection"]
    if _prefixable(connection, context, many) and isinstance(sql, str):
        return _prefixed(execute, sql, params, many, context, wire.set_local(value, True))
    with transaction.atomic(using=connection.alias):
        _send_value(connection, value)
        return execute(sql, params, many, context)


def fence_statement(
    execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Django execute wrapper: the statement runs under the current :func:`fencing` token."""
    connection: BaseDatabaseWrapper = context["connection"]
    with _rejections(connection):
        if _first_word(sql) in _CONTROL:
            return _run(execute, sql, params, many, context)
        value = wire.scope_value()
        if value is not None and connection.get_autocommit() and not connection.in_atomic_block:
            _state(connection).next(wire.IDLE, value)  # no transaction open: nothing held
            return _autocommit(execute, sql, params, many, context, value)
        status = _status(connection)
        if status == wire.IDLE and connection.get_autocommit():
            return _run(execute, sql, params, many, context)  # no scope: nothing to send
        state = _state(connection)
        send = state.next(status, value)
        if send is None:
            return _run(execute, sql, params, many, context)
        if _prefixable(connection, context, many) and isinstance(sql, str):
            # In the statement's own query, behind the driver's BEGIN: no round trip of its own.
            prefix = wire.set_local(send, status == wire.IDLE)
            result = _prefixed(execute, sql, params, many, context, prefix)
            state.sent(send, open_after=_status(connection) != wire.IDLE)
            return result
        _send(connection, send, status)
        return _run(execute, sql, params, many, context)


def _run(
    execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    try:
        return execute(sql, params, many, context)
    finally:
        if _forgets(sql):
            _state(context["connection"]).forget()


# ---------------------------------------------------------------- cursors: callproc, COPY


class _FencedCursorMixin:
    """``callproc()`` and COPY run with exactly the scope's token, or none, as statements do.

    Neither goes through Django's execute wrappers. In a transaction the wire's value is sent
    first; in autocommit a ``callproc()`` inside a scope runs in ``atomic()`` with the token,
    and a COPY (whose rows come after the call returns) runs with no token: a fenced table
    refuses it as unfenced.
    """

    db: BaseDatabaseWrapper
    cursor: Any

    def callproc(self, procname: str, params: Any = None, kparams: Any = None) -> Any:
        connection = self.db
        parent: Any = super()
        with _rejections(connection):
            value = wire.scope_value()
            if value is not None and connection.get_autocommit() and not connection.in_atomic_block:
                with transaction.atomic(using=connection.alias):
                    _send_value(connection, value)
                    return parent.callproc(procname, params, kparams)
            _sync(connection)
            return parent.callproc(procname, params, kparams)

    def _copy(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with _rejections(self.db):
            _sync(self.db)
        return getattr(self.cursor, name)(*args, **kwargs)

    def copy(self, *args: Any, **kwargs: Any) -> Any:  # psycopg 3
        return self._copy("copy", *args, **kwargs)

    def copy_expert(self, *args: Any, **kwargs: Any) -> Any:  # psycopg2
        return self._copy("copy_expert", *args, **kwargs)

    def copy_from(self, *args: Any, **kwargs: Any) -> Any:
        return self._copy("copy_from", *args, **kwargs)

    def copy_to(self, *args: Any, **kwargs: Any) -> Any:
        return self._copy("copy_to", *args, **kwargs)


class FencedCursorWrapper(_FencedCursorMixin, backend_utils.CursorWrapper):
    """Django's cursor wrapper, with :class:`_FencedCursorMixin`."""


class FencedCursorDebugWrapper(_FencedCursorMixin, backend_utils.CursorDebugWrapper):
    """Django's debug cursor wrapper (``DEBUG = True``), with :class:`_FencedCursorMixin`."""


def _make_cursor(connection: BaseDatabaseWrapper) -> Callable[[Any], Any]:
    def make_cursor(cursor: Any) -> Any:
        return FencedCursorWrapper(cursor, connection)

    return make_cursor


def _make_debug_cursor(connection: BaseDatabaseWrapper) -> Callable[[Any], Any]:
    def make_debug_cursor(cursor: Any) -> Any:
        return FencedCursorDebugWrapper(cursor, connection)

    return make_debug_cursor


# ---------------------------------------------------------------- install


def install(connection: BaseDatabaseWrapper, *, translate_errors: bool = True) -> None:
    """Fence every statement ``connection`` runs inside a :func:`fencing` scope (idempotent).

    The ``fencekit`` app calls it for each PostgreSQL connection; call it yourself only for a
    connection made outside Django's ``connections`` (its own ``DatabaseWrapper``). With
    ``translate_errors=False`` rejections stay Django's plain ``DatabaseError``.
    """
    if not isinstance(connection, BaseDatabaseWrapper):
        raise TypeError(
            "fencekit.django.runtime.install() takes a Django database connection "
            "(django.db.connections['default'], a DatabaseWrapper), not "
            f"{type(connection).__module__}.{type(connection).__name__}"
        )
    if connection.vendor != "postgresql":
        raise ValueError(
            f"fencekit fences PostgreSQL only; database {connection.alias!r} is {connection.vendor}"
        )
    _state(connection).translate = translate_errors
    if fence_statement not in connection.execute_wrappers:
        # First: Django runs execute_wrappers outermost first, so the token is set before
        # any other wrapper's timing or logging sees the statement.
        connection.execute_wrappers.insert(0, fence_statement)
    # Instance attributes over Django's methods (removed by uninstall()): callproc and COPY.
    vars(connection)["make_cursor"] = _make_cursor(connection)
    vars(connection)["make_debug_cursor"] = _make_debug_cursor(connection)


def uninstall(connection: BaseDatabaseWrapper) -> None:
    """Undo :func:`install`."""
    while fence_statement in connection.execute_wrappers:
        connection.execute_wrappers.remove(fence_statement)
    vars(connection).pop("make_cursor", None)
    vars(connection).pop("make_debug_cursor", None)


def is_installed(connection: object) -> bool:
    """Whether ``connection``'s statements carry the token."""
    return fence_statement in getattr(connection, "execute_wrappers", ())
