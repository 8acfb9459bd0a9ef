"""``fencekit status`` reports what would let a stale write into a "protected" table: fencekit's
objects owned by the wrong role (a restore by an application role), other triggers that fire
before fencekit's checks or rewrite the fence column, and partitions or inheritance children
that lack fencekit's triggers. Each is made for real in the database, reported with exit 1, and
fixed with the fix status prints."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

from .conftest import Cli

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

APP = "fk_status_app"  # an application role (cluster-wide: make_role drops it after the test)


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _status(cli: Cli, dsn: str, *extra: str) -> tuple[int, dict[str, Any]]:
    r = cli("status", "--json", "--dsn", dsn, *extra)
    return r.code, json.loads(r.out)


def _all_drift(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["core_drift"]) + [d for t in doc["tables"] for d in t["drift"]]


def _table_drift(doc: dict[str, Any], table: str) -> list[dict[str, Any]]:
    (t,) = [t for t in doc["tables"] if t["table"] == table]
    return list(t["drift"])


def _allow(cli: Cli, dsn: str, *drift: dict[str, Any]) -> None:
    """Allow reviewed code by the hash status printed for it (fencekit allow)."""
    for d in drift:
        assert d["sha256"], d
        assert f"fencekit allow {d['sha256']}" in d["fix"]
        r = cli("allow", d["sha256"], "--note", "reviewed", "--dsn", dsn)
        assert r.code == 0, r.err


def _triggers(spec: FenceSpec) -> dict[str, str]:
    """suffix (stmt, trunc, ins, upd, del) -> trigger name, from the generator (not the root
    guard, which only the protected table itself carries)."""
    return {
        t.name.rsplit("_", 1)[1]: t.name
        for t in sqlgen.table_objects(spec).triggers
        if not t.root_only
    }


def _record_owner(dsn: str) -> str:
    """The owner row the core install writes (absent from cores installed before it existed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fencekit.meta (key, value) VALUES ('owner', current_user) "
            "ON CONFLICT (key) DO NOTHING"
        )
        row = conn.execute("SELECT value FROM fencekit.meta WHERE key = 'owner'").fetchone()
    assert row is not None
    return str(row[0])


