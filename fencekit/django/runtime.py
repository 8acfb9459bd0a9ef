"""The token on every Django connection, through Django's own execute wrappers.

:func:`install` appends :func:`fence_statement` to a connection's ``execute_wrappers``; the
``fencekit`` app does that for every PostgreSQL connection Django opens
(``connection_created``). Nothing here knows the driver: the token goes out as
``SELECT set_config('fencekit.token', %s, true), set_config('fencekit.issuer', %s, true)`` on a
plain cursor of the driver's connection, which Django's psycopg 3 and psycopg2 backends both
accept, and
the transaction state is read from libpq's status (``connection.info.transaction_status``, the
same numbers in both drivers).

Inside a :func:`fencekit.fencing` scope, before a statement:

- **In a transaction** (``transaction.atomic()``, or autocommit off): the token is set once per
  transaction, before its first statement in the scope, and again after anything that may have
  undone it (a ``ROLLBACK TO SAVEPOINT``, which Django sends through the same wrappers when an
  inner ``atomic()`` fails) or when the scope's token changes. One extra round trip per
  transaction.
- **In autocommit**: the statement would be its own transaction, and a token set by an earlier
  statement would be gone. It runs in ``transaction.atomic()`` with the token set first: BEGIN,
  set_config, the statement, COMMIT. A ``SELECT`` runs as it is: a read needs no token.

Outside any scope, a statement in a transaction that an earlier statement fenced clears the
token first, so leaving ``with fencing(...)`` inside ``atomic()`` does not leave the token in
force for what follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from fencekit.context import current_issuer, current_token

__all__ = ["install"]

SET_TOKEN = "SELECT set_config('fencekit.token', %s, true), set_config('fencekit.issuer', %s, true)"
_CLEAR = ("", "")
# libpq's PQtransactionStatus, as psycopg 3 (an IntEnum) and psycopg2 (an int) report it.
_IDLE, _INTRANS = 0, 2
_STATE = "_fencekit_django"
# Statements that only move between savepoints: the token set in the transaction stays (or is
# reset by the rollback, which _forgets() notes); setting it before them would be wasted.
_SAVEPOINT_WORDS = ("SAVEPOINT", "RELEASE")


class _State:
    """What this connection's open transaction was given (None: nothing known)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent: tuple[str, str] | None = None


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
    upper = text.lstrip()[:40].upper()
    return upper.startswith(("ROLLBACK", "RESET", "DISCARD"))


def _send(connection: BaseDatabaseWrapper, value: tuple[str, str]) -> None:
    # A plain cursor of the driver's connection: not Django's (its wrappers would run this
    # function again), and not the statement's own, which may be a named server-side cursor
    # (.iterator()) that would only DECLARE the set_config. Errors still become django.db's.
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        cursor.execute(SET_TOKEN, value)
    _state(connection).sent = value


def fence_statement(
    execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Django execute wrapper: the statement runs under the current :func:`fencing` token."""
    connection: BaseDatabaseWrapper = context["connection"]
    state = _state(connection)
    token = current_token()
    status = _status(connection)
    if status == _IDLE:
        state.sent = None  # no transaction open: whatever was set ended with the last one
    word = _first_word(sql)
    if token is None:
        if state.sent not in (None, _CLEAR) and status == _INTRANS and word not in _SAVEPOINT_WORDS:
            _send(connection, _CLEAR)
        return _run(execute, sql, params, many, context, state)
    value = (str(token), current_issuer() or "")
    if word in _SAVEPOINT_WORDS or word in ("COMMIT", "ROLLBACK", "BEGIN"):
        return _run(execute, sql, params, many, context, state)
    if connection.get_autocommit() and not connection.in_atomic_block:
        if word == "SELECT":
            # A read needs no token; wrapping it would cost three round trips. (A SELECT of a
            # function that writes a fenced table is refused as unfenced: run it in atomic().)
            return execute(sql, params, many, context)
        # Its own transaction: open one, so the token and the statement share it.
        with transaction.atomic(using=connection.alias):
            _send(connection, value)
            return execute(sql, params, many, context)
    if status in (_IDLE, _INTRANS) and state.sent != value:
        _send(connection, value)
    return _run(execute, sql, params, many, context, state)


def _run(
    execute: Callable[..., Any],
    sql: Any,
    params: Any,
    many: bool,
    context: dict[str, Any],
    state: _State,
) -> Any:
    try:
        return execute(sql, params, many, context)
    finally:
        if _forgets(sql):
            state.sent = None


def install(connection: BaseDatabaseWrapper) -> None:
    """Fence every statement ``connection`` runs inside a :func:`fencing` scope (idempotent).

    The ``fencekit`` app calls it for each PostgreSQL connection; call it yourself only for a
    connection made outside Django's ``connections`` (its own ``DatabaseWrapper``).
    """
    if connection.vendor != "postgresql":
        raise ValueError(
            f"fencekit fences PostgreSQL only; database {connection.alias!r} is {connection.vendor}"
        )
    if fence_statement not in connection.execute_wrappers:
        # First: Django runs execute_wrappers outermost first, so the token is set before
        # any other wrapper's timing or logging sees the statement.
        connection.execute_wrappers.insert(0, fence_statement)


def uninstall(connection: BaseDatabaseWrapper) -> None:
    """Undo :func:`install`."""
    while fence_statement in connection.execute_wrappers:
        connection.execute_wrappers.remove(fence_statement)


def installed(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection``'s statements carry the token."""
    return fence_statement in connection.execute_wrappers
