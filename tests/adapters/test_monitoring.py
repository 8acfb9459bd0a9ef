"""The postgres_exporter query file and the Grafana dashboard that ship in fencekit/monitoring:
every query runs against a real database (protected tables, rejections, a bypass, a repair,
lateness, drift) as a role with no fencekit grant, returns exactly the declared columns with
types the exporter can use, and the dashboard uses only metrics the file defines."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
import yaml

from fencekit.cli import main
from fencekit.cli.monitoring import FILES, read

USAGES = {"LABEL", "COUNTER", "GAUGE"}
# Type OIDs: int2, int4, int8, float4, float8, numeric / text, varchar, name.
NUMERIC = {21, 23, 20, 700, 701, 1700}
TEXT = {25, 1043, 19}


def _queries() -> dict[str, Any]:
    doc = yaml.safe_load(read(FILES["postgres-exporter"]))
    assert isinstance(doc, dict)
    assert doc
    return doc


def _columns(spec: dict[str, Any]) -> dict[str, str]:
    """``{column: usage}`` of one query, in order; each entry a one-key mapping."""
    out: dict[str, str] = {}
    for entry in spec["metrics"]:
        assert isinstance(entry, dict)
        assert len(entry) == 1, entry
        ((name, meta),) = entry.items()
        assert meta["usage"] in USAGES, (name, meta)
        assert meta.get("description"), name
        out[name] = meta["usage"]
    return out


def metric_names() -> set[str]:
    """What postgres_exporter exports: ``<query name>_<column>`` for counters and gauges."""
    return {
        f"{q}_{c}"
        for q, spec in _queries().items()
        for c, usage in _columns(spec).items()
        if usage != "LABEL"
    }


def _run(dsn: str, *statements: str, token: int | None = None, bypass: bool = False) -> None:
    with psycopg.connect(dsn) as conn:
        if token is not None:
            conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        if bypass:
            conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
        for stmt in statements:
            conn.execute(stmt)


def _reject(dsn: str, sqlstate: str, statement: str, token: int | None = None) -> None:
    with pytest.raises(psycopg.Error) as info:
        _run(dsn, statement, token=token)
    assert info.value.sqlstate == sqlstate


@pytest.fixture
def busy(dsn: str, capsys: pytest.CaptureFixture[str]) -> str:
    """A database with a key-, a row- and a table-fenced table that have seen rejections, a
    bypassed write, a repair, a late stale token and a disabled trigger."""
    _run(
        dsn,
        "CREATE TABLE payments (id serial PRIMARY KEY, account_id int NOT NULL)",
        "CREATE TABLE accounts (id int PRIMARY KEY, v int)",
        "CREATE TABLE report (v int)",
    )
    for args in (
        ["payments", "--key", "account_id"],
        ["accounts"],
        ["report", "--scope", "table"],
    ):
        assert main(["protect", *args, "--dsn", dsn]) == 0
    capsys.readouterr()
    _run(dsn, "INSERT INTO payments (account_id) VALUES (1)", token=34)
    _run(dsn, "UPDATE fencekit.fences SET updated_at = now() - interval '2 minutes'")
    _reject(dsn, "YF001", "INSERT INTO payments (account_id) VALUES (1)", token=33)
    _reject(dsn, "YF003", "INSERT INTO accounts VALUES (1, 0)")
    _run(dsn, "INSERT INTO accounts VALUES (1, 0)", bypass=True)  # superuser: an admin
    _run(dsn, "SELECT fencekit.set_fence('payments', '{1}', 50, reason => 'test')")
    _run(dsn, "ALTER TABLE report DISABLE TRIGGER ALL")
    return dsn


def test_query_file_shape() -> None:
    queries = _queries()
    assert {"fencekit_rejections", "fencekit_writes", "fencekit_table", "fencekit_drift"} <= set(
        queries
    )
    for name, spec in queries.items():
        assert re.fullmatch(r"fencekit_[a-z_]+", name), name
        assert isinstance(spec["query"], str)
        assert _columns(spec)


def test_every_query_runs_as_a_role_without_grants(busy: str, make_role: Any) -> None:
    exporter = make_role("fk_exporter")  # CONNECT only, like a monitoring login
    results: dict[str, list[dict[str, Any]]] = {}
    with psycopg.connect(exporter, autocommit=True) as conn:
        for name, spec in _queries().items():
            cur = conn.execute(spec["query"])
            assert cur.description is not None
            got = {d.name: d.type_code for d in cur.description}
            declared = _columns(spec)
            assert list(got) == list(declared), name  # exactly the declared columns
            for col, usage in declared.items():
                allowed = TEXT if usage == "LABEL" else NUMERIC
                assert got[col] in allowed, (name, col, got[col])
            results[name] = [dict(zip(got, row, strict=True)) for row in cur.fetchall()]
    by = {(r["table"], r["reason"]): r["count"] for r in results["fencekit_rejections"]}
    assert by[("public.payments", "stale")] == 1
    assert by[("public.accounts", "missing")] == 1
    assert not any(reason in ("bypassed", "unfenced") for _, reason in by)
    writes = {r["table"]: r for r in results["fencekit_writes"]}
    assert writes["public.accounts"]["bypassed"] == 1
    assert writes["public.payments"]["bypassed"] == 0
    table = {r["table"]: r for r in results["fencekit_table"]}
    assert 120 <= table["public.payments"]["max_lateness_seconds"] < 150
    assert table["public.accounts"]["max_lateness_seconds"] == 0
    assert table["public.payments"]["max_token_gap"] == 1
    assert table["public.payments"]["last_rejection_timestamp_seconds"] > 1.7e9
    drift = {r["table"]: r for r in results["fencekit_drift"]}
    # DISABLE TRIGGER ALL: a table fence's statement check, its TRUNCATE trigger and the root
    # guard that keeps it from becoming a child
    assert drift["public.report"]["triggers_not_firing"] == 3
    assert drift["public.payments"]["triggers_not_firing"] == 0
    for t in ("public.payments", "public.accounts"):
        assert (drift[t]["triggers_missing"], drift[t]["functions_changed"]) == (0, 0), t
        assert drift[t]["table_missing"] == 0
    repairs = {r["table"]: r for r in results["fencekit_repairs"]}
    assert repairs["public.payments"]["repairs"] == 1
    assert repairs["public.payments"]["lowered"] == 0
    assert results["fencekit_core"][0]["version"] >= 1
    unfenced = {r["table"]: r for r in results["fencekit_unfenced_writers"]}
    assert unfenced["public.payments"]["on_missing"] == "reject"
    assert unfenced["public.payments"]["writers"] == 0
    assert unfenced["public.payments"]["last_seen_timestamp_seconds"] == 0


def test_drift_view_sees_edited_functions_and_dropped_triggers(busy: str) -> None:
    with psycopg.connect(busy, autocommit=True) as conn:
        (fn,) = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN fencekit.protected r "
            "ON p.proname = r.tag || '_upd' WHERE r.table_name = 'accounts'"
        ).fetchone() or (None,)
        src = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (fn,)).fetchone()
        assert src is not None
        conn.execute(src[0].replace("RETURN NEW;", "RETURN NEW; -- edited", 1))
        (trig,) = conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'payments'::regclass "
            "AND tgname LIKE 'fencekit\\_%\\_del'"
        ).fetchone() or (None,)
        conn.execute(f'DROP TRIGGER "{trig}" ON payments')
        rows = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT table_name, triggers_missing, functions_changed FROM fencekit.drift"
            )
        }
    assert rows["accounts"] == (0, 1)
    assert rows["payments"] == (1, 0)


def _exprs(node: Any) -> list[str]:
    """Every PromQL string in the dashboard: targets' expr, variables' queries."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                out.append(v)
            elif k == "query" and isinstance(v, (str, dict)):
                out += [v] if isinstance(v, str) else [str(v.get("query", ""))]
            else:
                out += _exprs(v)
    elif isinstance(node, list):
        for v in node:
            out += _exprs(v)
    return out


