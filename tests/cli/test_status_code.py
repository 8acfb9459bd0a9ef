"""``fencekit status`` names every object on or attached to a protected table that runs code
fencekit did not generate.

Each case is the owner's attack: code that swaps the token a writer presents
(``set_config('fencekit.token', '999999', true)``), put where a statement on the table runs it:
a trigger after fencekit's check, the fence column's default, another column's default, a
generated column, a column's domain, a CHECK constraint, an index expression, an RLS policy, a
rule, a foreign key cascading into a table with such a trigger. Where it is cheap to show, the
stale write it lets in is shown too. status must exit 1 and name the object; allowing the code's
hash (``fencekit allow``) silences it, and a changed body is reported again. On the code before
this change status called each of these tables clean."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from .conftest import Cli

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

SWAP = "PERFORM pg_catalog.set_config('fencekit.token', '999999', true);"
APP = "fk_code_app"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _status(cli: Cli, dsn: str) -> tuple[int, dict[str, Any]]:
    r = cli("status", "--json", "--dsn", dsn)
    return r.code, json.loads(r.out)


def _drift(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["core_drift"]) + [d for t in doc["tables"] for d in t["drift"]]


def _swap_functions(dsn: str) -> None:
    """Functions that swap the token, of every shape the places below need."""
    _sql(
        dsn,
        f"CREATE FUNCTION swap_trigger() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN {SWAP} "
        "RETURN NULL; END$$",
        f"CREATE FUNCTION swap_bool() RETURNS boolean LANGUAGE plpgsql AS $$BEGIN {SWAP} "
        "RETURN true; END$$",
        f"CREATE FUNCTION swap_int(x bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$BEGIN "
        f"{SWAP} RETURN x; END$$",
        f"CREATE FUNCTION swap_check(x numeric) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS "
        f"$$BEGIN {SWAP} RETURN true; END$$",
    )


@pytest.fixture
def accounts(cli: Cli, dsn: str, make_role: Callable[..., str]) -> str:
    """accounts with a row fence: row 1 at fence 50. Returns the DSN of a DML-only app role."""
    _sql(
        dsn,
        "CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL)",
        "INSERT INTO accounts VALUES (1, 0)",
    )
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '50', true)")
        conn.execute("UPDATE accounts SET balance = 10")
    _swap_functions(dsn)
    assert _status(cli, dsn)[0] == 0
    return make_role(APP, "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")


def _stale_update_lands(app_dsn: str, first: str) -> bool:
    """As the app, T(3): ``first``, then UPDATE row 1 (fence 50). True when it is accepted;
    False also when ``first`` itself is refused because a row of a row fence read the swapped
    token, not the one its statement check validated (YF004)."""
    refused: str | None = None
    with psycopg.connect(app_dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '3', true)")
        try:
            conn.execute(first)
        except psycopg.DatabaseError as exc:
            first_refused = exc.sqlstate
        else:
            first_refused = None
        if first_refused is not None:
            assert first_refused == "YF004", first_refused
            return False
        try:
            conn.execute("UPDATE accounts SET balance = 666 WHERE id = 1")
        except psycopg.DatabaseError as exc:
            refused = exc.sqlstate
        conn.rollback()
    assert refused in (None, "YF001")
    return refused is None


# (setup SQL, the kind, the object, a statement that runs the code) per place.
PLACES = {
    "after_trigger": (
        [
            "CREATE TRIGGER aaa_after AFTER INSERT ON accounts FOR EACH ROW "
            "EXECUTE FUNCTION swap_trigger()"
        ],
        "foreign_trigger",
        "public.accounts: trigger aaa_after",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    # After fencekit's statement check, ahead of its row trigger: the new row's fence is the
    # swapped token.
    "before_statement_after_fencekits": (
        [
            "CREATE TRIGGER zz_swap BEFORE INSERT ON accounts FOR EACH STATEMENT "
            "EXECUTE FUNCTION swap_trigger()"
        ],
        "foreign_trigger_first",
        "public.accounts: trigger zz_swap",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "fence_column_default": (
        [
            "ALTER TABLE accounts ALTER COLUMN fencekit_fence SET DEFAULT "
            "(pg_catalog.set_config('fencekit.token', '999999', true))::bigint"
        ],
        "fence_default_foreign",
        "public.accounts.fencekit_fence",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "column_default": (
        ["ALTER TABLE accounts ADD COLUMN stamp boolean DEFAULT swap_bool()"],
        "foreign_default",
        "public.accounts.stamp",
        "INSERT INTO accounts (id, balance) VALUES (2, 0)",
    ),
    "generated_column": (
        ["ALTER TABLE accounts ADD COLUMN twin bigint GENERATED ALWAYS AS (swap_int(id)) STORED"],
        "foreign_default",
        "public.accounts.twin",
        "INSERT INTO accounts (id, balance) VALUES (2, 0)",
    ),
    "domain": (
        [
            "CREATE DOMAIN checked_amount AS numeric CHECK (swap_check(VALUE))",
            "ALTER TABLE accounts ADD COLUMN amount checked_amount",
        ],
        "foreign_column_type",
        "public.accounts.amount",
        "INSERT INTO accounts (id, balance, amount) VALUES (2, 0, 1)",
    ),
    "check_constraint": (
        ["ALTER TABLE accounts ADD CONSTRAINT sane CHECK (swap_check(balance))"],
        "foreign_constraint",
        "public.accounts: constraint sane",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    # A built-in that runs SQL given as text (the second review's N5): no user function at all.
    "check_ts_rewrite": (
        [
            "ALTER TABLE accounts ADD CONSTRAINT sneaky CHECK (pg_catalog.ts_rewrite("
            "'a'::pg_catalog.tsquery, 'SELECT ''a''::pg_catalog.tsquery, ''b''::pg_catalog.tsquery "
            "FROM (SELECT pg_catalog.set_config(''fencekit.token'', ''999999'', true)) s') "
            "IS NOT NULL)"
        ],
        "foreign_constraint",
        "public.accounts: constraint sneaky",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "index_expression": (
        ["CREATE INDEX accounts_twin ON accounts ((swap_int(id)))"],
        "foreign_index",
        "public.accounts: index public.accounts_twin",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "partial_index_predicate": (
        ["CREATE INDEX accounts_some ON accounts (id) WHERE swap_check(balance)"],
        "foreign_index",
        "public.accounts: index public.accounts_some",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "rls_policy": (
        [
            "CREATE POLICY everyone ON accounts USING (swap_bool())",
            "ALTER TABLE accounts ENABLE ROW LEVEL SECURITY",
        ],
        "foreign_policy",
        "public.accounts: policy everyone",
        "SELECT count(*) FROM accounts",
    ),
    "rule": (
        [
            "CREATE RULE swap AS ON INSERT TO accounts DO ALSO "
            "SELECT pg_catalog.set_config('fencekit.token', '999999', true)"
        ],
        "foreign_rule",
        "public.accounts: rule swap",
        "INSERT INTO accounts VALUES (2, 0)",
    ),
    "cascade": (
        [
            "CREATE TABLE notes (id int, account_id bigint REFERENCES accounts ON DELETE CASCADE)",
            "CREATE TRIGGER swap AFTER DELETE ON notes FOR EACH ROW "
            "EXECUTE FUNCTION swap_trigger()",
            "SELECT pg_catalog.set_config('fencekit.token', '2', false)",
            "INSERT INTO accounts VALUES (3, 0)",  # fence 2: T(3) may delete it
            "RESET fencekit.token",
            "INSERT INTO notes VALUES (1, 3)",
        ],
        "foreign_cascade",
        "public.accounts: foreign key public.notes.notes_account_id_fkey",
        "DELETE FROM accounts WHERE id = 3",
    ),
    "cascade_set_null_into_a_check": (
        [
            "CREATE TABLE notes (id int CHECK (swap_check(id)), "
            "account_id bigint REFERENCES accounts ON DELETE SET NULL)",
            "SELECT pg_catalog.set_config('fencekit.token', '2', false)",
            "INSERT INTO accounts VALUES (3, 0)",
            "RESET fencekit.token",
            "INSERT INTO notes VALUES (1, 3)",
        ],
        "foreign_cascade",
        "public.accounts: foreign key public.notes.notes_account_id_fkey",
        "DELETE FROM accounts WHERE id = 3",
    ),
    "view_instead_of_trigger": (
        [
            "CREATE VIEW accounts_v AS SELECT id, balance FROM accounts",
            "CREATE TRIGGER swap INSTEAD OF INSERT ON accounts_v FOR EACH ROW "
            "EXECUTE FUNCTION swap_trigger()",
        ],
        "foreign_view",
        "public.accounts: view public.accounts_v",
        "INSERT INTO accounts_v VALUES (2, 0)",
    ),
    "view_where": (
        ["CREATE VIEW accounts_w AS SELECT id, balance FROM accounts WHERE swap_bool()"],
        "foreign_view",
        "public.accounts: view public.accounts_w",
        "SELECT count(*) FROM accounts_w",
    ),
}


# Places whose swap a row of the statement running it reads: that statement is refused.
SWAPPED_IN_STATEMENT = {"before_statement_after_fencekits", "fence_column_default"}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_code_that_swaps_the_token_is_reported_and_allowed_by_hash(
    cli: Cli, dsn: str, accounts: str, place: str
) -> None:
    setup, kind, obj, runs_it = PLACES[place]
    _sql(dsn, *setup)
    _sql(dsn, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP}")
    # The hole: a stale T(3) gets its second statement past the fence at 50; unless the code
    # swaps the token between the row fence's statement check and a row of the statement that
    # runs it, which is refused then (one statement, one token). Reported either way.
    assert _stale_update_lands(accounts, runs_it) == (place not in SWAPPED_IN_STATEMENT)
    code, doc = _status(cli, dsn)
    assert code == 1
    found = [d for d in _drift(doc) if d["object"] == obj]
    assert [d["kind"] for d in found] == [kind], _drift(doc)
    (d,) = found
    assert "fencekit.token" in d["message"]
    assert f"fencekit allow {d['sha256']}" in d["fix"]
    human = cli("status", "--dsn", dsn)
    assert f"[{kind}]" in human.out
    # Reviewed (pretend), allowed by hash: status is clean again.
    r = cli("allow", d["sha256"], "--note", "reviewed", "--dsn", dsn)
    assert r.code == 0, r.err
    code, doc = _status(cli, dsn)
    assert code == 0, _drift(doc)


def test_a_trigger_allowed_by_hash_survives_renames_and_a_changed_body_is_reported(
    cli: Cli, dsn: str, accounts: str
) -> None:
    """An application versions its trigger names (…_v1 becoming …_v2, function included):
    the reviewed code's hash still matches. Changing the body flags it again."""
    _sql(
        dsn,
        "CREATE FUNCTION touch_v1() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "NEW.balance := NEW.balance; RETURN NEW; END$$",
        "CREATE TRIGGER touch_v1 BEFORE UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION touch_v1()",
    )
    code, doc = _status(cli, dsn)
    (d,) = _drift(doc)
    assert (code, d["kind"]) == (1, "foreign_trigger_fence_column")
    assert cli("allow", d["sha256"], "--dsn", dsn).code == 0
    assert _status(cli, dsn)[0] == 0
    listed = json.loads(cli("allow", "--list", "--json", "--dsn", dsn).out)["allowed"]
    assert [(a["sha256"], a["object"]) for a in listed] == [(d["sha256"], d["object"])]

    # The upgrade: same body under new names.
    _sql(
        dsn,
        "DROP TRIGGER touch_v1 ON accounts",
        "DROP FUNCTION touch_v1()",
        "CREATE FUNCTION touch_v2() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "NEW.balance := NEW.balance; RETURN NEW; END$$",
        "CREATE TRIGGER touch_v2 BEFORE UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION touch_v2()",
    )
    assert _status(cli, dsn)[0] == 0

    # The hole an allow-list by name opened: same name, new body.
    _sql(
        dsn,
        "CREATE OR REPLACE FUNCTION touch_v2() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "NEW.fencekit_fence := 1; RETURN NEW; END$$",
    )
    code, doc = _status(cli, dsn)
    (d2,) = _drift(doc)
    assert (code, d2["object"]) == (1, "public.accounts: trigger touch_v2")
    assert d2["sha256"] != d["sha256"]
    # Revoked, the old hash no longer silences the old body either.
    assert cli("allow", "--revoke", d["sha256"], "--dsn", dsn).code == 0
    assert json.loads(cli("allow", "--list", "--json", "--dsn", dsn).out)["allowed"] == []


