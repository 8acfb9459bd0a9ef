"""A live lease belongs to the role that acquired it: another role cannot take it over.

Ownership is judged by the session's role (the SET ROLE role, else the login role), as
``fencekit.session_role()`` reports it, never by ``current_user`` (inside the SECURITY DEFINER
lease functions that is their owner). Holder names and tokens are public
(``fencekit.leases_current``), so the holder name proves nothing: role appb sending appa's
holder name to ``acquire`` gets NULL while appa's grant is live, and ``renew`` / ``release``
with appa's name and token return false. Members of fencekit_admin may renew and release any
grant, never take one over. Once a grant has expired, anyone may acquire it: that is the
takeover a lease exists for. On the code before this change, appb's ``acquire`` with appa's
holder name handed appb a new token and took the lease from appa.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.errors import LeaseMismatchError
from fencekit.psycopg import transaction
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements

ACQUIRE = "SELECT fencekit.acquire(%s, %s, %s::interval)"
RENEW = "SELECT fencekit.renew(%s, %s, %s, %s::interval)"
RELEASE = "SELECT fencekit.release(%s, %s, %s)"
LEASE = "SELECT holder, token, acquired_by::text FROM fencekit.leases WHERE resource = %s"
DML = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"


def q(conn: psycopg.Connection[Any], query: str, *params: object) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0] if len(row) == 1 else row


@pytest.fixture
def owner(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def roles(make_role: Callable[..., str]) -> dict[str, str]:
    return {
        "appa": make_role("lease_appa", "fencekit_writer", DML),
        "appb": make_role("lease_appb", "fencekit_writer", DML),
        "admin": make_role("lease_admin", "fencekit_admin"),
    }


def test_another_role_cannot_take_a_live_lease_by_its_holder_name(owner, roles) -> None:
    with psycopg.connect(roles["appa"], autocommit=True) as a:
        token = q(a, ACQUIRE, "billing:42", "worker-1", "30 s")
        assert token is not None
        with psycopg.connect(roles["appb"], autocommit=True) as b:
            assert q(b, ACQUIRE, "billing:42", "worker-1", "30 s") is None
            assert q(b, RENEW, "billing:42", "worker-1", token, "30 s") is False
            assert q(b, RELEASE, "billing:42", "worker-1", token) is False
        # appa still holds it, under the same token: nothing moved.
        assert q(owner, LEASE, "billing:42") == ("worker-1", token, "lease_appa")
        assert q(owner, "SELECT fencekit.lease_token('billing:42')") == token
        assert q(a, RENEW, "billing:42", "worker-1", token, "30 s") is True
        # The holder calling again (a lost reply) still gets a new token, in its own role.
        again = q(a, ACQUIRE, "billing:42", "worker-1", "30 s")
        assert again > token
        assert q(owner, "SELECT fencekit.lease_token('billing:42')") == again
        assert q(a, RELEASE, "billing:42", "worker-1", again) is True


def test_an_expired_lease_is_anyone_s_to_take(owner, roles) -> None:
    with psycopg.connect(roles["appa"], autocommit=True) as a:
        token = q(a, ACQUIRE, "r", "worker-1", "0.2 s")
        a.execute("SELECT pg_sleep(0.3)")
        with psycopg.connect(roles["appb"], autocommit=True) as b:
            taken = q(b, ACQUIRE, "r", "worker-1", "30 s")  # even under the same name
            assert taken > token
        assert q(owner, LEASE, "r") == ("worker-1", taken, "lease_appb")
        # Now it is appb's: appa, the old holder, can neither renew, release nor retake it.
        assert q(a, RENEW, "r", "worker-1", taken, "30 s") is False
        assert q(a, RELEASE, "r", "worker-1", taken) is False
        assert q(a, ACQUIRE, "r", "worker-1", "30 s") is None


def test_the_session_role_owns_the_lease_not_the_login_or_current_user(
    owner, roles, make_role: Callable[..., str]
) -> None:
    # One login that is a member of both applications: it acts as the role it SET ROLE to.
    both = make_role("lease_both", "lease_appa", "lease_appb")
    with psycopg.connect(both, autocommit=True) as c:
        c.execute("SET ROLE lease_appa")
        token = q(c, ACQUIRE, "r", "worker-1", "30 s")
        assert q(owner, LEASE, "r") == ("worker-1", token, "lease_appa")
        c.execute("SET ROLE lease_appb")
        assert q(c, ACQUIRE, "r", "worker-1", "30 s") is None
        assert q(c, RENEW, "r", "worker-1", token, "30 s") is False
        c.execute("RESET ROLE")  # the login role itself is a third role (and no writer)
        c.execute("SET ROLE lease_appa")
        assert q(c, RENEW, "r", "worker-1", token, "30 s") is True
    # A SECURITY DEFINER function owned by a superuser lends nothing: the caller is judged.
    owner.execute(
        "CREATE FUNCTION public.take(r text, h text) RETURNS bigint LANGUAGE sql "
        "SECURITY DEFINER SET search_path = pg_catalog "
        "AS $$ SELECT fencekit.acquire(r, h, '30 s') $$"
    )
    owner.execute("GRANT EXECUTE ON FUNCTION public.take(text, text) TO PUBLIC")
    with psycopg.connect(roles["appb"], autocommit=True) as b:
        assert q(b, "SELECT public.take('r', 'worker-1')") is None
    assert q(owner, LEASE, "r") == ("worker-1", token, "lease_appa")


def test_an_admin_may_free_a_lease_but_not_take_it(owner, roles) -> None:
    with psycopg.connect(roles["appa"], autocommit=True) as a:
        token = q(a, ACQUIRE, "r", "worker-1", "30 s")
    with psycopg.connect(roles["admin"], autocommit=True) as adm:
        assert q(adm, ACQUIRE, "r", "worker-1", "30 s") is None
        assert q(adm, "SELECT fencekit.lease_token('r')") == token
        assert q(adm, RENEW, "r", "worker-1", token, "30 s") is True
        assert q(adm, RELEASE, "r", "worker-1", token) is True
        assert q(adm, "SELECT fencekit.lease_token('r')") is None
        mine = q(adm, ACQUIRE, "r", "admin-1", "30 s")
        assert mine > token
    assert q(owner, LEASE, "r") == ("admin-1", mine, "lease_admin")


def test_a_failed_takeover_leaves_the_lease_bound_fence_to_its_holder(owner, roles) -> None:
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
    owner.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON billing TO lease_appa, lease_appb")
    with psycopg.connect(roles["appa"], autocommit=True) as a:
        token = q(a, ACQUIRE, "billing:42", "worker-1", "30 s")
        with psycopg.connect(roles["appb"], autocommit=True) as b:
            assert q(b, ACQUIRE, "billing:42", "worker-1", "30 s") is None
            # appb has no token of its own: a guess above appa's is refused by the lease.
            with pytest.raises(LeaseMismatchError), transaction(b, token + 1):
                b.execute("INSERT INTO billing VALUES (42, 666)")
        with transaction(a, token):
            a.execute("INSERT INTO billing VALUES (42, 1)")
    assert q(owner, "SELECT total FROM billing WHERE account_id = 42") == 1