def _give_everything_to(dsn: str, role: str) -> int:
    """What `pg_restore --no-owner` run by ``role`` leaves behind: schema fencekit and every
    table, view, sequence and function in it owned by ``role``. Returns how many objects."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stmts = [
            r[0]
            for r in conn.execute(
                """SELECT format('ALTER TABLE %%s OWNER TO %%I', c.oid::regclass, %s::text)
                     FROM pg_class c
                    WHERE c.relnamespace = 'fencekit'::regnamespace
                      AND c.relkind IN ('r', 'p', 'v', 'S')
                   UNION ALL
                   SELECT format('ALTER ROUTINE %%s OWNER TO %%I', p.oid::regprocedure, %s::text)
                     FROM pg_proc p WHERE p.pronamespace = 'fencekit'::regnamespace""",
                (role, role),
            ).fetchall()
        ]
        for stmt in stmts:
            conn.execute(stmt)
        conn.execute(f"ALTER SCHEMA fencekit OWNER TO {role}")
    return len(stmts) + 1


@pytest.fixture
def app(make_role: Callable[..., str]) -> str:
    make_role(APP, "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    return APP


@pytest.fixture
def accounts(cli: Cli, dsn: str) -> FenceSpec:
    """accounts with a row fence, one row at fence 50."""
    _sql(
        dsn,
        "CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL)",
        "INSERT INTO accounts VALUES (1, 0)",
    )
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '50', true)")
        conn.execute("UPDATE accounts SET balance = 10")
    return FenceSpec(TableName("public", "accounts"))


@pytest.fixture
def ledger(cli: Cli, dsn: str) -> FenceSpec:
    """ledger with a key fence on account_id (statement-level checks only)."""
    _sql(dsn, "CREATE TABLE ledger (id bigint PRIMARY KEY, account_id bigint NOT NULL)")
    assert cli("protect", "ledger", "--key", "account_id", "--dsn", dsn).code == 0
    return FenceSpec(TableName("public", "ledger"), scope=Scope.KEY, key=("account_id",))


# ------------------------------------------------------------------------------- clean


@pytest.mark.all_servers
def test_clean_protected_database_is_ok(
    cli: Cli, dsn: str, accounts: FenceSpec, ledger: FenceSpec
) -> None:
    # Triggers of the application's own: on the row-fenced table an AFTER trigger that sorts
    # first (after fencekit's checks) and a BEFORE statement trigger that sorts after
    # fencekit's statement check, yet fires ahead of the row trigger that judges each row; on
    # the key-fenced table an AFTER STATEMENT trigger that sorts after fencekit's. Each can set
    # fencekit.token, so each is reported until a DBA allows its code; then the database is
    # clean.
    _sql(
        dsn,
        "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$",
        "CREATE TRIGGER aaa_audit AFTER INSERT OR UPDATE ON accounts "
        "FOR EACH ROW EXECUTE FUNCTION audit()",
        "CREATE TRIGGER zz_audit BEFORE INSERT ON accounts "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit()",
        "CREATE TRIGGER zz_audit AFTER INSERT ON ledger "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit()",
    )
    _record_owner(dsn)
    code, doc = _status(cli, dsn)
    assert code == 1
    found = _all_drift(doc)
    assert {(d["kind"], d["object"]) for d in found} == {
        ("foreign_trigger", "public.accounts: trigger aaa_audit"),
        ("foreign_trigger_first", "public.accounts: trigger zz_audit"),
        ("foreign_trigger", "public.ledger: trigger zz_audit"),
    }
    # One function, no arguments, no WHEN: one hash, whatever the trigger's name or table.
    assert len({d["sha256"] for d in found}) == 1
    _allow(cli, dsn, found[0])
    code, doc = _status(cli, dsn)
    assert code == 0, _all_drift(doc)
    assert doc["drift"] is False
    assert doc["core_drift"] == []
    assert all(t["drift"] == [] for t in doc["tables"])
    r = cli("status", "--dsn", dsn)
    assert r.code == 0
    assert "Drift:" not in r.out


# ------------------------------------------------------------------------------- ownership


def test_objects_given_to_an_app_role_are_reported_and_fixed(
    cli: Cli, dsn: str, accounts: FenceSpec, app: str
) -> None:
    """A restore by the application role, as far as two objects go: a fencekit table and the
    row fence's generated function now belong to the application role."""
    installer = _record_owner(dsn)
    fn = next(f for f in sqlgen.table_objects(accounts).functions if f.name.endswith("_upd"))
    _sql(
        dsn,
        f"ALTER TABLE fencekit.fences OWNER TO {app}",
        f"ALTER FUNCTION {fn.sql_name}() OWNER TO {app}",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    assert doc["drift"] is True
    (d,) = doc["core_drift"]
    assert d["kind"] == "owner_changed"
    assert d["object"] == f"owner {app}"
    assert sorted(d["objects"]) == sorted(["table fencekit.fences", f"function {fn.sql_name}()"])
    assert f"2 object(s) in schema fencekit are owned by {app}, not {installer}" in d["message"]
    assert "neither a superuser nor a member of fencekit_admin" in d["message"]
    assert f"ALTER TABLE fencekit.fences OWNER TO {installer}" in d["fix"]

    human = cli("status", "--dsn", dsn)
    assert human.code == 1
    assert f"fencekit: 2 object(s) in schema fencekit are owned by {app}" in human.out
    assert "[owner_changed]" in human.out

    _sql(dsn, d["fix"])
    code, doc = _status(cli, dsn)
    assert (code, doc["core_drift"]) == (0, []), doc


def test_whole_schema_restored_by_an_app_role_is_one_line(
    cli: Cli, dsn: str, accounts: FenceSpec, ledger: FenceSpec, app: str
) -> None:
    """`pg_restore --no-owner` run by the application role: every object in schema fencekit
    belongs to it. status says so on one line, with a count and a few names, and a fix that
    gives them back without touching the application's own tables."""
    installer = _record_owner(dsn)
    _sql(dsn, "CREATE TABLE app_own (id int)", f"ALTER TABLE app_own OWNER TO {app}")
    count = _give_everything_to(dsn, app)
    assert count > 20  # core tables, views, sequences, functions, per-table functions, counters
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["core_drift"]
    assert d["kind"] == "owner_changed"
    assert len(d["objects"]) == count
    assert "schema fencekit" in d["objects"]
    assert f"{count} object(s) in schema fencekit are owned by {app}" in d["message"]
    assert f"and {count - 3} more" in d["message"]
    human = cli("status", "--dsn", dsn)
    assert human.out.count(f"are owned by {app}") == 1
    assert f"owned by {app}, not {installer}" in human.out

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(d["fix"])
        owners = conn.execute(
            "SELECT relowner::regrole::text FROM pg_class WHERE relname = 'app_own'"
        ).fetchone()
    assert owners == (app,)  # the fix left the application's own table alone
    code, doc = _status(cli, dsn)
    assert (code, doc["core_drift"]) == (0, []), doc


def test_protect_by_a_member_of_fencekit_admin_is_not_drift(
    cli: Cli, dsn: str, make_role: Callable[..., str]
) -> None:
    """The migration role (a member of fencekit_admin that owns the table, and may create in
    schema fencekit, as protect needs) runs protect: the table's generated functions and
    counters are its own, as they should be. A core object handed to it is still reported."""
    installer = _record_owner(dsn)
    migrator_dsn = make_role("fk_status_migrator", "fencekit_admin")
    _sql(dsn, "GRANT CREATE ON SCHEMA fencekit TO fk_status_migrator")
    _sql(
        dsn,
        "CREATE TABLE invoices (id bigint PRIMARY KEY, k bigint NOT NULL)",
        "ALTER TABLE invoices OWNER TO fk_status_migrator",
    )
    assert cli("protect", "invoices", "--key", "k", "--dsn", migrator_dsn).code == 0
    with psycopg.connect(dsn) as conn:
        owned = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace "
            "AND proowner = 'fk_status_migrator'::regrole"
        ).fetchone()
    assert owned is not None
    assert owned[0] > 0
    code, doc = _status(cli, dsn)
    assert (code, doc["core_drift"]) == (0, []), _all_drift(doc)

    _sql(dsn, "ALTER TABLE fencekit.resources OWNER TO fk_status_migrator")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["core_drift"]
    assert d["kind"] == "owner_changed"
    assert d["objects"] == ["table fencekit.resources"]  # not the table's own functions
    assert "neither a superuser" not in d["message"]
    assert d["fix"] == f"ALTER TABLE fencekit.resources OWNER TO {installer}"


