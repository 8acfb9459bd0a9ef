"""The token wire: what a transaction must send for the token and the issuer, and when.

Pure: no driver, no I/O. Each driver adapter (``fencekit.psycopg``, ``psycopg2``, ``asyncpg``,
``django.runtime``, and SQLAlchemy through them) keeps one :class:`Wire` per connection, asks it
what to send before every statement it can see, and decides only *how* to carry it: in the
BEGIN's query, as a prefix of the statement's simple query, in a pipeline, or as a statement of
its own. The answer is the same on every driver:

- **a fresh transaction** (the connection is idle) inside a :func:`fencekit.fencing` scope:
  the scope's token; nothing outside a scope;
- **a statement in an open transaction**: nothing when the transaction already holds the
  scope's token (sent earlier, or pinned by a fenced block); the scope's token when it holds
  another one or may not hold it (after a ``ROLLBACK TO SAVEPOINT``); a clear (``''``) when no
  scope is active and the transaction may still hold a token this wire sent: a token never
  outlives its scope inside a transaction;
- **a failed or broken transaction**: nothing (only ROLLBACK runs there);
- **commit, rollback**: nothing; the next transaction starts fresh.

What it sends is ``SET LOCAL`` (transaction-local, so a pooled connection never hands a token
on), built here and nowhere else. On a fresh transaction an untagged token sends no issuer
statement: ``fencekit.issuer`` is unset or ``''`` there, which both read as untagged.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from fencekit.context import _SCOPE, fencing
from fencekit.errors import MissingTokenError

__all__ = [
    "CLEAR",
    "IDLE",
    "INERROR",
    "INTRANS",
    "Value",
    "Wire",
    "resolve",
    "scope_now",
    "scope_value",
    "set_config",
    "set_local",
]

Value = tuple[str, str]
"""(token, issuer) as sent: ``("34", "etcd")``; ``("34", "")`` is an untagged token."""

CLEAR: Final[Value] = ("", "")
"""What clears a token an earlier statement of the transaction set (both read as unset)."""

# libpq's PQtransactionStatus numbers, which psycopg 3, psycopg2 and Django all report.
IDLE: Final = 0
ACTIVE: Final = 1
INTRANS: Final = 2
INERROR: Final = 3

_ISSUER_TEXT = re.compile(r"[a-z0-9_-]{0,31}")  # fencing()'s issuer names, or '' (untagged)


scope_now: Final = _SCOPE.get
"""The innermost :func:`fencing` scope, or None: read before every statement, so an adapter's
hot path takes its value as ``None if scope is None else scope._sent`` with no call between."""


def scope_value() -> Value | None:
    """The current :func:`fencing` scope's (token, issuer) as sent; None outside any scope."""
    scope = _SCOPE.get()
    return None if scope is None else scope._sent


def resolve(token: int | None, issuer: str | None) -> fencing:
    """The scope an explicit call (``transaction(conn, token)``, ``set_token``) runs in: ``token``
    and ``issuer``, or the current scope's when ``token`` is None (none: MissingTokenError)."""
    if token is None:
        scope = _SCOPE.get()
        if scope is None:
            raise MissingTokenError()
        token, issuer = scope.token, issuer or scope.issuer
    return fencing(token, issuer)


def _checked_text(value: Value) -> Value:
    # Both parts are spliced into SQL: checked again whoever calls, so neither needs quoting
    # (a token is digits, '' clears; an issuer a name fencing() accepts), whatever
    # standard_conforming_strings says.
    token, issuer = value
    if not (token == "" or (token.isascii() and token.isdigit())):
        raise ValueError(f"not a validated token: {token!r}")
    if issuer and not _ISSUER_TEXT.fullmatch(issuer):
        raise ValueError(f"not a validated issuer: {issuer!r}")
    return value


