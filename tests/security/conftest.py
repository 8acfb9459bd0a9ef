"""Adversarial fixtures: protected tables with known fences, and two hostile roles.

- ``dml``: an application role with only SELECT/INSERT/UPDATE/DELETE on public's tables.
- ``schema_owner``: the same rights, plus it owns a schema of its own (``evil``) where it may
  create tables, functions and operators, and put that schema first on its search_path.

Every attack is checked twice: it fails with the expected SQLSTATE, and a snapshot of
everything that matters (protected rows and their fences, fencekit's tables, triggers and their
enabled state, fencekit's functions and their settings, role memberships) is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

Conn = psycopg.Connection[Any]

DML = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"
FENCE = 10  # every protected table starts with this fence
STALE = 5

# Row fence, key fence, table fence: every scope gets the same attacks.
VICTIMS = {
    "acct": FenceSpec(TableName("public", "acct")),
    "items": FenceSpec(TableName("public", "items"), scope=Scope.KEY, key=("account_id",)),
    "ledger": FenceSpec(TableName("public", "ledger"), scope=Scope.TABLE),
}
# A write per table that touches existing rows (int columns only: the hijack tests define
# hostile operators on bigint and text, and these statements must not use them themselves).
WRITES = {
    "acct": "UPDATE acct SET balance = balance + 1 WHERE id = 1",
    "items": "UPDATE items SET qty = qty + 1 WHERE id = 1",
    "ledger": "UPDATE ledger SET amount = amount + 1 WHERE id = 1",
}

SNAPSHOT = {
    "acct": "SELECT * FROM public.acct ORDER BY id",
    "items": "SELECT * FROM public.items ORDER BY id",
    "ledger": "SELECT * FROM public.ledger ORDER BY id",
    "fences": "SELECT resource, key, fence FROM fencekit.fences ORDER BY 1, 2",
    "leases": "SELECT resource, holder, token FROM fencekit.leases ORDER BY 1",
    "protected": "SELECT schema_name, table_name, tag, spec::text FROM fencekit.protected "
    "ORDER BY 1, 2",
    "resources": "SELECT * FROM fencekit.resources ORDER BY 1",
    "meta": "SELECT * FROM fencekit.meta ORDER BY 1",
    "triggers": "SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger "
    "WHERE NOT tgisinternal ORDER BY 1, 2",
    "functions": "SELECT proname, md5(prosrc), proconfig, prosecdef, proowner::regrole::text "
    "FROM pg_proc WHERE pronamespace = 'fencekit'::regnamespace ORDER BY 1, 2",
    "relations": "SELECT relname, relkind, relowner::regrole::text, relacl::text FROM pg_class "
    "WHERE relnamespace = 'fencekit'::regnamespace ORDER BY 1",
    "columns": "SELECT attrelid::regclass::text, attname, atttypid FROM pg_attribute "
    "WHERE attrelid IN ('public.acct'::regclass, 'public.items'::regclass, "
    "'public.ledger'::regclass) AND attnum > 0 AND NOT attisdropped ORDER BY 1, 2",
    "admins": "SELECT member::regrole::text FROM pg_auth_members "
    "WHERE roleid = 'fencekit_admin'::regrole ORDER BY 1",
    "superusers": "SELECT rolname FROM pg_roles WHERE rolsuper ORDER BY 1",
    "rules": "SELECT tablename, rulename FROM pg_rules WHERE schemaname = 'public' ORDER BY 1",
    "policies": "SELECT tablename, policyname FROM pg_policies ORDER BY 1",
    "role_settings": "SELECT setrole::regrole::text, setconfig FROM pg_db_role_setting ORDER BY 1",
}


def snapshot(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    conn.rollback()
    out = {name: conn.execute(q).fetchall() for name, q in SNAPSHOT.items()}
    conn.rollback()
    return out


def write_as(conn: Conn, token: int | None, stmt: str, *, bypass: bool = False) -> None:
    conn.rollback()
    if token is not None:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    if bypass:
        conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
    conn.execute(stmt)
    conn.commit()


def attempt(
    conn: Conn,
    sqlstate: str | Sequence[str],
    stmt: str,
    *,
    token: int | None = None,
    bypass: bool = False,
) -> psycopg.Error:
    """Run ``stmt`` (under ``token``/bypass) in a transaction: it must fail with ``sqlstate``."""
    wanted = (sqlstate,) if isinstance(sqlstate, str) else tuple(sqlstate)
    conn.rollback()
    if token is not None:
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    if bypass:
        conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
    with pytest.raises(psycopg.Error) as info:  # noqa: PT012  # the failure may come at COMMIT
        conn.execute(stmt)
        conn.commit()
    conn.rollback()
    err = info.value
    assert err.sqlstate in wanted, f"{stmt!r}: expected {wanted}, got {err.sqlstate}: {err}"
    return err


@pytest.fixture
def victim(db: Conn) -> Conn:
    """Three protected tables (row, key, table fence), each written under token 10."""
    db.execute(
        "CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL);"
        "CREATE TABLE items (id int PRIMARY KEY, account_id int NOT NULL, qty int NOT NULL);"
        "CREATE TABLE ledger (id int PRIMARY KEY, amount int NOT NULL);"
    )
    for spec in VICTIMS.values():
        for stmt in protect_statements(spec):
            db.execute(stmt.encode())
    db.commit()
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute("INSERT INTO acct VALUES (1, 100), (2, 200)")
    db.execute("INSERT INTO items VALUES (1, 1, 5), (2, 2, 7)")
    db.execute("INSERT INTO ledger VALUES (1, 50)")
    db.execute("SELECT fencekit.acquire('billing:1', 'legit-holder', '1 hour')")
    db.commit()
    return db


@pytest.fixture(params=["dml", "schema_owner"])
def attacker(request: pytest.FixtureRequest, victim: Conn, make_role: Any) -> Iterator[Conn]:
    """A connection as a hostile role (autocommit off); see the module docstring."""
    name = f"sec_{request.param}"
    # A writer: DML and fencekit_writer, as a real application role would have.
    dsn = make_role(name, DML, "fencekit_writer")
    if request.param == "schema_owner":
        victim.execute(f"CREATE SCHEMA evil AUTHORIZATION {name}")
        victim.commit()
    with psycopg.connect(dsn) as conn:
        yield conn


@pytest.fixture
def unchanged(victim: Conn) -> Callable[[], None]:
    """Call it at the end of an attack: everything that matters is as it was before."""
    before = snapshot(victim)

    def check() -> None:
        after = snapshot(victim)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert not changed, f"the attack changed: {changed}"

    return check


# ---------------------------------------------------------------- attack helpers
#
# The modules test_key_identity, test_token_mid_statement, test_borrowed_bypass, test_children,
# test_definer_callers, test_grants and test_own_tables share what follows. Their attacks run
# many cases per database (one database per test keeps the suite fast), record every case that
# went wrong in a ``Findings`` and fail once at the end with the whole list, each line naming
# the scope, write path, role and token or setting that failed.

APP = "sec_app"  # the application role of the attack modules: DML only, no fencekit grant
FRESH = 20  # a token newer than FENCE


def protect(conn: Conn, spec: FenceSpec) -> None:
    """Run the generated protect statements on ``conn`` (no commit)."""
    for stmt in protect_statements(spec):
        conn.execute(stmt.encode())


def without_keys_guard(table: str) -> str:
    """SQL: drop the key fence's trigger whose ``UPDATE OF`` list makes PostgreSQL refuse to
    retype a key column of ``table`` (its owner may): what the checks behind it hold against."""
    return (
        "DO $$DECLARE g name; BEGIN SELECT tgname INTO STRICT g FROM pg_catalog.pg_trigger"
        f" WHERE tgrelid = '{table}'::regclass AND tgname LIKE 'fencekit\\_%\\_keys';"
        f" EXECUTE format('DROP TRIGGER %I ON {table}', g); END$$"
    )


def counts(conn: Conn, table: str, schema: str = "public") -> dict[str, int]:
    """``fencekit.rejections`` for one table: reason -> count (sequences: survive rollbacks)."""
    rows = conn.execute(
        "SELECT reason, count FROM fencekit.rejections WHERE schema_name = %s AND table_name = %s",
        (schema, table),
    ).fetchall()
    return {reason: int(n) for reason, n in rows}


def gauges(conn: Conn, table: str, schema: str = "public") -> tuple[Any, Any]:
    """(last_rejected_at, max_token_gap) of one table."""
    row = conn.execute(
        "SELECT max(last_rejected_at), max(max_token_gap) FROM fencekit.rejections "
        "WHERE schema_name = %s AND table_name = %s",
        (schema, table),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def fences(conn: Conn, resource: str) -> dict[str, int]:
    """Key and table fences of a resource (read as superuser): key -> fence."""
    rows = conn.execute(
        "SELECT key, fence FROM fencekit.fences WHERE resource = %s", (resource,)
    ).fetchall()
    return {k: int(f) for k, f in rows}


@dataclass(frozen=True)
class Outcome:
    """What one statement did: ``sqlstate`` None means it succeeded."""

    sqlstate: str | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.sqlstate is None

    def __str__(self) -> str:
        if self.sqlstate is None:
            return "success"
        return f"{self.sqlstate} ({self.message.splitlines()[0] if self.message else ''})"


def outcome(
    conn: Conn,
    stmt: str,
    *,
    token: int | str | None = None,
    role: str | None = None,
    bypass: bool = False,
    settings: dict[str, str] | None = None,
    copy_rows: Sequence[str] = (),
) -> Outcome:
    """Run ``stmt`` in a fresh transaction and say how it ended.

    ``role``: ``SET LOCAL ROLE`` first (the connection must be allowed to: a superuser's). The
    statement then runs with exactly that role's rights, and the caller can ``RESET ROLE`` in
    the same transaction to inspect what it did. ``settings`` are set transaction-locally
    before the token. ``copy_rows`` feeds a ``COPY ... FROM STDIN`` (lines without newline).

    On success the transaction is left OPEN (inspect, then roll back or commit); on failure it
    is rolled back and the SQLSTATE returned.
    """
    conn.rollback()
    try:
        if role is not None:
            conn.execute(f'SET LOCAL ROLE "{role}"')
        for name, value in (settings or {}).items():
            conn.execute("SELECT set_config(%s, %s, true)", (name, value))
        if token is not None:
            conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
        if bypass:
            conn.execute("SELECT set_config('fencekit.bypass', 'on', true)")
        if copy_rows:
            with conn.cursor().copy(stmt) as copy:
                for line in copy_rows:
                    copy.write(line + "\n")
        else:
            conn.execute(stmt)
    except psycopg.Error as exc:
        conn.rollback()
        return Outcome(exc.sqlstate or "?????", str(exc))
    return Outcome(None)


def copy_text(value: str) -> str:
    """``value`` escaped for one field of COPY's text format."""
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


class Findings:
    """Collects what went wrong across many cases; ``assert_clean()`` fails with all of them."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.cases = 0

    def check(self, label: str, ok: bool, problem: str = "") -> bool:
        self.cases += 1
        if not ok:
            self.failures.append(f"{label}: {problem}")
        return ok

    def expect(self, label: str, got: Outcome, wanted: str | Sequence[str] | None) -> bool:
        """``wanted``: a SQLSTATE, several, or None for success."""
        if wanted is None:
            return self.check(label, got.ok, f"expected success, got {got}")
        codes = (wanted,) if isinstance(wanted, str) else tuple(wanted)
        return self.check(label, got.sqlstate in codes, f"expected {'/'.join(codes)}, got {got}")

    def assert_clean(self) -> None:
        if self.failures:
            shown = "\n  ".join(self.failures[:200])
            extra = len(self.failures) - 200
            more = f"\n  ... and {extra} more" if extra > 0 else ""
            raise AssertionError(
                f"{len(self.failures)} of {self.cases} checks failed:\n  {shown}{more}"
            )


@pytest.fixture
def findings() -> Findings:
    return Findings()
