"""psycopg 3 adapter (sync and async): carry the fencing token into each transaction.

The token always travels transaction-locally (``SET LOCAL``, or ``set_config(..., true)``), so a
pooled connection or a transaction-mode pgbouncer never hands it to the next client; with it goes
``fencekit.issuer``, the scope's issuer (``fencing(token, issuer=...)``, set by a ``Lease``) or
``''`` for an untagged token: a resource bound to another issuer rejects the write (YF007).

How it travels, without a round trip of its own:

- **In the BEGIN.** Where psycopg is about to open a transaction (``conn.transaction()`` on an
  idle connection, or the implicit BEGIN before the first statement of a connection not in
  autocommit mode), fencekit sends ``BEGIN; SET LOCAL fencekit.token = ...; SET LOCAL
  fencekit.issuer = ...`` as that round trip's one simple query. This needs psycopg internals,
  all in :mod:`fencekit._psycopg_internals`, checked at import.
- **In a pipeline with the statement** (the public path). Where no BEGIN is coming (autocommit,
  a transaction already open, pipeline mode), or when that import-time check failed, the fenced
  cursor sends ``SELECT set_config(...)`` in one psycopg pipeline with the statement it guards,
  flushed and answered together. A statement that may hold several (a ``Composed``, or text with
  ``;`` and no parameters) cannot share a pipeline: the token goes one statement before it.

- :func:`transaction` / :func:`async_transaction`: a transaction block fenced with a token.
- :func:`set_token` / :func:`async_set_token`: fence the transaction already open (one statement).
- :func:`install`: automatic mode; every statement the connection runs inside a
  :func:`fencekit.fencing` scope carries the scope's token (works as psycopg_pool's ``configure``).

Fence rejections are raised as :class:`~fencekit.errors.FenceError` subclasses, with the psycopg
error chained.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from functools import cache
from types import TracebackType
from typing import Any, TypeAlias, cast

import psycopg
from psycopg import sql
from psycopg.abc import Params, Query
from psycopg.pq import PipelineStatus, TransactionStatus

from fencekit import _psycopg_internals as _internals
from fencekit import metrics
from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import (
    FenceError,
    MissingTokenError,
    commit_outcome_unknown,
    validate_token,
)

__all__ = [
    "AnyConnection",
    "AsyncFencedCursor",
    "FencedCursor",
    "async_set_token",
    "async_transaction",
    "install",
    "set_token",
    "transaction",
    "uninstall",
    "use_begin_path",
]

AnyConnection: TypeAlias = "psycopg.Connection[Any] | psycopg.AsyncConnection[Any]"
"""A psycopg 3 connection, sync or async: what the helpers shared by the twins take."""

SET_TOKEN = "SELECT set_config('fencekit.token', %s, true), set_config('fencekit.issuer', %s, true)"
_CLEAR = ("", "")  # (token, issuer) sent to clear what an earlier statement set
_IDLE = TransactionStatus.IDLE
_INTRANS = TransactionStatus.INTRANS
_STATE = "_fencekit_state"


class _State:
    """Per-connection bookkeeping, kept as an attribute of the psycopg connection."""

    __slots__ = (
        "dirty",
        "installed",
        "pinned",
        "previous_factory",
        "setter",
        "tracked",
        "tx_value",
    )

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
        # pinned: the (token, issuer) a transaction() block began with, for as long as the
        # block runs: psycopg forbids commit() inside it, so the transaction is the block's.
        self.pinned: tuple[str, str] | None = None


def _state(conn: AnyConnection) -> _State:
    state: _State | None = getattr(conn, _STATE, None)
    if state is None:
        state = _State()
        setattr(conn, _STATE, state)
    return state


def _forget_transaction(conn: AnyConnection) -> None:
    """A transaction boundary or savepoint rollback: what was set may no longer hold."""
    state = _state(conn)
    state.tx_value = None


def _track_transactions(conn: AnyConnection) -> None:
    """Declare that :func:`_forget_transaction` is called at every boundary of ``conn``."""
    state = _state(conn)
    state.tracked = True


def _is_tracked(conn: AnyConnection) -> bool:
    """True when ``conn`` is installed and :func:`_track_transactions` was declared for it."""
    state: _State | None = getattr(conn, _STATE, None)
    return state is not None and state.installed and state.tracked


def _scope_value() -> tuple[str, str] | None:
    """(token, issuer) of the current :func:`fencing` scope, as sent; None outside any."""
    token = current_token()
    return None if token is None else (str(token), current_issuer() or "")


def _checked_value(token: int, issuer: str | None) -> tuple[str, str]:
    """(token, issuer) as sent, for a validated token; ``fencing()`` checks the issuer name."""
    return str(token), fencing(token, issuer).issuer or ""


def _wanted(conn: AnyConnection) -> tuple[bool, tuple[str, str]]:
    """(must send set_config before the next statement, (token, issuer) to send)."""
    state = _state(conn)
    status = conn.pgconn.transaction_status
    if status == _IDLE:
        state.dirty = False  # a new transaction starts clean: nothing to clear
        state.tx_value = None
    elif status != _INTRANS:
        # Failed transaction (only ROLLBACK works) or broken connection: add nothing.
        return False, _CLEAR
    value = _scope_value()
    if value is not None:
        if state.pinned == value and status == _INTRANS:
            return False, value
        return not (state.tracked and state.tx_value == value), value
    return state.dirty, _CLEAR


# ---------------------------------------------------------------- BEGIN carries the token
#
# psycopg opens a transaction with its own round trip: BEGIN alone (conn.transaction(), or the
# implicit BEGIN before the first statement of a non-autocommit connection). fencekit sends
# "BEGIN; SET LOCAL fencekit.token = ..." in that round trip instead, as one simple query: the token
# costs no round trip, no pipeline and no extra protocol message. The token is a validated int
# and the issuer a quoted literal, so the query is built client-side like psycopg's own BEGIN.
# Sending it takes psycopg internals, kept in fencekit._psycopg_internals, so it is opt-in
# (use_begin_path()); when its import-time check fails (_internals.AVAILABLE is False) every
# transaction takes the pipeline path, opted in or not.


def _begin_path() -> bool:
    return _internals.ENABLED and _internals.AVAILABLE


def use_begin_path(enabled: bool = True) -> bool:
    """Opt in to (or out of) sending the token inside psycopg's own ``BEGIN``.

    Off by default: fencekit then uses psycopg's public API only, and the token rides a pipeline
    with the transaction's first statement (the same round trips, one statement more). On, it
    saves that statement by overriding private psycopg ``Transaction`` internals, checked at
    import (:mod:`fencekit._psycopg_internals`; docs/psycopg.md has the measured difference).
    Returns whether the BEGIN path is now in use: False when turned off, or when this psycopg
    lacks an internal it needs (``fencekit._psycopg_internals.missing()`` names them).
    """
    _internals.ENABLED = bool(enabled)
    return _begin_path()


def _set_token_sql(conn: AnyConnection, value: tuple[str, str]) -> bytes:
    # SET LOCAL, not SELECT set_config(): a utility statement is neither planned nor answered
    # with rows, which measured ~10 us against ~40 us of server time per transaction here.
    # Built by hand: psycopg's sql.Literal costs ~10 us a call, as much as the statement.
    token, issuer = value
    if not (token.isascii() and token.isdigit()):
        raise ValueError(f"not a validated token: {token!r}")  # tokens pass validate_token()
    issuer_sql = sql.Literal(issuer).as_bytes(conn) if issuer else b"''"
    return (
        b"SET LOCAL fencekit.token = '"
        + token.encode("ascii")
        + b"'; SET LOCAL fencekit.issuer = "
        + issuer_sql
    )


def _begin_sql(conn: AnyConnection) -> bytes:
    """The BEGIN psycopg would send for ``conn`` (isolation level, read only, deferrable)."""
    parts = [b"BEGIN"]
    if conn.isolation_level is not None:
        level = psycopg.IsolationLevel(conn.isolation_level).name.replace("_", " ")
        parts += [b"ISOLATION LEVEL", level.encode()]
    if conn.read_only is not None:
        parts.append(b"READ ONLY" if conn.read_only else b"READ WRITE")
    if conn.deferrable is not None:
        parts.append(b"DEFERRABLE" if conn.deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def _idle_outside_pipeline(conn: AnyConnection) -> bool:
    pgconn = conn.pgconn
    return bool(pgconn.transaction_status == _IDLE and pgconn.pipeline_status == PipelineStatus.OFF)


def _opens_with_begin(conn: AnyConnection) -> bool:
    """True when psycopg is about to send a BEGIN of its own before the next statement, and
    fencekit can send it instead, with the token (see :mod:`fencekit._psycopg_internals`)."""
    return _begin_path() and not conn.autocommit and _idle_outside_pipeline(conn)


def _begin_with_token(conn: psycopg.Connection[Any], value: tuple[str, str]) -> None:
    _internals.begin(conn, _begin_sql(conn) + b"; " + _set_token_sql(conn, value))


async def _async_begin_with_token(
    conn: psycopg.AsyncConnection[Any], value: tuple[str, str]
) -> None:
    await _internals.async_begin(conn, _begin_sql(conn) + b"; " + _set_token_sql(conn, value))


def _setter(conn: AnyConnection) -> Any:
    state = _state(conn)
    if state.setter is None or state.setter.closed:
        if isinstance(conn, psycopg.AsyncConnection):
            state.setter = psycopg.AsyncCursor(conn)
        else:
            state.setter = psycopg.Cursor(conn)
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


def _after(conn: AnyConnection, value: tuple[str, str]) -> None:
    state = _state(conn)
    if state.pinned != value:
        state.pinned = None  # another value was sent: the block's token no longer holds
    open_tx = conn.pgconn.transaction_status != _IDLE
    state.dirty = bool(value[0]) and open_tx
    state.tx_value = value if open_tx else None


def _count(exc: BaseException) -> None:
    """Count a rejection psycopg raised (it raises fencekit's classes itself:
    :mod:`fencekit._psycopg_errors`); metrics count each error object once."""
    if isinstance(exc, FenceError):
        metrics.record_rejection(exc)


# ---------------------------------------------------------------- cursors


class FencedCursor(psycopg.Cursor[Any]):
    """A cursor whose statements carry :func:`fencekit.current_token` (see :func:`install`)."""

    count_rejections = True

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
            if _opens_with_begin(conn):
                _begin_with_token(conn, value)  # replaces psycopg's own BEGIN round trip
                super().execute(_q(query), params, prepare=prepare, binary=binary)
            elif _piggybacks(query, params):
                with conn.pipeline():
                    _setter(conn).execute(SET_TOKEN, value)
                    super().execute(_q(query), params, prepare=prepare, binary=binary)
            else:
                self._fence_now(value)
                super().execute(_q(query), params, prepare=prepare, binary=binary)
            _after(conn, value)
            return self
        except psycopg.Error as exc:
            if self.count_rejections:
                _count(exc)
            raise

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
            if self.count_rejections:
                _count(exc)
            raise


class AsyncFencedCursor(psycopg.AsyncCursor[Any]):
    """Async twin of :class:`FencedCursor`."""

    count_rejections = True

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
            if _opens_with_begin(conn):
                await _async_begin_with_token(conn, value)
                await super().execute(_q(query), params, prepare=prepare, binary=binary)
            elif _piggybacks(query, params):
                async with conn.pipeline():
                    await _setter(conn).execute(SET_TOKEN, value)
                    await super().execute(_q(query), params, prepare=prepare, binary=binary)
            else:
                await _setter(conn).execute(SET_TOKEN, value)
                await super().execute(_q(query), params, prepare=prepare, binary=binary)
            _after(conn, value)
            return self
        except psycopg.Error as exc:
            if self.count_rejections:
                _count(exc)
            raise

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
            if self.count_rejections:
                _count(exc)
            raise


@cache
def fenced_cursor_class(base: type[Any], *, count_rejections: bool = True) -> type[Any]:
    """The fenced variant of a cursor class (``ClientCursor``, ``RawCursor``, a subclass...)."""
    fenced: type[Any] = AsyncFencedCursor if issubclass(base, psycopg.AsyncCursor) else FencedCursor
    if issubclass(base, fenced):
        return base  # already fenced: keep its error translation as it is
    if base in (psycopg.Cursor, psycopg.AsyncCursor):
        if count_rejections:
            return fenced
        bases: tuple[type[Any], ...] = (fenced,)
    else:
        bases = (fenced, base)
    return type(f"Fenced{base.__name__}", bases, {"count_rejections": count_rejections})


def install(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    *,
    count_rejections: bool = True,
) -> None:
    """Automatic mode: statements on ``conn`` carry the current :func:`fencing` token.

    Replaces ``conn.cursor_factory`` with its fenced variant (idempotent), and makes
    ``conn.transaction()`` opened inside a scope send the token with its BEGIN (no extra
    statement, no pipeline; without the BEGIN path, see the module docstring, the token rides
    the block's first statement). Server-side (named) cursors are not covered. Usable as
    ``psycopg_pool.ConnectionPool(configure=install)``.
    """
    state = _state(conn)
    factory = conn.cursor_factory
    fenced = fenced_cursor_class(cast(Any, factory), count_rejections=count_rejections)
    if factory is not fenced:
        if not state.installed:
            state.previous_factory = factory
        conn.cursor_factory = fenced
    _wrap_transaction(conn)
    state.installed = True


def uninstall(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Undo :func:`install`."""
    state = _state(conn)
    if state.installed and state.previous_factory is not None:
        conn.cursor_factory = state.previous_factory
    vars(conn).pop("transaction", None)
    state.installed = False
    state.previous_factory = None


# ---------------------------------------------------------------- explicit API


def _resolve(token: int | None, issuer: str | None = None) -> tuple[int, str | None]:
    """(token, issuer): the given ones, or the current scope's when ``token`` is None."""
    if token is None:
        token = current_token()
        if token is None:
            raise MissingTokenError()
        issuer = issuer or current_issuer()
    return validate_token(token), issuer


def _outer() -> tuple[str, str]:
    return _scope_value() or _CLEAR


@contextmanager
def _fenced_factory(conn: AnyConnection) -> Iterator[None]:
    """Temporarily install the fenced cursor on a connection that is not in automatic mode."""
    state = _state(conn)
    if state.installed:
        yield
        return
    factory = conn.cursor_factory
    conn.cursor_factory = fenced_cursor_class(cast(Any, factory))
    try:
        yield
    finally:
        conn.cursor_factory = factory


# A fenced block is one object, the transaction itself, rather than context managers nested
# around psycopg's: each generator-based layer measurably slowed a one-row transaction (its
# code runs with cold caches between two round trips), and psycopg's own conn.transaction()
# is one such layer.


def _token_tx(cls: Any, conn: AnyConnection, value: tuple[str, str], *args: Any) -> Any:
    """A ``cls`` block on ``conn`` whose BEGIN carries ``value``; see :class:`_TokenBlock`."""
    tx = cls(conn, *args)
    tx._fk_value = value
    tx._fk_tail = _set_token_sql(conn, value)  # what BeginHook appends to the BEGIN
    tx._fk_scope = None
    tx._fk_translate = False
    tx._fk_factory = None
    return tx


class _TokenBlock:
    """What a fenced block does around psycopg's transaction: state, scope, cursor factory.

    While the block runs its token is pinned (its statements need not resend it: psycopg
    forbids commit() inside a block, so the transaction is the block's). Blocks made by
    :func:`transaction` are also a :func:`fencing` scope, run their statements on fenced
    cursors, and raise fence rejections as :class:`~fencekit.errors.FenceError`.
    """

    connection: Any
    _fk_value: tuple[str, str]
    _fk_scope: fencing | None
    _fk_translate: bool
    _fk_factory: Any

    def _fk_enter(self) -> None:
        conn = self.connection
        if not _begins_with_token(conn):
            # Something began a transaction (or a pipeline) since the block was made: its
            # BEGIN, which was to carry the token, will not be sent.
            raise psycopg.ProgrammingError(
                "fencekit: the connection is no longer idle: enter the block returned by "
                "transaction() right away, before running anything else on the connection"
            )
        state = _state(conn)
        state.pinned, state.dirty, state.tx_value = self._fk_value, True, None
        if self._fk_scope is not None:
            self._fk_scope.__enter__()
            if not state.installed:
                factory = self._fk_factory = conn.cursor_factory
                conn.cursor_factory = fenced_cursor_class(factory)

    def _fk_exit(self) -> None:
        conn = self.connection
        state = _state(conn)
        state.pinned = None
        state.dirty = False
        if self._fk_scope is not None:
            if self._fk_factory is not None:
                conn.cursor_factory = self._fk_factory
                self._fk_factory = None
            self._fk_scope.__exit__(None, None, None)

    def _fk_raise(self, exc: BaseException | None) -> None:
        """Count the rejection ``exc`` is, if this block counts them (psycopg raises it)."""
        if self._fk_translate and exc is not None:
            _count(exc)

    def _fk_failed(self, exc: BaseException) -> None:
        """psycopg's enter or exit raised (COMMIT failed, the connection broke): undo, translate."""
        self._fk_exit()
        self._fk_raise(exc)

    def _fk_commit_failed(self, exc: BaseException) -> None:
        """COMMIT raised: a lost connection leaves the outcome unknown (a failover, a crash);
        say so with its own error rather than as a plain OperationalError (docs/ha.md)."""
        self._fk_failed(exc)
        if getattr(self, "force_rollback", False):
            return  # it was a ROLLBACK: nothing was committed
        token, issuer = self._fk_value
        unknown = commit_outcome_unknown(exc, int(token), issuer or None)
        if unknown is not None:
            raise unknown from exc

    def _fk_exited(self, suppressed: bool, exc_val: BaseException | None) -> bool:
        self._fk_exit()
        if not suppressed:
            self._fk_raise(exc_val)
        return suppressed


class _TokenTransaction(_TokenBlock, _internals.BeginHook, psycopg.Transaction):
    def __enter__(self) -> _TokenTransaction:
        self._fk_enter()
        try:
            return super().__enter__()
        except BaseException as exc:
            self._fk_failed(exc)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        try:
            suppressed = bool(super().__exit__(exc_type, exc_val, exc_tb))
        except BaseException as exc:
            if exc_val is None:
                self._fk_commit_failed(exc)
            else:
                self._fk_failed(exc)
            raise
        return self._fk_exited(suppressed, exc_val)


class _AsyncTokenTransaction(_TokenBlock, _internals.BeginHook, psycopg.AsyncTransaction):
    async def __aenter__(self) -> _AsyncTokenTransaction:
        self._fk_enter()
        try:
            return await super().__aenter__()
        except BaseException as exc:
            self._fk_failed(exc)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        try:
            suppressed = bool(await super().__aexit__(exc_type, exc_val, exc_tb))
        except BaseException as exc:
            if exc_val is None:
                self._fk_commit_failed(exc)
            else:
                self._fk_failed(exc)
            raise
        return self._fk_exited(suppressed, exc_val)


def _wrap_transaction(conn: AnyConnection) -> None:
    """Automatic mode: ``conn.transaction()`` inside a scope sends the token with its BEGIN.

    An instance attribute shadowing the method, removed by :func:`uninstall`; outside a scope,
    in pipeline mode or nested in an open transaction it is psycopg's own.
    """
    if "transaction" in vars(conn):
        return
    original: Any = type(conn).transaction
    cls = _AsyncTokenTransaction if isinstance(conn, psycopg.AsyncConnection) else _TokenTransaction

    def transaction(savepoint_name: str | None = None, force_rollback: bool = False) -> Any:
        value = _scope_value()
        if value is not None and _begins_with_token(conn):
            return _token_tx(cls, conn, value, savepoint_name, force_rollback)
        return original(conn, savepoint_name, force_rollback)

    vars(conn)["transaction"] = transaction


def _begins_with_token(conn: AnyConnection) -> bool:
    """True when a transaction block opened now can send the token with its BEGIN."""
    return _begin_path() and _idle_outside_pipeline(conn)


def _block(
    cls: Any,
    nested: Callable[..., Any],
    conn: AnyConnection,
    token: int | None,
    issuer: str | None,
    savepoint_name: str | None,
    force_rollback: bool,
) -> Any:
    """What :func:`transaction` returns: a ``cls`` block whose BEGIN carries the token, or,
    inside an open transaction or a pipeline, ``nested``'s block around psycopg's."""
    value, issuer = _resolve(token, issuer)
    scope = fencing(value, issuer)
    if not _begins_with_token(conn):
        return nested(conn, scope, savepoint_name, force_rollback)
    value_sent = (str(scope.token), scope.issuer or "")
    tx = _token_tx(cls, conn, value_sent, savepoint_name, force_rollback)
    tx._fk_scope = scope
    tx._fk_translate = True
    return tx


def transaction(
    conn: psycopg.Connection[Any],
    token: int | None = None,
    *,
    issuer: str | None = None,
    savepoint_name: str | None = None,
    force_rollback: bool = False,
) -> AbstractContextManager[psycopg.Transaction]:
    """``conn.transaction()`` whose statements carry ``token`` (default: the current scope's).

    The token is validated before anything is sent; the block is also a :func:`fencing` scope.
    Statements must run on cursors made inside the block (or ``conn.execute``). The token rides
    the block's BEGIN (or, without the BEGIN path, its first statement): no extra round trip.
    Nested inside an open transaction (a savepoint), it rides the block's first statement, and
    the outer transaction's token is restored on exit (one statement). ``issuer`` tags the
    token with its issuer (default: the scope's, when ``token`` is None).
    """
    block: AbstractContextManager[psycopg.Transaction] = _block(
        _TokenTransaction, _nested_transaction, conn, token, issuer, savepoint_name, force_rollback
    )
    return block


def _outer_to_restore(conn: AnyConnection, nested: bool) -> tuple[str, str] | None:
    """After a nested block set its token: the outer one to set again (None: nothing to do)."""
    state = _state(conn)
    if nested and state.dirty and not state.installed and _in_transaction(conn):
        return _outer()
    return None


def _restored(conn: AnyConnection, outer: tuple[str, str]) -> None:
    state = _state(conn)
    state.dirty = bool(outer[0])
    state.tx_value = None


@contextmanager
def _nested_transaction(
    conn: psycopg.Connection[Any], scope: fencing, savepoint_name: str | None, force_rollback: bool
) -> Iterator[psycopg.Transaction]:
    """:func:`transaction` inside an open transaction or a pipeline: psycopg's block."""
    nested = conn.pgconn.transaction_status != _IDLE
    committing = False
    try:
        with scope, _fenced_factory(conn), conn.transaction(savepoint_name, force_rollback) as tx:
            yield tx
            committing = True  # the body is done: what fails from here on is the COMMIT
    except psycopg.Error as exc:
        _count(exc)
        _raise_if_outcome_unknown(exc, scope, committing and not nested and not force_rollback)
        raise
    finally:
        outer = _outer_to_restore(conn, nested)
        if outer is not None:
            psycopg.Cursor(conn).execute(SET_TOKEN, outer)
            _restored(conn, outer)


def async_transaction(
    conn: psycopg.AsyncConnection[Any],
    token: int | None = None,
    *,
    issuer: str | None = None,
    savepoint_name: str | None = None,
    force_rollback: bool = False,
) -> AbstractAsyncContextManager[psycopg.AsyncTransaction]:
    """Async twin of :func:`transaction`."""
    block: AbstractAsyncContextManager[psycopg.AsyncTransaction] = _block(
        _AsyncTokenTransaction,
        _async_nested_transaction,
        conn,
        token,
        issuer,
        savepoint_name,
        force_rollback,
    )
    return block


@asynccontextmanager
async def _async_nested_transaction(
    conn: psycopg.AsyncConnection[Any],
    scope: fencing,
    savepoint_name: str | None,
    force_rollback: bool,
) -> AsyncIterator[psycopg.AsyncTransaction]:
    nested = conn.pgconn.transaction_status != _IDLE
    committing = False
    try:
        with scope, _fenced_factory(conn):
            async with conn.transaction(savepoint_name, force_rollback) as atx:
                yield atx
                committing = True  # the body is done: what fails from here on is the COMMIT
    except psycopg.Error as exc:
        _count(exc)
        _raise_if_outcome_unknown(exc, scope, committing and not nested and not force_rollback)
        raise
    finally:
        outer = _outer_to_restore(conn, nested)
        if outer is not None:
            await psycopg.AsyncCursor(conn).execute(SET_TOKEN, outer)
            _restored(conn, outer)


def _raise_if_outcome_unknown(exc: BaseException, scope: fencing, at_commit: bool) -> None:
    """A COMMIT cut off by a lost connection (a failover, a crash) leaves the outcome unknown:
    say so with its own error rather than as a plain OperationalError (docs/ha.md)."""
    if not at_commit or scope.token is None:
        return
    unknown = commit_outcome_unknown(exc, int(scope.token), scope.issuer or None)
    if unknown is not None:
        raise unknown from exc


def _in_transaction(conn: AnyConnection) -> bool:
    return bool(conn.pgconn.transaction_status == _INTRANS)


def _explicit(conn: AnyConnection) -> None:
    state = _state(conn)
    state.pinned = None
    state.dirty = False  # set by hand: automatic mode must not clear it
    state.tx_value = None  # and a scope's token must still be sent over it


def _check_open(conn: AnyConnection) -> None:
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
    params = _checked_value(value, issuer)
    psycopg.Cursor(conn).execute(SET_TOKEN, params)
    _explicit(conn)


async def async_set_token(
    conn: psycopg.AsyncConnection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Async twin of :func:`set_token`."""
    value, issuer = _resolve(token, issuer)
    _check_open(conn)
    params = _checked_value(value, issuer)
    await psycopg.AsyncCursor(conn).execute(SET_TOKEN, params)
    _explicit(conn)
