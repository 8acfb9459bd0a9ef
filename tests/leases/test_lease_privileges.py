"""Who may take leases from fencekit's built-in issuer: members of fencekit_writer only.

fencekit.acquire / renew / release are executable by PUBLIC but refuse any session whose role
(the SET ROLE role, else the login role) is not a member of fencekit_writer, with SQLSTATE
YF000, before they take any lock. fencekit.lease_token (which takes a FOR SHARE lock that
acquire waits on) is executable by fencekit_admin only. The lock tests fail against the
previous install, where an outsider's acquire or lease_token held the lease row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg import errors

from fencekit.errors import FenceUsageError, LeaseMismatchError, translate
from fencekit.leases import AsyncPostgresIssuer, Lease, PostgresIssuer
from fencekit.psycopg import transaction
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

ACQUIRE = "SELECT fencekit.acquire(%s, %s, %s::interval)"
RENEW = "SELECT fencekit.renew(%s, %s, %s, %s::interval)"
RELEASE = "SELECT fencekit.release(%s, %s, %s)"
DML = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"


def q(conn: psycopg.Connection[Any], query: str, *params: object) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


def assert_refused(exc: psycopg.Error, role: str) -> None:
    """fencekit's own refusal: YF000, naming the role and the missing grant."""
    assert exc.sqlstate == "YF000", exc
    assert f"role {role} " in (exc.diag.message_primary or ""), exc.diag.message_primary
    assert "fencekit_writer" in (exc.diag.message_primary or "")
    assert exc.diag.message_hint == f"GRANT fencekit_writer TO {role};"


@pytest.fixture
def owner(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def outsider(make_role) -> str:
    return str(make_role("lease_outsider"))


@pytest.fixture
def writer(make_role) -> str:
    return str(make_role("lease_writer", "fencekit_writer"))


# ------------------------------------------------------------------ SQL


def test_outsider_is_refused_by_acquire_renew_and_release(owner, outsider) -> None:
    token = q(owner, ACQUIRE, "r", "owner", "30 s")
    with psycopg.connect(outsider, autocommit=True) as out:
        for stmt, params in (
            (ACQUIRE, ("r", "intruder", "30 s")),
            (ACQUIRE, ("fresh", "intruder", "30 s")),  # a resource nobody ever held
            (RENEW, ("r", "owner", token, "30 s")),
            (RELEASE, ("r", "owner", token)),
        ):
            with pytest.raises(psycopg.Error) as info:
                out.execute(stmt, params)
            assert_refused(info.value, "lease_outsider")
        # Before the argument checks too: bad input is not how an outsider learns anything.
        with pytest.raises(psycopg.Error) as info:
            out.execute(ACQUIRE, ("", "", "0 s"))
        assert_refused(info.value, "lease_outsider")
    # Nothing changed: the owner still holds its lease, no row was created.
    assert q(owner, "SELECT holder FROM fencekit.leases_current WHERE resource = 'r'") == "owner"
    assert q(owner, "SELECT count(*) FROM fencekit.leases WHERE resource = 'fresh'") == 0
    assert q(owner, RENEW, "r", "owner", token, "30 s") is True


def test_refusal_detail_is_one_line_json(outsider) -> None:
    with psycopg.connect(outsider, autocommit=True) as out, pytest.raises(psycopg.Error) as info:
        out.execute(ACQUIRE, ("billing:42", "h", "30 s"))
    error = translate(info.value)
    assert isinstance(error, FenceUsageError)
    assert error.detail["role"] == "lease_outsider"
    assert error.detail["missing_grant"] == "fencekit_writer"
    assert error.resource == "billing:42"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("acquire-expired", "YF000"),  # a row that exists: the FOR UPDATE path
        ("acquire-new", "YF000"),  # no row yet: the INSERT path
        ("renew", "YF000"),
        ("release", "YF000"),
        ("lease_token", "42501"),  # FOR SHARE
    ],
)
def test_outsider_in_an_open_transaction_holds_no_lease_row(
    owner, outsider, writer, call: str, expected: str
) -> None:
    """While an outsider's transaction that called a lease function stays open, a member's
    acquire on the same resource does not wait for it. Against the previous install each
    call here succeeded (or returned false) holding the lease row, and the member timed out."""
    res = f"r-{call}"
    token = q(owner, ACQUIRE, res, "owner", "50 ms" if call == "acquire-expired" else "30 s")
    if call == "acquire-new":
        res = "r-new"
    time.sleep(0.1)
    stmt, params = {
        "acquire-expired": (ACQUIRE, (res, "intruder", "30 s")),
        "acquire-new": (ACQUIRE, (res, "intruder", "30 s")),
        "renew": (RENEW, (res, "owner", token, "30 s")),
        "release": (RELEASE, (res, "owner", token)),
        "lease_token": ("SELECT fencekit.lease_token(%s)", (res,)),
    }[call]
    with psycopg.connect(outsider) as out, psycopg.connect(writer, autocommit=True) as member:
        refused: psycopg.Error | None = None
        try:
            out.execute(stmt, params)
        except psycopg.Error as exc:
            refused = exc
        assert out.info.transaction_status != psycopg.pq.TransactionStatus.IDLE  # still open
        member.execute("SET lock_timeout = '200ms'")
        # LockNotAvailable here if the outsider's open transaction held the lease row.
        got = q(member, ACQUIRE, res, "member", "30 s")
        assert (got is None) == (call in ("renew", "release", "lease_token"))  # owner holds it
        out.rollback()
    assert refused is not None, f"{call} by an outsider was not refused"
    assert refused.sqlstate == expected, refused


