"""psycopg 3 adapter (sync and async): carry the fencing token into each transaction.

The token always travels transaction-locally (``SET LOCAL``), so a pooled connection or a
transaction-mode pgbouncer never hands it to the next client; with a tagged token goes
``fencekit.issuer`` (``fencing(token, issuer=...)``, set by a ``Lease``): a resource bound to
another issuer rejects the write (YF007). What to send, and when, is :mod:`fencekit.wire`'s
answer; this module only carries it, without a round trip of its own:

- **In the BEGIN** (the default). Where psycopg is about to open a transaction
  (``conn.transaction()`` on an idle connection, or the implicit BEGIN before the first
  statement of a connection not in autocommit mode), fencekit sends ``BEGIN; SET LOCAL
  fencekit.token = '34'`` as that round trip's one simple query. This needs psycopg internals,
  all in :mod:`fencekit._psycopg_internals`, checked at import; when the check fails, importing
  this module warns (``RuntimeWarning``) and every transaction takes the path below.
- **In a pipeline with the statement.** Where no BEGIN is coming (autocommit, a scope entered
  in a transaction already open, pipeline mode), the fenced cursor sends ``SELECT
  set_config(...)`` in one psycopg pipeline with the statement it guards. A statement that may
  hold several (a ``Composed``, or text with ``;`` and no parameters), ``copy()`` and named
  cursors cannot share a pipeline: the token goes as a statement of its own before them.

- :func:`transaction` / :func:`async_transaction`: a transaction block fenced with a token.
- :func:`set_token` / :func:`async_set_token`: fence the transaction already open (one statement).
- :func:`install`: automatic mode; every statement the connection runs inside a
  :func:`fencekit.fencing` scope carries the scope's token (works as psycopg_pool's ``configure``).

Fence rejections are raised as :class:`~fencekit.errors.FenceError` subclasses (psycopg raises
them itself: :mod:`fencekit._psycopg_errors`).
"""

from __future__ import annotations

import warnings
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
from psycopg.abc import Params, Query
from psycopg.pq import PipelineStatus

from fencekit import _psycopg_internals as _internals
from fencekit import metrics, wire
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
    "is_installed",
    "set_token",
    "transaction",
    "uninstall",
]

AnyConnection: TypeAlias = "psycopg.Connection[Any] | psycopg.AsyncConnection[Any]"
"""A psycopg 3 connection, sync or async: what the helpers shared by the twins take."""

_STATE = "_fencekit_state"

if not _internals.AVAILABLE:
    warnings.warn(
        f"fencekit.psycopg: psycopg {psycopg.__version__} lacks "
        f"{', '.join(_internals.missing())}: the token rides a pipeline with each "
        "transaction's first statement instead of its BEGIN (one statement more; "
        "docs/psycopg.md)",
        RuntimeWarning,
        stacklevel=2,
    )


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


def _fence_before(conn: psycopg.Connection[Any]) -> None:
    """Before ``copy()`` or a named cursor's statement: what the wire says, on its own."""
    value = _next(conn)
    if value is None:
        return
    if _opens_with_begin(conn):
        _internals.begin(conn, _begin_query(conn, value))
    else:
        text = _alone(conn, value)
        if text is None:
            return
        _setter(conn).execute(text)
    _after(conn, value)


async def _async_fence_before(conn: psycopg.AsyncConnection[Any]) -> None:
    value = _next(conn)
    if value is None:
        return
    if _opens_with_begin(conn):
        await _internals.async_begin(conn, _begin_query(conn, value))
    else:
        text = _alone(conn, value)
        if text is None:
            return
        await _setter(conn).execute(text)
    _after(conn, value)