def test_without_a_recorded_owner_an_unprivileged_schema_owner_is_reported(
    cli: Cli, dsn: str, accounts: FenceSpec, app: str
) -> None:
    """Cores installed before the owner row existed compare with the owner of schema fencekit;
    when that owner is an application role (neither superuser nor member of fencekit_admin),
    that alone is the problem."""
    _sql(dsn, "DELETE FROM fencekit.meta WHERE key = 'owner'")
    _give_everything_to(dsn, app)
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = doc["core_drift"]
    assert d["kind"] == "owner_unprivileged"
    assert d["object"] == f"owner {app}"
    assert "neither a superuser nor a member of fencekit_admin" in d["message"]
    assert f"GRANT fencekit_admin TO {app}" in d["fix"]
    # The DBA decides app is fencekit's administering role after all. (A restore by app
    # leaves it owning the tables too: the row fence's TRUNCATE check belongs to their owner.)
    _sql(dsn, f"GRANT fencekit_admin TO {app}; ALTER TABLE {accounts.table.sql} OWNER TO {app}")
    assert _status(cli, dsn)[0] == 0


# ------------------------------------------------------------------------------- foreign triggers


def test_foreign_before_trigger_that_sorts_first_is_reported(
    cli: Cli, dsn: str, accounts: FenceSpec
) -> None:
    # A row trigger named to fire before fencekit's row trigger, handing every row a token:
    # the row check refuses a row that reads another token than the statement check saw
    # (YF004), and status still reports the trigger (it can change the row first).
    _sql(
        dsn,
        "CREATE FUNCTION default_token() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM set_config('fencekit.token', '999999', true); RETURN NEW; END$$",
        "CREATE TRIGGER aaa_default_token BEFORE UPDATE ON accounts "
        "FOR EACH ROW EXECUTE FUNCTION default_token()",
    )
    with psycopg.connect(dsn) as conn:  # stale (the row's fence is 50), swapped: refused
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.DatabaseError) as swapped:
            conn.execute("UPDATE accounts SET balance = balance")
    assert swapped.value.sqlstate == "YF004"
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.accounts")
    assert d["kind"] == "foreign_trigger_first"
    assert d["object"] == "public.accounts: trigger aaa_default_token"
    assert "fires on UPDATE ahead of fencekit's " + _triggers(accounts)["upd"] in d["message"]
    assert "set fencekit.token (set_config)" in d["message"]
    # Renamed as the fix says, fencekit's row trigger reads the writer's own token first; the
    # trigger is still reported (it can overwrite the fence column fencekit set).
    assert "RENAME TO zz_aaa_default_token" in d["fix"]
    _sql(dsn, "ALTER TRIGGER aaa_default_token ON accounts RENAME TO zz_aaa_default_token")
    code, doc = _status(cli, dsn)
    (d2,) = _table_drift(doc, "public.accounts")
    assert (code, d2["kind"], d2["sha256"]) == (1, "foreign_trigger_fence_column", d["sha256"])
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.DatabaseError) as err:
            conn.execute("UPDATE accounts SET balance = balance")
    assert err.value.sqlstate == "YF001"
    # Reviewed and accepted by the DBA: silenced.
    _allow(cli, dsn, d)
    assert _status(cli, dsn)[0] == 0