def test_members_acquire_renew_and_release_as_before(writer, make_role) -> None:
    admin = make_role("lease_admin_member", "fencekit_admin")  # admin is granted fencekit_writer
    for dsn, who in ((writer, "w"), (admin, "a")):
        with psycopg.connect(dsn, autocommit=True) as c:
            token = q(c, ACQUIRE, f"r-{who}", who, "30 s")
            assert token is not None
            assert q(c, ACQUIRE, f"r-{who}", "other", "30 s") is None
            assert q(c, RENEW, f"r-{who}", who, token, "30 s") is True
            assert q(c, RELEASE, f"r-{who}", who, token) is True
            assert q(c, ACQUIRE, f"r-{who}", "other", "30 s") > token


def test_the_session_role_is_judged_not_the_login_or_current_user(owner, outsider, make_role):
    # A member that SET ROLEs to an outsider is an outsider; so is a superuser.
    switcher = make_role("lease_switcher", "fencekit_writer", "lease_outsider")
    with psycopg.connect(switcher, autocommit=True) as c:
        assert q(c, ACQUIRE, "r", "s", "30 s") is not None
        c.execute("SET ROLE lease_outsider")
        with pytest.raises(psycopg.Error) as info:
            c.execute(ACQUIRE, ("r2", "s", "30 s"))
        assert_refused(info.value, "lease_outsider")
    owner.execute("SET ROLE lease_outsider")
    with pytest.raises(psycopg.Error) as info:
        owner.execute(ACQUIRE, ("r3", "s", "30 s"))
    assert_refused(info.value, "lease_outsider")
    owner.execute("RESET ROLE")
    # A SECURITY DEFINER function owned by a superuser lends nothing.
    owner.execute(
        "CREATE FUNCTION public.take(r text) RETURNS bigint LANGUAGE sql SECURITY DEFINER "
        "SET search_path = pg_catalog AS $$ SELECT fencekit.acquire(r, 'lent', '30 s') $$"
    )
    with psycopg.connect(outsider, autocommit=True) as out, pytest.raises(psycopg.Error) as info:
        out.execute("SELECT public.take('r4')")
    assert_refused(info.value, "lease_outsider")


def test_lease_token_is_for_fencekit_admin_only(owner, outsider, writer, make_role) -> None:
    token = q(owner, ACQUIRE, "r", "owner", "30 s")
    for dsn in (outsider, writer):
        with (
            psycopg.connect(dsn, autocommit=True) as c,
            pytest.raises(errors.InsufficientPrivilege),
        ):
            c.execute("SELECT fencekit.lease_token('r')")
    admin = make_role("lease_token_admin", "fencekit_admin")
    with psycopg.connect(admin, autocommit=True) as c:
        assert q(c, "SELECT fencekit.lease_token('r')") == token
    public_grants = q(
        owner,
        "SELECT count(*) FROM pg_proc AS p, aclexplode(p.proacl) AS a "
        "WHERE p.oid = 'fencekit.lease_token(text)'::regprocedure AND a.grantee = 0",
    )
    assert public_grants == 0


