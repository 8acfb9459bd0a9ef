"""fencekit's rejections registered with psycopg 3, so that psycopg raises them itself.

psycopg maps each SQLSTATE to an exception class, and a library may add its own through a public
extension point: subclassing ``psycopg.errors.DatabaseError`` with ``code=`` (psycopg calls it
``DatabaseError.__init_subclass__``). Each class here is one of fencekit's rejections *and* a
``psycopg.DatabaseError`` registered for its ``YF`` SQLSTATE: any psycopg connection in the
process, fenced by an adapter or not, raises it, ``except fencekit.StaleTokenError`` and
``except psycopg.Error`` both catch it, and SQLAlchemy wraps it in ``DBAPIError`` with it as
``.orig``. Imported by ``fencekit/__init__.py`` (psycopg is a dependency of fencekit).

Everything psycopg knows about the error stays (``diag``, ``pgresult``, ``sqlstate``); the
fencekit fields (``table``, ``key``, ``token``, ``fence``...) are read from the diagnostics when
psycopg builds the error, and ``orig`` is the error itself.
"""

from __future__ import annotations

from typing import Any, cast

from psycopg import errors as pg_errors
from psycopg.pq.abc import PGconn

from fencekit import errors

__all__: list[str] = []


class _RegisteredError(errors.FencekitError, pg_errors.DatabaseError):
    """What psycopg's constructor gets, turned into fencekit's fields."""

    def __init__(
        self,
        *args: Any,
        info: Any = None,
        encoding: str = "utf-8",
        pgconn: PGconn | None = None,
    ) -> None:
        pg_errors.DatabaseError.__init__(self, *args, info=info, encoding=encoding, pgconn=pgconn)
        fence = cast(errors.FenceError, self)  # every subclass below is one
        if info is not None:
            message, fields = errors.fields_of(self)
            fence._set_fields(message, orig=self, **fields)
        else:  # built by hand, or unpickled (whose state then restores the fields)
            fence._set_fields(str(args[0]) if args else fence.advice, orig=self)


# _RegisteredError first, for its constructor (the one psycopg calls); nothing else of psycopg's is
# overridden by fencekit's classes, whose __str__, __repr__ and as_dict() come next in the MRO.
# ``code=`` registers each with psycopg for its SQLSTATE.
_CLASSES = errors.driver_classes(_RegisteredError, __name__, driver_first=True, code_keyword="code")
FenceUsageError = _CLASSES["FenceUsageError"]
StaleTokenError = _CLASSES["StaleTokenError"]
ReusedTokenError = _CLASSES["ReusedTokenError"]
MissingTokenError = _CLASSES["MissingTokenError"]
MalformedTokenError = _CLASSES["MalformedTokenError"]
BypassRefusedError = _CLASSES["BypassRefusedError"]
LeaseMismatchError = _CLASSES["LeaseMismatchError"]
IssuerMismatchError = _CLASSES["IssuerMismatchError"]
