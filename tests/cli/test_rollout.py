"""``fencekit rollout`` and ``fencekit enforce``: the report of who writes without a token, its
verdict, and the one step to enforce that refuses while a writer is seen."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekit.catalog.rollout import enforce_refusal, parse_duration
from fencekit.catalog.session import pinned_path
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, table_objects
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


def test_enforce_refuses_a_table_watched_for_less_than_the_window(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """No writer seen yet, but watched for less than the window: a writer that runs less often
    (a weekly job) may not have written yet. Refused unless forced, then ready once watched."""
    _setup(db, dsn)
    db.execute("DELETE FROM fencekit.unfenced_writers")  # as if nobody had written yet
    db.commit()
    r = cli("enforce", "done", "--window", "7d", "--dsn", dsn)
    assert r.code == 1, r.out
    assert "watched in rollout mode only since" in r.err
    assert "less than the window (1w)" in r.err
    assert "Nothing was changed" in r.err
    _age(db, "done", "8 days")
    ok = cli("enforce", "done", "--window", "7d", "--dsn", dsn)
    assert ok.code == 0, ok.err


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


def _hold_record_lock(m: Conn, tag: str, who: tuple[Any, ...], stmt: str) -> None:
    """Take the advisory lock fencekit.record_unfenced_writer takes to record ``who`` running
    ``stmt``: its key is computable by anyone, and taking it needs no grant."""
    got = m.execute(
        "SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('fencekit.attribution'),"
        " pg_catalog.hashtext(%s || ' ' || pg_catalog.md5(pg_catalog.concat_ws(E'\\x1f',"
        " %s::text, %s::text, %s::text, %s::text,"
        " pg_catalog.md5(fencekit.statement_shape(%s::text))))))",
        [tag, *who, stmt],
    ).fetchone()
    assert got == (True,)


def test_a_writer_whose_record_another_role_holds_keeps_the_table_not_ready(
    cli: Cli, db: Conn, dsn: str, make_role: Any
) -> None:
    db.execute("CREATE TABLE legacy (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO legacy VALUES (1, 'a')")
    for s in protect_statements(FenceSpec(TableName("public", "legacy"), on_missing="allow")):
        db.execute(s)
    db.commit()
    _age(db, "legacy", "2 hours")  # watched long enough: only the writes below hold it back
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = 'legacy'").fetchone()
    assert row is not None
    tag = row[0]
    db.commit()
    stmt = "UPDATE legacy SET v = 'x' WHERE id = 1"
    legacy = make_conninfo(dsn, application_name="legacy")
    # A role with no grant at all holds the legacy writer's record lock while it writes.
    holder = make_role("attr_lock_holder")
    with psycopg.connect(holder, autocommit=True) as m:
        for _ in range(3):  # three sessions: each records (or would) its first statement
            with psycopg.connect(legacy, autocommit=True) as w:
                who = w.execute(
                    "SELECT session_user, current_user, current_setting('application_name'),"
                    " host(inet_client_addr())"
                ).fetchone()
                assert who is not None
                _hold_record_lock(m, tag, who, stmt)
                w.execute(stmt)
    r = cli("rollout", "legacy", "--json", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.out
    t = json.loads(r.out)["tables"][0]
    assert t["writers_total"] == 0  # the writer was not recorded: its lock was held
    assert t["verdict"] == "not_ready"
    assert t["unattributed"]["statements"] == 3
    assert t["unattributed"]["last_seen"] is not None
    text = cli("rollout", "legacy", "--window", "1h", "--dsn", dsn)
    assert text.code == 1
    assert "3 tokenless statement(s) not attributed, last seen" in text.out
    assert "verdict: not ready" in text.out
    assert "ready to enforce" not in text.out
    refused = cli("enforce", "legacy", "--window", "1h", "--dsn", dsn)
    assert refused.code == 1, refused.out
    assert "3 tokenless statement(s) not attributed" in refused.err
    assert "Nothing was changed" in refused.err
    # A role that may not read the writers (the public totals decide) is refused alike.
    with psycopg.connect(holder, autocommit=True) as m:
        totals = m.execute(
            "SELECT writers, unattributed_statements, last_seen IS NOT NULL"
            " FROM fencekit.unfenced_writer_totals WHERE table_name = 'legacy'"
        ).fetchone()
        assert totals == (0, 3, True)
        why = enforce_refusal(m, TableName("public", "legacy"), parse_duration("1h"))
    assert why is not None
    assert "written without a token" in why
    row = db.execute(
        "SELECT spec ->> 'on_missing' FROM fencekit.protected WHERE table_name = 'legacy'"
    ).fetchone()
    assert row == ("allow",)


def test_a_role_that_reads_only_the_totals_is_refused_too_early_as_well(
    db: Conn, dsn: str, make_role: Any
) -> None:
    """enforce's check for a role that may not read the writers (the public totals) refuses a
    table watched for less than the window, as the full report does."""
    _setup(db, dsn)
    db.execute("DELETE FROM fencekit.unfenced_writers")
    db.commit()
    app = make_role("rollout_totals", "SELECT ON ALL TABLES IN SCHEMA public")
    with psycopg.connect(app) as conn:
        why = enforce_refusal(conn, TableName("public", "done"), timedelta(days=7))
    assert why is not None
    assert "watched in rollout mode only since" in why
    _age(db, "done", "8 days")
    with psycopg.connect(app) as conn:
        assert enforce_refusal(conn, TableName("public", "done"), timedelta(days=7)) is None


def test_a_window_beyond_a_century_is_refused_as_a_typo(cli: Cli, dsn: str) -> None:
    r = cli("rollout", "--window", "99999999w", "--dsn", dsn)
    assert r.code == 2, r.err
    assert "--window" in r.err
    assert "longer than 100 years" in r.err


def test_enforce_refuses_while_a_partition_lacks_its_statement_checks(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """A partition made after protect (auto-cover off) has the row checks, cloned from the
    parent, but not its statement checks: a tokenless write that names it is neither counted
    nor attributed, so the report cannot tell who writes it. enforce refuses until it is
    covered."""
    db.execute(
        "CREATE TABLE parts (id int, k int NOT NULL, PRIMARY KEY (id, k)) PARTITION BY LIST (k);"
        "CREATE TABLE parts_1 PARTITION OF parts FOR VALUES IN (1)"
    )
    spec = FenceSpec(TableName("public", "parts"), on_missing="allow")
    for s in protect_statements(spec):
        db.execute(s)
    db.execute("CREATE TABLE parts_2 PARTITION OF parts FOR VALUES IN (2)")
    db.commit()
    _age(db, "parts", "2 hours")
    r = cli("enforce", "parts", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.out
    assert "partition public.parts_2 lacks fencekit's statement trigger(s)" in r.err
    assert "Nothing was changed" in r.err
    assert enforce_refusal(db, TableName("public", "parts"), timedelta(hours=1)) is not None
    db.rollback()
    assert cli("protect", "parts", "--on-missing", "allow", "--dsn", dsn).code == 0
    ok = cli("enforce", "parts", "--window", "1h", "--dsn", dsn)
    assert ok.code == 0, ok.err


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_a_writer_at_repeatable_read_or_serializable_is_reported_and_holds_enforce_back(
    cli: Cli, db: Conn, dsn: str, make_role: Any, level: str
) -> None:
    """Such a writer's record waits in fencekit.unfenced_log until the report side folds it:
    the report names it, enforce refuses, and so do the gates of a role that reads only the
    public totals and of an admin whose own transaction is SERIALIZABLE (it may not fold)."""
    db.execute("CREATE TABLE ledger (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO ledger VALUES (1, 'a')")
    for s in protect_statements(FenceSpec(TableName("public", "ledger"), on_missing="allow")):
        db.execute(s)
    db.commit()
    _age(db, "ledger", "2 hours")
    with psycopg.connect(make_conninfo(dsn, application_name="batch")) as w:
        w.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        w.execute("UPDATE ledger SET v = 'b' WHERE id = 1")
    table, window = TableName("public", "ledger"), parse_duration("1h")
    reader = make_role("rollout_ledger_totals")
    with psycopg.connect(reader) as m:
        why = enforce_refusal(m, table, window)
    assert why is not None
    assert "1 writer(s)" in why
    with psycopg.connect(dsn) as admin:
        admin.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        why = enforce_refusal(admin, table, window)
    assert why is not None
    assert "written without a token" in why
    # Its append and its commit's marker, not folded yet.
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (2,)
    db.commit()
    r = cli("rollout", "ledger", "--json", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.err
    (t,) = json.loads(r.out)["tables"]
    assert t["verdict"] == "not_ready"
    assert [(w["application_name"], w["statement"]) for w in t["writers"]] == [
        ("batch", "UPDATE ledger SET v = ? WHERE id = ?")
    ]
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_log").fetchone() == (0,)
    db.commit()
    refused = cli("enforce", "ledger", "--window", "1h", "--dsn", dsn)
    assert refused.code == 1, refused.out
    assert "application_name 'batch'" in refused.err


def test_a_long_tokenless_transaction_is_not_ready_right_after_its_commit(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """The write ran longer before its commit than the window plus the report's lag
    (attribution_lag(), 10 s): right after the commit, the report still lists the writer, at
    the commit's time, and enforce refuses. A real sleep: the report reads the server's
    clock."""
    db.execute("CREATE TABLE chi (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO chi VALUES (20, 'a')")
    db.commit()
    assert cli("protect", "chi", "--on-missing", "allow", "--dsn", dsn).code == 0
    with psycopg.connect(make_conninfo(dsn, application_name="longtx")) as w:
        w.execute("UPDATE chi SET v = 'long' WHERE id = 20")
        w.execute("SELECT pg_sleep(11.5)")
        (committed,) = w.execute("SELECT clock_timestamp()").fetchone() or (None,)
    r = cli("rollout", "chi", "--json", "--window", "1s", "--dsn", dsn)
    assert r.code == 1, r.out
    (t,) = json.loads(r.out)["tables"]
    assert t["verdict"] == "not_ready"
    (writer,) = t["writers"]
    assert writer["application_name"] == "longtx"
    assert committed is not None
    assert datetime.fromisoformat(writer["last_seen"]) >= committed
    refused = cli("enforce", "chi", "--window", "1s", "--dsn", dsn)
    assert refused.code == 1, refused.out
    assert "application_name 'longtx'" in refused.err


def _tokenless(dsn: str, stmt: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(stmt)


def _protect(db: Conn, spec: FenceSpec) -> None:
    for s in protect_statements(spec):
        db.execute(s)
    db.commit()


def test_a_child_that_also_inherits_from_a_table_outside_the_tree_is_not_ready(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """A statement that names the child's other parent writes the child's rows and fires only
    that parent's statement triggers: a table fence's checks, all statement-level, do not
    run, so its tokenless writes are neither counted nor, once enforced, refused. The report
    calls the table not ready, naming child and parent, and enforce refuses. (A key fence's
    transition tables keep its tree free of inheritance children.)"""
    spec = FenceSpec(TableName("public", "tr"), scope=Scope.TABLE, on_missing="allow")
    db.execute(
        "CREATE TABLE tr (id bigint, v text); CREATE TABLE rc (id bigint, v text) INHERITS (tr);"
        "CREATE TABLE side3 (id bigint, v text); INSERT INTO rc VALUES (1, 'a')"
    )
    _protect(db, spec)
    db.execute("ALTER TABLE rc INHERIT side3")
    db.commit()
    _age(db, "tr", "2 hours")
    _tokenless(dsn, "UPDATE side3 SET v = 'tokenless via side3' WHERE id = 1")
    text = cli("rollout", "tr", "--window", "1h", "--dsn", dsn)
    assert text.code == 1, text.out
    assert "child table public.rc also inherits from public.side3" in text.out
    assert "fix: ALTER TABLE public.rc NO INHERIT public.side3" in text.out
    assert "verdict: not ready: 1 way(s) to write its rows that its checks do not see" in text.out
    assert "ready to enforce" not in text.out
    doc = json.loads(cli("rollout", "tr", "--json", "--window", "1h", "--dsn", dsn).out)
    assert doc["ready"] is False
    (t,) = doc["tables"]
    assert t["verdict"] == "uncovered"
    assert [(u["kind"], u["object"]) for u in t["uncovered"]] == [
        ("child_other_parent", "child table public.rc: parent public.side3")
    ]
    r = cli("enforce", "tr", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.out
    assert "child table public.rc also inherits from public.side3" in r.err
    assert "Nothing was changed" in r.err
    db.execute("ALTER TABLE rc NO INHERIT side3")
    db.commit()
    assert cli("rollout", "tr", "--window", "1h", "--dsn", dsn).code == 0
    ok = cli("enforce", "tr", "--window", "1h", "--dsn", dsn)
    assert ok.code == 0, ok.err


def test_a_row_fence_child_with_another_parent_is_still_seen(cli: Cli, db: Conn, dsn: str) -> None:
    """A row fence's row triggers fire on the child whatever the statement names: status
    reports nothing, and neither does the gate."""
    db.execute(
        "CREATE TABLE tr (id bigint, v text); CREATE TABLE rc (id bigint, v text) INHERITS (tr);"
        "CREATE TABLE side3 (id bigint, v text)"
    )
    _protect(db, FenceSpec(TableName("public", "tr"), on_missing="allow"))
    db.execute("ALTER TABLE rc INHERIT side3")
    db.commit()
    _age(db, "tr", "2 hours")
    r = cli("rollout", "tr", "--json", "--window", "1h", "--dsn", dsn)
    assert json.loads(r.out)["tables"][0]["verdict"] == "ready", r.out


def test_a_child_made_after_protect_keeps_the_report_not_ready(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """A tokenless writer that names an inheritance child made after protect is neither
    counted nor attributed: the report does not call the table ready (its exit status with
    it), as enforce refuses."""
    db.execute("CREATE TABLE ua (id bigint, v text)")
    _protect(db, FenceSpec(TableName("public", "ua"), scope=Scope.TABLE, on_missing="allow"))
    db.execute("CREATE TABLE uac () INHERITS (ua); INSERT INTO uac VALUES (1, 'a')")
    db.commit()
    _age(db, "ua", "2 hours")
    _tokenless(dsn, "UPDATE uac SET v = 'b' WHERE id = 1")
    text = cli("rollout", "ua", "--window", "1h", "--dsn", dsn)
    assert text.code == 1, text.out
    assert "0 writer(s) without a token" in text.out
    assert "inheritance child public.uac lacks fencekit's trigger(s)" in text.out
    assert "fix: fencekit protect public.ua --scope table --on-missing allow" in text.out
    assert "verdict: not ready" in text.out
    assert "enforce public.ua" not in text.out
    doc = json.loads(cli("rollout", "ua", "--json", "--window", "1h", "--dsn", dsn).out)
    assert doc["ready"] is False
    assert doc["tables"][0]["verdict"] == "uncovered"
    assert [u["kind"] for u in doc["tables"][0]["uncovered"]] == ["child_triggers_missing"]
    r = cli("enforce", "ua", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.out
    assert "inheritance child public.uac lacks fencekit's trigger(s)" in r.err
    assert cli("protect", "ua", "--scope", "table", "--on-missing", "allow", "--dsn", dsn).code == 0
    assert cli("rollout", "ua", "--window", "1h", "--dsn", dsn).code == 0


def test_a_role_that_reads_only_the_totals_is_refused_an_uncovered_tree_as_well(
    db: Conn, dsn: str, make_role: Any
) -> None:
    """The migrating role may not read the writers: the gate judges the tree from the
    catalogs alike, with the report's words."""
    db.execute(
        "CREATE TABLE tr (id bigint, v text); CREATE TABLE rc () INHERITS (tr);"
        "CREATE TABLE side3 (id bigint, v text)"
    )
    _protect(db, FenceSpec(TableName("public", "tr"), scope=Scope.TABLE, on_missing="allow"))
    db.execute("ALTER TABLE rc INHERIT side3; CREATE TABLE uc () INHERITS (tr)")
    db.commit()
    _age(db, "tr", "2 hours")
    app = make_role("rollout_migrator", "SELECT ON ALL TABLES IN SCHEMA public")
    tr, hour = TableName("public", "tr"), timedelta(hours=1)
    with psycopg.connect(app) as conn, pinned_path(conn):  # as the migration operations run
        why = enforce_refusal(conn, tr, hour)
    assert why is not None
    assert "child table public.rc also inherits from public.side3" in why
    assert "inheritance child public.uc lacks fencekit's trigger(s)" in why
    with pinned_path(db):
        assert why == enforce_refusal(db, tr, hour)


