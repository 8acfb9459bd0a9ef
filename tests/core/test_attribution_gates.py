"""The enforce gate sees every tokenless write, at every isolation level it may run at.

A migration may run the gate in a REPEATABLE READ or SERIALIZABLE transaction, where the fold of
the attribution log refuses to run and the gate judges by ``fencekit.unfenced_writer_totals``.
At SERIALIZABLE that view does not read the log; it took the time of the last append only when
appends were numbered past the last fold's mark, which missed an append of a transaction still
open at that fold, and every append after an unprotect and a protect (which restart the
numbering but left the old mark). At REPEATABLE READ the fold itself failed with 40001 when a
writer's row was recorded after its snapshot. And a writer's record was accepted for any table
that carried a trigger calling one of the protected table's functions, the row fence's TRUNCATE
check included, which the table's owner owns and may put anywhere.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit.catalog.rollout import enforce_refusal
from fencekit.ident import object_tag
from fencekit.spec import TableName
from tests.core.helpers import protect, unprotect, write

Conn = psycopg.Connection[Any]
WINDOW = timedelta(hours=1)


def _aged(db: Conn, table: str) -> None:
    """Watched for longer than the window (the gate's other condition)."""
    db.execute(
        "UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'"
        " WHERE table_name = %s",
        [table],
    )
    db.commit()


def _refusal(dsn: str, level: psycopg.IsolationLevel, table: str) -> str | None:
    with psycopg.connect(dsn) as c:
        c.isolation_level = level
        why = enforce_refusal(c, TableName("public", table), WINDOW)
        c.rollback()
        return why


def _rr_write(dsn: str, table: str, app: str = "gate-rr") -> psycopg.Connection[Any]:
    """An open REPEATABLE READ transaction that wrote ``table`` without a token."""
    c = psycopg.connect(make_conninfo(dsn, application_name=app))
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    c.execute(f"UPDATE {table} SET v = 'rr' WHERE id = 1")
    return c


@pytest.fixture
def table(db: Conn) -> str:
    db.execute("CREATE TABLE gate_t (id int PRIMARY KEY, v text)")
    db.commit()
    protect(db, "gate_t", on_missing="allow")
    write(db, 10, "INSERT INTO gate_t SELECT g, 'a' FROM generate_series(1, 5) g")
    _aged(db, "gate_t")
    return "gate_t"


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_an_append_open_at_a_fold_is_seen_by_the_gate(
    db: Conn, dsn: str, table: str, level: str
) -> None:
    writer = _rr_write(dsn, table)
    db.execute("SELECT fencekit.fold_unfenced_log(NULL)")  # moves the mark past the append
    db.commit()
    writer.commit()  # the append is visible only now
    writer.close()
    iso = (
        psycopg.IsolationLevel.SERIALIZABLE
        if level == "serializable"
        else psycopg.IsolationLevel.REPEATABLE_READ
    )
    why = _refusal(dsn, iso, table)
    assert why is not None
    assert "written without a token" in why


def test_appends_after_unprotect_and_protect_are_seen_by_a_serializable_gate(
    db: Conn, dsn: str, table: str
) -> None:
    for _ in range(3):
        w = _rr_write(dsn, table)
        w.commit()
        w.close()
    db.execute("SELECT fencekit.fold_unfenced_log(NULL)")  # mark = 3
    db.commit()
    spec = protect(db, table, on_missing="allow")
    unprotect(db, spec)
    # Nothing of the table's attribution is left for the next protection to inherit.
    tag = object_tag("public", table)
    for t in ("unfenced_writers", "unfenced_overflow", "unfenced_log", "unfenced_log_folded"):
        n = db.execute(f"SELECT count(*) FROM fencekit.{t} WHERE tag = %s", [tag]).fetchone()
        assert n == (0,), t
    db.rollback()
    protect(db, table, on_missing="allow")
    _aged(db, table)
    w = _rr_write(dsn, table)  # numbered 1 again
    w.commit()
    w.close()
    why = _refusal(dsn, psycopg.IsolationLevel.SERIALIZABLE, table)
    assert why is not None
    assert "written without a token" in why


def test_a_gate_at_repeatable_read_does_not_fail_on_a_writer_recorded_after_its_snapshot(
    db: Conn, dsn: str, table: str
) -> None:
    with psycopg.connect(make_conninfo(dsn, application_name="gate-rc"), autocommit=True) as rc:
        rc.execute(f"UPDATE {table} SET v = 'rc' WHERE id = 2")  # the writer's row
        w = _rr_write(dsn, table, app="gate-rc")  # the same writer's log row
        w.commit()
        w.close()
        with psycopg.connect(dsn) as gate:
            gate.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            gate.execute("SELECT count(*) FROM fencekit.protected")  # the snapshot
            with psycopg.connect(
                make_conninfo(dsn, application_name="gate-rc"), autocommit=True
            ) as again:  # a new session: nothing recorded in its settings yet
                again.execute(f"UPDATE {table} SET v = 'rc2' WHERE id = 2")  # after it
            why = enforce_refusal(gate, TableName("public", table), WINDOW)  # no 40001
            gate.rollback()
    assert why is not None
    assert "written without a token" in why


def test_a_table_carrying_only_the_owners_truncate_check_records_nothing(
    db: Conn, make_role: Any
) -> None:
    make_role("gate_owner")
    w_dsn = make_role("gate_w")
    db.execute("CREATE SCHEMA gs AUTHORIZATION gate_owner")
    db.execute("SET ROLE gate_owner; CREATE TABLE gs.t (id int PRIMARY KEY, v text); RESET ROLE")
    db.commit()
    protect(db, "gs.t", on_missing="allow")
    tag = object_tag("gs", "t")
    db.execute(
        "SET ROLE gate_owner; CREATE TABLE gs.u (id int); GRANT ALL ON gs.u TO gate_w;"
        " GRANT USAGE ON SCHEMA gs TO gate_w;"
        " CREATE TRIGGER fencekit_yy BEFORE INSERT ON gs.u FOR EACH STATEMENT"
        f" EXECUTE FUNCTION fencekit.{tag}_trunc(); RESET ROLE"
    )
    db.commit()
    with psycopg.connect(w_dsn) as w:
        # The truncate check refuses a TRUNCATE-less caller that is not writing gs.t; an
        # INSERT into gs.u must not be recorded or counted as a write of gs.t.
        try:
            w.execute("INSERT INTO gs.u VALUES (1)")
            w.commit()
        except psycopg.Error:
            w.rollback()
        direct = None
        try:
            w.execute("SELECT fencekit.record_unfenced_writer(%s, 'gs.u'::regclass, 1)", [tag])
            w.commit()
        except psycopg.Error as e:
            w.rollback()
            direct = e.sqlstate
    assert direct == "42501"
    n = db.execute("SELECT count(*) FROM fencekit.unfenced_writers WHERE tag = %s", [tag])
    assert n.fetchone() == (0,)
    db.rollback()
