"""Key and table fences under concurrency: writers that carry the same token never wait for each
other, and only an advance waits, for the writers under the older token.

A key whose fence already holds the token is share-locked (FOR SHARE) by each writer; an advance
to a higher token takes the fence row's exclusive lock. Each test runs the same statements on a
protected table and on an unprotected twin and asks for the same outcome: fencekit adds no wait
and no deadlock that the plain table does not have.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.core.helpers import STALE, Conn, key_fence, protect, rows, write

pytestmark = [pytest.mark.all_servers, pytest.mark.slow]

Work = Callable[[psycopg.Connection], None]


def _tables(db: Conn, scope: str) -> None:
    """``fenced`` (protected) and ``plain`` (not): rows 1-8 under key 1, 11-18 under key 2."""
    for t in ("fenced", "plain"):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL)")
        db.execute(f"INSERT INTO {t} SELECT g, 1, 0 FROM generate_series(1, 8) g")
        db.execute(f"INSERT INTO {t} SELECT g, 2, 0 FROM generate_series(11, 18) g")
    db.commit()
    protect(db, "fenced", scope, **({"key": ("k",)} if scope == "key" else {}))
    # The holder's first write under token 10 advances the fences; the tests start after it.
    write(db, 10, "UPDATE fenced SET v = 1 WHERE id IN (1, 11)")


def _tx(dsn: str, token: int | None) -> psycopg.Connection:
    conn = psycopg.connect(dsn)
    conn.execute("SET lock_timeout = '5s'")  # a wait that should not happen fails, not hangs
    conn.execute("SET deadlock_timeout = '100ms'")
    if token is not None:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    return conn


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


@pytest.mark.parametrize("scope", ["key", "table"])
def test_same_token_writers_of_one_key_do_not_wait(db: Conn, dsn: str, scope: str) -> None:
    _tables(db, scope)
    for table in ("fenced", "plain"):
        holders = [_tx(dsn, 10) for _ in range(4)]
        try:
            # Each holds its write open; the next must not wait for it (lock_timeout would say).
            for i, conn in enumerate(holders):
                started = time.monotonic()
                conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (2 + i,))
                assert time.monotonic() - started < 2, f"{table}: writer {i} waited"
            for conn in holders:
                conn.commit()
        finally:
            for conn in holders:
                conn.close()
    assert rows(db, "SELECT id, v FROM fenced WHERE id BETWEEN 2 AND 5 ORDER BY id") == [
        (i, 1) for i in range(2, 6)
    ]


@pytest.mark.parametrize("scope", ["key", "table"])
def test_an_advance_waits_for_the_old_tokens_writers_only(db: Conn, dsn: str, scope: str) -> None:
    _tables(db, scope)
    old = _tx(dsn, 10)
    new = _tx(dsn, 11)
    try:
        old.execute("UPDATE fenced SET v = 5 WHERE id = 2")  # holds the fence under token 10
        done = threading.Event()

        def advance() -> None:
            new.execute("UPDATE fenced SET v = 6 WHERE id = 3")  # another row of the key
            done.set()
            new.commit()

        t, errors = _in_thread(advance)
        assert not done.wait(0.5), "the advance did not wait for the writer under token 10"
        old.commit()  # the old holder's write lands before the fence moves
        t.join(10)
        assert not t.is_alive()
        assert errors == [], errors
        assert done.is_set()
    finally:
        old.close()
        new.close()
    fence = key_fence(db, "public.fenced", "1" if scope == "key" else "")
    assert fence == 11
    # After the advance, token 10 is stale: the contract holds.
    late = _tx(dsn, 10)
    try:
        with pytest.raises(psycopg.Error) as info:
            late.execute("UPDATE fenced SET v = 7 WHERE id = 4")
        assert info.value.sqlstate == STALE
    finally:
        late.close()


def test_same_token_writers_in_opposite_key_order_do_not_deadlock(db: Conn, dsn: str) -> None:
    """Two transactions of one holder touch keys 1 and 2 in opposite orders, different rows:
    no deadlock on the plain table, none on the fenced one."""
    _tables(db, "key")
    for table in ("plain", "fenced"):
        a, b = _tx(dsn, 10), _tx(dsn, 10)
        try:
            a.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 2")  # key 1
            b.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 12")  # key 2
            t, errors = _in_thread(
                lambda: a.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 13")  # noqa: B023
            )
            b.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 3")  # key 1
            t.join(10)
            assert errors == [], f"{table}: {errors}"
            a.commit()
            b.commit()
        finally:
            a.close()
            b.close()


def _pool(
    db: Conn, dsn: str, table: str, token_of: Callable[[int], int], rounds: int = 30
) -> tuple[list[int], list[int], list[str]]:
    """Eight connections (a holder with a pool, or several holders), each writing its own rows
    of keys 1-4 in random key order, several statements per transaction; the plain table would
    never make them wait for each other. Returns committed and stale tokens and other errors;
    each commit is logged in ``history`` in commit order (see test_concurrency)."""
    workers = 8
    counter = itertools.count(0)
    lock = threading.Lock()
    committed: list[int] = []
    stale: list[int] = []
    other: list[str] = []
    start = threading.Barrier(workers)

    def worker(w: int) -> None:
        rnd = random.Random(w)
        with psycopg.connect(dsn) as conn:
            conn.execute("SET deadlock_timeout = '200ms'")
            conn.commit()
            start.wait()
            for _ in range(rounds):
                with lock:
                    token = token_of(next(counter))
                time.sleep(rnd.random() * 0.002)
                keys = rnd.sample([1, 2, 3, 4], rnd.randint(1, 3))
                try:
                    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
                    for k in keys:
                        conn.execute(
                            f"UPDATE {table} SET v = %s WHERE id = %s", (token, w * 100 + k)
                        )
                    conn.execute("INSERT INTO history (token, keys) VALUES (%s, %s)", (token, keys))
                    conn.commit()
                    with lock:
                        committed.append(token)
                except psycopg.Error as exc:
                    conn.rollback()
                    with lock:
                        (stale.append(token) if exc.sqlstate == STALE else other.append(str(exc)))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return committed, stale, other


def _pool_tables(db: Conn, scope: str) -> None:
    for t in ("acct", "plain"):
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, k int NOT NULL, v bigint)")
        db.execute(
            f"INSERT INTO {t} SELECT w * 100 + k, k, 0 "
            "FROM generate_series(0, 7) w, generate_series(1, 4) k"
        )
    db.execute("CREATE TABLE history (seq bigserial PRIMARY KEY, token bigint, keys int[])")
    db.commit()
    protect(db, "acct", scope, **({"key": ("k",)} if scope == "key" else {}))


@pytest.mark.parametrize("scope", ["key", "table"])
def test_one_holder_with_eight_connections_never_deadlocks(db: Conn, dsn: str, scope: str) -> None:
    """The holder's fences already hold its token (its first write, or a claim at grant):
    from then on its eight connections run as on the plain table, without an error."""
    _pool_tables(db, scope)
    write(db, 7, "UPDATE acct SET v = 7 WHERE id BETWEEN 1 AND 4")
    for table in ("plain", "acct"):
        committed, stale, other = _pool(db, dsn, table, lambda _: 7)
        assert other == [], f"{table}: {other[:2]}"
        assert stale == [], table
        assert len(committed) == 8 * 30


@pytest.mark.parametrize("scope", ["key", "table"])
def test_rotating_holders_with_eight_connections_keep_the_contract(
    db: Conn, dsn: str, scope: str
) -> None:
    """Each token is shared by about a dozen writes, then the next holder's token arrives, while
    older writes are still running: per key, committed tokens never go down in commit order.
    A writer under an older token can deadlock with the advance that makes it stale (PostgreSQL
    aborts one of the two; no older-token write commits after the advance); nothing else may
    fail. A run in which the scheduler let no older write meet a newer token proves nothing:
    it runs again (at most three times), its tokens going on from where the last run ended."""
    _pool_tables(db, scope)
    committed: list[int] = []
    stale: list[int] = []
    other: list[str] = []
    for _attempt in range(3):
        base = max(committed, default=0)
        c, s, o = _pool(db, dsn, "acct", lambda n, base=base: base + 1 + n // 12)
        committed, stale, other = committed + c, stale + s, other + o
        if s:
            break
    unexpected = [e for e in other if "deadlock detected" not in e]
    assert unexpected == [], unexpected[:2]
    assert committed, "nothing committed"
    assert stale, "the run exercised no contention"
    history = rows(db, "SELECT token, keys FROM history ORDER BY seq")
    for key in (1, 2, 3, 4):
        order = [t for t, ks in history if scope == "table" or key in ks]
        assert order == sorted(order), f"key {key}: a lower token committed after a higher one"
