"""No token ever leaks into another transaction: pools, pgbouncer, threads and asyncio tasks.

Each worker interleaves fenced and unfenced transactions at random on shared pooled
connections. Every transaction reads ``fencekit.token`` and checks it is exactly its own token
(or none); every few unfenced ones also try a write to a protected table, which the database
must reject as missing a token. Counts are bounded so each test stays well under 30 s.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fkpg
from fencekit.context import current_token, fencing
from fencekit.errors import MissingTokenError
from tests.adapters.conftest import TOKEN_SQL, protect, sa_url

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

THREADS = 4
PER_WORKER = 750  # 4 workers x 750 = 3000 transactions per test
WRITE = "UPDATE slots SET v = v + 1 WHERE id = %s"


@pytest.fixture
def slots(dsn: str) -> str:
    protect(dsn, "CREATE TABLE slots (id int PRIMARY KEY, v int NOT NULL)", "slots")
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '1', true)")
        conn.execute("INSERT INTO slots SELECT g, 0 FROM generate_series(0, 15) g")
    return dsn


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []

    def add(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1


def run_threads(worker: Callable[[int, Tally], None]) -> Tally:
    tally = Tally()

    def guarded(n: int) -> None:
        try:
            worker(n, tally)
        except BaseException as exc:  # surfaced in the main thread below
            tally.errors.append(f"worker {n}: {exc!r}")

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not tally.errors, tally.errors
    return tally


def one_sync(conn: Any, n: int, step: int, rng: random.Random, tally: Tally) -> None:
    """One transaction on an auto-fenced psycopg or SQLAlchemy connection (`execute` + row)."""
    if rng.random() < 0.5:
        token = 1000 + n * 100000 + step  # increasing per worker: its writes are never stale
        with fencing(token):
            assert conn.execute(TOKEN_SQL).fetchone()[0] == str(token)
            conn.execute(WRITE, (n,))
            tally.add("fenced")
    else:
        assert current_token() is None
        assert conn.execute(TOKEN_SQL).fetchone()[0] is None, "token leaked"
        tally.add("unfenced")
        if step % 10 == 0:
            with pytest.raises(MissingTokenError):
                conn.execute(WRITE, (n,))
            tally.add("rejected")


def test_psycopg_pool_threads(slots: str) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(slots, min_size=2, max_size=2, configure=fkpg.install) as pool:

        def worker(n: int, tally: Tally) -> None:
            rng = random.Random(n)
            for step in range(PER_WORKER):
                with pool.connection() as conn:
                    one_sync(conn, n, step, rng, tally)

        tally = run_threads(worker)
    print(f"psycopg_pool threads: {dict(tally.counts)}")
    assert tally.counts["fenced"] + tally.counts["unfenced"] == THREADS * PER_WORKER
    assert tally.counts["rejected"] > 0


async def test_psycopg_pool_async_tasks(slots: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    async def configure(conn: psycopg.AsyncConnection) -> None:
        fkpg.install(conn)

    counts: Counter[str] = Counter()
    async with AsyncConnectionPool(slots, min_size=2, max_size=2, configure=configure) as pool:

        async def worker(n: int) -> None:
            rng = random.Random(n)
            for step in range(PER_WORKER):
                async with pool.connection() as conn:
                    if rng.random() < 0.5:
                        token = 1000 + n * 100000 + step
                        async with fencing(token):
                            cur = await conn.execute(TOKEN_SQL)
                            assert (await cur.fetchone())[0] == str(token)
                            await conn.execute(WRITE, (n,))
                        counts["fenced"] += 1
                    else:
                        cur = await conn.execute(TOKEN_SQL)
                        assert (await cur.fetchone())[0] is None, "token leaked"
                        counts["unfenced"] += 1
                    await asyncio.sleep(0)  # interleave tasks between transactions

        await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(THREADS))), 60)
    print(f"psycopg_pool async tasks: {dict(counts)}")
    assert counts["fenced"] + counts["unfenced"] == THREADS * PER_WORKER


def test_sqlalchemy_queuepool_threads(slots: str) -> None:
    from sqlalchemy import create_engine

    import fencekit.sqlalchemy

    engine = create_engine(sa_url(slots), pool_size=2, max_overflow=0)
    fencekit.sqlalchemy.install(engine)

    def worker(n: int, tally: Tally) -> None:
        rng = random.Random(n)
        for step in range(PER_WORKER):
            with engine.begin() as conn:
                one_sync(SAShim(conn), n, step, rng, tally)

    try:
        tally = run_threads(worker)
    finally:
        engine.dispose()
    print(f"SQLAlchemy QueuePool threads: {dict(tally.counts)}")
    assert tally.counts["fenced"] + tally.counts["unfenced"] == THREADS * PER_WORKER


class SAShim:
    """``conn.execute(sql, params)`` for a SQLAlchemy Connection, psycopg-style."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if params:
            return self.conn.exec_driver_sql(sql, params)
        return self.conn.exec_driver_sql(sql)


