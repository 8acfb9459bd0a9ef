"""SQLAlchemy 2 plugin (sync and asyncio, psycopg driver): fence every transaction in a scope.

``fencekit.orm.install(target)`` accepts a ``sessionmaker``, ``Session``, ``Engine`` or
``Connection`` (or their asyncio twins). From then on, inside ``with fencekit.fencing(token):``
every statement those sessions or connections send carries the token transaction-locally, in
whichever transaction runs it: after commit and rollback, in savepoints (``begin_nested``), for
ORM flushes and Core / bulk ``update()`` / ``delete()`` alike.

How: the plugin puts :mod:`fencekit.psycopg`'s fenced cursor on the psycopg connections the
target uses, so ``set_config`` travels in one pipeline with the statement it guards (no extra
round trip), and a ``handle_error`` listener turns fence rejections into
:class:`~fencekit.errors.FenceError`. The fenced cursor is a property of the pooled psycopg
connection: once a connection has served an installed session, any code using it inside a
``fencing()`` scope is fenced too. Outside a scope nothing is sent.
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, ExceptionContext
from sqlalchemy.orm import Session, sessionmaker

from fencekit import metrics
from fencekit import psycopg as fk_psycopg
from fencekit.context import current_token
from fencekit.errors import translate

__all__ = ["install", "uninstall"]

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_sessionmaker,
    )

Target: TypeAlias = (
    "Engine | Connection | Session | sessionmaker[Any] | AsyncEngine | AsyncConnection"
    " | AsyncSession | async_sessionmaker[Any]"
)


def _install_on(connection: Connection) -> None:
    """Fence the psycopg connection under ``connection`` (cheap and idempotent)."""
    driver = connection.connection.driver_connection
    if fk_psycopg.is_tracked(driver):
        return  # installed before: the common case, once per transaction
    module = type(driver).__module__
    if not module.startswith("psycopg"):
        raise TypeError(
            f"fencekit.orm needs the psycopg (3) driver, got {type(driver).__name__} from "
            f"{module}: use a postgresql+psycopg:// URL"
        )
    # SQLAlchemy wraps driver errors itself; _on_error then translates them.
    fk_psycopg.install(cast(Any, driver), translate_errors=False)
    # The engine's boundary listeners (_listen_engine) let the cursor send the token once per
    # transaction instead of once per statement.
    fk_psycopg.track_transactions(driver)


def _on_error(ctx: ExceptionContext) -> BaseException | None:
    error = translate(ctx.original_exception)
    if error is None:
        return None
    metrics.record_rejection(error)
    return error


def _on_begin(connection: Connection) -> None:
    _install_on(connection)


def _on_session_begin(session: Session, transaction: Any, connection: Connection) -> None:
    _install_on(connection)
    _listen_engine(connection.engine)


def _count_unfenced(
    conn: Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> None:
    if current_token() is not None or context is None:
        return
    if not (context.isinsert or context.isupdate or context.isdelete):
        return
    table = getattr(getattr(context.compiled, "statement", None), "table", None)
    name = getattr(table, "name", None)
    if name is not None:
        # Label like the database does (schema-qualified) so both sides' counters line up.
        name = f"{getattr(table, 'schema', None) or conn.dialect.default_schema_name}.{name}"
    metrics.record_unfenced(name)


def _boundary(conn: Connection, *args: Any) -> None:
    """Transaction begin/end or savepoint rollback (which reverts transaction-local settings)."""
    dbapi = conn.connection.driver_connection if not conn.invalidated else None
    if dbapi is not None:
        fk_psycopg.forget_transaction(dbapi)


# Engines whose listeners are in place: event.contains() is too slow to ask at every begin.
_listening: weakref.WeakSet[Engine] = weakref.WeakSet()


def _listen_engine(engine: Engine, *, check: bool = False) -> None:
    if engine in _listening and not check:
        return
    _listening.add(engine)
    if not event.contains(engine, "handle_error", _on_error):
        event.listen(engine, "handle_error", _on_error)
        event.listen(engine, "before_cursor_execute", _count_unfenced)
    if not event.contains(engine, "begin", _boundary):
        # Kept by uninstall(): connections already tracked rely on them.
        for name in ("begin", "commit", "rollback", "rollback_savepoint"):
            event.listen(engine, name, _boundary)


def _resolve(target: Target) -> Engine | Connection | Session | sessionmaker[Any] | type[Session]:
    """The sync object that carries the events for ``target``."""
    if "sqlalchemy.ext.asyncio" not in sys.modules:
        # Not imported means no async object exists; importing it needs greenlet.
        return cast("Engine | Connection | Session | sessionmaker[Any]", target)
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_sessionmaker,
    )

    if isinstance(target, AsyncEngine):
        return target.sync_engine
    if isinstance(target, AsyncConnection):
        if target.sync_connection is None:
            raise ValueError("the AsyncConnection is not started: install it after connect()")
        return target.sync_connection
    if isinstance(target, AsyncSession):
        return target.sync_session
    if isinstance(target, async_sessionmaker):
        # Session events cannot be attached to an async_sessionmaker: give its sessions a
        # private sync Session subclass and listen on that, so other sessions are untouched.
        base: type[Session] = target.kw.get("sync_session_class") or Session
        if not getattr(base, "_fencekit_private", False):
            base = type(f"Fenced{base.__name__}", (base,), {"_fencekit_private": True})
            target.kw["sync_session_class"] = base
        return base
    return target


def install(target: Target) -> None:
    """Fence ``target``'s transactions with the current :func:`fencekit.fencing` token.

    Idempotent. Needs the psycopg 3 driver (``postgresql+psycopg://``, sync or async).
    """
    resolved = _resolve(target)
    if isinstance(resolved, Engine):
        _listen_engine(resolved, check=True)
        if not event.contains(resolved, "begin", _on_begin):
            event.listen(resolved, "begin", _on_begin)
    elif isinstance(resolved, Connection):
        _listen_engine(resolved.engine, check=True)
        if not resolved.closed and not resolved.invalidated:
            _install_on(resolved)
            fk_psycopg.forget_transaction(resolved.connection.driver_connection)
        if not event.contains(resolved, "begin", _on_begin):
            event.listen(resolved, "begin", _on_begin)
    elif isinstance(resolved, Session | sessionmaker) or issubclass(resolved, Session):
        if not event.contains(resolved, "after_begin", _on_session_begin):
            event.listen(resolved, "after_begin", _on_session_begin)
    else:
        raise TypeError(f"cannot install fencekit on {type(target).__name__}")


def uninstall(target: Target) -> None:
    """Remove the listeners :func:`install` added (connections already fenced stay fenced)."""
    resolved = _resolve(target)
    if isinstance(resolved, Engine | Connection):
        _listening.discard(resolved if isinstance(resolved, Engine) else resolved.engine)
    for name, fn in (
        ("begin", _on_begin),
        ("after_begin", _on_session_begin),
        ("handle_error", _on_error),
        ("before_cursor_execute", _count_unfenced),
    ):
        try:
            if event.contains(resolved, name, fn):
                event.remove(resolved, name, fn)
        except Exception:  # noqa: S112 - event name not valid for this target kind
            continue
