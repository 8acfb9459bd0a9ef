"""``fencekit status``: spec, template version, drift (each kind made for real in the
database), rejection counts; human and JSON output; exit 1 on drift."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from fencekit import catalog, sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

from .conftest import Cli

TABLE = TableName("public", "billing_summary")


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _status(cli: Cli, dsn: str) -> tuple[int, dict[str, Any]]:
    r = cli("status", "--json", "--dsn", dsn)
    return r.code, json.loads(r.out)


def _kinds(doc: dict[str, Any]) -> set[str]:
    return {d["kind"] for t in doc["tables"] for d in t["drift"]}


def _trigger(spec: FenceSpec, suffix: str) -> str:
    (name,) = [t.name for t in sqlgen.table_objects(spec).triggers if t.name.endswith(suffix)]
    return name


@pytest.fixture
def protected(cli: Cli, dsn: str) -> FenceSpec:
    """billing_summary with a row fence (on_equal=reject: its triggers have no WHEN clause, so
    the fence column's type can be altered, which is one of the drifts to detect)."""
    _sql(
        dsn,
        "CREATE TABLE billing_summary (account_id bigint PRIMARY KEY, total numeric NOT NULL)",
        "INSERT INTO billing_summary VALUES (42, 100)",
    )
    assert cli("protect", "billing_summary", "--on-equal", "reject", "--dsn", dsn).code == 0
    return FenceSpec(TABLE, on_equal="reject")


def test_no_protected_tables(cli: Cli, dsn: str) -> None:
    r = cli("status", "--dsn", dsn)
    assert r.code == 0
    assert f"fencekit core version {sqlgen.CORE_VERSION}" in r.out
    assert "no protected tables" in r.out


def test_core_not_installed(cli: Cli, raw_dsn: str) -> None:
    r = cli("status", "--dsn", raw_dsn)
    assert r.code == 1
    assert "core is not installed" in r.err
    code, doc = _status(cli, raw_dsn)
    assert code == 1
    assert doc["core"]["installed"] is False
    assert doc["core_drift"][0]["kind"] == "core_missing"


@pytest.mark.all_servers
def test_clean_table_with_spec_template_and_rejection_counts(
    cli: Cli, dsn: str, protected: FenceSpec
) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '34', true)")
        conn.execute("UPDATE billing_summary SET total = 120")
        conn.commit()
        for _ in range(2):
            conn.execute("SELECT set_config('fencekit.token', '30', true)")
            with pytest.raises(psycopg.DatabaseError, match="stale"):
                conn.execute("UPDATE billing_summary SET total = 1")
            conn.rollback()
    code, doc = _status(cli, dsn)
    assert code == 0, doc
    assert doc["drift"] is False
    (t,) = doc["tables"]
    assert t["table"] == "public.billing_summary"
    assert t["spec"] == protected.as_dict()
    assert t["template_version"] == sqlgen.TEMPLATE_VERSION
    assert t["drift"] == []
    assert t["rejections"]["stale"] == 2
    assert t["rejections"]["missing"] == 0
    assert t["max_token_gap"] == 4
    assert t["last_rejected_at"] is not None

    human = cli("status", "--dsn", dsn)
    assert human.code == 0
    assert "public.billing_summary" in human.out
    assert "row fence, column fencekit_fence, on_equal=reject" in human.out
    assert "stale=2" in human.out


@pytest.mark.all_servers
@pytest.mark.parametrize(
    ("alter", "kind", "words"),
    [
        ("DISABLE", "trigger_disabled", "is disabled"),
        ("ENABLE REPLICA", "trigger_replica_only", "fires only under session_replication_role"),
        ("ENABLE ALWAYS", "trigger_always", "also fires under session_replication_role"),
    ],
)
def test_trigger_state_is_drift(
    cli: Cli, dsn: str, protected: FenceSpec, alter: str, kind: str, words: str
) -> None:
    name = _trigger(protected, "_upd")
    _sql(dsn, f"ALTER TABLE billing_summary {alter} TRIGGER {name}")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["tables"][0]["drift"]
    assert d["kind"] == kind
    assert words in d["message"]
    assert d["fix"] == f"ALTER TABLE public.billing_summary ENABLE TRIGGER {name}"
    _sql(dsn, d["fix"])
    assert _status(cli, dsn)[0] == 0


