"""psycopg 3 adapter, sync form.

Generated from ``fencekit/_psycopg_async.py``
by ``scripts/async_to_sync.py``: edit that file, not this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from types import TracebackType
from typing import Any

import psycopg
from psycopg.abc import Params, Query

from fencekit import _psycopg_internals as _internals
from fencekit import wire
from fencekit._psycopg_core import (
    _after,
    _alone,
    _begin_query,
    _block,
    _check_open,
    _count,
    _explicit,
    _fenced_factory,
    _how,
    _next,
    _opens_with_begin,
    _outer_to_restore,
    _raise_if_outcome_unknown,
    _restored,
    _setter,
    _TokenBlock,
)
from fencekit.context import fencing


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


class FencedCursor(psycopg.Cursor[Any]):
    """A cursor whose statements carry :func:`fencekit.current_token` (see
    :func:`fencekit.psycopg.install`)."""

    count_rejections = True

    def _fenced(self, run: Callable[[], Any], query: Query, params: object, shares: bool) -> None:
        conn = self.connection
        try:
            value = _next(conn)
            if value is None:
                run()
                return
            how = _how(conn, query, params, shares)
            if how == "begin":
                # psycopg's BEGIN round trip, with the token
                _internals.begin(conn, _begin_query(conn, value))
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

    @contextmanager
    def copy(self, statement: Query, params: Params | None = None, **kwargs: Any) -> Iterator[Any]:
        _fence_before(self.connection)  # COPY cannot share a pipeline
        with super().copy(statement, params, **kwargs) as copy:
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


@cache
def fenced_class(base: type[Any], count_rejections: bool = True) -> type[Any]:
    """The fenced variant of a cursor class of this form (``ClientCursor``, a subclass...)."""
    if issubclass(base, psycopg.ServerCursor):
        if issubclass(base, FencedServerCursor):
            return base
        if base is psycopg.ServerCursor:
            return FencedServerCursor
        return type(f"Fenced{base.__name__}", (FencedServerCursor, base), {})
    if issubclass(base, FencedCursor):
        return base  # already fenced: keep its error translation as it is
    if base is psycopg.Cursor:
        if count_rejections:
            return FencedCursor
        bases: tuple[type[Any], ...] = (FencedCursor,)
    else:
        bases = (FencedCursor, base)
    return type(f"Fenced{base.__name__}", bases, {"count_rejections": count_rejections})


class _TokenTransaction(_TokenBlock, _internals.BeginHook, psycopg.Transaction):
    _fk_fenced = staticmethod(fenced_class)

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
        _TokenTransaction,
        _nested_transaction,
        conn,
        token,
        issuer,
        savepoint_name,
        force_rollback,
    )
    return block


@contextmanager
def _nested_transaction(
    conn: psycopg.Connection[Any],
    scope: fencing,
    savepoint_name: str | None,
    force_rollback: bool,
) -> Iterator[psycopg.Transaction]:
    """:func:`transaction` inside an open transaction or a pipeline: psycopg's block."""
    nested = conn.pgconn.transaction_status != wire.IDLE
    committing = False
    try:
        with scope, _fenced_factory(conn, fenced_class):
            block = conn.transaction(savepoint_name, force_rollback)
            with block as tx:
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


def set_token(
    conn: psycopg.Connection[Any], token: int | None = None, *, issuer: str | None = None
) -> None:
    """Fence the transaction open on ``conn`` (or the one psycopg opens implicitly).

    One statement, so one round trip (two if it also opens the transaction); prefer
    :func:`transaction` or :func:`install`, which ride the next statement instead.
    """
    scope = wire.resolve(token, issuer)
    _check_open(conn)
    psycopg.Cursor(conn).execute(wire.set_local(scope._sent))
    _explicit(conn)