def test_a_child_whose_triggers_only_bear_fencekit_names_is_not_covered(
    cli: Cli, db: Conn, dsn: str
) -> None:
    """The owner gives a new child triggers under the names of fencekit's that call a no-op
    function of its own: judged as status judges them (function and shape), the child is not
    covered, and neither the report nor enforce takes the names for the checks."""
    spec = FenceSpec(TableName("public", "ub"), scope=Scope.TABLE, on_missing="allow")
    db.execute("CREATE TABLE ub (id bigint, v text)")
    _protect(db, spec)
    db.execute(
        "CREATE TABLE ubc () INHERITS (ub);"
        "CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN RETURN NULL; END $$"
    )
    for tr in table_objects(spec).triggers:
        if tr.on_partitions and not tr.partitioned_only:
            db.execute(
                f"CREATE TRIGGER {tr.name} {tr.timing} ON ubc FOR EACH STATEMENT"
                " EXECUTE FUNCTION public.noop()"
            )
    db.commit()
    _age(db, "ub", "2 hours")
    doc = json.loads(cli("rollout", "ub", "--json", "--window", "1h", "--dsn", dsn).out)
    (t,) = doc["tables"]
    assert t["verdict"] == "uncovered"
    assert {u["kind"] for u in t["uncovered"]} == {"trigger_changed"}
    assert all("calls public.noop" in u["message"] for u in t["uncovered"])
    r = cli("enforce", "ub", "--window", "1h", "--dsn", dsn)
    assert r.code == 1, r.out
    assert "calls public.noop, not fencekit." in r.err