def test_dropped_trigger_is_drift_and_protect_repairs_it(
    cli: Cli, dsn: str, protected: FenceSpec
) -> None:
    name = _trigger(protected, "_del")
    _sql(dsn, f"DROP TRIGGER {name} ON billing_summary")
    code, doc = _status(cli, dsn)
    assert code == 1
    assert _kinds(doc) == {"trigger_missing"}
    human = cli("status", "--dsn", dsn)
    assert human.code == 1
    assert f"trigger {name} is missing [trigger_missing]" in human.out
    assert "fix: fencekit protect public.billing_summary --on-equal reject --dsn DSN" in human.out
    assert cli("protect", "billing_summary", "--on-equal", "reject", "--dsn", dsn).code == 0
    assert _status(cli, dsn)[0] == 0


def test_changed_function_body_is_drift(cli: Cli, dsn: str, protected: FenceSpec) -> None:
    fn = next(f for f in sqlgen.table_objects(protected).functions if f.name.endswith("_upd"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (src,) = conn.execute(
            f"SELECT pg_get_functiondef('{fn.sql_name}()'::regprocedure)"
        ).fetchone()
        # A "quick fix" by hand: same function, one line added. The comment (stamp) stays.
        conn.execute(src.replace("BEGIN\n", "BEGIN\n  RETURN NEW;\n", 1))
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["tables"][0]["drift"]
    assert d["kind"] == "function_changed"
    assert fn.name in d["object"]


def test_altered_and_dropped_fence_column_is_drift(
    cli: Cli, dsn: str, protected: FenceSpec
) -> None:
    # The INSERT and UPDATE triggers' WHEN clauses depend on the fence column: PostgreSQL
    # itself refuses to change its type or drop it while the table is protected.
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        _sql(dsn, "ALTER TABLE billing_summary ALTER COLUMN fencekit_fence TYPE integer")
    with pytest.raises(psycopg.errors.DependentObjectsStillExist):
        _sql(dsn, "ALTER TABLE billing_summary DROP COLUMN fencekit_fence")
    # Once those triggers are dropped, the type can change: status says so.
    ins, upd = _trigger(protected, "_ins"), _trigger(protected, "_upd")
    _sql(
        dsn,
        f"DROP TRIGGER {ins} ON billing_summary",
        f"DROP TRIGGER {upd} ON billing_summary",
        "ALTER TABLE billing_summary ALTER COLUMN fencekit_fence TYPE integer",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    assert _kinds(doc) == {"trigger_missing", "fence_column_altered"}
    (d,) = [d for d in doc["tables"][0]["drift"] if d["kind"] == "fence_column_altered"]
    assert "is integer, not bigint" in d["message"]
    _sql(dsn, "ALTER TABLE billing_summary DROP COLUMN fencekit_fence CASCADE")
    assert "fence_column_missing" in _kinds(_status(cli, dsn)[1])


def test_renamed_table_is_drift(cli: Cli, dsn: str, protected: FenceSpec) -> None:
    _sql(dsn, "ALTER TABLE billing_summary RENAME TO billing_summary_old")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["tables"][0]["drift"]
    assert d["kind"] == "table_renamed"
    assert "was renamed to public.billing_summary_old" in d["message"]
    assert d["fix"].startswith(
        "fencekit rename public.billing_summary public.billing_summary_old --dsn DSN"
    )


def test_partition_attached_after_protect_is_drift(cli: Cli, dsn: str) -> None:
    _sql(
        dsn,
        "CREATE TABLE events (id int NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (1) TO (10)",
    )
    r = cli("protect", "events", "--dsn", dsn)
    assert r.code == 0
    assert "its 1 existing partition(s) get fencekit's statement triggers" in r.err
    assert _status(cli, dsn)[0] == 0
    _sql(
        dsn,
        # LIKE copies the fence column too, not its DEFAULT (no INCLUDING DEFAULTS)
        "CREATE TABLE events_2 (LIKE events)",
        "ALTER TABLE events ATTACH PARTITION events_2 FOR VALUES FROM (10) TO (20)",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    default, d = sorted(doc["tables"][0]["drift"], key=lambda x: str(x["kind"]))
    assert d["kind"] == "partition_triggers_missing"
    assert d["object"] == "partition public.events_2"  # the CLI pins search_path: qualified
    assert default["kind"] == "fence_default_missing"
    assert default["object"] == "public.events_2.fencekit_fence"
    assert cli("protect", "events", "--dsn", dsn).code == 0  # re-run covers the new partition
    assert _status(cli, dsn)[0] == 0


def test_objects_from_an_older_template_are_drift(
    cli: Cli, dsn: str, protected: FenceSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend this fencekit generates a newer template than the one the table was protected by.
    monkeypatch.setattr(sqlgen, "TEMPLATE_VERSION", sqlgen.TEMPLATE_VERSION + 1)
    code, doc = _status(cli, dsn)
    assert code == 1
    assert _kinds(doc) == {"template_outdated"}


def test_unknown_template_version_in_the_registry_is_drift(
    cli: Cli, dsn: str, protected: FenceSpec
) -> None:
    _sql(dsn, "UPDATE fencekit.protected SET template_version = 999")
    code, doc = _status(cli, dsn)
    assert code == 1
    assert _kinds(doc) == {"template_unknown"}


def test_registry_row_from_an_older_template_asks_for_protect(
    cli: Cli, dsn: str, protected: FenceSpec
) -> None:
    # What a table protected by an older fencekit looks like to this one.
    _sql(dsn, f"UPDATE fencekit.protected SET template_version = {sqlgen.TEMPLATE_VERSION - 1}")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = [d for d in doc["tables"][0]["drift"] if d["kind"] == "template_outdated"]
    assert d["fix"].startswith("fencekit protect public.billing_summary --on-equal reject")


def test_key_fence_drift_uses_the_generators_object_names(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, k int NOT NULL)")
    assert cli("protect", "t", "--key", "k", "--dsn", dsn).code == 0
    spec = FenceSpec(TableName("public", "t"), scope=Scope.KEY, key=("k",))
    with psycopg.connect(dsn) as conn:
        st = catalog.status(conn)
    assert st.tables[0].spec == spec
    assert not st.has_drift
    for fn in sqlgen.table_objects(spec).functions:
        if not fn.partitioned_only:  # t is not partitioned: it has none of those
            _sql(dsn, f"DROP FUNCTION {fn.sql_name}() CASCADE")
    with psycopg.connect(dsn) as conn:
        kinds = {d.kind for d in catalog.status(conn).tables[0].drift}
    assert kinds == {"function_missing", "trigger_missing"}


def test_durability_warning_follows_the_server_settings(cli: Cli, dsn: str) -> None:
    """The test servers run with fsync off: status warns (lease tokens could repeat after a
    crash) without calling it drift; with fsync on there is nothing to say."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        fsync = conn.execute("SELECT current_setting('fsync')::boolean").fetchone()
    assert fsync is not None
    code, doc = _status(cli, dsn)
    assert code == 0  # a warning, not drift
    fsync_warnings = [w for w in doc["warnings"] if w.startswith("fsync is off")]
    assert bool(fsync_warnings) == (not fsync[0])
    r = cli("status", "--dsn", dsn)
    assert ("fsync is off" in r.out) == (not fsync[0])
