"""``fencekit protect`` on a table that already runs its owner's code (triggers, foreign-key
cascades): it shows each, says what it means for the fence, and with --allow-existing-code
allows the reviewed code in the same step, so ``fencekit status`` is clean right after."""

from __future__ import annotations

import json

import psycopg

from .conftest import Cli

APP_SCHEMA = [
    "CREATE TABLE queue (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'todo')",
    "CREATE TABLE events (id bigserial PRIMARY KEY, "
    "job_id bigint NOT NULL REFERENCES queue (id) ON DELETE CASCADE, at timestamptz)",
    "CREATE FUNCTION notify_job() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
    "PERFORM pg_notify('jobs', NEW.id::text); RETURN NEW; END$$",
    "CREATE TRIGGER notify_job AFTER INSERT ON queue FOR EACH ROW EXECUTE FUNCTION notify_job()",
    "CREATE FUNCTION stamp_event() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN OLD; END$$",
    "CREATE TRIGGER stamp_event BEFORE DELETE ON events FOR EACH ROW "
    "EXECUTE FUNCTION stamp_event()",
]


def _app(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in APP_SCHEMA:
            conn.execute(stmt)


def test_protect_shows_the_owner_code_and_status_agrees(cli: Cli, dsn: str) -> None:
    _app(dsn)
    r = cli("protect", "queue", "--dsn", dsn)
    assert r.code == 0, r.err
    # Its trigger, and the trigger a delete reaches through the cascade into events.
    assert "code of the table's owner already fires on it (2)" in r.out
    assert "[foreign_trigger] public.queue: trigger notify_job" in r.out
    assert "[foreign_cascade] public.queue: foreign key public.events.events_job_id_fkey" in r.out
    assert "fencekit allow " in r.out
    assert "--allow-existing-code" in r.out
    doc = json.loads(cli("protect", "queue", "--json", "--dsn", dsn).out)  # a no-op re-run
    assert {d["kind"] for d in doc["owner_code"]} == {"foreign_trigger", "foreign_cascade"}
    assert doc["allowed"] == {}
    status = cli("status", "--json", "--dsn", dsn)
    assert status.code == 1
    reported = {d["sha256"] for t in json.loads(status.out)["tables"] for d in t["drift"]}
    assert {d["sha256"] for d in doc["owner_code"]} == reported


def test_allow_existing_code_leaves_status_clean(cli: Cli, dsn: str) -> None:
    _app(dsn)
    r = cli("protect", "queue", "--allow-existing-code", "--dsn", dsn)
    assert r.code == 0, r.err
    assert r.out.count("    allowed ") == 2
    status = cli("status", "--dsn", dsn)
    assert status.code == 0, status.out
    listed = json.loads(cli("allow", "--list", "--json", "--dsn", dsn).out)["allowed"]
    assert listed
    assert all("--allow-existing-code" in row["note"] for row in listed)
    # A changed body is reported again.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION notify_job() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
            "PERFORM set_config('fencekit.token', '999', true); RETURN NEW; END$$"
        )
    assert cli("status", "--dsn", dsn).code == 1


def test_a_table_without_owner_code_says_nothing_more(cli: Cli, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE plain (id bigint PRIMARY KEY)")
    r = cli("protect", "plain", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "owner" not in r.out
