"""The token rides the transaction's BEGIN: same messages as an unfenced transaction."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from packaging.version import Version

import fencekit.psycopg as fkpg
from fencekit import _psycopg_async
from fencekit import _psycopg_core as core
from fencekit import _psycopg_internals as internals
from fencekit.context import fencing
from fencekit.errors import StaleTokenError
from tests.adapters.conftest import TOKEN_SQL


def test_the_begin_path_is_the_default_where_the_internals_are_there() -> None:
    assert core._begin_path() is internals.AVAILABLE


def test_without_the_internals_importing_the_adapter_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fallback is visible: importing fencekit.psycopg names what psycopg lacks."""
    import importlib
    import sys

    monkeypatch.delattr(psycopg.Connection, "wait")
    monkeypatch.setattr(internals, "AVAILABLE", internals.missing() == [])
    import fencekit

    monkeypatch.setattr(fencekit, "psycopg", fkpg)  # put back after the import below
    monkeypatch.delitem(sys.modules, "fencekit.psycopg")
    with pytest.warns(RuntimeWarning, match=r"lacks Connection\.wait: the token rides a pipeline"):
        importlib.import_module("fencekit.psycopg")


UPDATE = "UPDATE billing_summary SET summary = %s WHERE account_id = 42"
ISSUER_SQL = "SELECT NULLIF(current_setting('fencekit.issuer', true), '')"


def exchanges(
    conn: psycopg.Connection[Any], fn: Callable[[], object]
) -> list[list[tuple[str, str]]]:
    """The frontend messages ``fn`` sent, as (type, first field), one list per round trip.

    From libpq's protocol trace: a round trip is a run of frontend messages that the server
    then answers (so a pipeline's messages make one round trip).
    """
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
    out: list[list[tuple[str, str]]] = []
    previous = "B"
    for line in lines:
        parts = line.split("\t")
        if parts[0] == "F":
            if previous == "B":
                out.append([])
            out[-1].append((parts[2], parts[3].strip() if len(parts) > 3 else ""))
        if parts[0] in ("F", "B"):
            previous = parts[0]
    return out


def frontend(conn: psycopg.Connection[Any], fn: Callable[[], object]) -> list[tuple[str, str]]:
    """The frontend messages ``fn`` sent, as (type, first field), from libpq's trace."""
    return [message for trip in exchanges(conn, fn) for message in trip]


def one(conn: psycopg.Connection[Any], query: str) -> Any:
    return conn.execute(query).fetchone()[0]  # type: ignore[index]


BEGIN_34 = "\"BEGIN; SET LOCAL fencekit.token = '34'\""  # untagged: no issuer statement


# psycopg's own BEGIN: one simple query from psycopg 3.2 on; psycopg 3.1 sends it with the
# extended protocol (Parse, Bind, Describe, Execute, Sync), in the same one round trip.
PSYCOPG_BEGIN = ("Query", '"BEGIN"')
PSYCOPG_31_BEGIN = ("Parse", '"" "BEGIN" 0')


def shapes(conn: psycopg.Connection[Any], auto: psycopg.Connection[Any]) -> dict[str, Any]:
    """Each way a transaction gets fenced with token 34 (``auto`` is install()ed), as
    :func:`exchanges`; ``base`` is the same transaction unfenced, on an unprotected table.

    A fenced UPDATE that succeeds carried a token (none is rejected: YF003); the test of the
    fence afterwards shows it was 34.
    """
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

    return {
        "base": exchanges(conn, unfenced),
        "explicit": exchanges(conn, explicit),
        "scoped": exchanges(auto, scoped_block),
        "implicit": exchanges(auto, implicit),
    }


