"""SQLAlchemy 2 plugin (sync and asyncio; psycopg, psycopg2, asyncpg): fence every transaction.

``fencekit.sqlalchemy.install(target)`` accepts a ``sessionmaker``, ``Session``, ``Engine`` or
``Connection`` (or their asyncio twins). From then on, inside ``with fencekit.fencing(token):``
every statement those sessions or connections send carries the token transaction-locally, in
whichever transaction runs it: after commit and rollback, in savepoints (``begin_nested``), for
ORM flushes and Core / bulk ``update()`` / ``delete()`` alike.

How: the plugin puts :mod:`fencekit.psycopg`'s fenced cursor on the psycopg connections the
target uses, so the token travels with the transaction's BEGIN or in one pipeline with the
statement it guards (no extra round trip), and a ``handle_error`` listener turns fence rejections
into :class:`~fencekit.errors.FenceError` instances that are also the
:class:`sqlalchemy.exc.DBAPIError` SQLAlchemy would have raised. The fenced cursor is a property
of the pooled psycopg connection: once a connection has served an installed session, any code
using it inside a ``fencing()`` scope is fenced too. Outside a scope nothing is sent.

When the cursor factory is put in place matters: SQLAlchemy 2 creates a statement's cursor
*before* it autobegins the transaction (``Connection._execute_context``), so a ``begin``
listener comes too late for the first statement of a commit-as-you-go or ``AUTOCOMMIT``
connection that the pool has just opened. An installed engine therefore fences every psycopg
connection its pool hands out (the pool's ``checkout`` event, whatever made the pool open it),
and an installed ``Connection`` fences its psycopg connection before each statement
(``before_execute``, which also covers the connection it reopens after an invalidation).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import psycopg
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, ExceptionContext
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from fencekit import metrics, wire
from fencekit import psycopg as fk_psycopg
from fencekit._sqlalchemy_errors import _on_begin_clear, _on_commit, _outcome_unknown, _rejection
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


SUPPORTED_DRIVERS = ("psycopg", "psycopg2", "asyncpg")
"""SQLAlchemy drivers (``postgresql+<driver>://``) the plugin fences."""


def _check_driver(dialect: Any) -> None:
    """Refuse, at install, an engine whose driver fencekit cannot carry the token through."""
    if dialect.name != "postgresql" or dialect.driver not in SUPPORTED_DRIVERS:
        raise TypeError(
            f"fencekit.sqlalchemy does not support {dialect.name}+{dialect.driver}: use one of "
            + ", ".join(f"postgresql+{d}://" for d in SUPPORTED_DRIVERS)
        )


def _fence_driver(driver: Any) -> None:
    """Fence a pooled driver connection (cheap and idempotent)."""
    if fk_psycopg._is_tracked(driver):
        return  # installed before: the common case
    if isinstance(driver, psycopg.Connection | psycopg.AsyncConnection):
        # SQLAlchemy wraps driver errors itself; _on_error then counts them.
        fk_psycopg.install(driver, translate_errors=False)
        # The engine's boundary listeners (_listen_engine) let the cursor send the token once
        # per transaction instead of once per statement.
        fk_psycopg._track_transactions(driver)
        return
    # By the classes' modules (an installed asyncpg connection's class is fencekit's subclass).
    modules = {cls.__module__.split(".")[0] for cls in type(driver).__mro__}
    module = type(driver).__module__.split(".")[0]
    if "psycopg2" in modules:
        from fencekit import psycopg2 as fk_psycopg2

        if not fk_psycopg2.is_installed(driver):
            fk_psycopg2.install(driver, translate_errors=False)  # _on_error translates
        return
    if "asyncpg" in modules:
        from fencekit import asyncpg as fk_asyncpg

        if not fk_asyncpg.is_installed(driver):
            fk_asyncpg.install(driver)  # its BEGIN carries the token
        return
    raise TypeError(
        f"fencekit.sqlalchemy does not support the {module} driver "
        f"({type(driver).__name__}): use one of "
        + ", ".join(f"postgresql+{d}://" for d in SUPPORTED_DRIVERS)
    )


def _install_on(connection: Connection) -> None:
    """Fence the psycopg connection under ``connection`` (reconnecting it if invalidated)."""
    _fence_driver(connection.connection.driver_connection)


def _on_checkout(
    dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection
) -> None:
    # Every connection the pool hands out, before anything can make a cursor on it: new ones
    # (first use, growth, overflow, recycle, invalidation, dispose) and pooled ones alike.
    _fence_driver(record.driver_connection)


def _on_execute(
    connection: Connection, clause: Any, multiparams: Any, params: Any, options: Any
) -> tuple[Any, Any, Any]:
    # Before the statement's cursor exists (SQLAlchemy creates it before autobegin).
    _install_on(connection)
    return clause, multiparams, params  # retval=True: no wrapper, see _has()


def _on_error(ctx: ExceptionContext) -> BaseException | None:
    original = ctx.original_exception
    unknown = _outcome_unknown(ctx)
    if unknown is not None:
        return unknown
    if ctx.engine is not None and ctx.engine in _untranslated:
        return None
    error = translate(original)
    if error is None:
        return None
    metrics.record_rejection(error)  # once: a fenced cursor may have counted it already
    wrapped: BaseException | None = ctx.sqlalchemy_exception
    if isinstance(wrapped, sa_exc.DBAPIError):
        return _rejection(error, wrapped)
    return error


def _on_begin(connection: Connection) -> None:
    _install_on(connection)


def _on_session_begin(session: Session, transaction: Any, connection: Connection) -> None:
    _install_on(connection)
    if _untranslated and (session in _untranslated or type(session) in _untranslated):
        _untranslated.add(connection.engine)
    _listen_engine(connection.engine)


def _count_unfenced(
    conn: Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> tuple[str, Any]:
    if current_token() is None and context is not None and _writes(context):
        _count_unfenced_write(conn, context)
    if conn.dialect.driver == "asyncpg":
        _asyncpg_catch_up(conn, cursor)
    return statement, parameters  # retval=True: no wrapper, see _has()


def _asyncpg_catch_up(conn: Connection, cursor: Any) -> None:
    """asyncpg: the token rides the transaction's BEGIN. A scope entered (or left) after the
    BEGIN costs one statement, sent here on the statement's own cursor before it runs."""
    from fencekit import asyncpg as fk_asyncpg

    driver: Any = conn.connection.driver_connection
    if driver.is_in_transaction():
        state = fk_asyncpg._state(driver)
        value = state.next(wire.INTRANS, wire.scope_value())
        if value is not None:  # one statement: SQLAlchemy's asyncpg cursor prepares it
            cursor.execute(wire.set_config(value))
            state.sent(value, open_after=True)


def _writes(context: Any) -> bool:
    return bool(context.isinsert or context.isupdate or context.isdelete)


def _count_unfenced_write(conn: Connection, context: Any) -> None:
    table = getattr(getattr(context.compiled, "statement", None), "table", None)
    name = getattr(table, "name", None)
    if name is not None:
        # Label like the database does (schema-qualified) so both sides' counters line up.
        name = f"{getattr(table, 'schema', None) or conn.dialect.default_schema_name}.{name}"
    metrics.record_unfenced(name)


def _boundary(conn: Connection, *args: Any) -> None:
    """Transaction begin/end or savepoint rollback (which reverts transaction-local settings).
    (psycopg2 and asyncpg connections read their transaction status instead.)"""
    dbapi = conn.connection.driver_connection if not conn.invalidated else None
    if isinstance(dbapi, psycopg.Connection | psycopg.AsyncConnection):
        fk_psycopg._forget_transaction(dbapi)


def _has(listeners: Iterable[Any], fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is among ``listeners``, one event's listener collection.

    Not ``event.contains()``: SQLAlchemy's registry is keyed by the id() of the object passed to
    ``listen()``, and listeners can outlive that object (an Engine's ``handle_error`` listeners
    live on its dialect, which the ORM's compiled caches keep; ``dispose()`` copies the pool's
    to the new pool), so a new engine at a reused address looked installed while it was not.
    Listeners are compared as stored: ``before_*`` ones are registered with ``retval=True``,
    which SQLAlchemy stores unwrapped.
    """
    return any(listener is fn for listener in listeners)


# Engines whose listeners are in place: looking at the collections at every begin is slower.
_listening: weakref.WeakSet[Engine] = weakref.WeakSet()


def _listen_engine(engine: Engine, *, check: bool = False) -> None:
    if engine in _listening and not check:
        return
    _listening.add(engine)
    if not _has(engine.dialect.dispatch.handle_error, _on_error):
        event.listen(engine, "handle_error", _on_error)
    if not _has(engine.dispatch.before_cursor_execute, _count_unfenced):
        event.listen(engine, "before_cursor_execute", _count_unfenced, retval=True)
    if not _has(engine.dispatch.commit, _on_commit):
        event.listen(engine, "commit", _on_commit)
        event.listen(engine, "begin", _on_begin_clear)
    if not _has(engine.dispatch.begin, _boundary):
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


def _listen_connection(target: Engine | Connection) -> None:
    if not _has(target.dispatch.begin, _on_begin):
        event.listen(target, "begin", _on_begin)
    if not _has(target.dispatch.before_execute, _on_execute):
        # Connections checked out before install(), and an installed Connection's psycopg
        # connection after it reconnects, are fenced before their next statement's cursor.
        event.listen(target, "before_execute", _on_execute, retval=True)


# Session targets (instances, classes, a sessionmaker's class) listening for after_begin: their
# events are class-level or per instance, so they are remembered here (see _has()).
_sessions_listening: weakref.WeakSet[Any] = weakref.WeakSet()


def _session_holder(target: Session | sessionmaker[Any] | type[Session]) -> Any:
    return target.class_ if isinstance(target, sessionmaker) else target


# Engines (and session holders) installed with translate_errors=False.
_untranslated: weakref.WeakSet[Any] = weakref.WeakSet()


def install(target: Target, *, translate_errors: bool = True) -> None:
    """Fence ``target``'s transactions with the current :func:`fencekit.fencing` token.

    Idempotent. Drivers: psycopg 3 (``postgresql+psycopg://``, sync or async), psycopg2
    (``postgresql+psycopg2://``, the plain ``postgresql://``) and asyncpg
    (``postgresql+asyncpg://``); an engine on another driver is refused here, with TypeError.
    With ``translate_errors=False`` rejections stay SQLAlchemy's ``DBAPIError`` (not counted).
    """
    resolved = _resolve(target)
    if not isinstance(resolved, Engine | Connection | Session | sessionmaker) and not (
        isinstance(resolved, type) and issubclass(resolved, Session)
    ):
        raise TypeError(
            "fencekit.sqlalchemy.install() takes an Engine, Connection, Session or "
            "sessionmaker (sync or async), or a Session class, not "
            f"{type(target).__module__}.{type(target).__name__}"
        )
    engine = _engine_of(resolved)
    if engine is not None:
        _check_driver(engine.dialect)
    key = engine if engine is not None else _holder_or_none(resolved)
    if key is not None:
        if translate_errors:
            _untranslated.discard(key)
        else:
            _untranslated.add(key)
    if isinstance(resolved, Engine):
        _listen_engine(resolved, check=True)
        if not _has(resolved.pool.dispatch.checkout, _on_checkout):
            # Pool events on an Engine go to its pool; dispose() carries them to the new one.
            event.listen(resolved, "checkout", _on_checkout)
        _listen_connection(resolved)
    elif isinstance(resolved, Connection):
        _listen_engine(resolved.engine, check=True)
        if not resolved.closed and not resolved.invalidated:
            _install_on(resolved)
            _boundary(resolved)
        _listen_connection(resolved)
    elif isinstance(resolved, Session | sessionmaker) or issubclass(resolved, Session):
        holder = _session_holder(resolved)
        if holder not in _sessions_listening:
            event.listen(resolved, "after_begin", _on_session_begin)
            _sessions_listening.add(holder)


def _holder_or_none(resolved: Any) -> Any:
    if isinstance(resolved, Engine | Connection):
        return None
    return _session_holder(resolved)


def is_installed(target: object) -> bool:
    """Whether :func:`install` fences ``target`` (an engine, connection, session or maker)."""
    try:
        resolved: Any = _resolve(cast(Target, target))
    except ValueError:
        return False
    if isinstance(resolved, Engine | Connection):
        return (resolved if isinstance(resolved, Engine) else resolved.engine) in _listening
    if isinstance(resolved, Session | sessionmaker | type):
        try:
            return _session_holder(resolved) in _sessions_listening
        except TypeError:  # not weak-referenceable: never installed
            return False
    return False


def _engine_of(resolved: Any) -> Engine | None:
    """The engine ``resolved`` runs on, when known before its first transaction."""
    if isinstance(resolved, Engine):
        return resolved
    if isinstance(resolved, Connection):
        return resolved.engine
    bind = resolved.kw.get("bind") if isinstance(resolved, sessionmaker) else None
    if isinstance(resolved, Session):
        bind = resolved.bind
    if isinstance(bind, Engine | Connection):
        return bind if isinstance(bind, Engine) else bind.engine
    return None


def uninstall(target: Target) -> None:
    """Remove the listeners :func:`install` added (connections already fenced stay fenced)."""
    resolved = _resolve(target)
    if isinstance(resolved, Engine | Connection):
        _listening.discard(resolved if isinstance(resolved, Engine) else resolved.engine)
    else:
        _sessions_listening.discard(_session_holder(resolved))
    for name, fn in (
        ("checkout", _on_checkout),
        ("before_execute", _on_execute),
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
