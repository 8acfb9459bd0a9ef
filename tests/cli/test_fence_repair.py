"""Repairing a fence: ``fencekit fence set`` and ``fencekit.set_fence`` on real servers, for
every scope; refusals (not an admin, lowering without the flag, unknown key, row or table);
the audit row, the bypass count of a row repair, and what ``status`` shows."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from .conftest import Cli

BIGINT_MAX = 2**63 - 1


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def _one(dsn: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _write(dsn: str, token: int, statement: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        conn.execute(statement)


@pytest.fixture
def key_table(cli: Cli, dsn: str) -> str:
    """payments, key fence on account_id; a buggy writer pushed key 1 to the bigint maximum."""
    _sql(dsn, "CREATE TABLE payments (id serial PRIMARY KEY, account_id int NOT NULL, amt int)")
    assert cli("protect", "payments", "--key", "account_id", "--dsn", dsn).code == 0
    _write(dsn, 5, "INSERT INTO payments (account_id, amt) VALUES (1, 10), (2, 20)")
    _write(dsn, BIGINT_MAX, "UPDATE payments SET amt = 11 WHERE account_id = 1")
    return "payments"


@contextlib.contextmanager
def _stale() -> Iterator[None]:
    """The block raises a stale-token rejection (SQLSTATE YF001)."""
    with pytest.raises(psycopg.Error) as info:
        yield
    assert info.value.sqlstate == "YF001", info.value


def _fence(dsn: str, resource: str, key: str) -> int | None:
    return _one(dsn, "SELECT fencekit.current_fence(%s, %s)", (resource, key))  # type: ignore[no-any-return]


def test_lowering_is_refused_without_the_flag(cli: Cli, dsn: str, key_table: str) -> None:
    r = cli("fence", "set", "payments", "--key", "1", "--to", "35", "--dsn", dsn)
    assert r.code == 1, r
    assert "refusing to lower the fence" in r.err
    assert "--allow-lower" in r.err
    assert _fence(dsn, "public.payments", "1") == BIGINT_MAX
    assert _one(dsn, "SELECT count(*) FROM fencekit.repairs") == 0


def test_key_fence_repair_unlocks_the_key(cli: Cli, dsn: str, key_table: str) -> None:
    with _stale():
        _write(dsn, 6, "UPDATE payments SET amt = 12 WHERE account_id = 1")
    r = cli(
        "fence", "set", "payments", "--key", "1", "--to", "35", "--allow-lower",
        "--reason", "INC-1: writer sent bigint max", "--json", "--dsn", dsn,
    )  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["old_fence"] == BIGINT_MAX
    assert doc["new_fence"] == 35
    assert doc["lowered"] is True
    assert _fence(dsn, "public.payments", "1") == 35
    _write(dsn, 36, "UPDATE payments SET amt = 12 WHERE account_id = 1")  # accepted again
    with _stale():
        _write(dsn, 34, "UPDATE payments SET amt = 13 WHERE account_id = 1")
    row = _row(dsn, "SELECT repaired_by, schema_name, table_name, scope, resource, key, "
                    "old_fence, new_fence, lowered, reason FROM fencekit.repairs")  # fmt: skip
    assert row[1:] == (
        "public", "payments", "key", "public.payments", "1", BIGINT_MAX, 35, True,
        "INC-1: writer sent bigint max",
    )  # fmt: skip
    assert row[0] == _one(dsn, "SELECT session_user::text")


def _row(dsn: str, query: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return tuple(row)


def test_raise_needs_no_flag_and_status_shows_repairs(cli: Cli, dsn: str, key_table: str) -> None:
    r = cli("fence", "set", "payments", "--key", "2", "--to", "40", "--dsn", dsn)
    assert r.code == 0, r.err
    assert "5 -> 40" in r.out
    assert "recorded in fencekit.repairs" in r.out
    st = cli("status", "--dsn", dsn)
    assert "Repairs: 1 (0 lowered)" in st.out
    assert "public.payments key 2 fence 5 -> 40" in st.out
    doc = json.loads(cli("status", "--json", "--dsn", dsn).out)
    assert doc["repairs"]["count"] == 1
    assert doc["repairs"]["lowered"] == 0
    assert "5 -> 40" in doc["repairs"]["last"]


def test_non_admin_is_refused(cli: Cli, dsn: str, key_table: str, make_role: Any) -> None:
    app = make_role("repair_app", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    r = cli("fence", "set", "payments", "--key", "2", "--to", "40", "--dsn", app)
    assert r.code == 1
    assert "may not repair fences" in r.err
    assert "GRANT fencekit_admin" in r.err
    # The SQL function refuses with fencekit's own 42501, before touching anything.
    with psycopg.connect(app) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT fencekit.set_resource_fence('public.payments', '2', 40)")
    assert _fence(dsn, "public.payments", "2") == 5


def test_set_role_to_admin_works_and_admin_cannot_be_borrowed(
    cli: Cli, dsn: str, key_table: str, make_role: Any
) -> None:
    """Judged by the session role: a login that is a member repairs; a definer function
    owned by an admin lends nothing to a non-member."""
    admin = make_role("repair_admin", "fencekit_admin")
    assert cli("fence", "set", "payments", "--key", "2", "--to", "41", "--dsn", admin).code == 0
    assert _one(dsn, "SELECT repaired_by FROM fencekit.repairs") == "repair_admin"
    _sql(
        dsn,
        "CREATE FUNCTION public.lend() RETURNS bigint LANGUAGE sql SECURITY DEFINER "
        "AS $$ SELECT fencekit.set_resource_fence('public.payments', '2', 50) $$",
        "ALTER FUNCTION public.lend() OWNER TO repair_admin",
    )
    app = make_role("repair_app2")
    with psycopg.connect(app) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT public.lend()")
    assert _fence(dsn, "public.payments", "2") == 41


def test_unknown_key_table_and_bad_values(cli: Cli, dsn: str, key_table: str) -> None:
    r = cli("fence", "set", "payments", "--key", "99", "--to", "40", "--dsn", dsn)
    assert r.code == 1
    assert "has no fence: nothing to repair" in r.err
    r = cli("fence", "set", "payments", "--key", "x", "--to", "40", "--dsn", dsn)
    assert r.code == 1
    assert "invalid input syntax for type integer" in r.err
    r = cli("fence", "set", "payments", "--to", "40", "--dsn", dsn)
    assert r.code == 1
    assert "give 1 value(s), not 0" in r.err
    _sql(dsn, "CREATE TABLE plain (id int PRIMARY KEY)")
    r = cli("fence", "set", "plain", "--to", "40", "--dsn", dsn)
    assert r.code == 1
    assert "public.plain is not protected" in r.err
    r = cli("fence", "set", "nosuch", "--to", "40", "--dsn", dsn)
    assert r.code == 1
    assert "table nosuch does not exist" in r.err
    for bad in ("0", "-3", "x", str(BIGINT_MAX + 1)):
        r = cli("fence", "set", "payments", "--key", "2", "--to", bad, "--dsn", dsn)
        assert r.code == 2, (bad, r)
        assert "--to" in r.err, (bad, r)
    r = cli("fence", "set", "payments", "--key", "2", "--dsn", dsn)
    assert r.code == 2
    assert "--to" in r.err
    assert _one(dsn, "SELECT count(*) FROM fencekit.repairs") == 0
    assert _fence(dsn, "public.payments", "2") == 5


def test_composite_key_named_as_the_trigger_names_it(cli: Cli, dsn: str) -> None:
    """The key text comes from SQL under the key triggers' pinned settings: a timestamptz
    written in another zone and DateStyle names the same key."""
    _sql(
        dsn,
        "CREATE TABLE slots (region text NOT NULL, at timestamptz NOT NULL, v int, "
        "PRIMARY KEY (region, at))",
    )
    assert cli("protect", "slots", "--key", "region", "--key", "at", "--dsn", dsn).code == 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'America/New_York'; SET DateStyle = 'SQL, DMY'")
        conn.execute("SELECT set_config('fencekit.token', '7', true)")
        conn.execute("INSERT INTO slots VALUES ('eu', '2024-05-01 12:00+02', 1)")
    r = cli(
        "fence", "set", "slots", "--key", "eu", "--key", "2024-05-01 10:00:00Z", "--to", "9",
        "--dsn", dsn,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert _one(dsn, "SELECT fence FROM fencekit.fences WHERE resource = 'public.slots'") == 9
    assert _one(dsn, "SELECT count(*) FROM fencekit.fences") == 1


def test_table_fence_repair(cli: Cli, dsn: str) -> None:
    _sql(dsn, "CREATE TABLE report (v int)")
    assert cli("protect", "report", "--scope", "table", "--dsn", dsn).code == 0
    _write(dsn, 900, "INSERT INTO report VALUES (1)")
    r = cli("fence", "set", "report", "--key", "1", "--to", "950", "--dsn", dsn)
    assert r.code == 1
    assert "takes no key values" in r.err
    assert cli("fence", "set", "report", "--to", "950", "--dsn", dsn).code == 0
    assert _fence(dsn, "public.report", "") == 950
    with _stale():
        _write(dsn, 920, "INSERT INTO report VALUES (2)")


def test_row_repair_writes_as_the_owner_without_the_bypass(cli: Cli, dsn: str) -> None:
    """No bypassed write (the owner's triggers never run with the bypass on);
    the repair is audited in fencekit.repairs."""
    _sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, v int)")
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    _write(dsn, 5, "INSERT INTO accounts VALUES (1, 0), (2, 0)")
    _write(dsn, BIGINT_MAX, "UPDATE accounts SET v = 1 WHERE id = 1")
    bypassed = "SELECT count FROM fencekit.rejections WHERE table_name = 'accounts' AND reason = %s"
    assert _one(dsn, bypassed, ("bypassed",)) == 0
    r = cli("fence", "set", "accounts", "--key", "1", "--to", "12", "--dsn", dsn)
    assert r.code == 1
    assert "refusing to lower" in r.err
    r = cli("fence", "set", "accounts", "--key", "1", "--to", "12", "--allow-lower", "--dsn", dsn)
    assert r.code == 0, r.err
    assert _one(dsn, "SELECT fencekit_fence FROM accounts WHERE id = 1") == 12
    assert _one(dsn, bypassed, ("bypassed",)) == 0  # no bypass: the row was written as its owner
    assert _one(dsn, "SELECT key FROM fencekit.repairs") == '{"id": "1"}'
    r = cli("fence", "set", "accounts", "--key", "3", "--to", "12", "--dsn", dsn)
    assert r.code == 1
    assert "has no row" in r.err
    # The session's token and bypass setting are what they were after a repair.
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '13', true)")
        conn.execute("SELECT fencekit.set_fence('accounts', '{2}', 20)")
        token, byp = conn.execute(
            "SELECT current_setting('fencekit.token'), current_setting('fencekit.bypass')"
        ).fetchone() or (None, None)
        assert (token, byp) == ("13", "")
    _write(dsn, 13, "UPDATE accounts SET v = 2 WHERE id = 1")  # 13 >= 12: accepted
    with _stale():
        _write(dsn, 19, "UPDATE accounts SET v = 2 WHERE id = 2")


def test_row_repair_needs_a_session_of_the_owner(cli: Cli, dsn: str, make_role: Any) -> None:
    """Membership of fencekit_admin lends no right on the table itself: a row repair writes
    the table, which runs its owner's code, so it runs only in a session logged in as the
    owner; an admin's is refused (42501) with the statement to run as the owner, and the row
    keeps its fence. Granting the admin the owner's role changes nothing (SET ROLE is no
    sandbox: tests/security/test_owner_code_in_admin_sessions.py)."""
    _sql(dsn, "CREATE TABLE accounts (id int PRIMARY KEY, v int)")
    assert cli("protect", "accounts", "--dsn", dsn).code == 0
    _write(dsn, 5, "INSERT INTO accounts VALUES (1, 0)")
    owner = _one(dsn, "SELECT relowner::regrole::text FROM pg_class WHERE relname = 'accounts'")
    admin = make_role("repair_admin_ro", "fencekit_admin", owner)
    r = cli("fence", "set", "accounts", "--key", "1", "--to", "9", "--dsn", admin)
    assert r.code == 1
    assert f"logged in as the owner {owner}" in r.err
    assert "SELECT fencekit.set_fence('public.accounts', '{1}', 9, false, NULL)" in r.err
    assert _one(dsn, "SELECT fencekit_fence FROM accounts") == 5
    assert _one(dsn, "SELECT count(*) FROM fencekit.repairs") == 0


def test_help(cli: Cli) -> None:
    r = cli("fence", "set", "--help")
    assert r.code == 0
    assert "--allow-lower" in r.out
    assert "fencekit.repairs" in r.out
    assert "fencekit_admin" in r.out
