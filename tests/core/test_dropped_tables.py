"""A protected table that is dropped is forgotten (registry row and counters), so a table created
again under its name is protected afresh; its resource's fences stay (a fence is never lowered).
The event trigger that does it is installed only by a superuser; anyone else is told."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.core.helpers import Conn, one, protect, reject, rejection_count, rows, write

STALE = "YF001"
CORE_FILE = (
    Path(__file__).resolve().parents[2] / "fencekit" / "sqlsrc" / "core" / "85_forget_dropped.sql"
)


def _registered(db: Conn) -> list[str]:
    return [r[0] for r in rows(db, "SELECT table_name FROM fencekit.protected ORDER BY 1")]


def _counters(db: Conn, tag: str) -> int:
    return int(
        one(
            db,
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'fencekit'::regnamespace "
            "AND relkind = 'S' AND starts_with(relname, %s)",
            (tag + ":",),
        )
    )


def test_a_dropped_table_is_forgotten_and_its_successor_starts_fresh(db: Conn) -> None:
    db.execute("CREATE TABLE acct (id bigint PRIMARY KEY, k bigint NOT NULL)")
    protect(db, "acct", "key", key=("k",))
    db.commit()
    tag = one(db, "SELECT tag FROM fencekit.protected WHERE table_name = 'acct'")
    write(db, 50, "INSERT INTO acct VALUES (1, 7)")
    reject(db, STALE, 10, "UPDATE acct SET id = 1")
    assert rejection_count(db, "acct", "stale") == 1
    assert _counters(db, tag) > 0

    db.execute("DROP TABLE acct")
    db.commit()
    assert _registered(db) == []
    assert _counters(db, tag) == 0

    db.execute("CREATE TABLE acct (id bigint PRIMARY KEY, k bigint NOT NULL)")
    protect(db, "acct", "key", key=("k",))
    db.commit()
    assert _registered(db) == ["acct"]
    assert rejection_count(db, "acct", "stale") == 0  # counts start from zero
    # The key's fence is the old table's: a token below what it accepted is still stale.
    reject(db, STALE, 10, "INSERT INTO acct VALUES (1, 7)")
    assert write(db, 60, "INSERT INTO acct VALUES (1, 7)") == 1


def test_dropping_a_table_that_took_a_protected_tables_old_name_forgets_nothing(
    db: Conn,
) -> None:
    db.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
    protect(db, "t")
    db.commit()
    # Renamed (status reports it), then another table takes the old name and is dropped.
    db.execute("ALTER TABLE t RENAME TO u")
    db.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
    db.execute("DROP TABLE t")
    db.commit()
    assert _registered(db) == ["t"]  # u's triggers still call the functions registered as t


def test_a_schema_dropped_with_its_tables_forgets_them(db: Conn) -> None:
    db.execute("CREATE SCHEMA app")
    db.execute("CREATE TABLE app.jobs (id bigint PRIMARY KEY)")
    protect(db, "app.jobs")
    db.commit()
    db.execute("DROP SCHEMA app CASCADE")
    db.commit()
    assert _registered(db) == []


def test_only_a_superuser_installs_the_event_trigger(
    db: Conn, make_role: Callable[..., str]
) -> None:
    db.execute("DROP EVENT TRIGGER fencekit_forget_dropped")
    db.commit()
    install_part = CORE_FILE.read_text().split("DO $do$", 1)[1]
    dsn = make_role("fk_not_super")
    notices: list[tuple[str, str]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A notice's fields are readable only inside the handler.
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_hint)))
        conn.execute("DO $do$" + install_part)
    ((primary, hint),) = notices
    assert "needs a superuser" in primary
    assert "table_missing" in hint
    assert rows(db, "SELECT evtname FROM pg_event_trigger WHERE evtname = %s",
                ("fencekit_forget_dropped",)) == []  # fmt: skip