def assert_fence_is_34(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(StaleTokenError), fkpg.transaction(conn, 33):
        conn.execute(UPDATE, ("stale",))
    with fkpg.transaction(conn, 34):
        conn.execute(UPDATE, ("equal",))


def test_every_transaction_shape_sends_the_token_with_begin(billing: str) -> None:
    """Same round trips as an unfenced transaction, the same messages in each, except that
    the BEGIN is one simple query that carries the token."""
    with psycopg.connect(billing) as conn, psycopg.connect(billing) as auto:
        fkpg.install(auto)
        trips = shapes(conn, auto)
        assert_fence_is_34(conn)
    base = trips.pop("base")
    assert len(base) == 3
    assert base[0][0] in (PSYCOPG_BEGIN, PSYCOPG_31_BEGIN)  # and in 3.1, four messages more
    assert "COMMIT" in base[-1][0][1]
    for name, fenced in trips.items():
        assert len(fenced) == len(base), name  # no extra round trip
        assert fenced[0] == [("Query", BEGIN_34)], name
        assert UPDATE.replace("%s", "$1") in fenced[1][0][1], name  # the statement, untouched
        assert [m[0] for m in fenced[1]] == [m[0] for m in base[1]], name  # no extra message
        assert fenced[-1] == base[-1], name


def test_without_the_internals_the_token_rides_a_pipeline(
    billing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The public path (taken when the import-time check fails): psycopg's own BEGIN, the
    token in one pipeline with the first statement, still no extra round trip."""
    monkeypatch.setattr(internals, "AVAILABLE", False)
    with psycopg.connect(billing) as conn, psycopg.connect(billing) as auto:
        fkpg.install(auto)
        trips = shapes(conn, auto)
        assert_fence_is_34(conn)
    base = trips.pop("base")
    for name, fenced in trips.items():
        # No extra round trip (psycopg 3.1 even puts the implicit BEGIN in the pipeline: one
        # round trip fewer than unfenced).
        assert len(fenced) <= len(base), name
        assert not any("SET LOCAL" in text for trip in fenced for _, text in trip), name
        statement = next(t for t in fenced if any("UPDATE" in text for _, text in t))
        setter = next(i for i, (_, text) in enumerate(statement) if "set_config" in text)
        assert "'34'" in statement[setter][1], name  # the token, checked digits
        assert statement[setter + 1][0] == "Bind", name
        assert fenced[-1] == base[-1], name


def test_the_internals_are_there_in_the_psycopg_under_test() -> None:
    """CI runs this file on the lowest psycopg pyproject.toml declares and on the newest."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    declared = re.search(r'"psycopg\[binary\]>=([0-9.]+)"', pyproject)
    assert declared is not None, "the psycopg dependency line of pyproject.toml moved"
    version = Version(psycopg.__version__)
    assert version >= Version(declared.group(1))
    expected = os.environ.get("FENCEKIT_EXPECT_PSYCOPG")
    if expected:  # scripts/test's run on the lowest psycopg sets it
        assert version == Version(expected)
    assert internals.missing() == []
    assert internals.AVAILABLE


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(psycopg.transaction.BaseTransaction, "_push_savepoint")
    monkeypatch.delattr(psycopg.Connection, "wait")
    assert internals.missing() == ["Transaction._push_savepoint", "Connection.wait"]


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
        assert core._begin_sql(conn) == conn._get_tx_start_command()


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
        assert core._state(conn).pinned is None
        conn.rollback()
        with fkpg.transaction(conn, 34):  # the connection is usable as ever
            conn.execute(UPDATE, ("written by B",))
        assert one(conn, "SELECT summary FROM billing_summary WHERE account_id = 42") == (
            "written by B"
        )


def test_a_block_is_entered_once(billing: str) -> None:
    with psycopg.connect(billing) as conn:
        block = fkpg.transaction(conn, 34)
        with block:
            conn.execute(UPDATE, ("once",))
        with pytest.raises(TypeError, match="only once"), block:
            conn.execute(UPDATE, ("twice",))
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize("begin_path", [True, False], ids=["begin", "public"])
async def test_async_shapes_send_the_token_with_begin(
    billing: str, monkeypatch: pytest.MonkeyPatch, begin_path: bool
) -> None:
    monkeypatch.setattr(internals, "AVAILABLE", begin_path)
    async with await psycopg.AsyncConnection.connect(billing) as conn:
        fkpg.install(conn)
        block = fkpg.async_transaction(conn, 34)
        assert isinstance(block, _psycopg_async._AsyncTokenTransaction) == begin_path
        async with block:
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
