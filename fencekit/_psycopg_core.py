"""psycopg 3 adapter, the core both faces share: per-connection state, what to send and how.

:mod:`fencekit.psycopg` is the public face; its sync and asyncio halves
(:mod:`fencekit._psycopg_sync`, generated from :mod:`fencekit._psycopg_async`) only do what
these helpers decide, so a decision is written once for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg
from psycopg.abc import Query
from psycopg.pq import PipelineStatus

from fencekit import _psycopg_internals as _internals
from fencekit import metrics, wire
from fencekit.context import fencing
from fencekit.errors import (
    FenceError,
    commit_outcome_unknown,
)

AnyConnection: TypeAlias = "psycopg.Connection[Any] | psycopg.AsyncConnection[Any]"
"""A psycopg 3 connection, sync or async: what the helpers shared by the twins take."""

_STATE = "_fencekit_state"


class _State(wire.Wire):
    """Per-connection bookkeeping, kept as an attribute of the psycopg connection.

    Not tracked by default: raw psycopg cannot see a BEGIN that ``conn.transaction()`` sent
    outside a scope, so a statement resends the token unless a block pinned it; the SQLAlchemy
    plugin, which sees every boundary, declares it (:func:`_track_transactions`)."""

    __slots__ = ("begin", "installed", "previous_factories", "setter")

    def __init__(self) -> None:
        super().__init__(tracked=False)
        self.begin: tuple[Any, bytes] | None = None  # (characteristics, the BEGIN for them)
        self.installed = False
        self.previous_factories: tuple[Any, Any] | None = None
        self.setter: Any = None  # a plain cursor reused for set_config


def _state(conn: AnyConnection) -> _State:
    state: _State | None = getattr(conn, _STATE, None)
    if state is None:
        state = _State()
        setattr(conn, _STATE, state)
    return state


def _forget_transaction(conn: AnyConnection) -> None:
    """A transaction boundary or savepoint rollback: what was set may no longer hold."""
    _state(conn).forget()


def _track_transactions(conn: AnyConnection) -> None:
    """Declare that :func:`_forget_transaction` is called at every boundary of ``conn``."""
    _state(conn).tracked = True


def _is_tracked(conn: AnyConnection) -> bool:
    """True when ``conn`` is installed and :func:`_track_transactions` was declared for it."""
    state: _State | None = getattr(conn, _STATE, None)
    return state is not None and state.installed and state.tracked


def _next(conn: AnyConnection) -> wire.Value | None:
    return _state(conn).next(conn.pgconn.transaction_status, wire.scope_value())


# ---------------------------------------------------------------- BEGIN carries the token
#
# psycopg opens a transaction with its own round trip: BEGIN alone. fencekit sends "BEGIN; SET
# LOCAL fencekit.token = ..." in that round trip instead, as one simple query: the token costs no
# round trip, no pipeline and no extra protocol message. This takes psycopg internals, kept in
# fencekit._psycopg_internals; when its import-time check fails (_internals.AVAILABLE is False)
# every transaction takes the pipeline path.


def _begin_path() -> bool:
    return _internals.AVAILABLE


def _set_token_sql(value: wire.Value) -> bytes:
    # SET LOCAL, not SELECT set_config(): a utility statement is neither planned nor answered
    # with rows, which measured ~10 us against ~40 us of server time per transaction here.
    return wire.set_local(value, fresh=True).encode("ascii")


def _begin_sql(conn: AnyConnection) -> bytes:
    """The BEGIN psycopg would send for ``conn`` (isolation level, read only, deferrable)."""
    state = _state(conn)
    key = (conn.isolation_level, conn.read_only, conn.deferrable)
    if state.begin is None or state.begin[0] != key:
        state.begin = (key, _begin_text(conn))
    return state.begin[1]


def _begin_text(conn: AnyConnection) -> bytes:
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
    return bool(
        pgconn.transaction_status == wire.IDLE and pgconn.pipeline_status == PipelineStatus.OFF
    )


def _opens_with_begin(conn: AnyConnection) -> bool:
    """True when psycopg is about to send a BEGIN of its own before the next statement, and
    fencekit can send it instead, with the token (see :mod:`fencekit._psycopg_internals`)."""
    return _begin_path() and not conn.autocommit and _idle_outside_pipeline(conn)


def _begin_query(conn: AnyConnection, value: wire.Value) -> bytes:
    return _begin_sql(conn) + b"; " + _set_token_sql(value)


def _setter(conn: AnyConnection) -> Any:
    state = _state(conn)
    if state.setter is None or state.setter.closed:
        if isinstance(conn, psycopg.AsyncConnection):
            state.setter = psycopg.AsyncCursor(conn)
        else:
            state.setter = psycopg.Cursor(conn)
    return state.setter


def _alone(conn: AnyConnection, value: wire.Value) -> bytes | None:
    """The statement that sets ``value`` on its own, before a path that cannot share a
    pipeline; None when it would end with itself (autocommit, no transaction open): the path
    then runs with no token, and a fenced table refuses it as unfenced."""
    pgconn = conn.pgconn
    if conn.autocommit and pgconn.transaction_status == wire.IDLE:
        return None
    if pgconn.pipeline_status != PipelineStatus.OFF:
        return wire.set_config(value).encode("ascii")  # a pipeline takes one statement
    return wire.set_local(value, fresh=pgconn.transaction_status == wire.IDLE).encode("ascii")


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


def _after(conn: AnyConnection, value: wire.Value) -> None:
    _state(conn).sent(value, open_after=conn.pgconn.transaction_status != wire.IDLE)


def _count(exc: BaseException) -> None:
    """Count a rejection psycopg raised (it raises fencekit's classes itself:
    :mod:`fencekit._psycopg_errors`); metrics count each error object once."""
    if isinstance(exc, FenceError):
        metrics.record_rejection(exc)


# ---------------------------------------------------------------- cursors
#
# How the next statement carries what the wire says: "begin" (fencekit sends the BEGIN, with
# the token), "pipeline" (set_config and the statement in one pipeline), "alone" (a statement
# of its own first). _how() decides; the sync and async cursors only do it.


def _how(conn: AnyConnection, query: Query, params: object, shares: bool) -> str:
    if _opens_with_begin(conn):
        return "begin"
    return "pipeline" if shares and _piggybacks(query, params) else "alone"


@contextmanager
def _fenced_factory(conn: AnyConnection, fenced: Callable[[Any], Any]) -> Iterator[None]:
    """Temporarily install the fenced cursor on a connection that is not in automatic mode."""
    if _state(conn).installed:
        yield
        return
    factory = conn.cursor_factory
    conn.cursor_factory = fenced(factory)
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
    tx._fk_tail = _set_token_sql(value)  # what BeginHook appends to the BEGIN
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
    _fk_fenced: Any  # the face's fenced cursor class for a base class

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
        state.pin(self._fk_value)
        if self._fk_scope is not None:
            self._fk_scope.__enter__()
            if not state.installed:
                factory = self._fk_factory = conn.cursor_factory
                conn.cursor_factory = self._fk_fenced(factory)

    def _fk_exit(self) -> None:
        conn = self.connection
        state = _state(conn)
        state.unpin()
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
    scope = wire.resolve(token, issuer)
    if not _begins_with_token(conn):
        return nested(conn, scope, savepoint_name, force_rollback)
    value_sent = scope._sent
    tx = _token_tx(cls, conn, value_sent, savepoint_name, force_rollback)
    tx._fk_scope = scope
    tx._fk_translate = True
    return tx


def _outer_to_restore(conn: AnyConnection, nested: bool) -> tuple[str, str] | None:
    """After a nested block set its token: the outer one to set again (None: nothing to do)."""
    state = _state(conn)
    if nested and state.dirty and not state.installed and _in_transaction(conn):
        return wire.scope_value() or wire.CLEAR
    return None


def _restored(conn: AnyConnection, outer: tuple[str, str]) -> None:
    state = _state(conn)
    state.dirty, state.held = bool(outer[0]), None


def _raise_if_outcome_unknown(exc: BaseException, scope: fencing, at_commit: bool) -> None:
    """A COMMIT cut off by a lost connection (a failover, a crash) leaves the outcome unknown:
    say so with its own error rather than as a plain OperationalError (docs/ha.md)."""
    if not at_commit or scope.token is None:
        return
    unknown = commit_outcome_unknown(exc, int(scope.token), scope.issuer or None)
    if unknown is not None:
        raise unknown from exc


def _in_transaction(conn: AnyConnection) -> bool:
    return bool(conn.pgconn.transaction_status == wire.INTRANS)


def _explicit(conn: AnyConnection) -> None:
    state = _state(conn)
    state.pinned = None
    state.dirty = False  # set by hand: automatic mode must not clear it
    state.held = None  # and a scope's token must still be sent over it


def _check_open(conn: AnyConnection) -> None:
    if conn.autocommit and conn.pgconn.transaction_status == wire.IDLE:
        raise psycopg.ProgrammingError(
            "set_token() needs an open transaction: in autocommit mode the setting would end "
            "with its own statement; use fencekit.psycopg.transaction(conn, token) instead"
        )
