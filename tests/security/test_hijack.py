"""search_path and operator hijacks by a role that owns a schema.

The role creates, in its own schema ``evil``, operators (``=``, ``<>``, ``<``, ``>``, ``<=``,
``>=``, ``~``) on the types fencekit compares, and functions with the names of the catalog and
fencekit functions the checks use; each lies in the attacker's favour and counts its calls in a
sequence (``nextval`` survives the rollback a rejection causes). Then it puts ``evil`` first on
its search_path (before and after the implicit ``pg_catalog``) and writes stale, unfenced and
"bypassed". Every write must still be rejected, no hostile object may ever have run, and a
fresh write must still advance the fence correctly.
"""

from __future__ import annotations

import pytest

from tests.security.conftest import FENCE, STALE, VICTIMS, WRITES, attempt, write_as

_COUNT = "SELECT pg_catalog.nextval('evil.calls') IS NULL"  # always false; counts the call

OPERATORS = {
    # name: result that would let a stale or unfenced write through if the check used it
    "=": "false",
    "<>": "false",
    "<": "true",
    ">": "false",
    "<=": "true",
    ">=": "false",
    "~": "true",
}
TYPES = ["bigint", "text", "varchar", "name"]

FUNCTIONS = [
    # same names as what fencekit's checks call (schema-qualified there: must not matter)
    ("current_setting(text, boolean)", "text", "'99999'"),
    ("current_setting(text)", "text", "'99999'"),
    ("length(text)", "integer", "1"),
    ("lower(text)", "text", "'off'"),
    ("pg_has_role(name, text, text)", "boolean", "true"),
    ("pg_has_role(text, text)", "boolean", "true"),
    ("to_jsonb(anyelement)", "jsonb", "'{}'::pg_catalog.jsonb"),
    ("bypass_allowed(text, oid, text)", "boolean", "true"),
    ("rejected_row(text, text, oid, text, text, jsonb, bigint, bigint)", "boolean", "true"),
    ("unfenced_row(text, text, oid, text, boolean)", "boolean", "true"),
    (
        "reject(text, text, oid, text, text, text, jsonb, bigint, bigint, text)",
        "boolean",
        "true",
    ),
    ("count_event(text, text, bigint)", "void", "NULL::void"),
    ("token_text()", "text", "'99999'"),
    ("max_fence(text)", "bigint", "0"),
    ("current_fence(text, text)", "bigint", "0"),
    ("lease_token(text)", "bigint", "NULL::bigint"),
]


def _install_evil(conn) -> None:
    conn.execute("CREATE SEQUENCE evil.calls")
    for op, lie in OPERATORS.items():
        for typ in TYPES:
            fn = f"evil.op_{abs(hash((op, typ))) % 10**8}"
            conn.execute(
                f"CREATE FUNCTION {fn}(a {typ}, b {typ}) RETURNS boolean LANGUAGE sql "
                f"AS $$ {_COUNT}; SELECT {lie} $$"
            )
            conn.execute(
                f"CREATE OPERATOR evil.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, FUNCTION = {fn})"
            )
    for signature, returns, lie in FUNCTIONS:
        conn.execute(
            f"CREATE FUNCTION evil.{signature} RETURNS {returns} LANGUAGE sql "
            f"AS $$ {_COUNT}; SELECT {lie} $$"
        )
    # Tables named like fencekit's own, for any unqualified reference.
    conn.execute("CREATE TABLE evil.fences (resource text, key text, fence bigint)")
    conn.execute("CREATE TABLE evil.leases (resource text, holder text, token bigint)")
    conn.commit()


def _calls(conn) -> tuple[int, bool]:
    row = conn.execute("SELECT last_value, is_called FROM evil.calls").fetchone()
    conn.rollback()
    return row


@pytest.fixture
def evil(victim, make_role):
    import psycopg

    from tests.security.conftest import DML

    dsn = make_role("sec_hijacker", DML, "fencekit_writer")
    victim.execute("CREATE SCHEMA evil AUTHORIZATION sec_hijacker")
    victim.commit()
    with psycopg.connect(dsn) as conn:
        _install_evil(conn)
        yield conn


@pytest.mark.parametrize(
    "path",
    [
        "evil, pg_catalog, public",  # before pg_catalog: every unqualified name is evil's
        "evil, public",  # pg_catalog implicitly first: exact-type matches still win
        "pg_temp, evil, pg_catalog, public",
    ],
)
@pytest.mark.parametrize("table", sorted(VICTIMS))
def test_hostile_search_path_changes_nothing(evil, victim, unchanged, path, table) -> None:
    evil.execute(f"SET search_path = {path}")
    evil.commit()
    # The hostile objects are live in this session: unqualified names reach them (an exact
    # type match wins even when pg_catalog is searched first).
    assert evil.execute("SELECT 'a'::varchar = 'a'::varchar").fetchone() == (False,)
    if path.startswith("evil, pg_catalog"):
        got = evil.execute("SELECT current_setting('fencekit.token', true)").fetchone()
        assert got == ("99999",)
    evil.rollback()
    evil.execute("SELECT setval('evil.calls', 1, false)")
    evil.commit()

    stmt = WRITES[table]
    attempt(evil, "YF001", stmt, token=STALE)
    attempt(evil, "YF003", stmt)
    attempt(evil, "YF005", stmt, token=STALE, bypass=True)
    attempt(evil, "YF004", f"SELECT set_config('fencekit.token', '0x10', true); {stmt}")
    attempt(evil, "YF001", f"DELETE FROM {table}", token=STALE)
    assert _calls(evil) == (1, False), "a hostile operator or function ran inside fencekit"
    unchanged()

    # Legitimate writes still work and still advance the fence, under the same search_path.
    write_as(evil, FENCE + 1, stmt)
    attempt(evil, "YF001", stmt, token=FENCE)
    assert _calls(evil) == (1, False)
    fence = {
        "acct": "SELECT fencekit_fence FROM acct WHERE id = 1",
        "items": "SELECT fencekit.current_fence('public.items', '1')",
        "ledger": "SELECT fencekit.current_fence('public.ledger', '')",
    }[table]
    assert victim.execute(fence).fetchone() == (FENCE + 1,)
    victim.rollback()


def test_hostile_search_path_cannot_fool_the_lease_functions(evil, victim) -> None:
    evil.execute("SET search_path = evil, pg_catalog, public")
    evil.execute("SELECT setval('evil.calls', 1, false)")
    evil.commit()
    # The legit holder's lease is live: a hijacked comparison must not hand it over.
    got = evil.execute("SELECT fencekit.acquire('billing:1', 'thief', '1 hour')").fetchone()
    evil.commit()
    assert got == (None,)
    assert evil.execute("SELECT fencekit.renew('billing:1', 'thief', 1, '1 hour')").fetchone() == (
        False,
    )
    evil.commit()
    assert _calls(evil) == (1, False)
    holder = victim.execute("SELECT holder FROM fencekit.leases WHERE resource = 'billing:1'")
    assert holder.fetchone() == ("legit-holder",)
    victim.rollback()
