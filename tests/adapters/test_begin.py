"""The token rides the transaction's BEGIN: same messages as an unfenced transaction."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fkpg
from fencekit.context import fencing
from tests.adapters.conftest import TOKEN_SQL

UPDATE = "UPDATE billing_summary SET summary = %s WHERE account_id = 42"
ISSUER_SQL = "SELECT NULLIF(current_setting('fencekit.issuer', true), '')"


def frontend(conn: psycopg.Connection[Any], fn: Callable[[], object]) -> list[tuple[str, str]]:
    """The frontend messages ``fn`` sent, as (type, first field), from libpq's trace."""
    with tempfile.TemporaryFile() as fh:
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        try:
            fn()
        finally:
            conn.pgconn.untrace()
        fh.seek(0)
        lines = fh.read().decode().splitlines()
    out = []
    for line in lines:
        parts = line.split("\t")
        if parts[0] == "F":
            out.append((parts[2], parts[3].strip() if len(parts) > 3 else ""))
    return out


def one(conn: psycopg.Connection[Any], query: str) -> Any:
    return conn.execute(query).fetchone()[0]  # type: ignore[index]


BEGIN_34 = "\"BEGIN; SET LOCAL fencekit.token = '34'; SET LOCAL fencekit.issuer = ''\""


def test_every_transaction_shape_sends_the_token_with_begin(billing: str) -> None:
    with psycopg.connect(billing) as conn, psycopg.connect(billing) as auto:
        fkpg.install(auto)

        conn.execute("CREATE TABLE unprotected AS SELECT * FROM billing_summary")
        conn.commit()

        def unfenced() -> None:
            with conn.transaction():
                conn.execute(UPDATE.replace("billing_summary", "unprotected"), ("plain",))

        def explicit() -> None:
            with fkpg.transaction(conn, 34):
                conn.execute(UPDATE, ("explicit",))

        def scoped_block() -> None:
            with fencing(34), auto.transaction():
                auto.execute(UPDATE, ("scoped block",))

        def implicit() -> None:  # how SQLAlchemy begins: psycopg's implicit BEGIN
            with fencing(34):
                auto.execute(UPDATE, ("implicit",))
                auto.commit()

        base = frontend(conn, unfenced)
        shapes = {
            "explicit": frontend(conn, explicit),
            "scoped": frontend(auto, scoped_block),
            "implicit": frontend(auto, implicit),
        }
    assert base[0] == ("Query", '"BEGIN"')
    for name, messages in shapes.items():
        assert [m[0] for m in messages] == [m[0] for m in base], name  # no extra message
        assert messages[0] == ("Query", BEGIN_34), name
        assert UPDATE.replace("%s", "$1") in messages[1][1], name  # the statement, untouched
        assert messages[-1] == base[-1] == ("Query", '"COMMIT"'), name


def test_begin_keeps_the_connection_transaction_characteristics(billing: str) -> None:
    with psycopg.connect(billing) as conn:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        conn.read_only = True
        conn.deferrable = False
        with fkpg.transaction(conn, 34, issuer="etcd"):
            assert one(conn, "SHOW transaction_isolation") == "serializable"
            assert one(conn, "SHOW transaction_read_only") == "on"
            assert one(conn, "SHOW transaction_deferrable") == "off"
            assert (one(conn, TOKEN_SQL), one(conn, ISSUER_SQL)) == ("34", "etcd")
        assert fkpg._begin_sql(conn) == conn._get_tx_start_command()


def test_statements_in_a_block_do_not_resend_the_token(billing: str) -> None:
    with psycopg.connect(billing) as conn:

        def block() -> None:
            with fkpg.transaction(conn, 34):
                for text in ("a", "b", "c"):
                    conn.execute(UPDATE, (text,))

        sent = frontend(conn, block)
    assert sum("fencekit.token" in text for _, text in sent) == 1


def test_nested_block_with_another_token_then_the_outer_token_again(billing: str) -> None:
    with psycopg.connect(billing) as conn, psycopg.connect(billing) as auto:
        fkpg.install(auto)
        for c in (conn, auto):
            with fkpg.transaction(c, 34):
                with fkpg.transaction(c, 40):  # a savepoint
                    assert one(c, TOKEN_SQL) == "40"
                assert one(c, TOKEN_SQL) == "34"
                with fencing(41):
                    assert one(c, TOKEN_SQL) == "41"  # transaction() fences the block's cursors
                c.execute(UPDATE, ("outer",))  # written under 34, the block's token
                assert one(c, TOKEN_SQL) == "34"
            assert one(c, TOKEN_SQL) is None
            c.rollback()


def test_uninstall_restores_psycopg_transaction(billing: str) -> None:
    with psycopg.connect(billing) as conn:
        fkpg.install(conn)
        assert "transaction" in vars(conn)
        fkpg.uninstall(conn)
        assert "transaction" not in vars(conn)
        with fencing(34), conn.transaction():
            assert one(conn, TOKEN_SQL) is None  # a plain cursor, a plain BEGIN


def test_a_failed_block_leaves_nothing_behind(billing: str) -> None:
    with psycopg.connect(billing) as conn:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        conn.execute("SET default_transaction_read_only = on")
        conn.commit()
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), fkpg.transaction(conn, 34):
            conn.execute(UPDATE, ("read only",))
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert one(conn, TOKEN_SQL) is None


def test_a_block_entered_after_its_connection_moved_on_is_refused(billing: str) -> None:
    """A block must carry its token in BEGIN: if that BEGIN is gone, entering it says so."""
    with psycopg.connect(billing) as conn:
        block = fkpg.transaction(conn, 34)
        conn.execute("SELECT 1")  # psycopg begins a transaction: the block's BEGIN is gone
        with pytest.raises(psycopg.ProgrammingError, match="right away"), block:
            conn.execute(UPDATE, ("never written",))
        assert one(conn, TOKEN_SQL) is None
        assert fkpg._state(conn).pinned is None
        conn.rollback()
        with fkpg.transaction(conn, 34):  # the connection is usable as ever
            conn.execute(UPDATE, ("written by B",))
        assert one(conn, "SELECT summary FROM billing_summary WHERE account_id = 42") == (
            "written by B"
        )


async def test_async_shapes_send_the_token_with_begin(billing: str) -> None:
    async with await psycopg.AsyncConnection.connect(billing) as conn:
        fkpg.install(conn)
        async with fkpg.async_transaction(conn, 34):
            cur = await conn.execute(TOKEN_SQL)
            assert (await cur.fetchone())[0] == "34"  # type: ignore[index]
        with fencing(35):
            async with conn.transaction():
                cur = await conn.execute(TOKEN_SQL)
                assert (await cur.fetchone())[0] == "35"  # type: ignore[index]
            await conn.execute(UPDATE, ("implicit",))
            cur = await conn.execute(TOKEN_SQL)
            assert (await cur.fetchone())[0] == "35"  # type: ignore[index]
            await conn.commit()
        cur = await conn.execute(TOKEN_SQL)
        assert (await cur.fetchone())[0] is None  # type: ignore[index]