def set_config(value: Value) -> str:
    """One statement that puts ``value`` in force for the open transaction: for a path that
    takes one statement only (the extended protocol, a pipeline)."""
    token, issuer = _checked_text(value)
    return (
        f"SELECT set_config('fencekit.token', '{token}', true), "
        f"set_config('fencekit.issuer', '{issuer}', true)"
    )


@functools.lru_cache(maxsize=256)  # a lease's token goes with many transactions
def set_local(value: Value, fresh: bool = False) -> str:
    """The ``SET LOCAL`` statements that put ``value`` in force for the open transaction.

    ``fresh``: the transaction has set nothing yet (they follow its BEGIN), so an untagged
    token needs no issuer statement. Several statements: for a simple query.
    """
    token, issuer = value
    if not issuer and fresh and token.isdigit() and token.isascii():  # a new lease's token
        return f"SET LOCAL fencekit.token = '{token}'"
    token, issuer = _checked_text(value)
    return f"SET LOCAL fencekit.token = '{token}'; SET LOCAL fencekit.issuer = '{issuer}'"


class Wire:
    """What one connection's open transaction holds, and what its next statement must send.

    The adapter calls :meth:`next` before each statement with the connection's transaction
    status and the scope's value, sends what it returns (if anything) in the same transaction,
    and then reports it with :meth:`sent`. :meth:`pin` is for a block whose BEGIN carried the
    token; :meth:`forget` for anything after which the value may have changed unseen (a
    ``ROLLBACK TO SAVEPOINT``, a transaction boundary the adapter cannot see).

    ``tracked`` says the adapter sees every transaction boundary, so a value sent earlier in
    the open transaction is known to hold; an adapter that cannot see some BEGINs (raw psycopg
    3, where ``conn.transaction()`` may open one behind its back) sends again before each
    statement, except inside a block it pinned.
    """

    __slots__ = ("dirty", "held", "pinned", "tracked")

    def __init__(self, *, tracked: bool = True) -> None:
        self.held: Value | None = None  # what the open transaction surely holds
        self.dirty = False  # the open transaction may hold a token this wire sent
        self.pinned: Value | None = None  # a block's token, for as long as the block runs
        self.tracked = tracked

    def next(self, status: int, value: Value | None) -> Value | None:
        """What to send before the next statement (None: nothing). ``value``: the scope's."""
        if status == IDLE:
            self.held, self.dirty = None, False  # a fresh transaction, or autocommit
        elif status != INTRANS:
            return None  # failed transaction or broken connection: add nothing
        if value is None:
            return CLEAR if self.dirty else None
        if status == INTRANS and (self.pinned == value or (self.tracked and self.held == value)):
            return None
        return value

    def sent(self, value: Value, *, open_after: bool) -> None:
        """``value`` was sent; ``open_after``: a transaction is still open (not autocommit)."""
        if self.pinned != value:
            self.pinned = None  # another value was sent: the block's token no longer holds
        if open_after:
            self.held, self.dirty = value, bool(value[0])
        else:
            self.held, self.dirty = None, False

    def fresh(self, value: Value) -> str:
        """A fresh transaction's BEGIN carries ``value``: recorded (as :meth:`next` on an idle
        connection and then :meth:`sent` would), and returned as the ``SET LOCAL`` to put after
        the BEGIN in its query (one ``SET LOCAL`` for a new untagged token: the common case)."""
        if self.pinned != value:
            self.pinned = None
        self.held = value
        self.dirty = bool(value[0])
        return set_local(value, True)

    def pin(self, value: Value) -> None:
        """A block whose BEGIN carried ``value`` starts: its statements need not resend it."""
        self.pinned, self.held, self.dirty = value, value, True

    def unpin(self) -> None:
        """The block ended (committed or rolled back)."""
        self.pinned, self.held, self.dirty = None, None, False

    def forget(self) -> None:
        """What was set may no longer hold (a savepoint rollback, an unseen boundary)."""
        self.held = None

    def ended(self) -> None:
        """COMMIT or ROLLBACK: nothing holds; the next transaction starts fresh."""
        self.pinned, self.held, self.dirty = None, None, False