def test_only_fencekit_admin_may_allow_and_only_reported_hashes(
    cli: Cli, dsn: str, accounts: str, make_role: Callable[..., str]
) -> None:
    _sql(
        dsn,
        "CREATE TRIGGER zz_swap AFTER UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION swap_trigger()",
        f"ALTER TABLE accounts OWNER TO {APP}",
    )
    # The other line: the row fence's TRUNCATE check still belongs to the old owner.
    (d,) = [x for x in _drift(_status(cli, dsn)[1]) if x.get("sha256")]
    r = cli("allow", d["sha256"], "--dsn", accounts)  # the table's owner, not an admin
    assert r.code == 1
    assert "permission denied" in r.err
    r = cli("allow", "0" * 64, "--dsn", dsn)
    assert r.code == 1
    assert "no code status reports has the hash" in r.err
    assert cli("allow", "nothex", "--dsn", dsn).code == 2
    assert _status(cli, dsn)[0] == 1


# ------------------------------------------------------------------------------- ancestors


@pytest.mark.parametrize("how", ["inherit", "attach_partition"])
# A key-fenced table cannot become a child (PostgreSQL refuses INHERIT to a table with
# transition-table triggers), and protect refuses a key fence on a child.
@pytest.mark.parametrize("scope", ["row", "table"])
def test_a_protected_table_under_an_unprotected_ancestor_is_reported(
    cli: Cli, dsn: str, how: str, scope: str
) -> None:
    if how == "inherit":
        _sql(
            dsn,
            "CREATE TABLE shadow (id bigint NOT NULL, account_id bigint NOT NULL)",
            "CREATE TABLE te (id bigint NOT NULL, account_id bigint NOT NULL)",
        )
    else:
        fence = ", fencekit_fence bigint" if scope == "row" else ""  # a partition adds none
        _sql(
            dsn,
            f"CREATE TABLE shadow (id bigint NOT NULL, account_id bigint NOT NULL{fence}) "
            "PARTITION BY RANGE (id)",
            "CREATE TABLE te (id bigint NOT NULL, account_id bigint NOT NULL)",
        )
    extra = ["--scope", scope]
    if how == "attach_partition":
        # Refused both ways: protect refuses a partition (protect its parent), and a protected
        # plain table cannot become one (fencekit_<tag>_root).
        assert cli("protect", "te", *extra, "--dsn", dsn).code == 0
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            _sql(dsn, "ALTER TABLE shadow ATTACH PARTITION te FOR VALUES FROM (0) TO (100)")
        assert _status(cli, dsn)[0] == 0
        return
    # A protected plain table cannot become an inheritance child either: the ancestor is one it
    # had when it was protected, and status reports it.
    assert cli("protect", "te", *extra, "--dsn", dsn).code == 0
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        _sql(dsn, "ALTER TABLE te INHERIT shadow")
    assert cli("unprotect", "te", "--dsn", dsn).code == 0
    _sql(dsn, "ALTER TABLE te INHERIT shadow")
    undo = "ALTER TABLE public.te NO INHERIT public.shadow"
    r = cli("protect", "te", *extra, "--dsn", dsn)
    if scope == "table":
        # A table fence's checks are all statement-level: protect refuses a child. Its owner
        # can still make it one, dropping the root guard.
        assert r.code == 1
        assert "NO INHERIT" in r.err
        _sql(dsn, "ALTER TABLE te NO INHERIT shadow")
        assert cli("protect", "te", *extra, "--dsn", dsn).code == 0
        _sql(
            dsn,
            "DO $$DECLARE g text; BEGIN SELECT tgname INTO g FROM pg_trigger "
            "WHERE tgrelid = 'te'::regclass AND right(tgname, 5) = '_root'; "
            "EXECUTE format('DROP TRIGGER %I ON te', g); END$$",
            "ALTER TABLE te INHERIT shadow",
        )
    else:
        assert r.code == 0
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _drift(doc)
    assert (d["kind"], d["object"]) == ("unprotected_ancestor", "public.te: ancestor public.shadow")
    assert undo in d["fix"]
    _sql(dsn, undo)
    assert cli("protect", "te", *extra, "--dsn", dsn).code == 0  # now with its guard
    assert _status(cli, dsn)[0] == 0


