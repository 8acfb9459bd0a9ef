"""Concurrent writers, each on its own connection and thread: the fence never ends below an
accepted token and a lower token never commits after a higher one.

Commit order is recorded by a history row inserted in the same transaction right after the
fenced write. Its sequence number is taken while the writer holds the lock its fenced write
took (the row, or the fences row of each key), so among writers of one resource the history
order is the commit order; a fence that let two writers pass concurrently shows up as a token
going down in that order.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest

from tests.core.helpers import STALE, Conn, key_fence, one, protect, rows, write

# Light (a few hundred transactions, well under a second) and version-sensitive: both servers.
pytestmark = pytest.mark.all_servers

WORKERS = 6
ROUNDS = 40
ABORT_RATE = 0.1  # some accepted writers roll back: their locks go, their tokens never count


@dataclass
class Outcomes:
    committed: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    other: list[tuple[int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, token: int, note: str = "") -> None:
        with self.lock:
            if kind == "committed":
                self.committed.append(token)
            elif kind == "stale":
                self.stale.append(token)
            elif kind != "skipped":
                self.other.append((token, note))


# A write picks one statement; it returns the keys it wrote (empty: wrote nothing).
Write = Callable[[psycopg.Connection, random.Random, int], list[int]]


def _run_workers(dsn: str, do_write: Write, seed: int) -> Outcomes:
    tokens = itertools.count(1)
    token_lock = threading.Lock()
    out = Outcomes()
    start = threading.Barrier(WORKERS)

    def worker(n: int) -> None:
        rnd = random.Random(seed * 100 + n)
        with psycopg.connect(dsn) as conn:
            start.wait()
            for _ in range(ROUNDS):
                with token_lock:
                    token = next(tokens)
                # Grant-to-write delay: later tokens overtake earlier ones, as a paused
                # worker's would.
                time.sleep(rnd.random() * 0.003)
                try:
                    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
                    keys = do_write(conn, rnd, token)
                    if not keys:
                        conn.rollback()
                        out.add("skipped", token)
                        continue
                    conn.execute("INSERT INTO history (token, keys) VALUES (%s, %s)", (token, keys))
                    if rnd.random() < ABORT_RATE:
                        conn.rollback()
                        out.add("skipped", token)
                    else:
                        conn.commit()
                        out.add("committed", token)
                except psycopg.Error as exc:
                    conn.rollback()
                    out.add("stale" if exc.sqlstate == STALE else "other", token, str(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return out


def _check_history(conn: Conn, out: Outcomes, keys: list[int]) -> None:
    assert out.other == [], f"unexpected errors (deadlocks?): {out.other[:3]}"
    assert out.committed, "no writer committed: the test exercised nothing"
    assert out.stale, "no writer was stale: the test exercised no contention"
    history = rows(conn, "SELECT token, keys FROM history ORDER BY seq")
    assert sorted(t for t, _ in history) == sorted(out.committed)
    for key in keys:
        order = [t for t, ks in history if key in ks]
        assert order == sorted(order), f"key {key}: a lower token committed after a higher one"
    # Each stale writer was refused because a higher token had committed first.
    assert max(out.stale) < max(out.committed)


def _setup(db: Conn, scope: str, *, pk: bool = True) -> None:
    db.execute("CREATE TABLE acct (k int NOT NULL, v bigint)")
    db.execute("CREATE TABLE history (seq bigserial PRIMARY KEY, token bigint, keys int[])")
    if pk:
        # One row per key: several rows of one key, locked by concurrent UPDATE and DELETE in
        # scan order, deadlock in plain PostgreSQL, with or without fencekit.
        db.execute("ALTER TABLE acct ADD PRIMARY KEY (k)")
    db.commit()
    protect(db, "acct", scope, **({"key": ("k",)} if scope == "key" else {}))


def _single_key_write(scope: str) -> Write:
    def do_write(conn: psycopg.Connection, rnd: random.Random, token: int) -> list[int]:
        # Row fences guard existing rows only (re-creation is what key fences are for), so
        # under a row fence every write is an UPDATE of the one row.
        op = "update" if scope == "row" else rnd.choice(["insert", "update", "delete"])
        stmt = {
            "insert": "INSERT INTO acct VALUES (1, %s) ON CONFLICT (k) DO NOTHING",
            "update": "UPDATE acct SET v = %s WHERE k = 1",
            "delete": "DELETE FROM acct WHERE k = 1 AND v <> %s",
        }[op]
        return [1] if conn.execute(stmt, (token,)).rowcount else []

    return do_write


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_concurrent_writers_on_one_resource(db: Conn, dsn: str, scope: str) -> None:
    _setup(db, scope)
    write(db, None, "INSERT INTO acct VALUES (1, 0)", bypass=True)  # superuser: admin
    out = _run_workers(dsn, _single_key_write(scope), seed=len(scope))
    _check_history(db, out, [1])
    if scope == "row":
        fence = one(db, "SELECT fencekit_fence FROM acct WHERE k = 1")
    else:
        fence = key_fence(db, "public.acct", "1" if scope == "key" else "")
    # The fence is the highest token that committed: never below an accepted one.
    assert fence == max(out.committed)


def test_concurrent_multi_key_writers_do_not_deadlock(db: Conn, dsn: str) -> None:
    """Writers touching several keys in random order lock fences in key order: no deadlock,
    and per key the commit order is still the token order."""
    _setup(db, "key", pk=False)  # inserts only: the writers share no table rows, only fences
    keys = [1, 2, 3, 4, 5]

    def do_write(conn: psycopg.Connection, rnd: random.Random, token: int) -> list[int]:
        chosen = rnd.sample(keys, rnd.randint(2, 4))  # random order on purpose
        conn.execute("INSERT INTO acct SELECT k, %s FROM unnest(%s::int[]) AS k", (token, chosen))
        return chosen

    out = _run_workers(dsn, do_write, seed=7)
    _check_history(db, out, keys)
    history = rows(db, "SELECT token, keys FROM history")
    for key in keys:
        accepted = [t for t, ks in history if key in ks]
        assert key_fence(db, "public.acct", str(key)) == (max(accepted) if accepted else None)
