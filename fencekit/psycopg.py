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
from typing import Any, cast

import psycopg

from fencekit import _psycopg_async, _psycopg_sync, wire
from fencekit import _psycopg_internals as _internals
from fencekit._psycopg_async import (
    AsyncFencedCursor,
    _AsyncTokenTransaction,
    async_set_token,
    async_transaction,
)
from fencekit._psycopg_core import (
    _STATE,
    AnyConnection,
    _begins_with_token,
    _State,
    _state,
    _token_tx,
)

# The boundary hooks the SQLAlchemy plugin calls (it sees every transaction boundary).
from fencekit._psycopg_core import _forget_transaction as _forget_transaction
from fencekit._psycopg_core import _is_tracked as _is_tracked
from fencekit._psycopg_core import _track_transactions as _track_transactions
from fencekit._psycopg_sync import (
    FencedCursor,
    _TokenTransaction,
    set_token,
    transaction,
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

if not _internals.AVAILABLE:
    warnings.warn(
        f"fencekit.psycopg: psycopg {psycopg.__version__} lacks "
        f"{', '.join(_internals.missing())}: the token rides a pipeline with each "
        "transaction's first statement instead of its BEGIN (one statement more; "
        "docs/psycopg.md)",
        RuntimeWarning,
        stacklevel=2,
    )


def fenced_cursor_class(base: type[Any], *, count_rejections: bool = True) -> type[Any]:
    """The fenced variant of a cursor class (``ClientCursor``, ``RawCursor``, a subclass...)."""
    asynchronous = issubclass(base, psycopg.AsyncCursor | psycopg.AsyncServerCursor)
    face = _psycopg_async if asynchronous else _psycopg_sync
    fenced: type[Any] = face.fenced_class(base, count_rejections)
    return fenced


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
