"""A claim and the operations that read and rewrite fences exclude each other.

Real concurrent sessions. ``race_t`` is key-fenced (key 1 at 40) and moved to a table fence,
whose fence must be the highest token either spec accepted.

- claim first: a claim at 50 is in flight (not committed) when ``fencekit move`` starts. The
  move waits for it, and carries 50. Before: the move read 40, deleted the claimed fence when
  the claim committed and wrote 40, so a stale T(45) was accepted.
- move first: the move is in flight when the claim starts. The claim waits for the move, then
  meets the new spec (a table fence: the key claim fails loudly); a table claim then holds.

- rename: a claim in flight while the table is renamed and ``fencekit rename`` moves its
  fences to the new name is carried (the rename's ``ALTER TABLE`` waits for the claim's lock).

T(45) is then refused.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import change_statements
from tests.security.conftest import Conn, protect

OLD = FenceSpec(TableName("public", "race_t"), scope=Scope.KEY, key=("k",))
NEW = FenceSpec(TableName("public", "race_t"), scope=Scope.TABLE)


@pytest.fixture
def race(db: Conn) -> Conn:
    db.execute("CREATE TABLE race_t (id int PRIMARY KEY, k int NOT NULL, v int)")
    protect(db, OLD)
    db.execute("SELECT set_config('fencekit.token', '40', true)")
    db.execute("INSERT INTO race_t VALUES (1, 1, 0)")
    db.commit()
    return db


def _waiting(db: Conn, pid: int) -> bool:
    db.rollback()
    row = db.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    db.rollback()
    return row is not None and row[0] == "Lock"


def _wait_until_blocked(db: Conn, pid: int) -> None:
    deadline = time.monotonic() + 20
    while not _waiting(db, pid):
        assert time.monotonic() < deadline, f"session {pid} never waited for a lock"
        time.sleep(0.05)


def _move(dsn: str, errors: list[BaseException], pid: list[int], go: threading.Event) -> None:
    try:
        with psycopg.connect(dsn) as conn:
            pid.append(conn.info.backend_pid)
            go.wait(20)
            for stmt in change_statements(OLD, NEW):
                conn.execute(stmt.encode())
            conn.commit()
    except BaseException as exc:  # handed to the test
        errors.append(exc)


def _table_fence(db: Conn) -> int | None:
    db.rollback()
    row = db.execute("SELECT fencekit.current_fence('public.race_t', '')").fetchone()
    db.rollback()
    return None if row is None or row[0] is None else int(row[0])


def _stale_write_refused(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '45', true)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO race_t VALUES (2, 1, 0)")
        assert info.value.sqlstate == "YF001", info.value


def test_a_claim_in_flight_is_carried_by_the_move(race: Conn, dsn: str) -> None:
    errors: list[BaseException] = []
    pid: list[int] = []
    go = threading.Event()
    with psycopg.connect(dsn) as claimer:
        assert claimer.execute("SELECT fencekit.claim('race_t', '{1}', 50)").fetchone() == (40,)
        mover = threading.Thread(target=_move, args=(dsn, errors, pid, go))
        mover.start()
        time.sleep(0.2)
        go.set()
        while not pid:
            time.sleep(0.01)
        _wait_until_blocked(race, pid[0])  # the move waits for the claim
        claimer.commit()
    mover.join(30)
    assert not mover.is_alive()
    assert not errors, errors
    assert _table_fence(race) == 50, "the move lost the claim that committed while it ran"
    _stale_write_refused(dsn)


def test_a_claim_waits_for_a_move_in_flight(race: Conn, dsn: str) -> None:
    outcome: dict[str, Any] = {}
    with psycopg.connect(dsn) as mover:
        for stmt in change_statements(OLD, NEW):
            mover.execute(stmt.encode())

        def claim() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                outcome["pid"] = conn.info.backend_pid
                try:
                    conn.execute("SELECT fencekit.claim('race_t', '{1}', 50)")
                    outcome["ok"] = True
                except psycopg.Error as exc:
                    outcome["error"] = exc

        t = threading.Thread(target=claim)
        t.start()
        while "pid" not in outcome:
            time.sleep(0.01)
        _wait_until_blocked(race, outcome["pid"])  # the claim waits for the move
        mover.commit()
    t.join(30)
    assert not t.is_alive()
    # The table is table-fenced now: the key claim, run against the spec it finds after the
    # wait, is refused loudly (the claimant knows it holds nothing), and the move's fence stands.
    assert "error" in outcome, "a key claim on a table fence was accepted"
    assert outcome["error"].sqlstate == "YF000", outcome["error"]
    assert _table_fence(race) == 40
    # And a table claim now holds.
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT fencekit.claim('race_t', '{}', 50)").fetchone() == (40,)
    _stale_write_refused(dsn)


def _rename(dsn: str, errors: list[BaseException], pid: list[int], go: threading.Event) -> None:
    from fencekit.sqlgen import rename_statements

    try:
        with psycopg.connect(dsn) as conn:
            pid.append(conn.info.backend_pid)
            go.wait(20)
            conn.execute("ALTER TABLE race_t RENAME TO race_u")
            for stmt in rename_statements(OLD, TableName("public", "race_u")):
                conn.execute(stmt.encode())
            conn.commit()
    except BaseException as exc:  # handed to the test
        errors.append(exc)


def test_a_claim_in_flight_is_carried_by_a_rename(race: Conn, dsn: str) -> None:
    """``fencekit rename`` moves an unnamed key fence's fences to the new name: a claim that
    commits while it runs is among them (before: the rename copied 40, then deleted the claimed
    50 when the claim committed)."""
    errors: list[BaseException] = []
    pid: list[int] = []
    go = threading.Event()
    with psycopg.connect(dsn) as claimer:
        assert claimer.execute("SELECT fencekit.claim('race_t', '{1}', 50)").fetchone() == (40,)
        renamer = threading.Thread(target=_rename, args=(dsn, errors, pid, go))
        renamer.start()
        go.set()
        while not pid:
            time.sleep(0.01)
        _wait_until_blocked(race, pid[0])
        claimer.commit()
    renamer.join(30)
    assert not renamer.is_alive()
    assert not errors, errors
    race.rollback()
    row = race.execute("SELECT fencekit.current_fence('public.race_u', '1')").fetchone()
    race.rollback()
    assert row == (50,), "the rename lost the claim that committed while it ran"
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '45', true)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO race_u VALUES (2, 1, 0)")
        assert info.value.sqlstate == "YF001", info.value