def test_a_statement_trigger_fires_ahead_of_a_row_fences_row_check_whatever_its_name(
    cli: Cli, dsn: str, accounts: FenceSpec
) -> None:
    # A BEFORE STATEMENT trigger fires ahead of a row fence's row check whatever its name; one
    # sorting after the statement check that swaps the token gets each row refused (YF004, the
    # row read another token than the statement check saw), and status reports it.
    _sql(
        dsn,
        "CREATE FUNCTION default_token() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM set_config('fencekit.token', '999999', true); RETURN NULL; END$$",
        "CREATE TRIGGER zz_default_token BEFORE UPDATE ON accounts "
        "FOR EACH STATEMENT EXECUTE FUNCTION default_token()",
    )
    with psycopg.connect(dsn) as conn:  # stale, swapped after the statement check: refused
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.DatabaseError) as swapped:
            conn.execute("UPDATE accounts SET balance = balance")
    assert swapped.value.sqlstate == "YF004"
    code, doc = _status(cli, dsn)
    (d,) = _table_drift(doc, "public.accounts")
    assert (code, d["kind"]) == (1, "foreign_trigger_first")
    assert "ahead of fencekit's " + _triggers(accounts)["upd"] in d["message"]
    assert "whatever its name" in d["fix"]
    assert "RENAME" not in d["fix"]


