"""The attack matrix, lease side: a claim makes every check a write makes; a lease is its
holder's application's alone.

For each check a write makes (stale token, malformed token, token
of another issuer, no write privilege, lease-bound fence without the live lease) and each role
(app, owner, admin), the same token is presented once as a write and once as
``fencekit.claim``: both must end with the same SQLSTATE. Then, for a lease held by one
application role, a second application role (and the owner, and an admin) cannot take, renew or
release it by sending the first one's holder name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from fencekit.embedded import EmbeddedServer
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security._matrix import MatrixDB, grant_tables, matrix_database
from tests.security.conftest import Outcome, outcome, protect

FENCE = 10
BIGINT_MAX = 9223372036854775807
READER = "mxl_reader"  # may read the tables, not write them


@dataclass(frozen=True)
class Check:
    """A write check: the table, the token, the session settings, and what both must give."""

    name: str
    table: str
    token: int
    sqlstate: str
    settings: tuple[tuple[str, str], ...] = ()
    issuer: str | None = None  # claim's issuer argument
    reader: bool = False  # run as the role that may only read the table


CHECKS = [
    Check("stale", "c_key", 5, "YF001"),
    Check("stale-table", "c_table", 5, "YF001"),
    Check("malformed", "c_key", 0, "YF004"),
    Check("issuer", "c_issuer", 50, "YF007", (("fencekit.issuer", "zookeeper"),), "zookeeper"),
    Check("privilege", "c_key", 50, "42501", reader=True),
    Check("lease-bound", "c_lease", BIGINT_MAX, "YF006"),
    Check("lease-bound-table", "c_lease_table", BIGINT_MAX, "YF006"),
]


def _build(m: MatrixDB) -> None:
    conn = m.conn
    conn.execute(f'SET ROLE "{m.role("owner")}"')
    for table in ("c_key", "c_table", "c_issuer", "c_lease", "c_lease_table", "c_equal"):
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, k int NOT NULL, v int)")
    conn.execute("RESET ROLE")

    def t(name: str) -> TableName:
        return TableName("public", name)

    protect(conn, FenceSpec(t("c_key"), scope=Scope.KEY, key=("k",)))
    protect(conn, FenceSpec(t("c_table"), scope=Scope.TABLE))
    protect(conn, FenceSpec(t("c_issuer"), scope=Scope.KEY, key=("k",), issuer="etcd"))
    protect(conn, FenceSpec(t("c_lease"), scope=Scope.KEY, key=("k",), lease_bound=True))
    protect(conn, FenceSpec(t("c_lease_table"), scope=Scope.TABLE, lease_bound=True))
    protect(conn, FenceSpec(t("c_equal"), scope=Scope.KEY, key=("k",), on_equal="reject"))
    grant_tables(m)
    conn.execute(f'DROP ROLE IF EXISTS "{READER}"')
    conn.execute(f'CREATE ROLE "{READER}"')
    conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{READER}"')
    conn.commit()
    # A live lease on the lease-bound resources, held by someone else (a token far below max).
    for table in ("c_lease", "c_lease_table"):
        conn.execute(
            "SELECT fencekit.acquire(fencekit.lease_resource(p.resource, %s), 'legit', "
            "'1 hour') FROM fencekit.protected p WHERE p.table_name = %s",
            ("1" if table == "c_lease" else "", table),
        )
    conn.commit()
    for table in ("c_key", "c_table", "c_issuer", "c_equal"):
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
        conn.execute(f"INSERT INTO {table} VALUES (1, 1, 0)")
        conn.commit()


@pytest.fixture(scope="module")
def mx(pg_server: EmbeddedServer) -> Iterator[MatrixDB]:
    with matrix_database(pg_server, "mxl", writers=("app2",)) as m:
        try:
            _build(m)
            yield m
        finally:
            m.conn.rollback()
            m.conn.execute(f'DROP OWNED BY "{READER}"')
            m.conn.execute(f'DROP ROLE IF EXISTS "{READER}"')
            m.conn.commit()


@pytest.mark.parametrize(
    ("check", "role"),
    [pytest.param(c, r, id=f"{c.name}-{r}") for c in CHECKS for r in ("app", "owner", "admin")],
)
def test_a_claim_makes_every_check_a_write_makes(mx: MatrixDB, check: Check, role: str) -> None:
    who = READER if check.reader else mx.role(role)
    keys = "ARRAY[]::text[]" if check.table.endswith("table") else "ARRAY['1']"
    write_stmt = (
        f"INSERT INTO {check.table} (id, k, v) VALUES (2, 1, 0)"
        if not check.table.endswith("table")
        else f"UPDATE {check.table} SET v = 1"
    )
    settings = dict(check.settings)
    write = outcome(mx.conn, write_stmt, token=check.token, role=who, settings=settings)
    mx.conn.rollback()
    issuer = f", issuer => '{check.issuer}'" if check.issuer else ""
    claim = outcome(
        mx.conn,
        f"SELECT fencekit.claim('{check.table}'::regclass, {keys}, {check.token}{issuer})",
        role=who,
    )
    mx.conn.rollback()
    assert write.sqlstate == check.sqlstate, f"the write: {write}"
    assert claim.sqlstate == check.sqlstate, f"the claim (the write gave {write}): {claim}"


@pytest.mark.parametrize(("role", "key"), [("app", 11), ("owner", 12), ("admin", 13)])
def test_a_claim_at_grant_and_on_equal_reject_work_together(
    mx: MatrixDB, role: str, key: int
) -> None:
    """Either the claim is refused with the reason, or the holder's first write under the
    claimed token (in its own transaction, as a worker's would be) is accepted: never a claim
    that locks its own holder out (YF002). Each role claims its own key: a claim commits."""
    claim = outcome(
        mx.conn,
        f"SELECT fencekit.claim('c_equal'::regclass, ARRAY['{key}'], 60)",
        role=mx.role(role),
    )
    mx.conn.commit()
    write = Outcome(None)
    if claim.ok:
        write = outcome(
            mx.conn,
            f"INSERT INTO c_equal (id, k, v) VALUES ({key}, {key}, 0)",
            token=60,
            role=mx.role(role),
        )
        mx.conn.rollback()
    assert not claim.ok or write.ok, f"claim {claim}, then the holder's first write: {write}"


def outcome_in(conn: Any, stmt: str) -> Outcome:
    """Run ``stmt`` inside the open transaction, behind a savepoint."""
    conn.execute("SAVEPOINT s")
    try:
        conn.execute(stmt)
    except psycopg.Error as exc:
        conn.execute("ROLLBACK TO SAVEPOINT s")
        return Outcome(exc.sqlstate or "?????", str(exc))
    return Outcome(None)


LEASE_OPS = {
    "acquire": "SELECT fencekit.acquire('mx:lease', 'app-holder', '1 minute')",
    "renew": "SELECT fencekit.renew('mx:lease', 'app-holder', {token}, '1 minute')",
    "release": "SELECT fencekit.release('mx:lease', 'app-holder', {token})",
}


@pytest.fixture(scope="module")
def held(mx: MatrixDB) -> int:
    """A live lease the app role holds as 'app-holder'; its token."""
    conn = mx.conn
    conn.rollback()
    conn.execute(f'SET ROLE "{mx.role("app")}"')
    row = conn.execute("SELECT fencekit.acquire('mx:lease', 'app-holder', '1 hour')").fetchone()
    conn.execute("RESET ROLE")
    conn.commit()
    assert row is not None
    assert row[0] is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("op", "role"),
    [
        pytest.param(op, r, id=f"{op}-{r}")
        for op in LEASE_OPS
        # An admin may take over a lease (it repairs fences too): not another application.
        for r in ("app2", "owner")
    ],
)
def test_another_application_cannot_take_renew_or_release_a_lease(
    mx: MatrixDB, held: int, op: str, role: str
) -> None:
    """Refused (an error) or a no-op (acquire: NULL, renew/release: false) that leaves the
    app's lease as it was."""
    conn = mx.conn
    conn.rollback()
    problem = ""
    try:
        conn.execute(f'SET LOCAL ROLE "{mx.role(role)}"')
        result = outcome_in(conn, LEASE_OPS[op].format(token=held))
        if result.ok:
            value = conn.execute("SELECT 1").fetchone()  # the call's own result is read below
            assert value is not None
        conn.execute("RESET ROLE")
        lease = conn.execute(
            "SELECT holder, token, released_at IS NULL AND expires_at > clock_timestamp() + "
            "interval '10 minutes' FROM fencekit.leases WHERE resource = 'mx:lease'"
        ).fetchone()
        if lease != ("app-holder", held, True):
            problem = f"the lease is now {lease}"
        elif result.ok and op == "renew":
            renewed = conn.execute(
                "SELECT expires_at < clock_timestamp() + interval '2 minutes' "
                "FROM fencekit.leases WHERE resource = 'mx:lease'"
            ).fetchone()
            if renewed != (False,):
                problem = "renewed"
    finally:
        conn.rollback()
    assert not problem, f"{role} sent the app's holder name to {op}: {problem}"
