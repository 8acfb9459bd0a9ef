"""An application role (DML only) and a role owning another schema try to get around fencing.

Each attack must fail with the SQLSTATE named here, and leave everything as it was (the
``unchanged`` snapshot). A legitimate write by the same role still works afterwards, so the
failures are fencing's doing, not a broken connection or missing grants.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.security.conftest import FENCE, STALE, VICTIMS, WRITES, attempt, write_as

DENIED = "42501"  # insufficient_privilege
MUST_OWN = ("42501",)  # "must be owner of table/function ..." is 42501 too
BYPASS_REFUSED, STALE_TOKEN, MISSING = "YF005", "YF001", "YF003"


def _tags(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT table_name, tag FROM fencekit.protected").fetchall())


@pytest.mark.parametrize("table", sorted(VICTIMS))
def test_bypass_is_refused(attacker, unchanged, table) -> None:
    stmt = WRITES[table]
    attempt(attacker, BYPASS_REFUSED, stmt, token=STALE, bypass=True)
    attempt(attacker, BYPASS_REFUSED, stmt, bypass=True)
    attempt(attacker, BYPASS_REFUSED, f"DELETE FROM {table}", token=STALE, bypass=True)
    for spelling in ("true", "1", "yes", "ON", "On"):
        attempt(
            attacker,
            BYPASS_REFUSED,
            f"SELECT set_config('fencekit.bypass', '{spelling}', true); {stmt}",
            token=STALE,
        )
    # Session-wide rather than transaction-local: still judged by role, per write.
    attacker.execute("SET fencekit.bypass = on")
    attacker.commit()
    attempt(attacker, BYPASS_REFUSED, stmt, token=STALE)
    attacker.execute("RESET fencekit.bypass")
    attacker.commit()
    unchanged()
    write_as(attacker, FENCE + 1, stmt)  # the role itself can still write with a fresh token


def test_bypass_as_a_role_default_is_refused(attacker, unchanged, victim) -> None:
    # A role may set some of its own session defaults. Either PostgreSQL refuses a default for
    # fencekit.bypass (16 does: unknown placeholders are superuser-only there), or the default
    # takes effect and fencing still refuses it, per write.
    role = attacker.info.user
    attacker.rollback()
    try:
        attacker.execute(f"ALTER ROLE {role} SET fencekit.bypass = 'on'")
        attacker.commit()
    except psycopg.errors.InsufficientPrivilege:
        attacker.rollback()
        unchanged()
        return
    try:
        with psycopg.connect(attacker.info.dsn) as fresh:
            assert fresh.execute("SHOW fencekit.bypass").fetchone() == ("on",)
            for table in VICTIMS:
                attempt(fresh, BYPASS_REFUSED, WRITES[table], token=STALE)
                attempt(fresh, BYPASS_REFUSED, WRITES[table])
    finally:
        victim.execute(f"ALTER ROLE {role} RESET fencekit.bypass")
        victim.commit()
    unchanged()


def test_cannot_become_admin_or_superuser(attacker, unchanged) -> None:
    role = attacker.info.user
    attempt(attacker, DENIED, "SET ROLE fencekit_admin")
    attempt(attacker, DENIED, "SET SESSION AUTHORIZATION postgres")
    attempt(attacker, DENIED, f"GRANT fencekit_admin TO {role}")
    attempt(attacker, DENIED, f"ALTER ROLE {role} SUPERUSER")
    attempt(attacker, DENIED, f"ALTER ROLE {role} BYPASSRLS")
    attempt(attacker, DENIED, "CREATE ROLE sec_sidekick LOGIN IN ROLE fencekit_admin")
    attempt(attacker, DENIED, "ALTER ROLE fencekit_admin LOGIN PASSWORD 'x'")
    unchanged()


@pytest.mark.parametrize(
    "table", ["fencekit.fences", "fencekit.leases", "fencekit.protected", "fencekit.resources",
              "fencekit.meta"],
)  # fmt: skip
def test_cannot_write_fencekits_tables(attacker, unchanged, table) -> None:
    for stmt in (
        f"UPDATE {table} SET {_any_column(table)} = {_any_column(table)}",
        f"DELETE FROM {table}",
        f"TRUNCATE {table}",
        f"INSERT INTO {table} SELECT * FROM {table}",
        f"ALTER TABLE {table} DISABLE TRIGGER ALL",
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
        f"DROP TABLE {table}",
        f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE",
    ):
        attempt(attacker, DENIED, stmt, token=FENCE + 100)
    unchanged()


def _any_column(table: str) -> str:
    return (
        {"fencekit.fences": "fence", "fencekit.leases": "token"}.get(table, "resource")
        if (table in ("fencekit.fences", "fencekit.leases", "fencekit.resources"))
        else {"fencekit.protected": "spec", "fencekit.meta": "value"}[table]
    )


def test_cannot_lower_a_fence(attacker, unchanged, victim) -> None:
    # Key and table fences live in fencekit.fences: no write right, and the definer function
    # that advances them only ever raises a fence.
    attempt(attacker, DENIED, "UPDATE fencekit.fences SET fence = 1")
    attempt(attacker, DENIED, "DELETE FROM fencekit.fences WHERE resource = 'public.items'")
    attempt(
        attacker, DENIED,
        "INSERT INTO fencekit.fences (resource, key, fence) VALUES ('public.items', '1', 1) "
        "ON CONFLICT (resource, key) DO UPDATE SET fence = 1",
    )  # fmt: skip
    # Only the key and table fences' own trigger functions (run as the role that protected the
    # table) advance fences: no writer may call it, not even to raise one.
    for token in (STALE, 2**63 - 1):
        attempt(
            attacker, DENIED,
            f"SELECT fencekit.advance_fences('public.items', ARRAY['1'], {token}, 'accept')",
        )  # fmt: skip
    # Row fences live in the row: the fence column takes the token, whatever the client sends.
    attempt(attacker, STALE_TOKEN, "UPDATE acct SET fencekit_fence = 1", token=STALE)
    attempt(attacker, MISSING, "UPDATE acct SET fencekit_fence = 1")
    attempt(
        attacker, STALE_TOKEN,
        "INSERT INTO acct VALUES (1, 0, 1) ON CONFLICT (id) DO UPDATE SET fencekit_fence = 1",
        token=STALE,
    )  # fmt: skip
    attempt(attacker, STALE_TOKEN, "DELETE FROM acct", token=STALE)
    attempt(attacker, STALE_TOKEN, "DELETE FROM items", token=STALE)
    attempt(attacker, STALE_TOKEN, "DELETE FROM ledger", token=STALE)
    attempt(attacker, (DENIED, STALE_TOKEN), "TRUNCATE acct, items, ledger", token=STALE)
    unchanged()
    # With the current token the client's value is replaced by the token, never kept.
    write_as(attacker, FENCE, "UPDATE acct SET fencekit_fence = 1, balance = balance WHERE id = 1")
    assert victim.execute("SELECT fencekit_fence FROM acct WHERE id = 1").fetchone() == (FENCE,)
    victim.rollback()


def test_cannot_reset_counters_or_rebind_resources(attacker, unchanged, victim) -> None:
    tag = _tags(victim)["acct"]
    seq = f'fencekit."{tag}:stale"'
    attempt(attacker, DENIED, f"SELECT setval('{seq}', 1, false)")
    attempt(attacker, MUST_OWN, f"ALTER SEQUENCE {seq} RESTART")
    attempt(attacker, MUST_OWN, f"DROP SEQUENCE {seq}")
    attempt(attacker, DENIED, f"SELECT fencekit.drop_counters('{tag}')")
    attempt(attacker, DENIED, f"SELECT fencekit.create_counters('{tag}')")
    attempt(attacker, DENIED, "SELECT fencekit.bind_resource('public.items', 'etcd')")
    unchanged()


@pytest.mark.parametrize("table", sorted(VICTIMS))
def test_cannot_disable_drop_or_replace_triggers(attacker, unchanged, victim, table) -> None:
    tag = _tags(victim)[table]
    trig = f"fencekit_{tag}_trunc"  # every scope has one (key fences: the only statement trigger)
    fn = f"fencekit.{tag}_stmt()"
    for stmt in (
        f"ALTER TABLE {table} DISABLE TRIGGER ALL",
        f"ALTER TABLE {table} DISABLE TRIGGER USER",
        f"ALTER TABLE {table} DISABLE TRIGGER {trig}",
        f"ALTER TABLE {table} ENABLE REPLICA TRIGGER {trig}",
        f"DROP TRIGGER {trig} ON {table}",
        f"ALTER TRIGGER {trig} ON {table} RENAME TO x",
        f"COMMENT ON TRIGGER {trig} ON {table} IS 'x'",
        f"CREATE TRIGGER sec_first BEFORE UPDATE ON {table} FOR EACH ROW "
        f"EXECUTE FUNCTION fencekit.{tag}_stmt()",
        f"CREATE RULE sec_rule AS ON UPDATE TO {table} DO INSTEAD NOTHING",
        f"ALTER TABLE {table} OWNER TO CURRENT_USER",
        f"ALTER TABLE {table} RENAME TO {table}_moved",
        f"ALTER TABLE {table} ADD COLUMN sec int",
        f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
        f"DROP FUNCTION {fn} CASCADE",
        f"ALTER FUNCTION {fn} RENAME TO x",
        f"ALTER FUNCTION {fn} SET search_path = public",
        f"ALTER FUNCTION {fn} OWNER TO CURRENT_USER",
        f"CREATE OR REPLACE FUNCTION {fn} RETURNS trigger LANGUAGE plpgsql "
        "AS $$BEGIN RETURN NULL; END$$",
        "CREATE OR REPLACE FUNCTION fencekit.bypass_allowed(text, oid, text) RETURNS boolean "
        "LANGUAGE sql AS 'SELECT true'",
        "CREATE FUNCTION fencekit.sec_helper() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER FUNCTION fencekit.reject(text, text, oid, text, text, text, jsonb, bigint, "
        "bigint, text) OWNER TO CURRENT_USER",
        "CREATE EVENT TRIGGER sec_evt ON ddl_command_start EXECUTE FUNCTION fencekit.token_text()",
    ):
        attempt(attacker, MUST_OWN, stmt)
    if table == "acct":
        attempt(attacker, MUST_OWN, "ALTER TABLE acct DROP COLUMN fencekit_fence")
        attempt(attacker, MUST_OWN, "ALTER TABLE acct ALTER COLUMN fencekit_fence SET DEFAULT 1")
    if attacker.info.user == "sec_schema_owner":
        attempt(attacker, MUST_OWN, f"ALTER TABLE {table} SET SCHEMA evil")
        attempt(attacker, MUST_OWN, f"ALTER FUNCTION {fn} SET SCHEMA evil")
    unchanged()


@pytest.mark.parametrize("table", sorted(VICTIMS))
def test_session_replication_role_replica_is_refused(attacker, unchanged, table) -> None:
    # Triggers do not fire under 'replica' (docs/dev/design.md); only superusers (or roles
    # granted SET on the parameter) may switch to it.
    for switch in (
        "SET session_replication_role = replica",
        "SET LOCAL session_replication_role = replica",
        "SELECT set_config('session_replication_role', 'replica', true)",
        "SELECT set_config('session_replication_role', 'replica', false)",
        f"ALTER ROLE {attacker.info.user} SET session_replication_role = replica",
        f"ALTER DATABASE {attacker.info.dbname} SET session_replication_role = replica",
    ):
        attempt(attacker, DENIED, f"{switch}; {WRITES[table]}", token=STALE)
    # The write itself, still stale, is still rejected.
    attempt(attacker, STALE_TOKEN, WRITES[table], token=STALE)
    unchanged()


def test_the_replica_switch_is_what_would_bypass(victim) -> None:
    """Control: as superuser, 'replica' does skip the triggers (so the refusal above matters)."""
    victim.execute("SET LOCAL session_replication_role = replica")
    victim.execute("SELECT set_config('fencekit.token', %s, true)", (str(STALE),))
    victim.execute(WRITES["acct"])
    assert victim.execute("SELECT fencekit_fence FROM acct WHERE id = 1").fetchone() == (FENCE,)
    victim.rollback()


def test_application_role_cannot_forge_rejection_counters(attacker, victim) -> None:
    # reject acts only for a transaction writing the table under that tag (not
    # for one that writes nothing, nor for one writing another protected table); count_event
    # counts only unfenced and bypassed writes, never a rejection.
    tag = _tags(victim)["acct"]
    query = "SELECT count FROM fencekit.rejections WHERE table_name = 'acct' AND reason = 'stale'"
    before = victim.execute(query).fetchone()
    victim.rollback()
    forgeries = [
        ("SELECT fencekit.count_event(%s, 'public.acct'::regclass, 'stale')", ()),
        ("SELECT fencekit.reject('stale', %s, 'public.acct'::regclass, NULL, NULL, NULL, "
         "NULL, 1, 1000000)", ()),
        ("SELECT fencekit.count_event(%s, 'public.ledger'::regclass, 'stale')",
         ("UPDATE ledger SET amount = amount WHERE false",)),
        ("SELECT fencekit.count_event(%s, 'public.acct'::regclass, 'stale')",
         ("LOCK TABLE ledger IN ROW EXCLUSIVE MODE",)),
    ]  # fmt: skip
    for call, first in forgeries:
        attacker.rollback()
        attacker.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE + 1),))
        for stmt in first:
            attacker.execute(stmt)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            attacker.execute(call, (tag,))
        attacker.rollback()
    after = victim.execute(query).fetchone()
    victim.rollback()
    assert after == before


def test_application_role_cannot_release_someone_elses_lease(attacker, victim) -> None:
    # Holder names and tokens are public (fencekit.leases_current); what protects a grant is
    # that only the role that acquired it (or fencekit_admin) may renew or release it.
    attacker.rollback()
    attacker.execute(
        "SELECT fencekit.release(resource, holder, token) FROM fencekit.leases_current"
    )
    attacker.commit()
    holder = victim.execute(
        "SELECT holder FROM fencekit.leases_current WHERE resource = 'billing:1'"
    ).fetchone()
    victim.rollback()
    assert holder == ("legit-holder",)