def test_dashboard_uses_only_metrics_the_query_file_defines() -> None:
    dash = json.loads(read(FILES["grafana"]))
    known = metric_names()
    exprs = _exprs(dash)
    assert len(exprs) >= len(dash["panels"])
    used = {m for e in exprs for m in re.findall(r"\bfencekit_[a-z0-9_]+", e)}
    assert used
    assert used <= known, used - known
    # Rejections, bypasses, lateness and drift are all on it.
    for needed in (
        "fencekit_rejections_count",
        "fencekit_writes_bypassed",
        "fencekit_table_max_lateness_seconds",
        "fencekit_drift_triggers_not_firing",
    ):
        assert needed in used, needed
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]


def test_cli_prints_the_shipped_files(capsys: pytest.CaptureFixture[str]) -> None:
    for sub, name in FILES.items():
        assert main(["monitoring", sub]) == 0
        assert capsys.readouterr().out == read(name)
    assert main(["monitoring", "nope"]) == 2


def test_client_metrics_carry_the_lateness(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A stale token on a key fence: the adapter's metric event and prometheus histogram get
    the lateness the database put in the DETAIL; a row fence's rejection has none."""
    from prometheus_client import CollectorRegistry

    import fencekit.psycopg as fkpg
    from fencekit import metrics
    from fencekit.context import fencing
    from fencekit.errors import StaleTokenError

    _run(
        dsn,
        "CREATE TABLE payments (id serial PRIMARY KEY, account_id int NOT NULL)",
        "CREATE TABLE accounts (id int PRIMARY KEY)",
    )
    assert main(["protect", "payments", "--key", "account_id", "--dsn", dsn]) == 0
    assert main(["protect", "accounts", "--dsn", dsn]) == 0
    capsys.readouterr()
    _run(dsn, "INSERT INTO payments (account_id) VALUES (1)", token=34)
    _run(dsn, "INSERT INTO accounts VALUES (1)", token=34)
    _run(dsn, "UPDATE fencekit.fences SET updated_at = now() - interval '45 seconds'")
    registry = CollectorRegistry()
    listener = metrics.enable_prometheus(registry)
    events: list[metrics.MetricEvent] = []
    remove = metrics.add_listener(events.append)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            fkpg.install(conn)
            with fencing(33), pytest.raises(StaleTokenError):
                conn.execute("INSERT INTO payments (account_id) VALUES (1)")
            with fencing(33), pytest.raises(StaleTokenError):
                conn.execute("UPDATE accounts SET id = 1")
    finally:
        remove()
        metrics.remove_listener(listener)
    key_event, row_event = events
    assert key_event.lateness is not None
    assert 45 <= key_event.lateness < 60
    assert row_event.lateness is None
    count = registry.get_sample_value(
        "fencekit_client_rejection_lateness_seconds_count", {"table": "public.payments"}
    )
    assert count == 1
    total = registry.get_sample_value(
        "fencekit_client_rejection_lateness_seconds_sum", {"table": "public.payments"}
    )
    assert total is not None
    assert 45 <= total < 60


def test_opentelemetry_lateness_histogram(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fencekit import metrics
    from fencekit.errors import translate

    from .test_metrics import RecordingMeter

    _run(dsn, "CREATE TABLE report (v int)")
    assert main(["protect", "report", "--scope", "table", "--dsn", dsn]) == 0
    capsys.readouterr()
    _run(dsn, "INSERT INTO report VALUES (1)", token=9)
    _run(dsn, "UPDATE fencekit.fences SET updated_at = now() - interval '5 seconds'")
    meter = RecordingMeter()
    listener = metrics.enable_opentelemetry(meter)
    try:
        with pytest.raises(psycopg.Error) as info:
            _run(dsn, "INSERT INTO report VALUES (2)", token=8)
        error = translate(info.value)
        assert error is not None
        metrics.record_rejection(error)
    finally:
        metrics.remove_listener(listener)
    ((name, seconds, attrs),) = meter.recorded
    assert (name, attrs) == ("fencekit.client.rejection_lateness", {"table": "public.report"})
    assert 5 <= seconds < 20