async def test_sqlalchemy_async_tasks(slots: str, greenlet: None) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    import fencekit.sqlalchemy

    engine = create_async_engine(sa_url(slots), pool_size=2, max_overflow=0)
    fencekit.sqlalchemy.install(engine)
    counts: Counter[str] = Counter()

    async def worker(n: int) -> None:
        rng = random.Random(n)
        for step in range(PER_WORKER // 2):
            fenced = rng.random() < 0.5
            token = 1000 + n * 100000 + step
            async with engine.begin() as conn:
                if fenced:
                    with fencing(token):
                        got = (await conn.execute(text(TOKEN_SQL))).scalar()
                        await conn.execute(
                            text("UPDATE slots SET v = v + 1 WHERE id = :n"), {"n": n}
                        )
                    assert got == str(token)
                else:
                    got = (await conn.execute(text(TOKEN_SQL))).scalar()
                    assert got is None, "token leaked"
            counts["fenced" if fenced else "unfenced"] += 1

    try:
        await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(THREADS))), 60)
    finally:
        await engine.dispose()
    print(f"SQLAlchemy async tasks: {dict(counts)}")
    assert sum(counts.values()) == THREADS * (PER_WORKER // 2)


def test_pgbouncer_transaction_mode_threads(slots: str, pgbouncer: Any) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(slots)["dbname"]
    bouncer_dsn = pgbouncer.dsn_for(str(dbname))
    backends: set[int] = set()

    def worker(n: int, tally: Tally) -> None:
        rng = random.Random(n)
        # One client connection per worker for the whole run: pgbouncer hands each of its
        # transactions to whichever server connection is free (pool of 5 for 4+ clients).
        with psycopg.connect(bouncer_dsn, prepare_threshold=None) as conn:
            fkpg.install(conn)
            for step in range(PER_WORKER):
                if step % 50 == 0:
                    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                    with tally.lock:
                        backends.add(pid)
                one_sync(conn, n, step, rng, tally)
                conn.commit()  # ends an aborted transaction too (the server rolls it back)

    tally = run_threads(worker)
    print(
        f"pgbouncer transaction mode: {dict(tally.counts)}, server backends seen: {len(backends)}"
    )
    assert tally.counts["fenced"] + tally.counts["unfenced"] == THREADS * PER_WORKER


async def test_pgbouncer_async_tasks(slots: str, pgbouncer: Any) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(slots)["dbname"]
    bouncer_dsn = pgbouncer.dsn_for(str(dbname))
    counts: Counter[str] = Counter()

    async def worker(n: int) -> None:
        rng = random.Random(100 + n)
        async with await psycopg.AsyncConnection.connect(
            bouncer_dsn, prepare_threshold=None, autocommit=True
        ) as conn:
            fkpg.install(conn)
            for step in range(PER_WORKER // 2):
                token = 1000 + n * 100000 + step
                if rng.random() < 0.5:
                    async with fencing(token):
                        cur = await conn.execute(TOKEN_SQL)
                        assert (await cur.fetchone())[0] == str(token)
                    counts["fenced"] += 1
                else:
                    cur = await conn.execute(TOKEN_SQL)
                    assert (await cur.fetchone())[0] is None, "token leaked"
                    counts["unfenced"] += 1

    await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(6))), 60)
    print(f"pgbouncer async tasks (autocommit): {dict(counts)}")
    assert sum(counts.values()) == 6 * (PER_WORKER // 2)
