"""procrastinate's own tables in rollout mode: the rollout report names the statements its
connector sends without a token, per table, and enforcing is refused until they carry one.
(The manual proof runs procrastinate's whole test suite the same way; this is its shape.)"""

from __future__ import annotations

import json
from typing import Any

import procrastinate
import psycopg
import pytest
from procrastinate import schema, testing

from fencekit.cli import main
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

TABLES = (
    "procrastinate_jobs",
    "procrastinate_events",
    "procrastinate_periodic_defers",
    "procrastinate_workers",
)


def test_the_report_names_what_procrastinate_writes_without_a_token(
    db: psycopg.Connection[Any], dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db.execute(schema.SchemaManager(connector=testing.InMemoryConnector()).get_schema())
    for t in TABLES:
        spec = FenceSpec(TableName("public", t), scope=Scope.TABLE, on_missing="allow")
        for s in protect_statements(spec):
            db.execute(s)
    db.commit()
    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))

    @app.task(name="bill", queue="billing")
    def bill(account: int) -> None:
        del account

    with app.open():
        job_id = bill.defer(account=42)
        assert app.job_manager.cancel_job_by_id(job_id)

    capsys.readouterr()
    assert main(["rollout", "--json", "--window", "1h", "--dsn", dsn]) == 1
    doc = json.loads(capsys.readouterr().out)
    tables = {t["table"]: t for t in doc["tables"]}
    jobs = tables["public.procrastinate_jobs"]
    assert jobs["verdict"] == "not_ready"
    statements = " | ".join(w["statement"] for w in jobs["writers"])
    assert "procrastinate_defer_jobs" in statements
    assert "procrastinate_cancel_job" in statements
    # A defer inserts its event through a trigger: procrastinate_events' writer is the defer.
    events = " | ".join(w["statement"] for w in tables["public.procrastinate_events"]["writers"])
    assert "procrastinate_defer_jobs" in events
    assert tables["public.procrastinate_workers"]["verdict"] == "too_early"
    assert main(["enforce", "procrastinate_jobs", "--window", "1h", "--dsn", dsn]) == 1
    assert "procrastinate_defer_jobs" in capsys.readouterr().err
