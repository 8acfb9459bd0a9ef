"""fencekit.asyncpg: the adapter contract on asyncpg against a real server.

Stale write rejected with the typed error (fencekit's class and asyncpg's), missing token
refused, no token leaking across pooled connections, commit outcomes reported, and the token in
asyncpg's own BEGIN (no round trip of its own).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

asyncpg = pytest.importorskip("asyncpg")

import fencekit  # noqa: E402
import fencekit.asyncpg as fkapg  # noqa: E402
from fencekit import fencing, metrics  # noqa: E402
from tests.adapters.conftest import TOKEN_SQL, connect_kwargs  # noqa: E402

UPDATE = "UPDATE billing_summary SET summary = $1 WHERE account_id = 42"


def summary(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT summary FROM billing_summary WHERE account_id = 42").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def events() -> Any:
    seen: list[metrics.MetricEvent] = []
    remove = metrics.add_listener(seen.append)
    yield seen
    remove()


async def test_stale_write_rejected_with_typed_error(billing: str, events: list) -> None:
    a = await asyncpg.connect(**connect_kwargs(billing))
    b = await asyncpg.connect(**connect_kwargs(billing))
    try:
        async with fkapg.transaction(b, 34):
            await b.execute(UPDATE, "written by B")
        with pytest.raises(fencekit.StaleTokenError) as info:
            async with fkapg.transaction(a, 33):
                await a.execute(UPDATE, "stale summary from A")
    finally:
        await a.close()
        await b.close()
    err = info.value
    assert isinstance(err, asyncpg.PostgresError)  # asyncpg's handlers catch it too
    assert err.sqlstate == "YF001"
    assert (err.token, err.fence, err.table) == (33, 34, "public.billing_summary")
    assert err.key == {"account_id": "42"}
    assert isinstance(err.detail, dict)
    assert err.as_dict()["fence"] == 34
    assert summary(billing) == "written by B"
    assert [(e.kind, e.reason) for e in events] == [("rejected", "stale")]
    # Not an installed connection: the block put the class back.
    assert type(a) is asyncpg.Connection


async def test_each_rejection_is_counted_once_on_any_connection(billing: str, events: list) -> None:
    """Counted where asyncpg builds the error: on an installed connection (its statement runs
    as asyncpg's own coroutine) and on a plain one fenced with set_token()."""
    ahead = await asyncpg.connect(**connect_kwargs(billing))
    plain = await asyncpg.connect(**connect_kwargs(billing))
    installed = await asyncpg.connect(**connect_kwargs(billing))
    fkapg.install(installed)
    try:
        async with fkapg.transaction(ahead, 50):
            await ahead.execute(UPDATE, "written by the holder")
        async with plain.transaction():
            await fkapg.set_token(plain, 49)
            with pytest.raises(fencekit.StaleTokenError):
                await plain.execute(UPDATE, "stale, plain connection")
        with fencing(48):
            async with installed.transaction():
                with pytest.raises(fencekit.StaleTokenError):
                    await installed.execute(UPDATE, "stale, installed connection")
    finally:
        for c in (ahead, plain, installed):
            await c.close()
    assert [(e.kind, e.reason) for e in events] == [("rejected", "stale")] * 2
    assert summary(billing) == "written by the holder"


async def test_missing_token_refused(billing: str) -> None:
    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        fkapg.install(conn)
        with pytest.raises(fencekit.MissingTokenError) as info:
            await conn.execute(UPDATE, "no token")
        assert isinstance(info.value, asyncpg.PostgresError)
        with pytest.raises(fencekit.MissingTokenError):
            async with fkapg.transaction(conn):  # no token given, no scope: refused unsent
                pass
    finally:
        await conn.close()
    assert summary(billing) == "initial"


async def test_install_every_path_carries_the_scope_token(billing: str) -> None:
    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        fkapg.install(conn)
        async with fencing(40):
            # Outside a transaction, with arguments: wrapped in a transaction.
            assert await conn.execute(UPDATE, "args") == "UPDATE 1"
            # Without arguments: one simple query, one implicit transaction.
            status = await conn.execute(
                "UPDATE billing_summary SET summary = 'simple' WHERE account_id = 42"
            )
            assert status == "UPDATE 1"
            async with conn.transaction():  # asyncpg's BEGIN carries it
                assert await conn.fetchval(TOKEN_SQL) == "40"
                stmt = await conn.prepare("SELECT current_setting('fencekit.token')")
                assert await stmt.fetchval() == "40"
        assert await conn.fetchval(TOKEN_SQL) is None
        async with conn.transaction():
            async with fencing(41):  # entered inside the transaction: one statement
                assert await conn.fetchval(TOKEN_SQL) == "41"
            assert await conn.fetchval(TOKEN_SQL) is None  # cleared after the scope
    finally:
        await conn.close()
    assert summary(billing) == "simple"


async def test_a_simple_query_that_begins_with_begin_carries_the_token(billing: str) -> None:
    """``execute("BEGIN; UPDATE ...; COMMIT")``: the token goes right after the BEGIN, before
    the statements that follow it in the same query."""
    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        fkapg.install(conn)
        async with fencing(43):
            await conn.execute(
                "BEGIN; UPDATE billing_summary SET summary = 'in one query' "
                "WHERE account_id = 42; COMMIT"
            )
            await conn.execute("START TRANSACTION ISOLATION LEVEL SERIALIZABLE ;")
            assert await conn.fetchval(TOKEN_SQL) == "43"
            await conn.execute("COMMIT")
    finally:
        await conn.close()
    assert summary(billing) == "in one query"


async def test_token_rides_asyncpg_begin(billing: str) -> None:
    """The fenced transaction sends as many queries as the unfenced one (server's count)."""
    conn = await asyncpg.connect(**connect_kwargs(billing))
    sent: list[str] = []
    conn.add_query_logger(lambda record: sent.append(record.query))
    try:
        async with conn.transaction():
            await conn.execute("SELECT $1::text", "unfenced")
        await asyncio.sleep(0.05)  # asyncpg calls query loggers soon after, not at once
        unfenced = list(sent)
        sent.clear()
        fkapg.install(conn)
        async with fencing(42), conn.transaction():
            await conn.execute(UPDATE, "fenced")
        await asyncio.sleep(0.05)
        assert len(sent) == len(unfenced) == 3  # BEGIN (with the token), UPDATE, COMMIT
        assert sent[0].startswith("BEGIN")
        assert "SET LOCAL fencekit.token = '42'" in sent[0]
    finally:
        await conn.close()


async def test_the_connection_class_own_execute_sees_every_statement(billing: str) -> None:
    """install() on an application's subclass that overrides execute(): the BEGIN (with the token)
    and the COMMIT still go through it, not past it to asyncpg's internals."""
    seen: list[str] = []

    class Logged(asyncpg.Connection):  # type: ignore[misc]
        __slots__ = ()

        def execute(self, query: str, *args: Any, timeout: float | None = None) -> Any:
            seen.append(query)
            return super().execute(query, *args, timeout=timeout)

    conn = await asyncpg.connect(**connect_kwargs(billing), connection_class=Logged)
    try:
        fkapg.install(conn)
        async with fencing(43), conn.transaction():
            await conn.execute(UPDATE, "subclass")
    finally:
        await conn.close()
    assert len(seen) == 3
    assert seen[0].startswith("BEGIN")
    assert "SET LOCAL fencekit.token = '43'" in seen[0]
    assert seen[1:] == [UPDATE, "COMMIT;"]
    assert summary(billing) == "subclass"


async def test_install_takes_a_connection_class_without_slots(billing: str) -> None:
    """An application's connection class without ``__slots__`` (it has a ``__dict__``):
    install() still fences it; its own execute() runs first, before the token is added."""
    seen: list[str] = []

    class Plain(asyncpg.Connection):  # type: ignore[misc]
        def execute(self, query: str, *args: Any, timeout: float | None = None) -> Any:
            seen.append(query)
            return super().execute(query, *args, timeout=timeout)

    conn = await asyncpg.connect(**connect_kwargs(billing), connection_class=Plain)
    try:
        fkapg.install(conn)
        conn.note = "an attribute of the application's"  # its __dict__ survives
        async with fencing(44), conn.transaction():
            assert await conn.fetchval(TOKEN_SQL) == "44"
            await conn.execute(UPDATE, "no slots")
        assert conn.note == "an attribute of the application's"
        fkapg.uninstall(conn)
        assert type(conn) is Plain
    finally:
        await conn.close()
    assert seen[0].startswith("BEGIN")
    assert summary(billing) == "no slots"


async def test_a_closed_fenced_connection_refuses_begin_and_commit(billing: str) -> None:
    conn = await asyncpg.connect(**connect_kwargs(billing))
    fkapg.install(conn)
    await conn.close()
    for query in ("BEGIN", "COMMIT"):
        with fencing(44), pytest.raises(asyncpg.InterfaceError, match="closed"):
            await conn.execute(query)


def test_the_asyncpg_internals_of_the_begin_path_are_there() -> None:
    """The BEGIN and COMMIT skip asyncpg's execute() coroutine where its internals are as
    fencekit expects; on an asyncpg without them they run through execute() (slower)."""
    assert fkapg._DIRECT
    assert fkapg.FencedConnection._fk_direct


async def test_nested_transaction_restores_outer_token(billing: str) -> None:
    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        async with fkapg.transaction(conn, 50):
            async with fkapg.transaction(conn, 51):
                assert await conn.fetchval(TOKEN_SQL) == "51"
            assert await conn.fetchval(TOKEN_SQL) == "50"
    finally:
        await conn.close()


async def test_no_leak_across_pooled_connections(billing: str) -> None:
    pool = await asyncpg.create_pool(
        **connect_kwargs(billing), min_size=1, max_size=1, init=fkapg.init
    )
    try:
        async with pool.acquire() as conn, fencing(60):
            assert await conn.execute(UPDATE, "pooled") == "UPDATE 1"
        async with pool.acquire() as conn:
            assert await conn.fetchval(TOKEN_SQL) is None
            with pytest.raises(fencekit.MissingTokenError):
                await conn.execute(UPDATE, "unfenced")

        async def worker(token: int | None) -> object:
            async with pool.acquire() as c:
                if token is None:
                    return await c.fetchval(TOKEN_SQL)
                async with fencing(token):
                    return await c.fetchval(TOKEN_SQL)

        results = await asyncio.gather(*(worker(t) for t in (70, None, 71, None)))
        assert results == ["70", None, "71", None]
    finally:
        await pool.close()
    assert summary(billing) == "pooled"


async def test_commit_outcome_unknown(billing: str) -> None:
    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        with pytest.raises(fencekit.CommitOutcomeUnknownError) as info:  # noqa: PT012
            async with fkapg.transaction(conn, 80):
                await conn.execute(UPDATE, "maybe")
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                with psycopg.connect(billing, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert info.value.token == 80
    finally:
        await conn.close()


async def test_install_refuses_what_it_cannot_fence(billing: str) -> None:
    pool = await asyncpg.create_pool(**connect_kwargs(billing), min_size=1, max_size=1)
    try:
        with pytest.raises(TypeError, match="connection_class"):
            fkapg.install(pool)
    finally:
        await pool.close()
    with psycopg.connect(billing) as conn, pytest.raises(TypeError, match=r"asyncpg\.Connection"):
        fkapg.install(conn)