class FencedCursor(psycopg.Cursor[Any]):
    """A cursor whose statements carry :func:`fencekit.current_token` (see :func:`install`)."""

    count_rejections = True

    def _fenced(
        self, run: Callable[[], object], query: Query, params: object, shares: bool
    ) -> None:
        conn = self.connection
        try:
            value = _next(conn)
            if value is None:
                run()
                return
            how = _how(conn, query, params, shares)
            if how == "begin":
                _internals.begin(conn, _begin_query(conn, value))  # psycopg's BEGIN round trip
                run()
            elif how == "pipeline":
                with conn.pipeline():
                    _setter(conn).execute(wire.set_config(value).encode("ascii"))
                    run()
            else:
                text = _alone(conn, value)
                if text is not None:
                    _setter(conn).execute(text)
                run()
            _after(conn, value)
        except psycopg.Error as exc:
            if self.count_rejections:
                _count(exc)
            raise

    def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> FencedCursor:
        parent: Any = super()
        self._fenced(
            lambda: parent.execute(query, params, prepare=prepare, binary=binary),
            query,
            params,
            True,
        )
        return self

    def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        parent: Any = super()
        self._fenced(
            lambda: parent.executemany(query, params_seq, returning=returning), query, 1, True
        )

    def copy(self, statement: Query, params: Params | None = None, **kwargs: Any) -> Any:
        _fence_before(self.connection)  # COPY cannot share a pipeline
        return super().copy(statement, params, **kwargs)