def test_any_foreign_trigger_fires_ahead_of_a_key_fences_check(
    cli: Cli, dsn: str, ledger: FenceSpec
) -> None:
    # A key fence judges INSERT, UPDATE and DELETE after the statement: every BEFORE trigger
    # and AFTER ROW trigger fires ahead of it, whatever its name, and can hand it a token.
    _sql(
        dsn,
        "CREATE FUNCTION default_token() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM set_config('fencekit.token', '999999', true); RETURN NULL; END$$",
        "CREATE TRIGGER zz_default_token AFTER INSERT ON ledger "
        "FOR EACH ROW EXECUTE FUNCTION default_token()",
        "INSERT INTO ledger VALUES (1, 42)",  # no token, yet accepted: that is the hole
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.ledger")
    assert d["kind"] == "foreign_trigger_first"
    assert d["object"] == "public.ledger: trigger zz_default_token"
    assert "AFTER row trigger zz_default_token" in d["message"]
    assert "ahead of fencekit's " + _triggers(ledger)["ins"] in d["message"]
    assert "whatever its name" in d["fix"]
    assert "RENAME" not in d["fix"]
    _allow(cli, dsn, d)
    assert _status(cli, dsn)[0] == 0
    _sql(dsn, "DROP TRIGGER zz_default_token ON ledger")
    assert _status(cli, dsn)[0] == 0
    with psycopg.connect(dsn) as conn, pytest.raises(psycopg.DatabaseError) as err:
        conn.execute("INSERT INTO ledger VALUES (2, 42)")
    assert err.value.sqlstate == "YF003"


def test_a_trigger_named_like_fencekits_is_still_foreign(
    cli: Cli, dsn: str, ledger: FenceSpec
) -> None:
    # Named to sort first among fencekit's own, but its function is not fencekit's.
    _sql(
        dsn,
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$",
        "CREATE TRIGGER fencekit_0 BEFORE UPDATE ON ledger "
        "FOR EACH STATEMENT EXECUTE FUNCTION noop()",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.ledger")
    assert (d["kind"], d["object"]) == (
        "foreign_trigger_first",
        "public.ledger: trigger fencekit_0",
    )


def test_foreign_row_trigger_that_rewrites_the_row_fence_is_reported(
    cli: Cli, dsn: str, accounts: FenceSpec
) -> None:
    # Fires after fencekit's row trigger (its name sorts after), so it has the last word on
    # NEW.fencekit_fence: it lowers the row's fence and a stale write then passes.
    _sql(
        dsn,
        "CREATE FUNCTION reset_fence() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "NEW.fencekit_fence := 1; RETURN NEW; END$$",
        "CREATE TRIGGER zz_reset_fence BEFORE UPDATE ON accounts "
        "FOR EACH ROW EXECUTE FUNCTION reset_fence()",
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '60', true)")
        conn.execute("UPDATE accounts SET balance = 20")
        conn.commit()
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        conn.execute("UPDATE accounts SET balance = 666")  # stale, yet accepted: the hole
        conn.commit()
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.accounts")
    assert d["kind"] == "foreign_trigger_fence_column"
    assert d["object"] == "public.accounts: trigger zz_reset_fence"
    assert "overwrite NEW.fencekit_fence" in d["message"]
    human = cli("status", "--dsn", dsn)
    assert human.code == 1
    assert "[foreign_trigger_fence_column]" in human.out
    _allow(cli, dsn, d)
    assert _status(cli, dsn)[0] == 0


# ------------------------------------------------------------------------------- descendants


def test_child_and_partition_created_after_protect_are_reported(
    cli: Cli, dsn: str, accounts: FenceSpec
) -> None:
    _sql(
        dsn,
        "CREATE TABLE events (id int NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (1) TO (10)",
    )
    assert cli("protect", "events", "--scope", "table", "--dsn", dsn).code == 0
    assert _status(cli, dsn)[0] == 0
    _sql(
        dsn,
        "CREATE TABLE accounts_archive () INHERITS (accounts)",
        "CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM (10) TO (20)",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    (child,) = _table_drift(doc, "public.accounts")
    assert child["kind"] == "child_triggers_missing"
    assert child["object"] == "child table public.accounts_archive"
    for name in _triggers(accounts).values():  # statement and row triggers alike
        assert name in child["message"]
    assert child["fix"].startswith("fencekit protect public.accounts --dsn DSN")
    (part,) = _table_drift(doc, "public.events")
    assert part["kind"] == "partition_triggers_missing"
    assert part["object"] == "partition public.events_2"
    assert part["fix"].startswith("fencekit protect public.events --scope table --dsn DSN")
    human = cli("status", "--dsn", dsn)
    assert "[child_triggers_missing]" in human.out
    assert "[partition_triggers_missing]" in human.out


def test_disabled_trigger_and_foreign_trigger_on_a_partition_are_reported(
    cli: Cli, dsn: str
) -> None:
    _sql(
        dsn,
        "CREATE TABLE events (id int NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (1) TO (10)",
    )
    assert cli("protect", "events", "--dsn", dsn).code == 0
    spec = FenceSpec(TableName("public", "events"))
    upd = _triggers(spec)["upd"]  # a clone PostgreSQL made of the parent's row trigger
    _sql(dsn, f"ALTER TABLE events_1 DISABLE TRIGGER {upd}")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.events")
    assert d["kind"] == "trigger_disabled"
    assert d["object"] == f"partition public.events_1: trigger {upd}"
    assert d["message"].startswith("on partition public.events_1: ")
    _sql(dsn, d["fix"])
    assert _status(cli, dsn)[0] == 0

    _sql(
        dsn,
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$",
        "CREATE TRIGGER a_first BEFORE DELETE ON events_1 "
        "FOR EACH STATEMENT EXECUTE FUNCTION noop()",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _table_drift(doc, "public.events")
    assert (d["kind"], d["object"]) == ("foreign_trigger_first", "public.events_1: trigger a_first")


def test_children_that_exist_at_protect_time_are_covered(cli: Cli, dsn: str) -> None:
    """Protect covers every descendant that exists when it runs (an inheritance child, its own
    child, a partition); re-running it covers one created later."""
    _sql(
        dsn,
        "CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL)",
        "CREATE TABLE accounts_old () INHERITS (accounts)",
        "CREATE TABLE accounts_older () INHERITS (accounts_old)",
        "CREATE TABLE events (id int NOT NULL, day int NOT NULL) PARTITION BY RANGE (day)",
        "CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (1) TO (10)",
    )
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    assert cli("protect", "events", "--dsn", dsn).code == 0
    code, doc = _status(cli, dsn)
    assert code == 0, _all_drift(doc)
    _sql(dsn, "CREATE TABLE accounts_new () INHERITS (accounts)")
    assert _status(cli, dsn)[0] == 1
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    code, doc = _status(cli, dsn)
    assert code == 0, _all_drift(doc)


@pytest.mark.parametrize(
    "timing",
    [
        "BEFORE UPDATE ON ledger FOR EACH ROW",
        "AFTER UPDATE ON ledger FOR EACH ROW",
        "BEFORE UPDATE ON ledger FOR EACH STATEMENT",
    ],
)
def test_a_trigger_that_rewrites_the_token_on_a_key_fenced_table_is_reported(
    cli: Cli, dsn: str, ledger: FenceSpec, timing: str
) -> None:
    # The attack: the table owner adds a trigger (named to sort after fencekit's, so a rename
    # cannot be the fix) that swaps whatever token a writer presents for a high one. A key
    # fence judges the statement after it, by the swapped token: a DML-only writer's stale
    # write lands. Before key fences reported every trigger firing ahead of their AFTER check,
    # status called this table clean.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('fencekit.token', '10', true)")
        conn.execute("INSERT INTO ledger VALUES (1, 42)")
        conn.execute("COMMIT")
        conn.execute("CREATE ROLE ledger_writer")
        conn.execute("GRANT SELECT, UPDATE ON ledger TO ledger_writer")
    _sql(
        dsn,
        "CREATE FUNCTION swap_token() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "PERFORM set_config('fencekit.token', '999999', true); RETURN NEW; END$$",
        f"CREATE TRIGGER zz_swap_token {timing} EXECUTE FUNCTION swap_token()",
    )
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("SET LOCAL ROLE ledger_writer")
            conn.execute("SELECT set_config('fencekit.token', '5', true)")  # stale: fence is 10
            conn.execute("UPDATE ledger SET account_id = 42 WHERE id = 1")  # accepted: the hole
            conn.rollback()
        code, doc = _status(cli, dsn)
        assert code == 1
        (d,) = _table_drift(doc, "public.ledger")
        assert d["kind"] == "foreign_trigger_first"
        assert d["object"] == "public.ledger: trigger zz_swap_token"
        assert "ahead of fencekit's " + _triggers(ledger)["upd"] in d["message"]
        assert "whatever its name" in d["fix"]
        # Dropped, the stale write is refused again.
        _sql(dsn, "DROP TRIGGER zz_swap_token ON ledger")
        assert _status(cli, dsn)[0] == 0
        with psycopg.connect(dsn) as conn:
            conn.execute("SET LOCAL ROLE ledger_writer")
            conn.execute("SELECT set_config('fencekit.token', '5', true)")
            with pytest.raises(psycopg.DatabaseError) as err:
                conn.execute("UPDATE ledger SET account_id = 42 WHERE id = 1")
        assert err.value.sqlstate == "YF001"
    finally:
        _sql(dsn, "DROP OWNED BY ledger_writer", "DROP ROLE ledger_writer")


def test_a_built_in_trigger_function_with_a_when_clause_is_reported(
    cli: Cli, dsn: str, accounts: FenceSpec
) -> None:
    """A trigger that runs PostgreSQL's own function is harmless only without a WHEN clause:
    the clause is the owner's expression, and it can swap the token (set_config), directly or
    through query_to_xml, which leaves no catalog link to what it runs. status reports it."""
    _sql(
        dsn,
        "CREATE TRIGGER a_swap BEFORE UPDATE ON accounts FOR EACH ROW "
        "WHEN (pg_catalog.set_config('fencekit.token', '999999', true) IS NOT NULL) "
        "EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    kinds = {(d["kind"], d["object"]) for d in _table_drift(doc, "public.accounts")}
    assert ("foreign_trigger_first", "public.accounts: trigger a_swap") in kinds, kinds
    # Without the clause the same built-in trigger sets nothing and is not reported.
    _sql(
        dsn,
        "DROP TRIGGER a_swap ON accounts",
        "CREATE TRIGGER a_plain BEFORE UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()",
    )
    assert _status(cli, dsn)[0] == 0
