"""The CLI's sessions parse everything under ``search_path = pg_catalog, pg_temp``.

An operator or function in ``public`` whose argument types match exactly beats pg_catalog's
inexact one (``public.=(oid, regclass)`` over ``oid = oid``), so a catalog query run by a DBA
under the default path runs code anyone with CREATE on ``public`` planted.
:func:`pin_search_path` remembers the session's own path, then pins it: the only thing still
resolved through the user's path is the TABLE a user typed (:func:`regclass_oid`), as SQL
would resolve it, by ``pg_catalog.to_regclass`` alone.
"""

from __future__ import annotations

import weakref

from fencekit.catalog.model import Conn
from fencekit.sqlgen.pin import PINNED_PATH

__all__ = ["caller_search_path", "pin_search_path", "regclass_oid"]

_CALLER_PATH: weakref.WeakKeyDictionary[Conn, str] = weakref.WeakKeyDictionary()

_SET_PATH = (
    "SELECT pg_catalog.set_config('search_path'::pg_catalog.text, %s::pg_catalog.text, false)"
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