@pytest.mark.parametrize(
    ("before", "after", "kind"),
    [
        ("CREATE TABLE ud (id bigint, v text)", "DISABLE TRIGGER {stmt}", "trigger_disabled"),
        (
            "CREATE TABLE ud (id bigint, v text)",
            "ENABLE REPLICA TRIGGER {stmt}",
            "trigger_replica_only",
        ),
        (
            # Protect refuses a table fence on a child: its owner drops the root guard and
            # makes it one.
            "CREATE TABLE ud_top (id bigint, v text); CREATE TABLE ud (id bigint, v text)",
            "INHERIT ud_top",
            "unprotected_ancestor",
        ),
    ],
    ids=["disabled", "replica-only", "unprotected-ancestor"],
)
def test_the_table_s_own_unseen_paths_keep_it_uncovered(
    cli: Cli, db: Conn, dsn: str, before: str, after: str, kind: str
) -> None:
    """Its statement check disabled or replica-only, or a parent nobody protects whose
    statements write its rows: tokenless writes go uncounted, so not ready, as status says.
    ENABLE ALWAYS still fires: no reason to refuse."""
    spec = FenceSpec(TableName("public", "ud"), scope=Scope.TABLE, on_missing="allow")
    db.execute(before)
    _protect(db, spec)
    stmt = next(tr.name for tr in table_objects(spec).triggers if tr.name.endswith("_stmt"))
    if kind == "unprotected_ancestor":
        root = next(tr.name for tr in table_objects(spec).triggers if tr.root_only)
        db.execute(f"DROP TRIGGER {root} ON ud")
    db.execute(f"ALTER TABLE ud {after.format(stmt=stmt)}")
    db.commit()
    _age(db, "ud", "2 hours")
    doc = json.loads(cli("rollout", "ud", "--json", "--window", "1h", "--dsn", dsn).out)
    (t,) = doc["tables"]
    assert t["verdict"] == "uncovered"
    assert [u["kind"] for u in t["uncovered"]] == [kind]
    assert cli("enforce", "ud", "--window", "1h", "--dsn", dsn).code == 1
    db.execute(f"ALTER TABLE ud ENABLE ALWAYS TRIGGER {stmt}")
    if kind == "unprotected_ancestor":
        db.execute("ALTER TABLE ud NO INHERIT ud_top")
    db.commit()
    assert cli("enforce", "ud", "--window", "1h", "--dsn", dsn).code == 0
