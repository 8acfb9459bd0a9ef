"""psycopg 3 adapter (sync and async): carry the fencing token into each transaction.

The token always travels transaction-locally, ``set_config('fencekit.token', $1, true)`` with a
bound parameter, so a pooled connection or a transaction-mode pgbouncer never hands it to the next
client. It costs no extra round trip: the fenced cursors send ``set_config`` in one pipeline
(psycopg's pipeline mode) with the statement it guards, flushed together and answered together.
The same statement sets ``fencekit.issuer`` to the scope's issuer (``fencing(token, issuer=...)``,
set by a ``Lease``), or to ``''`` for an untagged token: a resource bound to another issuer
rejects the write (YF007).

- :func:`transaction` / :func:`async_transaction`: a transaction block fenced with a token.
- :func:`set_token` / :func:`async_set_token`: fence the transaction already open (one statement).
- :func:`install`: automatic mode; every statement the connection runs inside a
  :func:`fencekit.fencing` scope carries the scope's token (works as psycopg_pool's ``configure``).

Fence rejections are raised as :class:`~fencekit.errors.FenceError` subclasses, with the psycopg
error chained.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from typing import Any, cast

import psycopg
from psycopg.abc import Params, Query
from psycopg.pq import TransactionStatus

from fencekit import metrics
from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import TokenNotSetError, translate, validate_token

__all__ = [
    "AsyncFencedCursor",
    "FencedCursor",
    "async_set_token",
    "async_transaction",
    "install",
    "set_token",
    "transaction",
    "uninstall",
]

SET_TOKEN = "SELECT set_config('fencekit.token', %s, true), set_config('fencekit.issuer', %s, true)"
_CLEAR = ("", "")  # (token, issuer) sent to clear what an earlier statement set
_IDLE = TransactionStatus.IDLE
_INTRANS = TransactionStatus.INTRANS
_STATE = "_fencekit_state"


class _State:
    """Per-connection bookkeeping, kept as an attribute of the psycopg connection."""

    __slots__ = ("dirty", "installed", "previous_factory", "setter", "tracked", "tx_value")

    def __init__(self) -> None:
        # True while the open transaction may hold a token we set (so it must be cleared when
        # a statement runs outside any scope). Reset whenever the connection is seen idle.
        self.dirty = False
        self.installed = False
        self.previous_factory: Any = None
        self.setter: Any = None  # a plain cursor reused for set_config
        # tracked: something that sees every transaction boundary (the SQLAlchemy plugin's
        # events) resets tx_value, so a token already set in this transaction is not resent.
        # Raw psycopg cannot see a BEGIN sent by conn.transaction(): it resends every time.
        self.tracked = False
        self.tx_value: tuple[str, str] | None = None


def _state(conn: Any) -> _State:
    state: _State | None = getattr(conn, _STATE, None)
    if state is None:
        state = _State()
        setattr(conn, _STATE, state)
    return state


def forget_transaction(conn: Any) -> None:
    """A transaction boundary or savepoint rollback: what was set may no longer hold."""
    state = _state(conn)
    state.tx_value = None


def track_transactions(conn: Any) -> None:
    """Declare that :func:`forget_transaction` is called at every boundary of ``conn``."""
    state = _state(conn)
    state.tracked = True


def _wanted(conn: Any) -> tuple[bool, tuple[str, str]]:
    """(must send set_config before the next statement, (token, issuer) to send)."""
    state = _state(conn)
    status = conn.pgconn.transaction_status
    if status == _IDLE:
        state.dirty = False  # a new transaction starts clean: nothing to clear
        state.tx_value = None
    elif status != _INTRANS:
        # Failed transaction (only ROLLBACK works) or broken connection: add nothing.
        return False, _CLEAR
    token = current_token()
    if token is not None:
        value = (str(token), current_issuer() or "")
        return not (state.tracked and state.tx_value == value), value
    return state.dirty, _CLEAR


def _setter(conn: Any) -> Any:
    state = _state(conn)
    if state.setter is None or state.setter.closed:
        cls = psycopg.AsyncCursor if isinstance(conn, psycopg.AsyncConnection) else psycopg.Cursor
        state.setter = cls(conn)
    return state.setter


def _piggybacks(query: Query, params: object) -> bool:
    """Whether ``query`` can share a pipeline: one statement (pipeline = extended protocol)."""
    if params:
        return True  # bound parameters already mean one statement
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    if not isinstance(query, str):
        return False  # a Composed may hold several statements: set the token separately
    body = query.strip().rstrip(";")
    return bool(body) and ";" not in body


def _q(query: Query) -> Any:
    # Template queries (PEP 750) go through psycopg's overloads untouched.
    return query


def _after(conn: Any, value: tuple[str, str]) -> None:
    state = _state(conn)
    open_tx = conn.pgconn.transaction_status != _IDLE
    state.dirty = bool(value[0]) and open_tx
    state.tx_value = value if open_tx else None


def _translated(exc: psycopg.Error) -> BaseException:
    error = translate(exc)
    if error is None:
        return exc
    metrics.record_rejection(error)
    return error


# ---------------------------------------------------------------- cursors


class FencedCursor(psycopg.Cursor[Any]):
    """A cursor whose statements carry :func:`fencekit.current_token` (see :func:`install`)."""

    translate_errors = True

    def _fence_now(self, value: tuple[str, str]) -> None:
        _setter(self.connection).execute(SET_TOKEN, value)

    def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> FencedCursor:
        conn = self.connection
        try:
            send, value = _wanted(conn)
            if not send:
                super().execute(_q(query), params, prepare=prepare, binary=binary)
                return self
            if _piggybacks(query, params):
                with conn.pipeline():
                    _setter(conn).execute(SET_TOKEN, value)
                    super().execute(_q(query), params, prepare=prepare, binary=binary)
            else:
                self._fence_now(value)
                super().execute(_q(query), params, prepare=prepare, binary=binary)
            _after(conn, value)
            return self
        except psycopg.Error as exc:
            if not self.translate_errors:
                raise
            raise _translated(exc) from exc

    def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        conn = self.connection
        try:
            send, value = _wanted(conn)
            if not send:
                super().executemany(query, params_seq, returning=returning)
                return
            with conn.pipeline():  # executemany rides the same pipeline
                _setter(conn).execute(SET_TOKEN, value)
                super().executemany(query, params_seq, returning=returning)
            _after(conn, value)
        except psycopg.Error as exc:
            if not self.translate_errors:
                raise
            raise _translated(exc) from exc


class AsyncFencedCursor(psycopg.AsyncCursor[Any]):
    """Async twin of :class:`FencedCursor`."""

    translate_errors = True

    async def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> AsyncFencedCursor:
        conn = self.connection
        try:
            send, value = _wanted(conn)
            if not send:
                await super().execute(_q(query), params, prepare=prepare, binary=binary)
                return self
            if _piggybacks(query, params):
                async with conn.pipeline():
                    await _setter(conn).execute(SET_TOKEN, value)
                    await super().execute(_q(query), params, prepare=prepare, binary=binary)
            else:
                await _setter(conn).execute(SET_TOKEN, value)
                await super().execute(_q(query), params, prepare=prepare, binary=binary)
            _after(conn, value)
            return self
        except psycopg.Error as exc:
            if not self.translate_errors:
                raise
            raise _translated(exc) from exc

    async def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        conn = self.connection
        try:
            send, value = _wanted(conn)
            if not send:
                await super().executemany(query, params_seq, returning=returning)
                return
            async with conn.pipeline():
                await _setter(conn).execute(SET_TOKEN, value)
                await super().executemany(query, params_seq, returning=returning)
            _after(conn, value)
        except psycopg.Error as exc:
            if not self.translate_errors:
                raise
            raise _translated(exc) from exc


@cache
def fenced_cursor_class(base: type[Any], *, translate_errors: bool = True) -> type[Any]:
    """The fenced variant of a cursor class (``ClientCursor``, ``RawCursor``, a subclass...)."""
    fenced: type[Any] = AsyncFencedCursor if issubclass(base, psycopg.AsyncCursor) else FencedCursor
    if issubclass(base, fenced):
        return base  # already fenced: keep its error translation as it is
    if base in (psycopg.Cursor, psycopg.AsyncCursor):
        if translate_errors:
            return fenced
        bases: tuple[type[Any], ...] = (fenced,)
    else:
        bases = (fenced, base)
    return type(f"Fenced{base.__name__}", bases, {"translate_errors": translate_errors})


def install(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    *,
    translate_errors: bool = True,
) -> None:
    """Automatic mode: statements on ``conn`` carry the current :func:`fencing` token.

    Replaces ``conn.cursor_factory`` with its fenced variant (idempotent). Server-side (named)
    cursors are not covered. Usable as ``psycopg_pool.ConnectionPool(configure=install)``.
    """
    state = _state(conn)
    factory = conn.cursor_factory
    fenced = fenced_cursor_class(cast(Any, factory), translate_errors=translate_errors)
    if factory is not fenced:
        if not state.installed:
            state.previous_factory = factory
        conn.cursor_factory = fenced
    state.installed = True


def uninstall(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Undo :func:`install`."""
    state = _state(conn)
    if state.installed and state.previous_factory is not None:
        conn.cursor_factory = state.previous_factory
    state.installed = False
    state.previous_factory = None