# ------------------------------------------------------------------------------- settings


@pytest.mark.pg_since(15)
def test_a_grant_of_set_on_session_replication_role_is_reported(
    cli: Cli, dsn: str, accounts: str
) -> None:
    _sql(dsn, f"GRANT SET ON PARAMETER session_replication_role TO {APP}")
    try:
        code, doc = _status(cli, dsn)
        assert code == 1
        (d,) = _drift(doc)
        assert d["kind"] == "replication_role_granted"
        assert APP in d["message"]
        _sql(dsn, d["fix"].removeprefix("as a superuser: "))
        assert _status(cli, dsn)[0] == 0
    finally:
        _sql(dsn, f"REVOKE SET ON PARAMETER session_replication_role FROM {APP}")


def test_settings_that_hand_sessions_a_token_are_reported(
    cli: Cli, dsn: str, accounts: str
) -> None:
    # A role default: every session of the app presents token 999999 without an issuer.
    _sql(dsn, f"ALTER ROLE {APP} SET fencekit.token = '999999'")
    with psycopg.connect(accounts) as conn:  # the hole: no token asked for, a write lands
        conn.execute("UPDATE accounts SET balance = 1 WHERE id = 1")
        conn.rollback()
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _drift(doc)
    assert (d["kind"], d["object"]) == ("token_setting", f"role {APP}")
    assert d["fix"] == f"ALTER ROLE {APP} RESET fencekit.token"
    _sql(dsn, d["fix"])
    assert _status(cli, dsn)[0] == 0
    # A foreign server (postgres_fdw's options) handing its sessions a token.
    _sql(
        dsn,
        "CREATE FOREIGN DATA WRAPPER fk_wrapper",
        "CREATE SERVER elsewhere FOREIGN DATA WRAPPER fk_wrapper "
        "OPTIONS (options '-c fencekit.token=999999')",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _drift(doc)
    assert (d["kind"], d["object"]) == ("token_setting", "foreign server elsewhere")
    _sql(dsn, "DROP SERVER elsewhere", "DROP FOREIGN DATA WRAPPER fk_wrapper")
    assert _status(cli, dsn)[0] == 0


def test_ordinary_schema_objects_that_run_no_user_code_are_not_reported(
    cli: Cli, dsn: str, accounts: str
) -> None:
    """What applications usually have: built-in defaults, constraints with built-in operators,
    a domain with a built-in CHECK, an enum, partial and expression indexes over built-ins, an
    RLS policy comparing with current_user, a plain view, a cascade into a table with no
    triggers. None of it can set the token: status stays clean."""
    _sql(
        dsn,
        "CREATE TYPE state AS ENUM ('open', 'closed')",
        "CREATE DOMAIN positive AS numeric CHECK (VALUE >= 0)",
        "CREATE SEQUENCE accounts_seq",
        "ALTER TABLE accounts ADD COLUMN serial_no bigint DEFAULT nextval('accounts_seq'), "
        "ADD COLUMN created timestamptz DEFAULT now(), ADD COLUMN ref uuid DEFAULT "
        "gen_random_uuid(), ADD COLUMN st state DEFAULT 'open', ADD COLUMN limit_ positive, "
        "ADD COLUMN owner_name text DEFAULT current_user, "
        "ADD COLUMN upper_owner text GENERATED ALWAYS AS (upper(owner_name)) STORED, "
        "ADD CONSTRAINT sane CHECK (balance > -1000 AND st <> 'closed' OR balance = 0)",
        "CREATE INDEX accounts_open ON accounts (id) WHERE st = 'open'",
        "CREATE INDEX accounts_lower ON accounts (lower(owner_name))",
        "CREATE POLICY mine ON accounts USING (owner_name = current_user OR true)",
        "ALTER TABLE accounts ENABLE ROW LEVEL SECURITY",
        "CREATE VIEW accounts_open_v AS SELECT id, balance FROM accounts WHERE st = 'open'",
        "CREATE TABLE notes (id int, account_id bigint REFERENCES accounts ON DELETE CASCADE)",
    )
    code, doc = _status(cli, dsn)
    assert code == 0, _drift(doc)


def test_a_subscription_into_a_protected_table_is_warned_about(
    cli: Cli, dsn: str, accounts: str
) -> None:
    """A subscriber that also takes local writes: the apply worker writes with no check firing,
    and replicated fence rows replace the subscriber's own. status cannot tell whether local
    writes happen, so it warns (exit status unchanged)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        host, port, db, user = conn.info.host, conn.info.port, conn.info.dbname, conn.info.user
        conn.execute("CREATE PUBLICATION fk_pub FOR TABLE accounts")
        # Publisher and subscriber in one database: no slot, never enabled; the table list is
        # read over a replication connection when the subscription is created.
        conn.execute(
            f"CREATE SUBSCRIPTION fk_sub CONNECTION 'host={host} port={port} dbname={db} "
            f"user={user}' PUBLICATION fk_pub WITH (create_slot = false, enabled = false, "
            "slot_name = NONE, connect = true)"
        )
    try:
        code, doc = _status(cli, dsn)
        assert code == 0
        (w,) = [w for w in doc["warnings"] if "subscription" in w]
        assert w.startswith("subscription fk_sub replicates into public.accounts")
    finally:
        _sql(dsn, "DROP SUBSCRIPTION fk_sub", "DROP PUBLICATION fk_pub")


def test_triggers_running_postgresqls_own_functions_are_not_reported(
    cli: Cli, dsn: str, accounts: str
) -> None:
    """Built-in trigger functions set no setting; one whose arguments name the row fence's
    column could still write it, and is reported."""
    _sql(
        dsn,
        "ALTER TABLE accounts ADD COLUMN doc tsvector, ADD COLUMN body text",
        "CREATE TRIGGER aaa_skip BEFORE UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "CREATE TRIGGER aaa_doc BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION tsvector_update_trigger(doc, 'pg_catalog.simple', body)",
    )
    code, doc = _status(cli, dsn)
    assert code == 0, _drift(doc)
    _sql(
        dsn,
        "CREATE TRIGGER aaa_fence BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW "
        "EXECUTE FUNCTION tsvector_update_trigger(fencekit_fence, 'pg_catalog.simple', body)",
    )
    code, doc = _status(cli, dsn)
    assert code == 1
    assert [d["object"] for d in _drift(doc)] == ["public.accounts: trigger aaa_fence"]


@pytest.mark.parametrize("scope", ["table"])  # a key fence's child cannot take a second parent
def test_a_child_that_also_inherits_from_outside_the_tree_is_reported(
    cli: Cli, dsn: str, scope: str
) -> None:
    """A covered inheritance child given a second parent: statements that name that parent
    write the child's rows and fire only its statement triggers, so the key or table fence's
    checks (all statement-level) never see them. Status names it, and the statement that
    undoes it."""
    _sql(
        dsn,
        "CREATE TABLE tp (id bigint NOT NULL, account_id bigint NOT NULL)",
        "CREATE TABLE tc () INHERITS (tp)",
        "CREATE TABLE side (id bigint NOT NULL, account_id bigint NOT NULL)",
    )
    extra = ["--scope", scope] + (["--key", "account_id"] if scope == "key" else [])
    assert cli("protect", "tp", *extra, "--dsn", dsn).code == 0
    assert _status(cli, dsn)[0] == 0
    _sql(dsn, "ALTER TABLE tc INHERIT side")
    code, doc = _status(cli, dsn)
    assert code == 1
    (d,) = _drift(doc)
    assert (d["kind"], d["object"]) == (
        "child_other_parent",
        "child table public.tc: parent public.side",
    )
    _sql(dsn, d["fix"])
    assert _status(cli, dsn)[0] == 0
