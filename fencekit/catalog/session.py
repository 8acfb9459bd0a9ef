"""The CLI's sessions parse everything under ``search_path = pg_catalog, pg_temp``.

An operator or function in ``public`` whose argument types match exactly beats pg_catalog's
inexact one (``public.=(oid, regclass)`` over ``oid = oid``), so a catalog query run by a DBA
under the default path runs code anyone with CREATE on ``public`` planted.
:func:`pin_search_path` remembers the session's own path, then pins it: the only thing still
resolved through the user's path is the TABLE a user typed (:func:`regclass_oid`), as SQL
would resolve it, by ``pg_catalog.to_regclass`` alone.

A connection fencekit did not open (a migration's, a test's, an application's) is pinned only
for as long as fencekit reads or writes through it (:func:`pinned_path`), and given its own path
back after: its owner's later statements resolve as they did before.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from fencekit.catalog.model import Conn
from fencekit.sqlgen.pin import PINNED_PATH

__all__ = ["caller_search_path", "pin_search_path", "pinned_path", "regclass_oid"]

_CALLER_PATH: weakref.WeakKeyDictionary[Conn, str] = weakref.WeakKeyDictionary()

_SET_PATH = (
    "SELECT pg_catalog.set_config('search_path'::pg_catalog.text, %s::pg_catalog.text, false)"
)
_SET_PATH_LOCAL = (
    "SELECT pg_catalog.set_config('search_path'::pg_catalog.text, %s::pg_catalog.text, true)"
)


def _current(conn: Conn) -> str:
    row = conn.execute(
        "SELECT pg_catalog.current_setting('search_path'::pg_catalog.text)"
    ).fetchone()
    return str(row[0]) if row else ""


def pin_search_path(conn: Conn) -> None:
    """Pin ``conn``'s search_path for the session (an autocommit connection: it is not undone
    by a rollback), after remembering the one it had for :func:`regclass_oid`."""
    _CALLER_PATH[conn] = _current(conn)
    conn.execute(_SET_PATH, (PINNED_PATH,))


def caller_search_path(conn: Conn) -> str:
    """The search_path the user's names resolve through: the session's before it was pinned."""
    saved = _CALLER_PATH.get(conn)
    return saved if saved is not None else _current(conn)


def regclass_oid(conn: Conn, text: str) -> int | None:
    """The oid of the relation ``text`` names, resolved as SQL would under the user's path, or
    None. On a pinned session the path is the user's for this one call of a pg_catalog function
    on a text parameter (nothing else is parsed under it), then pinned again."""
    query = "SELECT pg_catalog.to_regclass(%s::pg_catalog.text)::pg_catalog.oid"
    saved = _CALLER_PATH.get(conn)
    if saved is None:
        row = conn.execute(query, (text,)).fetchone()
    else:
        conn.execute(_SET_PATH, (saved,))
        try:
            row = conn.execute(query, (text,)).fetchone()
        finally:
            conn.execute(_SET_PATH, (PINNED_PATH,))
    return None if row is None or row[0] is None else int(row[0])


@contextlib.contextmanager
def pinned_path(conn: Any) -> Iterator[None]:
    """Pin ``conn``'s search_path while the block runs, then restore the one it had.

    For a connection someone else opened (alembic's, Django's, a test's): every catalog query
    and statement fencekit runs on it is parsed under ``pg_catalog, pg_temp``, so an operator
    or function planted in a schema on its path (``"$user"``, ``public``) whose argument types
    match exactly never wins over pg_catalog's. Inside a transaction the pin is
    transaction-local (an error that aborts the transaction drops it too); on an autocommit
    connection, where that would last one statement, it is the session's until the block ends.
    The two queries run before the pin call only pg_catalog functions on exactly typed
    arguments, which nothing on the caller's path can beat."""
    saved = _current(conn)
    conn.execute(_SET_PATH_LOCAL, (PINNED_PATH,))
    local = _current(conn) == PINNED_PATH  # not so in autocommit: the pin lasted one statement
    if not local:
        conn.execute(_SET_PATH, (PINNED_PATH,))
    restore = _SET_PATH_LOCAL if local else _SET_PATH
    try:
        yield
    except BaseException:
        # An aborted transaction refuses the restore; its rollback restores the path itself.
        with contextlib.suppress(Exception):
            conn.execute(restore, (saved,))
        raise
    conn.execute(restore, (saved,))