# ---------------------------------------------------------------- explicit API


def _resolve(token: int | None, issuer: str | None = None) -> tuple[int, str | None]:
    """(token, issuer): the given ones, or the current scope's when ``token`` is None."""
    if token is None:
        token = current_token()
        if token is None:
            raise TokenNotSetError()
        issuer = issuer or current_issuer()
    return validate_token(token), issuer


def _outer() -> tuple[str, str]:
    outer = current_token()
    return (str(outer), current_issuer() or "") if outer else _CLEAR


@contextmanager
def _fenced_factory(conn: Any) -> Iterator[None]:
    """Temporarily install the fenced cursor on a connection that is not in automatic mode."""
    state = _state(conn)
    if state.installed:
        yield
        return
    factory = conn.cursor_factory
    conn.cursor_factory = fenced_cursor_class(factory)
    try:
        yield
    finally:
        conn.cursor_factory = factory


@contextmanager
def transaction(
    conn: psycopg.Connection[Any],
    token: int | None = None,
    *,
    issuer: str | None = None,
    savepoint_name: str | None = None,
    force_rollback: bool = False,
) -> Iterator[psycopg.Transaction]:
    """``conn.transaction()`` whose statements carry ``token`` (default: the current scope's).

    The token is validated before anything is sent; the block is also a :func:`fencing` scope.
    Statements must run on cursors made inside the block (or ``conn.execute``). The token rides
    the block's first statement: no extra round trip. Nested inside an open transaction (a
    savepoint), the outer transaction's token is restored on exit (one statement).
    ``issuer`` tags the token with its issuer (default: the scope's, when ``token`` is None).
    """
    value, issuer = _resolve(token, issuer)
    nested = conn.pgconn.transaction_status != _IDLE
    try:
        with (
            fencing(value, issuer),
            _fenced_factory(conn),
            conn.transaction(savepoint_name, force_rollback) as tx,
        ):
            yield tx
    except psycopg.Error as exc:
        raise _translated(exc) from exc
    finally:
        state = _state(conn)
        if nested and state.dirty and not state.installed and _in_transaction(conn):
            outer = _outer()
            psycopg.Cursor(conn).execute(SET_TOKEN, outer)
            state.dirty = bool(outer[0])
            state.tx_value = None


