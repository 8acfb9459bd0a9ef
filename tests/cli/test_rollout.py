"""``fencekit rollout`` and ``fencekit enforce``: the report of who writes without a token, its
verdict, and the one step to enforce that refuses while a writer is seen."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen import protect_statements
from tests.cli.conftest import Cli

Conn = psycopg.Connection[Any]


def _setup(db: Conn, dsn: str) -> None:
    db.execute("CREATE TABLE jobs (id int PRIMARY KEY, status text)")
    db.execute("CREATE TABLE done (id int PRIMARY KEY)")
    db.execute("INSERT INTO jobs VALUES (1, 'new')")
    for t in ("jobs", "done"):
        for s in protect_statements(FenceSpec(TableName("public", t), on_missing="allow")):
            db.execute(s)
    db.commit()
    for app, stmt in (
        ("worker", "UPDATE jobs SET status = 'doing' WHERE id = 1"),
        ("cron", "DELETE FROM jobs WHERE status = 'old'"),
    ):
        with psycopg.connect(make_conninfo(dsn, application_name=app), autocommit=True) as c:
            c.execute(stmt)


def _age(db: Conn, table: str, by: str) -> None:
    """As if the table was protected, and last written without a token, ``by`` ago."""
    db.execute(
        "UPDATE fencekit.protected SET protected_at = now() - %s::interval WHERE table_name = %s",
        [by, table],
    )
    db.execute(
        "UPDATE fencekit.unfenced_writers u SET first_seen = now() - %s::interval,"
        " last_seen = now() - %s::interval FROM fencekit.protected p"
        " WHERE p.tag = u.tag AND p.table_name = %s",
        [by, by, table],
    )
    db.commit()


def test_the_report_names_each_writer_and_its_statement(cli: Cli, db: Conn, dsn: str) -> None:
    _setup(db, dsn)
    r = cli("rollout", "--json", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.err
    doc = json.loads(r.out)
    assert doc["ready"] is False
    assert doc["window_seconds"] == 3600
    tables = {t["table"]: t for t in doc["tables"]}
    assert set(tables) == {"public.jobs", "public.done"}
    jobs = tables["public.jobs"]
    assert jobs["verdict"] == "not_ready"
    assert jobs["blocking_writers"] == 2
    got = {(w["application_name"], w["statement"]) for w in jobs["writers"]}
    assert got == {
        ("worker", "UPDATE jobs SET status = ? WHERE id = ?"),
        ("cron", "DELETE FROM jobs WHERE status = ?"),
    }
    for w in jobs["writers"]:
        assert w["statement_source"] in ("fencekit", "pg_stat_statements")
        assert w["statements"] >= 1
        assert w["first_seen"] <= w["last_seen"]
    assert tables["public.done"]["verdict"] == "too_early"
    assert "fencekit enforce public.jobs --window 1h" in jobs["enforce"]["command"]
    text = cli("rollout", "jobs", "--window", "1h", "--dsn", dsn)
    assert text.code == 1
    assert "application_name 'worker'" in text.out
    assert "UPDATE jobs SET status = ? WHERE id = ?" in text.out
    assert "verdict: not ready: 2 writer(s)" in text.out
    # --since lists only recent writers; the verdict still counts them all.
    _age(db, "jobs", "2 hours")
    since = json.loads(cli("rollout", "jobs", "--json", "--since", "1h", "--dsn", dsn).out)
    assert since["tables"][0]["writers"] == []
    assert since["tables"][0]["writers_total"] == 2


def test_enforce_refuses_while_a_writer_is_seen_and_switches_once_none_is(
    cli: Cli, db: Conn, dsn: str
) -> None:
    _setup(db, dsn)
    r = cli("enforce", "jobs", "--window", "1h", "--dsn", dsn)
    assert r.code == 1
    assert "written without a token within the last 1h by 2 writer(s)" in r.err
    assert "'worker'" in r.err
    assert "Nothing was changed" in r.err
    spec = db.execute(
        "SELECT spec ->> 'on_missing' FROM fencekit.protected WHERE table_name = 'jobs'"
    ).fetchone()
    assert spec == ("allow",)
    db.commit()
    _age(db, "jobs", "2 hours")
    ready = cli("rollout", "jobs", "--window", "1h", "--dsn", dsn)
    assert ready.code == 0, ready.out
    assert "verdict: ready to enforce" in ready.out
    assert "op.enforce_fence('jobs', schema='public', window='1h')" in ready.out
    ok = cli("enforce", "jobs", "--window", "1h", "--json", "--dsn", dsn)
    assert ok.code == 0, ok.err
    assert json.loads(ok.out)["spec"]["on_missing"] == "reject"
    after = json.loads(cli("rollout", "jobs", "--json", "--dsn", dsn).out)
    assert after["tables"][0]["verdict"] == "enforced"
    assert after["ready"] is True
    with psycopg.connect(dsn, autocommit=True) as c, pytest.raises(psycopg.Error) as refused:
        c.execute("UPDATE jobs SET status = 'x'")
    assert refused.value.sqlstate == "YF003"


def test_enforce_force_switches_past_writers(cli: Cli, db: Conn, dsn: str) -> None:
    _setup(db, dsn)
    r = cli("enforce", "jobs", "--force", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "forced past" in r.out
    row = db.execute(
        "SELECT spec ->> 'on_missing' FROM fencekit.protected WHERE table_name = 'jobs'"
    ).fetchone()
    assert row == ("reject",)


def test_a_table_protected_without_attribution_is_not_called_ready(
    cli: Cli, db: Conn, dsn: str
) -> None:
    db.execute("CREATE TABLE old (id int PRIMARY KEY)")
    for s in protect_statements(FenceSpec(TableName("public", "old"), on_missing="allow")):
        # What a protect before attribution installed: the same checks without it.
        db.execute("\n".join(x for x in s.split("\n") if "fencekit.attribute(" not in x))
    db.commit()
    _age(db, "old", "30 days")
    r = cli("rollout", "old", "--json", "--dsn", dsn)
    assert json.loads(r.out)["tables"][0]["verdict"] == "not_attributed"
    assert r.code == 1
    refused = cli("enforce", "old", "--dsn", dsn)
    assert refused.code == 1
    assert "protected before attribution" in refused.err


def test_reading_writers_needs_fencekit_admin(cli: Cli, db: Conn, dsn: str, make_role: Any) -> None:
    _setup(db, dsn)
    app = make_role("rollout_app", "SELECT, UPDATE ON ALL TABLES IN SCHEMA public")
    r = cli("rollout", "--dsn", app)
    assert r.code != 0
    assert "needs fencekit_admin" in r.err
