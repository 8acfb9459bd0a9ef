"""SQLAlchemy plugin, its errors: a fence rejection as both a FenceError and the DBAPIError
SQLAlchemy would have raised, and a fenced COMMIT that lost its connection as an outcome unknown.

:mod:`fencekit.sqlalchemy`'s ``handle_error`` listener builds them; its ``commit`` and ``begin``
listeners are :func:`_on_commit` and :func:`_on_begin_clear`.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, ExceptionContext

from fencekit.context import current_issuer, current_token
from fencekit.errors import CommitOutcomeUnknownError, FenceError, commit_outcome_unknown


class _SQLAlchemyRejection:
    """Mixin of the errors :func:`_rejection` builds: a FenceError that is a DBAPIError too.

    Both parents have a ``detail``: FenceError's (the rejection's DETAIL JSON, a dict) is kept;
    the notes SQLAlchemy adds with ``add_detail`` (e.g. "raised as a result of Query-invoked
    autoflush") go to ``sqlalchemy_details`` and are shown after the message.
    """

    sqlalchemy_details: list[str]
    _fk_parents: tuple[type[FenceError], type[sa_exc.DBAPIError]]

    def add_detail(self, msg: str) -> None:
        self.sqlalchemy_details.append(msg)

    def __str__(self) -> str:
        text = FenceError.__str__(cast(FenceError, self))
        return "\n".join([text, *(f"({d})" for d in self.sqlalchemy_details)])

    def __reduce__(self) -> tuple[Any, ...]:
        # The class is built at run time: pickle how to build it again, not its name.
        state = dict(vars(self))
        if "_info" in state:
            # psycopg's result handle does not pickle; ``orig`` (psycopg's own error, which
            # pickles its diagnostics) keeps them.
            state.update(_info=None, _pgconn=None)
        return _rebuild, (*self._fk_parents, cast(BaseException, self).args, state)


# One class per (fence error, SQLAlchemy error) pair, so that `except` clauses see one type.
_classes: dict[tuple[type[FenceError], type[sa_exc.DBAPIError]], type[FenceError]] = {}


def _rejection_class(fence: type[FenceError], dbapi: type[sa_exc.DBAPIError]) -> type[FenceError]:
    """The class that is both ``fence`` and ``dbapi``, named like ``fence``."""
    cls = _classes.get((fence, dbapi))
    if cls is None:
        namespace = {
            "__module__": fence.__module__,
            "__qualname__": fence.__qualname__,
            "__doc__": f"{fence.__doc__}\n\nRaised through SQLAlchemy: also a {dbapi.__name__}.",
            "_fk_parents": (fence, dbapi),
        }
        built = type(fence.__name__, (_SQLAlchemyRejection, fence, dbapi), namespace)
        cls = _classes.setdefault((fence, dbapi), cast("type[FenceError]", built))
    return cls


def _rebuild(
    fence: type[FenceError],
    dbapi: type[sa_exc.DBAPIError],
    args: tuple[Any, ...],
    state: dict[str, Any],
) -> FenceError:
    cls = _rejection_class(fence, dbapi)
    error = cls.__new__(cls, *args)
    vars(error).update(state)
    return error


def _rejection(error: FenceError, wrapped: sa_exc.DBAPIError) -> FenceError:
    """``error`` as an instance of its class and of ``wrapped``'s: SQLAlchemy's attributes
    (``statement``, ``params``, ``connection_invalidated``...) from ``wrapped``, fencekit's
    (``table``, ``key``, ``token``, ``fence``, ``detail``...) from ``error``."""
    state = {**vars(wrapped), **vars(error), "sqlalchemy_details": list(wrapped.detail)}
    combined = _rebuild(type(error), type(wrapped), error.args, state)
    combined.__cause__ = error.__cause__
    return combined


_COMMITTING = "fencekit_committing"
_unknown_classes: dict[type[sa_exc.DBAPIError], type[CommitOutcomeUnknownError]] = {}


def _on_commit(conn: Connection) -> None:
    """Before COMMIT: remember the scope's token, so that a connection lost during the COMMIT
    is reported as an outcome unknown under it (docs/ha.md)."""
    token = current_token()
    if token is not None:
        conn.info[_COMMITTING] = (token, current_issuer())


def _on_begin_clear(conn: Connection) -> None:
    conn.info.pop(_COMMITTING, None)


def _outcome_unknown(ctx: ExceptionContext) -> BaseException | None:
    """A fenced COMMIT that lost its connection: CommitOutcomeUnknownError, also the
    DBAPIError SQLAlchemy would have raised (its ``except`` clauses keep working)."""
    conn = ctx.connection
    pending = conn.info.pop(_COMMITTING, None) if conn is not None else None
    if pending is None or ctx.execution_context is not None:
        return None
    unknown = commit_outcome_unknown(ctx.original_exception, *pending)
    wrapped = ctx.sqlalchemy_exception
    if unknown is None or not isinstance(wrapped, sa_exc.DBAPIError):
        return unknown
    cls = _unknown_classes.get(type(wrapped))
    if cls is None:
        cls = type(
            "CommitOutcomeUnknownError",
            (CommitOutcomeUnknownError, type(wrapped)),
            {"__module__": CommitOutcomeUnknownError.__module__},
        )
        _unknown_classes[type(wrapped)] = cls
    combined = cls.__new__(cls, *unknown.args)
    vars(combined).update({**vars(wrapped), **vars(unknown)})
    combined.__cause__ = ctx.original_exception
    return combined