@asynccontextmanager
async def async_transaction(
    conn: psycopg.AsyncConnection[Any],
    token: int | None = None,
    *,
    issuer: str | None = None,
    savepoint_name: str | None = None,
    force_rollback: bool = False,
) -> AsyncIterator[psycopg.AsyncTransaction]:
    """Async twin of :func:`transaction`."""
    value, issuer = _resolve(token, issuer)
    nested = conn.pgconn.transaction_status != _IDLE
    try:
        with fencing(value, issuer), _fenced_factory(conn):
            async with conn.transaction(savepoint_name, force_rollback) as tx:
                yield tx
    except psycopg.Error as exc:
        raise _translated(exc) from exc
    finally:
        state = _state(conn)
        if nested and state.dirty and not state.installed and _in_transaction(conn):
            outer = _outer()
            await psycopg.AsyncCursor(conn).execute(SET_TOKEN, outer)
            state.dirty = bool(outer[0])
            state.tx_value = None


def _in_transaction(conn: Any) -> bool:
    return bool(conn.pgconn.transaction_status == _INTRANS)


def _explicit(conn: Any) -> None:
    state = _state(conn)
    state.dirty = False  # set by hand: automatic mode must not clear it
    state.tx_value = None  # and a scope's token must still be sent over it


def _check_open(conn: Any) -> None:
    if conn.autocommit and conn.pgconn.transaction_status == _IDLE:
        raise psycopg.ProgrammingError(
            "set_token() needs an open transaction: in autocommit mode the setting would end "
            "with its own statement; use fencekit.psycopg.transaction(conn, token) instead"
        )


def set_token(
    conn: psycopg.Connection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Fence the transaction open on ``conn`` (or the one psycopg opens implicitly).

    One statement, so one round trip (two if it also opens the transaction); prefer
    :func:`transaction` or :func:`install`, which ride the next statement instead.
    """
    value, issuer = _resolve(token, issuer)
    _check_open(conn)
    params = (str(value), fencing(value, issuer).issuer or "")  # fencing() checks the name
    psycopg.Cursor(conn).execute(SET_TOKEN, params)
    _explicit(conn)


async def async_set_token(
    conn: psycopg.AsyncConnection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Async twin of :func:`set_token`."""
    value, issuer = _resolve(token, issuer)
    _check_open(conn)
    params = (str(value), fencing(value, issuer).issuer or "")  # fencing() checks the name
    await psycopg.AsyncCursor(conn).execute(SET_TOKEN, params)
    _explicit(conn)