def test_reinstall_revokes_lease_token_from_public(owner, outsider) -> None:
    """An older install granted lease_token to PUBLIC; re-running the install takes it back."""
    from fencekit.sqlgen import render_install

    owner.execute("GRANT EXECUTE ON FUNCTION fencekit.lease_token(text) TO PUBLIC")
    with psycopg.connect(outsider, autocommit=True) as out:
        out.execute("SELECT fencekit.lease_token('r')")  # the old state: allowed
    owner.execute(render_install().encode())
    with (
        psycopg.connect(outsider, autocommit=True) as out,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        out.execute("SELECT fencekit.lease_token('r')")


def test_lease_bound_writes_of_a_plain_writer_still_check_the_lease(owner, make_role) -> None:
    """lease_mismatch reaches lease_token as its owner: a writer that is not fencekit_admin
    writes under its live lease token and is refused with another token."""
    owner.execute("CREATE TABLE billing (account_id int PRIMARY KEY, total int)")
    spec = FenceSpec(
        TableName("public", "billing"),
        scope=Scope.KEY,
        key=("account_id",),
        resource="billing",
        lease_bound=True,
    )
    for stmt in protect_statements(spec):
        owner.execute(stmt.encode())
    app = make_role("lease_bound_app", DML, "fencekit_writer")
    with PostgresIssuer(app) as issuer:
        grant = issuer.try_acquire("billing:42", "app", 30)
        assert grant is not None
    with psycopg.connect(app, autocommit=True) as conn:
        with transaction(conn, grant.token):
            conn.execute("INSERT INTO billing VALUES (42, 1)")
        with pytest.raises(LeaseMismatchError), transaction(conn, grant.token):
            conn.execute("INSERT INTO billing VALUES (43, 1)")  # nobody holds billing:43
    assert q(owner, "SELECT total FROM billing WHERE account_id = 42") == 1


# ------------------------------------------------------------------ Python


def test_issuer_raises_a_usage_error_naming_the_grant(outsider) -> None:
    with PostgresIssuer(outsider) as issuer:
        with pytest.raises(FenceUsageError) as info:
            issuer.try_acquire("billing:42", "h", 30)
        text = str(info.value)
        assert "lease_outsider" in text
        assert "GRANT fencekit_writer TO lease_outsider;" in text
        assert info.value.sqlstate == "YF000"
        assert isinstance(info.value, psycopg.Error)  # psycopg raises fencekit's class itself
        # The connection stays usable (autocommit): the next call is refused the same way.
        with pytest.raises(FenceUsageError):
            issuer.release_checked(_grant("billing:42"))


def _grant(resource: str):
    from fencekit.leases import Grant

    return Grant(resource, "h", 1, 30.0, "postgres")


def test_lease_fails_at_once_instead_of_waiting(outsider) -> None:
    with PostgresIssuer(outsider) as issuer:
        lease = Lease(issuer, "billing:42", ttl=30, wait=10)
        started = time.monotonic()
        refused = "GRANT fencekit_writer TO lease_outsider"
        with pytest.raises(FenceUsageError, match=refused) as info:
            lease.acquire()
        assert time.monotonic() - started < 5  # no retrying for the whole wait
        # psycopg raised fencekit's class itself: re-raised as is, never chained to itself.
        assert info.value.__cause__ is not info.value


def test_async_issuer_raises_the_same_error(outsider) -> None:
    async def run() -> None:
        async with AsyncPostgresIssuer(outsider) as issuer:
            with pytest.raises(FenceUsageError, match="GRANT fencekit_writer TO lease_outsider"):
                await issuer.try_acquire("billing:42", "h", 30)

    asyncio.run(run())


def test_revoked_grant_loses_the_lease_with_the_reason(owner, writer) -> None:
    with PostgresIssuer(writer) as issuer:
        lease = Lease(issuer, "billing:42", ttl=3, renew_fraction=0.1, fence=False)
        lease.acquire(wait=0)
        owner.execute("REVOKE fencekit_writer FROM lease_writer")
        # Renewal (every 0.3 s) is refused for good: lost well before the 3 s deadline.
        assert lease.wait_lost(timeout=2.0)
        assert lease.lost_reason is not None
        assert "GRANT fencekit_writer TO lease_writer;" in lease.lost_reason
        lease.release()
