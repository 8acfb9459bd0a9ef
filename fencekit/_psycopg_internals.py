"""Every psycopg internal that fencekit uses, in one place: the token in psycopg's own BEGIN.

Why: psycopg opens each transaction with a round trip of its own, a bare ``BEGIN`` (sent by
``conn.transaction()``, or before the first statement of a connection not in autocommit mode).
fencekit sends ``BEGIN; SET LOCAL fencekit.token = ...; SET LOCAL fencekit.issuer = ...`` as that
round trip's query instead, as one simple query, so a fenced transaction sends the messages of an
unfenced one. psycopg (3.1 to 3.3) has no public hook for the query that opens a transaction:
``Connection._get_tx_start_command()`` builds it and ``Connection._exec_command()`` sends it,
both private, and on an idle connection not in autocommit mode every public way to run a query
sends psycopg's BEGIN first. The public path, :mod:`fencekit.psycopg`'s fallback, sends
``set_config()`` in one pipeline with the transaction's first statement: the same round trips,
one statement more (sent as a statement of its own, as ``set_token()`` does, the token would cost
a round trip). Measured with ``fencekit bench --only adapters`` (one-row transactions on a
protected table against the same work unfenced, ratio of throughputs, higher is better; two
interleaved runs each on 2 shared cores, embedded PostgreSQL 16, 2026-12-03):
``fencekit.psycopg.transaction()`` 0.88x-0.90x with this module, 0.83x-0.85x on the public path;
``fencing()`` + ``install()`` 0.87x-0.88x against 0.81x-0.84x; the adapter alone (an
unprotected table) 0.93x-0.94x against 0.78x-0.87x; the SQLAlchemy unit of work 0.92x-0.94x
against 0.89x-0.91x.

Read in psycopg 3.1.0, 3.2.0, 3.3.0 and 3.3.9; the adapter tests passed on those and on 3.1.4,
3.1.20 and 3.2.13, and CI runs them on the lowest version ``pyproject.toml`` declares and on the
newest its pins allow (``scripts/test``, ``docs/testing.md``). What is used:

- ``Transaction._enter_gen`` (overridden by :class:`BeginHook`) and what psycopg's own does:
  the block's entry bookkeeping (3.3: ``status``, public; 3.1-3.2: ``_entered``),
  ``_push_savepoint()``, ``_get_enter_commands()``, ``_outer_transaction``, ``_conn`` and
  ``Connection._exec_command()`` (the SAVEPOINT of a block opened with a name);
- undocumented, though not underscored: ``Connection.lock`` and ``Connection.wait()``,
  ``psycopg.generators.execute`` and ``psycopg.errors.error_from_result``.

The default path. The check runs at import: :data:`AVAILABLE` is False when any of these is
missing (:func:`missing` names them); :mod:`fencekit.psycopg` then warns once
(``RuntimeWarning``) and never calls into this module: every transaction takes the public path.
``tests/adapters/test_begin.py`` compares the protocol traces of both paths with an unfenced
transaction.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators
from psycopg.abc import PQGen
from psycopg.pq import ExecStatus

__all__ = ["AVAILABLE", "BeginHook", "async_begin", "begin", "missing"]

# Attributes that psycopg's Transaction.__init__ assigns (so they are not on the class).
_TX_INIT_ATTRS = ("_conn", "_outer_transaction")


def missing() -> list[str]:
    """The internals this module needs that the imported psycopg lacks (empty: all there)."""
    tx = psycopg.Transaction
    gone = [
        f"Transaction.{name}"
        for name in ("_enter_gen", "_push_savepoint", "_get_enter_commands")
        if not callable(getattr(tx, name, None))
    ]
    init_names = set(getattr(getattr(tx.__init__, "__code__", None), "co_names", ()))
    gone += [f"Transaction.{name}" for name in _TX_INIT_ATTRS if name not in init_names]
    if not hasattr(tx, "Status") and "_entered" not in init_names:
        gone.append("Transaction.Status or Transaction._entered")
    for cls in (psycopg.Connection, psycopg.AsyncConnection):
        gone += [
            f"{cls.__name__}.{name}"
            for name in ("_exec_command", "wait")
            if not callable(getattr(cls, name, None))
        ]
    if not callable(getattr(generators, "execute", None)):
        gone.append("psycopg.generators.execute")
    if not callable(getattr(pg_errors, "error_from_result", None)):
        gone.append("psycopg.errors.error_from_result")
    return gone


AVAILABLE: bool = not missing()
"""True when the BEGIN path can run; :mod:`fencekit.psycopg` checks it before every use."""


def _begin_gen(conn: Any, query: bytes) -> PQGen[None]:
    """Send ``query`` (a BEGIN and the token) as one simple query; raise what the server raised."""
    conn.pgconn.send_query(query)
    results = yield from generators.execute(conn.pgconn)
    for result in results:
        if result.status == ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(result, encoding=conn.info.encoding)


def begin(conn: psycopg.Connection[Any], query: bytes) -> None:
    """Run ``query``, which opens a transaction, in place of psycopg's implicit BEGIN."""
    with conn.lock:
        conn.wait(_begin_gen(conn, query))


async def async_begin(conn: psycopg.AsyncConnection[Any], query: bytes) -> None:
    """Async twin of :func:`begin`."""
    async with conn.lock:
        await conn.wait(_begin_gen(conn, query))


class BeginHook:
    """Mixed into a ``psycopg.Transaction`` (or ``AsyncTransaction``) subclass: its BEGIN is
    followed, in the same query, by ``_fk_tail`` (fencekit's ``SET LOCAL`` statements).

    psycopg's ``__enter__`` runs ``_enter_gen`` under the connection's lock; this one does what
    psycopg's does, except that the outer transaction's BEGIN carries the tail. Nested in an
    open transaction (a savepoint) nothing is added.
    """

    _fk_tail: bytes

    def _enter_gen(self) -> PQGen[None]:
        tx: Any = self
        if hasattr(tx, "Status"):  # psycopg 3.3 (whose later releases check in __enter__ too)
            if tx.status != tx.Status.NOT_STARTED:
                raise TypeError("transaction blocks can be used only once")
            tx.status = tx.Status.ACTIVE
        else:  # psycopg 3.1-3.2
            if tx._entered:
                raise TypeError("transaction blocks can be used only once")
            tx._entered = True
        tx._push_savepoint()
        conn = tx._conn
        for i, command in enumerate(tx._get_enter_commands()):
            if i == 0 and tx._outer_transaction:
                yield from _begin_gen(conn, command + b"; " + self._fk_tail)
            else:
                yield from conn._exec_command(command)
