"""``fencekit protect`` of a table created again under a protected table's name says what the
earlier table left: the fences of its resource (kept), or a registry entry that the event
trigger forgetting dropped tables would have removed, where it is not installed."""

from __future__ import annotations

import psycopg

from .conftest import Cli

TABLE = "CREATE TABLE jobs (id bigint PRIMARY KEY, queue bigint NOT NULL)"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _fence_key_7(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '50', true)")
        conn.execute("INSERT INTO jobs VALUES (1, 7)")


def test_a_new_table_under_an_old_name_is_protected_afresh_and_keeps_the_fences(
    cli: Cli, dsn: str
) -> None:
    _sql(dsn, TABLE)
    assert cli("protect", "jobs", "--key", "queue", "--dsn", dsn).code == 0
    _fence_key_7(dsn)
    _sql(dsn, "DROP TABLE jobs", TABLE)
    r = cli("protect", "jobs", "--key", "queue", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "is protected afresh, but its resource 'public.jobs' keeps the fences" in r.err + r.out
    assert cli("status", "--dsn", dsn).code == 0


def test_without_the_event_trigger_protect_says_the_entry_is_an_earlier_tables(
    cli: Cli, dsn: str
) -> None:
    _sql(dsn, "DROP EVENT TRIGGER fencekit_forget_dropped", TABLE)
    assert cli("protect", "jobs", "--key", "queue", "--dsn", dsn).code == 0
    _sql(dsn, "DROP TABLE jobs", TABLE)
    assert cli("status", "--dsn", dsn).code == 1  # the registered table lacks its triggers
    r = cli("protect", "jobs", "--key", "queue", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "carries none of its triggers: it was dropped and created again" in r.err + r.out
    assert "unprotect it first" in r.err + r.out
    # A re-run finds its own triggers: nothing more to say.
    again = cli("protect", "jobs", "--key", "queue", "--dsn", dsn)
    assert "carries none of its triggers" not in again.err + again.out
