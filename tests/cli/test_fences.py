"""``fencekit fences``: the fences of row, key and table fences on a real server; key text
named as the key triggers name it; lateness of a rejected token recorded in the database (a
gauge that survives the rejection's rollback) and shown by ``fences``, ``status`` and the
rejection's DETAIL."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from fencekit.sqlgen.key import KEY_SETTINGS

from .conftest import Cli


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _write(dsn: str, token: int, statement: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(statement)


def _rejected(dsn: str, token: int, statement: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        _write(dsn, token, statement)
    return info.value


def _fences(cli: Cli, dsn: str, *args: str) -> dict[str, Any]:
    r = cli("fences", *args, "--json", "--dsn", dsn)
    assert r.code == 0, r.err
    doc: dict[str, Any] = json.loads(r.out)
    return doc


def test_row_fence_distribution_and_top(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, v int)")
    assert cli("protect", "accounts", "--on-missing", "allow", "--dsn", dsn).code == 0
    _write(dsn, 5, "INSERT INTO accounts VALUES (1, 0), (2, 0), (3, 0)")
    _write(dsn, 9, "UPDATE accounts SET v = 1 WHERE id = 2")
    _sql(dsn, "INSERT INTO accounts VALUES (4, 0)")  # no token, allowed: no fence
    doc = _fences(cli, dsn, "accounts", "--top", "2")
    assert (doc["rows"], doc["fenced_rows"], doc["unfenced_rows"]) == (4, 3, 1)
    assert (doc["min"], doc["max"]) == (5, 9)
    assert doc["primary_key"] == ["id"]
    assert doc["top"][0] == {"key": {"id": "2"}, "fence": 9}
    assert len(doc["top"]) == 2
    assert doc["max_lateness_seconds"] is None  # row fences keep no time per row
    assert _fences(cli, dsn, "accounts", "--key", "3")["row"] == {
        "key": {"id": "3"},
        "fence": 5,
    }
    text = cli("fences", "accounts", "--dsn", dsn)
    assert text.code == 0
    assert "4 row(s), 3 with a fence, 1 without; lowest 5, highest 9" in text.out
    assert "not kept for row fences" in text.out
    r = cli("fences", "accounts", "--key", "77", "--dsn", dsn)
    assert r.code == 1
    assert "no row with primary key" in r.err
    r = cli("fences", "accounts", "--key", "1", "--key", "2", "--dsn", dsn)
    assert r.code == 2
    assert "give 1 --key value(s), not 2" in r.err


def test_key_fence_per_key_with_times(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE payments (id serial PRIMARY KEY, account_id int NOT NULL)")
    assert cli("protect", "payments", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 5, "INSERT INTO payments (account_id) VALUES (1), (2), (3)")
    _write(dsn, 8, "INSERT INTO payments (account_id) VALUES (2)")
    doc = _fences(cli, dsn, "payments")
    assert doc["resource"] == "public.payments"
    assert (doc["fences"], doc["min"], doc["max"]) == (3, 5, 8)
    assert [(t["key"], t["fence"]) for t in doc["top"]] == [("2", 8), ("1", 5), ("3", 5)]
    assert all(t["advanced_at"] and 0 <= t["age_seconds"] < 60 for t in doc["top"])
    one = _fences(cli, dsn, "payments", "--key", "2")["key"]
    assert (one["key"], one["fence"]) == ("2", 8)
    assert _fences(cli, dsn, "payments", "--key", "42")["key"] == {"key": "42", "fence": None}
    text = cli("fences", "payments", "--key", "42", "--dsn", dsn).out
    assert "key 42: no fence (accepts every token)" in text
    r = cli("fences", "payments", "--key", "x", "--dsn", dsn)
    assert r.code == 2  # a usage error, named by fencekit
    assert "--key x does not fit the table's key columns" in r.err
    assert "invalid input syntax for type integer" in r.err


def test_composite_key_text_is_the_triggers(cli: Cli, dsn: str) -> None:
    """A session in another zone and DateStyle writes; --key given in yet another spelling
    finds the same key, because SQL computes its text under the triggers' settings."""
    _sql(
        dsn,
        "CREATE TABLE slots (region varchar(8) NOT NULL, at timestamptz NOT NULL, "
        "PRIMARY KEY (region, at))",
    )
    assert cli("protect", "slots", "--key", "region", "--key", "at", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'Asia/Tokyo'; SET DateStyle = 'German'")
        conn.execute("SELECT set_config('fencekit.token', '7', true)")
        conn.execute("INSERT INTO slots VALUES ('eu', '2024-05-01 12:00+02')")
    doc = _fences(cli, dsn, "slots", "--key", "eu", "--key", "2024-05-01T06:00:00-04:00")
    assert doc["key"]["fence"] == 7
    assert doc["key"]["key"] == doc["top"][0]["key"]
    r = cli("fences", "slots", "--key", "eu", "--dsn", dsn)
    assert r.code == 1
    assert "give 2 value(s), not 1" in r.err


def test_key_text_pins_the_key_triggers_settings(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT proconfig FROM pg_proc WHERE oid = "
            "'fencekit.key_text(regclass, text[])'::regprocedure"
        ).fetchone()
    assert row is not None
    config = {k.lower(): v for k, v in (c.split("=", 1) for c in row[0])}
    for name, value in KEY_SETTINGS:
        assert config[name].lower() == value.strip("'").lower(), name


def test_table_fence_and_refusals(cli: Cli, dsn: str, make_role: Any) -> None:
    _sql(dsn, "CREATE TABLE report (v int)", "CREATE TABLE plain (v int)")
    assert cli("protect", "report", "--scope", "table", "--dsn", dsn).code == 0
    assert _fences(cli, dsn, "report")["key"] == {"key": "", "fence": None}
    _write(dsn, 900, "INSERT INTO report VALUES (1)")
    doc = _fences(cli, dsn, "report")
    assert doc["key"]["fence"] == 900
    assert doc["fences"] == 1
    r = cli("fences", "report", "--key", "1", "--dsn", dsn)
    assert r.code == 2
    assert "takes no --key" in r.err
    r = cli("fences", "plain", "--dsn", dsn)
    assert r.code == 1
    assert "not protected" in r.err
    r = cli("fences", "nosuch", "--dsn", dsn)
    assert r.code == 1
    assert "does not exist" in r.err
    r = cli("fences", "report", "--top", "-1", "--dsn", dsn)
    assert r.code == 2
    app = make_role("fences_reader", "SELECT ON ALL TABLES IN SCHEMA public")
    r = cli("fences", "report", "--dsn", app)
    assert r.code == 1
    assert "permission denied" in r.err


def _age_fence(dsn: str, resource: str, seconds: int) -> None:
    """Move a fence's last advance into the past, as if it had happened ``seconds`` ago."""
    _sql(
        dsn,
        "UPDATE fencekit.fences SET updated_at = now() - make_interval(secs => "
        f"{seconds}) WHERE resource = '{resource}'",
    )


def test_lateness_of_a_stale_token(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE payments (id serial PRIMARY KEY, account_id int NOT NULL)")
    assert cli("protect", "payments", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 34, "INSERT INTO payments (account_id) VALUES (42)")
    _age_fence(dsn, "public.payments", 90)
    err = _rejected(dsn, 33, "INSERT INTO payments (account_id) VALUES (42)")
    assert err.sqlstate == "YF001"
    detail = json.loads(err.diag.message_detail or "{}")
    assert 90_000 <= detail["late_ms"] < 100_000
    with psycopg.connect(dsn) as conn:
        late = conn.execute(
            "SELECT max_lateness_seconds FROM fencekit.lateness WHERE table_name = 'payments'"
        ).fetchone()
    assert late is not None
    assert 90 <= float(late[0]) < 100  # survived the rejected transaction's rollback
    # A later, less late rejection keeps the worst.
    _write(dsn, 40, "INSERT INTO payments (account_id) VALUES (42)")
    err = _rejected(dsn, 39, "INSERT INTO payments (account_id) VALUES (42)")
    assert json.loads(err.diag.message_detail or "{}")["late_ms"] < 90_000
    assert 90 <= _fences(cli, dsn, "payments")["max_lateness_seconds"] < 100
    st = cli("status", "--dsn", dsn)
    assert "Worst lateness of a rejected token" in st.out
    assert "public.payments: 9" in st.out
    doc = json.loads(cli("status", "--json", "--dsn", dsn).out)
    (table,) = doc["tables"]
    assert 90 <= table["max_lateness_seconds"] < 100


def test_lateness_table_fence_reused_and_row_fence(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE report (v int)", "CREATE TABLE accounts (id int PRIMARY KEY)")
    assert (
        cli("protect", "report", "--scope", "table", "--on-equal", "reject", "--dsn", dsn).code == 0
    )
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    _write(dsn, 7, "INSERT INTO report VALUES (1)")
    _age_fence(dsn, "public.report", 30)
    err = _rejected(dsn, 7, "INSERT INTO report VALUES (2)")
    assert err.sqlstate == "YF002"
    assert 30_000 <= json.loads(err.diag.message_detail or "{}")["late_ms"] < 40_000
    _write(dsn, 7, "INSERT INTO accounts VALUES (1)")
    err = _rejected(dsn, 6, "UPDATE accounts SET id = 1")
    assert err.sqlstate == "YF001"
    assert json.loads(err.diag.message_detail or "{}")["late_ms"] is None
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute("SELECT table_name, max_lateness_seconds FROM fencekit.lateness"))
    assert rows["accounts"] is None
    assert 30 <= float(rows["report"]) < 40


def test_help(cli: Cli) -> None:
    r = cli("fences", "--help")
    assert r.code == 0
    assert "--key" in r.out
    assert "lateness" in r.out
