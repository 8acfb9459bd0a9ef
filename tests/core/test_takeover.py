"""A takeover under load: what a new holder's first write (the advance) meets from writers under
the old token, on real concurrent sessions.

Sessions are sequenced by what the server says (pg_blocking_pids), never by timing. Two facts
are pinned here, because the docs state them:

- a deadlock between the advance and a writer under the old token aborts one of the two
  (40P01); whichever commits, the fence contract holds: the old token's rows commit only if
  the advance did not, and after a committed advance the old token is stale;
- PostgreSQL does not queue a share lock behind a waiting advance: an old-token transaction
  that starts while the advance waits still gets in ahead of it (the documented limit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from tests.core.helpers import STALE, Conn, protect, reject, write

DEADLOCK = "40P01"


def _tables(db: Conn, scope: str) -> None:
    db.execute("CREATE TABLE fenced (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL)")
    db.execute("INSERT INTO fenced VALUES (1, 1, 0), (2, 2, 0), (3, 1, 0), (4, 1, 0), (5, 2, 0)")
    db.commit()
    protect(db, "fenced", scope, **({"key": ("k",)} if scope == "key" else {}))
    write(db, 10, "UPDATE fenced SET v = 1")  # every fence at 10


def _session(dsn: str, token: int) -> psycopg.Connection:
    conn = psycopg.connect(dsn)
    conn.execute("SET deadlock_timeout = '100ms'")
    conn.execute("SET lock_timeout = '60s'")  # a hang fails the test instead of the run
    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    return conn


def _run(conn: psycopg.Connection, stmt: str, out: dict[str, object]) -> threading.Thread:
    def go() -> None:
        try:
            conn.execute(stmt)
            conn.commit()
            out["ok"] = True
        except psycopg.Error as exc:
            conn.rollback()
            out["error"] = exc.sqlstate

    t = threading.Thread(target=go)
    t.start()
    return t


def _wait_until(db: Conn, what: Callable[[], bool]) -> None:
    """Poll the server until ``what`` holds (no timing decides the outcome)."""
    for _ in range(2000):
        if what():
            return
        db.execute("SELECT pg_sleep(0.01)")
        db.rollback()
    raise AssertionError("the sessions never reached the expected state")


def _blocked(db: Conn, pid: int) -> bool:
    row = db.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", (pid,)).fetchone()
    db.rollback()
    return bool(row and row[0])


def test_a_deadlock_with_the_advance_keeps_the_contract_whoever_is_aborted(
    db: Conn, dsn: str
) -> None:
    _tables(db, "key")
    old = _session(dsn, 10)
    new = _session(dsn, 11)
    try:
        old.execute("UPDATE fenced SET v = 2 WHERE id = 2")  # share-locks key 2's fence
        new_out: dict[str, object] = {}
        # Takes key 1's fence, waits for key 2's.
        t_new = _run(new, "UPDATE fenced SET v = 3 WHERE id IN (1, 5)", new_out)
        _wait_until(db, lambda: _blocked(db, new.info.backend_pid))
        old_out: dict[str, object] = {}
        t_old = _run(old, "UPDATE fenced SET v = 4 WHERE id = 3", old_out)  # waits for key 1
        t_new.join()
        t_old.join()
    finally:
        old.close()
        new.close()
    outcomes = [new_out.get("error"), old_out.get("error")]
    assert sorted(map(str, outcomes)) == sorted([DEADLOCK, "None"]), outcomes
    fence = db.execute("SELECT array_agg(DISTINCT fence) FROM fencekit.fences").fetchone()
    values = db.execute("SELECT array_agg(v ORDER BY id) FROM fenced WHERE id <> 4").fetchone()
    db.rollback()
    if new_out.get("ok"):
        # The advance committed: the old token's rows did not, and it is stale now.
        assert fence == ([11],)
        assert values == ([3, 1, 1, 3],)
        reject(db, STALE, 10, "UPDATE fenced SET v = 5 WHERE id = 3")
    else:
        # The advance was aborted (retryable): the old holder's rows committed under the fence
        # they were written under, which never moved.
        assert fence == ([10],)
        assert values == ([1, 2, 4, 1],)
        write(db, 11, "UPDATE fenced SET v = 6")  # the new holder's retry goes through


@pytest.mark.parametrize("scope", ["key", "table"])
def test_old_token_transactions_starting_while_an_advance_waits_get_in_ahead_of_it(
    db: Conn, dsn: str, scope: str
) -> None:
    """The documented limit: the advance waits for every old-token writer holding the fence's
    share lock, including ones that started after it began waiting."""
    _tables(db, scope)
    first = _session(dsn, 10)
    new = _session(dsn, 11)
    later = _session(dsn, 10)
    try:
        first.execute("UPDATE fenced SET v = 2 WHERE id = 1")
        new_out: dict[str, object] = {}
        t_new = _run(new, "UPDATE fenced SET v = 3 WHERE id = 4", new_out)
        _wait_until(db, lambda: _blocked(db, new.info.backend_pid))
        # Starts after the advance began waiting, and is not queued behind it.
        later.execute("UPDATE fenced SET v = 4 WHERE id = 3")
        assert _blocked(db, new.info.backend_pid)
        first.commit()
        _wait_until(
            db,
            lambda: (
                later.info.backend_pid
                in (
                    db.execute("SELECT pg_blocking_pids(%s)", (new.info.backend_pid,)).fetchone()
                    or [[]]
                )[0]
            ),
        )
        later.commit()
        t_new.join()
    finally:
        first.close()
        new.close()
        later.close()
    assert new_out == {"ok": True}
    reject(db, STALE, 10, "UPDATE fenced SET v = 5 WHERE id = 3")
