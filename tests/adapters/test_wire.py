"""The token wire: its pure answers, and one table of every path each driver offers.

Every path a driver offers (a statement, a batch, COPY, a named cursor, callproc, a prepared
statement, an asyncpg cursor) carries exactly the scope's token or none: after a scope ends
inside a transaction its token no longer goes with anything, and a new scope's token replaces
it. Each row runs against the real key-fenced ``billing_summary`` table (Django's paths are in
``tests/django/test_runtime.py``).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from fencekit import fencing, wire
from fencekit.errors import MissingTokenError, StaleTokenError, translate
from tests.adapters.conftest import connect_kwargs

# ---------------------------------------------------------------- the pure core

A, B = ("34", ""), ("35", "etcd")


@pytest.mark.parametrize(
    ("setup", "status", "scope", "expected"),
    [
        # a fresh transaction: the scope's token, or nothing
        ([], wire.IDLE, A, A),
        ([], wire.IDLE, None, None),
        # held already: nothing; another scope: its token; no scope: a clear
        ([("sent", A)], wire.INTRANS, A, None),
        ([("sent", A)], wire.INTRANS, B, B),
        ([("sent", A)], wire.INTRANS, None, wire.CLEAR),
        # cleared already: nothing more to clear
        ([("sent", A), ("sent", wire.CLEAR)], wire.INTRANS, None, None),
        # a savepoint rollback: the token may be gone (resend) or still there (clear)
        ([("sent", A), ("forget", None)], wire.INTRANS, A, A),
        ([("sent", A), ("forget", None)], wire.INTRANS, None, wire.CLEAR),
        # a failed transaction: only ROLLBACK runs there
        ([("sent", A)], wire.INERROR, B, None),
        # committed, then a new transaction: it starts fresh
        ([("sent", A), ("ended", None)], wire.IDLE, None, None),
        ([("sent", A)], wire.IDLE, A, A),
        # a block pinned its token: its statements need not send it
        ([("pin", A)], wire.INTRANS, A, None),
        ([("pin", A), ("unpin", None)], wire.INTRANS, None, None),
    ],
)
def test_what_the_next_statement_sends(
    setup: list[tuple[str, Any]], status: int, scope: wire.Value | None, expected: Any
) -> None:
    state = wire.Wire()
    for step, value in setup:
        if step == "sent":
            state.sent(value, open_after=True)
        else:
            getattr(state, step)(*(() if value is None else (value,)))
    assert state.next(status, scope) == expected


def test_an_untracked_wire_resends_unless_pinned() -> None:
    """An adapter that cannot see every BEGIN (raw psycopg 3) sends again each statement."""
    state = wire.Wire(tracked=False)
    state.sent(A, open_after=True)
    assert state.next(wire.INTRANS, A) == A
    state.pin(A)
    assert state.next(wire.INTRANS, A) is None


def test_least_sent_no_issuer_statement_for_an_untagged_token_on_a_fresh_transaction() -> None:
    assert wire.set_local(A, fresh=True) == "SET LOCAL fencekit.token = '34'"
    assert wire.set_local(A) == (
        "SET LOCAL fencekit.token = '34'; SET LOCAL fencekit.issuer = ''"
    )  # in a transaction that may have set an issuer before
    assert "fencekit.issuer = 'etcd'" in wire.set_local(B, fresh=True)
    assert "fencekit.issuer = ''" in wire.set_local(wire.CLEAR, fresh=True)


# ---------------------------------------------------------------- every driver path

UPDATE = "UPDATE billing_summary SET summary = %s WHERE account_id = %s"
BUMP = """CREATE FUNCTION bump(a bigint, s text) RETURNS text LANGUAGE sql
AS $$ UPDATE billing_summary SET summary = s WHERE account_id = a RETURNING summary $$"""
COPY_IN = "COPY billing_summary (account_id, summary) FROM STDIN"


class Psycopg:
    def __init__(self, dsn: str) -> None:
        import fencekit.psycopg as fkpg

        self.conn = psycopg.connect(dsn)
        fkpg.install(self.conn)

    def update(self, key: int) -> None:
        self.conn.execute(UPDATE, ("fenced", key))

    def run(self, path: str, key: int) -> None:
        conn = self.conn
        if path == "execute":
            conn.execute(UPDATE, ("path", key))
        elif path == "executemany":
            conn.cursor().executemany(UPDATE, [("path", key)])
        elif path == "copy":
            with conn.cursor().copy(COPY_IN) as copy:
                copy.write_row((key, "path"))
        elif path == "named cursor":  # the function writes when FETCH runs the query
            with conn.cursor(name="c") as cursor:
                cursor.execute("SELECT bump(%s, 'path')", (key,))
                cursor.fetchone()
        else:
            raise AssertionError(path)

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def close(self) -> None:
        self.conn.close()


class Psycopg2:
    def __init__(self, dsn: str) -> None:
        import psycopg2

        import fencekit.psycopg2 as fkpg2

        self.conn = psycopg2.connect(dsn)
        fkpg2.install(self.conn)

    def update(self, key: int) -> None:
        with self.conn.cursor() as cursor:
            cursor.execute(UPDATE, ("fenced", key))

    def run(self, path: str, key: int) -> None:
        with self.conn.cursor(name="c" if path == "named cursor" else None) as cursor:
            if path == "execute":
                cursor.execute(UPDATE, ("path", key))
            elif path == "executemany":
                cursor.executemany(UPDATE, [("path", key)])
            elif path == "callproc":
                cursor.callproc("bump", (key, "path"))
            elif path == "copy_expert":
                cursor.copy_expert(COPY_IN, io.StringIO(f"{key}\tpath\n"))
            elif path == "named cursor":
                cursor.execute("SELECT bump(%s, 'path')", (key,))
                cursor.fetchone()
            else:
                raise AssertionError(path)

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def close(self) -> None:
        self.conn.close()


class Asyncpg:
    def __init__(self, dsn: str) -> None:
        import asyncpg

        import fencekit.asyncpg as fkapg

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(asyncpg.connect(**connect_kwargs(dsn)))
        fkapg.install(self.conn)
        self.tx: Any = None

    def _begin(self) -> None:
        if self.tx is None:
            self.tx = self.conn.transaction()
            self.loop.run_until_complete(self.tx.start())

    def update(self, key: int) -> None:
        self._begin()
        self.loop.run_until_complete(
            self.conn.execute(UPDATE.replace("%s", "$1", 1).replace("%s", "$2"), "fenced", key)
        )

    def run(self, path: str, key: int) -> None:
        self._begin()
        self.loop.run_until_complete(self._run(path, key))

    async def _run(self, path: str, key: int) -> None:
        conn = self.conn
        update = "UPDATE billing_summary SET summary = $1 WHERE account_id = $2 RETURNING 1"
        if path == "execute":
            await conn.execute(update, "path", key)
        elif path == "fetch":
            await conn.fetch(update, "path", key)
        elif path == "prepared statement":
            statement = await conn.prepare(update)
            await statement.fetch("path", key)
        elif path == "cursor":
            cursor = await conn.cursor("SELECT bump($1, 'path')", key)
            await cursor.fetchrow()
        elif path == "copy_records_to_table":
            await conn.copy_records_to_table(
                "billing_summary", records=[(key, "path")], columns=["account_id", "summary"]
            )
        else:
            raise AssertionError(path)

    def _end(self, how: str) -> None:
        tx, self.tx = self.tx, None
        if tx is not None:
            self.loop.run_until_complete(getattr(tx, how)())

    def commit(self) -> None:
        self._end("commit")

    def rollback(self) -> None:
        self._end("rollback")

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


DRIVERS: dict[str, Callable[[str], Any]] = {
    "psycopg": Psycopg,
    "psycopg2": Psycopg2,
    "asyncpg": Asyncpg,
}
PATHS = [
    ("psycopg", "execute"),
    ("psycopg", "executemany"),
    ("psycopg", "copy"),
    ("psycopg", "named cursor"),
    ("psycopg2", "execute"),
    ("psycopg2", "executemany"),
    ("psycopg2", "callproc"),
    ("psycopg2", "copy_expert"),
    ("psycopg2", "named cursor"),
    ("asyncpg", "execute"),
    ("asyncpg", "fetch"),
    ("asyncpg", "prepared statement"),
    ("asyncpg", "cursor"),
    ("asyncpg", "copy_records_to_table"),
]


@pytest.fixture
def driver(request: pytest.FixtureRequest, billing: str) -> Iterator[Any]:
    with psycopg.connect(billing) as conn:
        conn.execute(BUMP)
    made = DRIVERS[request.param](billing)
    try:
        yield made
    finally:
        made.close()


def rejection(call: Callable[[], object]) -> Any:
    try:
        call()
    except Exception as exc:  # every driver's error, read the same way
        return translate(exc)
    return None


@pytest.mark.parametrize(("driver", "path"), PATHS, indirect=["driver"])
def test_every_path_carries_exactly_the_scopes_token_or_none(driver: Any, path: str) -> None:
    key = 43 if "copy" in path else 42  # COPY adds a row: a new key, fenced on first write
    # 1. A scope ends inside the transaction: its token must not go with the path.
    with fencing(34):
        driver.update(42)
    assert isinstance(rejection(lambda: driver.run(path, key)), MissingTokenError)
    driver.rollback()
    # 2. Another scope in the same transaction: the path carries the new token, not the old.
    with fencing(34):
        driver.update(42)
    with fencing(35):
        driver.run(path, key)
    driver.commit()
    # The fence of the path's key is now 35: 34 is stale there.
    with fencing(34):
        assert isinstance(rejection(lambda: driver.run("execute", key)), StaleTokenError)
    driver.rollback()