class AsyncFencedCursor(psycopg.AsyncCursor[Any]):
    """Async twin of :class:`FencedCursor`."""

    count_rejections = True

    async def _fenced(
        self, run: Callable[[], Any], query: Query, params: object, shares: bool
    ) -> None:
        conn = self.connection
        try:
            value = _next(conn)
            if value is None:
                await run()
                return
            how = _how(conn, query, params, shares)
            if how == "begin":
                await _internals.async_begin(conn, _begin_query(conn, value))
                await run()
            elif how == "pipeline":
                async with conn.pipeline():
                    await _setter(conn).execute(wire.set_config(value).encode("ascii"))
                    await run()
            else:
                text = _alone(conn, value)
                if text is not None:
                    await _setter(conn).execute(text)
                await run()
            _after(conn, value)
        except psycopg.Error as exc:
            if self.count_rejections:
                _count(exc)
            raise

    async def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> AsyncFencedCursor:
        parent: Any = super()
        await self._fenced(
            lambda: parent.execute(query, params, prepare=prepare, binary=binary),
            query,
            params,
            True,
        )
        return self

    async def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        parent: Any = super()
        await self._fenced(
            lambda: parent.executemany(query, params_seq, returning=returning), query, 1, True
        )

    @asynccontextmanager
    async def copy(
        self, statement: Query, params: Params | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        await _async_fence_before(self.connection)  # COPY cannot share a pipeline
        async with super().copy(statement, params, **kwargs) as copy:
            yield copy


class FencedServerCursor(psycopg.ServerCursor[Any]):
    """A named (server-side) cursor whose DECLARE and FETCHes run under the scope's token."""

    def execute(self, query: Query, params: Params | None = None, **kwargs: Any) -> Any:
        _fence_before(self.connection)
        return super().execute(query, params, **kwargs)

    def fetchone(self) -> Any:
        _fence_before(self.connection)  # a FETCH runs the query further
        return super().fetchone()

    def fetchmany(self, size: int = 0) -> list[Any]:
        _fence_before(self.connection)
        return super().fetchmany(size)

    def fetchall(self) -> list[Any]:
        _fence_before(self.connection)
        return super().fetchall()


class AsyncFencedServerCursor(psycopg.AsyncServerCursor[Any]):
    """Async twin of :class:`FencedServerCursor`."""

    async def execute(self, query: Query, params: Params | None = None, **kwargs: Any) -> Any:
        await _async_fence_before(self.connection)
        return await super().execute(query, params, **kwargs)

    async def fetchone(self) -> Any:
        await _async_fence_before(self.connection)
        return await super().fetchone()

    async def fetchmany(self, size: int = 0) -> list[Any]:
        await _async_fence_before(self.connection)
        return await super().fetchmany(size)

    async def fetchall(self) -> list[Any]:
        await _async_fence_before(self.connection)
        return await super().fetchall()


@cache
def fenced_cursor_class(base: type[Any], *, count_rejections: bool = True) -> type[Any]:
    """The fenced variant of a cursor class (``ClientCursor``, ``RawCursor``, a subclass...)."""
    if issubclass(base, psycopg.AsyncServerCursor | psycopg.ServerCursor):
        server = AsyncFencedServerCursor if issubclass(base, psycopg.AsyncServerCursor) else None
        fenced_server: type[Any] = server or FencedServerCursor
        if issubclass(base, fenced_server) or base in (
            psycopg.ServerCursor,
            psycopg.AsyncServerCursor,
        ):
            return fenced_server if not issubclass(base, fenced_server) else base
        return type(f"Fenced{base.__name__}", (fenced_server, base), {})
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


def install(conn: AnyConnection, *, translate_errors: bool = True) -> None:
    """Automatic mode: statements on ``conn`` carry the current :func:`fencing` token.

    Replaces ``conn.cursor_factory`` and ``conn.server_cursor_factory`` with their fenced
    variants (idempotent), and makes ``conn.transaction()`` opened inside a scope send the token
    with its BEGIN. ``copy()`` and named cursors carry it too. Usable as
    ``psycopg_pool.ConnectionPool(configure=install)``. With ``translate_errors=False`` (a layer
    above counts them, as the SQLAlchemy plugin does) rejections are not counted here; psycopg
    raises fencekit's classes either way.
    """
    if not isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        raise TypeError(
            "fencekit.psycopg.install() takes a psycopg.Connection or psycopg.AsyncConnection "
            f"(psycopg 3), not {type(conn).__module__}.{type(conn).__name__}: for psycopg2 "
            "use fencekit.psycopg2.install(), for a pool psycopg_pool's configure=install"
        )
    state = _state(conn)
    factories = (conn.cursor_factory, conn.server_cursor_factory)
    fenced = fenced_cursor_class(cast(Any, factories[0]), count_rejections=translate_errors)
    if not state.installed:
        state.previous_factories = factories
    conn.cursor_factory = fenced
    conn.server_cursor_factory = fenced_cursor_class(cast(Any, factories[1]))
    _wrap_transaction(conn)
    state.installed = True


def uninstall(conn: AnyConnection) -> None:
    """Undo :func:`install`."""
    state = _state(conn)
    if state.installed and state.previous_factories is not None:
        conn.cursor_factory, conn.server_cursor_factory = state.previous_factories
    vars(conn).pop("transaction", None)
    state.installed = False
    state.previous_factories = None


def is_installed(conn: object) -> bool:
    """Whether ``conn`` (a psycopg 3 connection) is in automatic mode."""
    state: _State | None = getattr(conn, _STATE, None)
    return state is not None and state.installed


# ---------------------------------------------------------------- explicit API


def _resolve(token: int | None, issuer: str | None = None) -> tuple[int, str | None]:
    """(token, issuer): the given ones, or the current scope's when ``token`` is None."""
    if token is None:
        token = current_token()
        if token is None:
            raise MissingTokenError()
        issuer = issuer or current_issuer()
    return validate_token(token), issuer


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
                conn.cursor_factory = fenced_cursor_class(factory)

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
        value = wire.scope_value()
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
        return wire.scope_value() or wire.CLEAR
    return None


def _restored(conn: AnyConnection, outer: tuple[str, str]) -> None:
    state = _state(conn)
    state.dirty, state.held = bool(outer[0]), None


@contextmanager
def _nested_transaction(
    conn: psycopg.Connection[Any], scope: fencing, savepoint_name: str | None, force_rollback: bool
) -> Iterator[psycopg.Transaction]:
    """:func:`transaction` inside an open transaction or a pipeline: psycopg's block."""
    nested = conn.pgconn.transaction_status != wire.IDLE
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
            psycopg.Cursor(conn).execute(wire.set_local(outer))
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
    nested = conn.pgconn.transaction_status != wire.IDLE
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
            await psycopg.AsyncCursor(conn).execute(wire.set_local(outer))
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


def set_token(
    conn: psycopg.Connection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Fence the transaction open on ``conn`` (or the one psycopg opens implicitly).

    One statement, so one round trip (two if it also opens the transaction); prefer
    :func:`transaction` or :func:`install`, which ride the next statement instead.
    """
    value, issuer = _resolve(token, issuer)
    _check_open(conn)
    psycopg.Cursor(conn).execute(wire.set_local(wire.checked(value, issuer)))
    _explicit(conn)


async def async_set_token(
    conn: psycopg.AsyncConnection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Async twin of :func:`set_token`."""
    value, issuer = _resolve(token, issuer)
    _check_open(conn)
    await psycopg.AsyncCursor(conn).execute(wire.set_local(wire.checked(value, issuer)))
    _explicit(conn)
