"""fencekit.psycopg2: the adapter contract on psycopg2 against a real server.

Stale write rejected with the typed error (fencekit's class and psycopg2's), missing token
refused, no token leaking across pooled connections, commit outcomes reported.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

psycopg2 = pytest.importorskip("psycopg2")
from psycopg2 import pool as pg2_pool  # noqa: E402

import fencekit  # noqa: E402
import fencekit.psycopg2 as fkpg2  # noqa: E402
from fencekit import fencing, metrics  # noqa: E402
from tests.adapters.conftest import TOKEN_SQL  # noqa: E402

UPDATE = "UPDATE billing_summary SET summary = %s WHERE account_id = 42"


def summary(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT summary FROM billing_summary WHERE account_id = 42").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def events() -> list[metrics.MetricEvent]:
    seen: list[metrics.MetricEvent] = []
    remove = metrics.add_listener(seen.append)
    yield seen
    remove()


def test_stale_write_rejected_with_typed_error(billing: str, events: list) -> None:
    a, b = psycopg2.connect(billing), psycopg2.connect(billing)
    try:
        with fkpg2.transaction(b, 34), b.cursor() as cur:
            cur.execute(UPDATE, ("written by B",))
        with (
            pytest.raises(fencekit.StaleTokenError) as info,
            fkpg2.transaction(a, 33),
            a.cursor() as cur,
        ):
            cur.execute(UPDATE, ("stale summary from A",))
    finally:
        a.close()
        b.close()
    err = info.value
    assert isinstance(err, psycopg2.DatabaseError)  # psycopg2's handlers catch it too
    assert (err.pgcode, err.sqlstate) == ("YF001", "YF001")
    assert (err.token, err.fence, err.table) == (33, 34, "public.billing_summary")
    assert err.key == {"account_id": "42"}
    assert isinstance(err.orig, psycopg2.Error)
    assert summary(billing) == "written by B"
    assert [(e.kind, e.reason) for e in events] == [("rejected", "stale")]


def test_missing_token_refused(billing: str) -> None:
    conn = psycopg2.connect(billing)
    try:
        fkpg2.install(conn)
        with pytest.raises(fencekit.MissingTokenError) as info, conn.cursor() as cur:
            cur.execute(UPDATE, ("no token",))
        assert isinstance(info.value, psycopg2.Error)
        conn.rollback()
        # Refused before sending, too: no token given and no scope.
        with pytest.raises(fencekit.MissingTokenError), fkpg2.transaction(conn):
            pass
    finally:
        conn.close()
    assert summary(billing) == "initial"


def test_install_scope_token_rides_the_statement(billing: str) -> None:
    conn = psycopg2.connect(billing)
    try:
        fkpg2.install(conn)
        with fencing(40), conn.cursor() as cur:
            cur.execute(UPDATE, ("fenced",))
            cur.execute(TOKEN_SQL)
            assert cur.fetchone() == ("40",)
        # After the scope, in the same transaction: the token is cleared before the next one.
        with conn.cursor() as cur:
            cur.execute(TOKEN_SQL)
            assert cur.fetchone() == (None,)
        conn.commit()
        # Autocommit: the token and the statement run as one implicit transaction.
        conn.autocommit = True
        with fencing(41), conn.cursor() as cur:
            cur.execute(UPDATE, ("autocommit",))
            assert cur.rowcount == 1
            cur.execute("SELECT %s::text", ("%s literal",))  # parameters still interpolate
            assert cur.fetchone() == ("%s literal",)
        with conn.cursor() as cur:
            cur.execute(TOKEN_SQL)
            assert cur.fetchone() == (None,)
    finally:
        conn.close()
    assert summary(billing) == "autocommit"


def test_executemany_is_fenced(billing: str) -> None:
    conn = psycopg2.connect(billing)
    try:
        fkpg2.install(conn)
        with fencing(50), conn.cursor() as cur:
            cur.executemany(UPDATE, [("one",), ("two",)])
        conn.commit()
    finally:
        conn.close()
    assert summary(billing) == "two"


def test_no_leak_across_pooled_connections(billing: str) -> None:
    """One connection, handed out twice: the second borrower sees no token."""
    pool = pg2_pool.ThreadedConnectionPool(1, 1, billing)
    try:
        fkpg2.install(pool)
        conn = pool.getconn()
        with fencing(60), conn.cursor() as cur:
            cur.execute(UPDATE, ("pooled",))
        pool.putconn(conn)  # mid-transaction: the pool rolls back
        again = pool.getconn()
        assert again is conn
        with again.cursor() as cur:
            cur.execute(TOKEN_SQL)
            assert cur.fetchone() == (None,)
            with pytest.raises(fencekit.MissingTokenError):
                cur.execute(UPDATE, ("unfenced",))
        again.rollback()
        pool.putconn(again)
    finally:
        pool.closeall()
    assert summary(billing) == "initial"


def test_no_leak_between_threads(billing: str) -> None:
    pool = pg2_pool.ThreadedConnectionPool(1, 2, billing)
    fkpg2.install(pool)
    seen: list[object] = []

    def worker(token: int | None) -> None:
        conn = pool.getconn()
        try:
            with conn.cursor() as cur:
                if token is None:
                    cur.execute(TOKEN_SQL)
                else:
                    with fencing(token):
                        cur.execute(TOKEN_SQL)
                seen.append(cur.fetchone()[0])
            conn.commit()
        finally:
            pool.putconn(conn)

    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in (70, None, 71, None)]
        for t in threads:
            t.start()
            t.join()
    finally:
        pool.closeall()
    assert seen == ["70", None, "71", None]


def test_commit_outcome_unknown(billing: str) -> None:
    conn = psycopg2.connect(billing)
    try:
        with (  # noqa: PT012
            pytest.raises(fencekit.CommitOutcomeUnknownError) as info,
            fkpg2.transaction(conn, 80),
            conn.cursor() as cur,
        ):
            cur.execute(UPDATE, ("maybe",))
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
            with psycopg.connect(billing, autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert info.value.token == 80
        assert isinstance(info.value.orig, psycopg2.OperationalError)
    finally:
        conn.close()


def test_install_refuses_other_drivers(billing: str) -> None:
    with psycopg.connect(billing) as conn, pytest.raises(TypeError, match="psycopg2"):
        fkpg2.install(conn)  # type: ignore[arg-type]


def test_executemany_in_autocommit_is_refused_not_unfenced(billing: str) -> None:
    """docs/psycopg2.md: in autocommit each statement of the batch is its own transaction,
    which the token sent before it does not reach: the table refuses the batch."""
    conn = psycopg2.connect(billing)
    conn.autocommit = True
    try:
        fkpg2.install(conn)
        with fencing(55), conn.cursor() as cur, pytest.raises(fencekit.MissingTokenError):
            cur.executemany(UPDATE, [("one",), ("two",)])
    finally:
        conn.close()
    assert summary(billing) == "initial"
