"""Lease-bound fences with the built-in issuer: a token must also be the CURRENT lease token.

Closes the plain scheme's window: A (token 1) writing after B acquired token 2 but before B
wrote. The same sequence on a plain key fence is accepted, so these tests can fail.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fencekit.errors import LeaseMismatchError
from fencekit.leases import PostgresIssuer
from fencekit.psycopg import transaction
from fencekit.spec import FenceSpec, Scope, SpecError, TableName
from fencekit.sqlgen import protect_statements


def _protect(dsn: str, *, lease_bound: bool) -> None:
    spec = FenceSpec(
        table=TableName("public", "billing_summary"),
        scope=Scope.KEY,
        key=("account_id",),
        resource="billing",
        lease_bound=lease_bound,
    )
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE billing_summary (account_id int PRIMARY KEY, total int)")
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())


def _write(dsn: str, account: int, total: int, token: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, transaction(conn, token):
        conn.execute(
            "INSERT INTO billing_summary VALUES (%s, %s) "
            "ON CONFLICT (account_id) DO UPDATE SET total = EXCLUDED.total",
            (account, total),
        )


def _takeover(issuer: PostgresIssuer) -> tuple[int, int]:
    a = issuer.try_acquire("billing:42", "A", 0.2)
    assert a is not None
    time.sleep(0.3)  # A is paused past its lease
    b = issuer.try_acquire("billing:42", "B", 30)
    assert b is not None
    return a.token, b.token


@pytest.mark.parametrize("lease_bound", [True, False])
def test_old_holder_cannot_write_before_the_new_one_does(dsn: str, lease_bound: bool) -> None:
    _protect(dsn, lease_bound=lease_bound)
    with PostgresIssuer(dsn) as issuer:
        a, b = _takeover(issuer)
    assert b > a
    if lease_bound:
        with pytest.raises(LeaseMismatchError) as info:
            _write(dsn, 42, 350, a)  # B has not written yet: the fence alone is still 0
        assert info.value.sqlstate == "YF006"
    else:
        _write(dsn, 42, 350, a)  # the window a plain fence leaves open
    _write(dsn, 42, 425, b)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT total FROM billing_summary").fetchone() == (425,)


def test_token_of_one_key_is_refused_on_another(dsn: str) -> None:
    _protect(dsn, lease_bound=True)
    with PostgresIssuer(dsn) as issuer:
        g = issuer.try_acquire("billing:42", "A", 30)
        assert g is not None
        _write(dsn, 42, 1, g.token)
        with pytest.raises(LeaseMismatchError):
            _write(dsn, 43, 1, g.token)  # nobody holds billing:43


def test_acquire_waits_for_a_lease_bound_write_in_flight(dsn: str) -> None:
    """The check locks the lease row FOR SHARE: no new grant while a checked write is open."""
    _protect(dsn, lease_bound=True)
    with PostgresIssuer(dsn) as issuer, PostgresIssuer(dsn) as other:
        got: list[object] = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            g = issuer.try_acquire("billing:42", "A", 1.0)
            assert g is not None
            with transaction(conn, g.token):
                conn.execute("INSERT INTO billing_summary VALUES (42, 1)")
                time.sleep(1.1)  # the lease expires while the write is still open
                t = threading.Thread(
                    target=lambda: got.append(other.try_acquire("billing:42", "B", 5))
                )
                t.start()
                time.sleep(0.3)
                assert t.is_alive(), "acquire must wait for the open lease-bound write"
            t.join(10)
        assert len(got) == 1
        grant = got[0]
        assert grant is not None
        assert grant.token > g.token  # type: ignore[attr-defined]


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("resource", ["billing:eu", None])
def test_a_lease_bound_resource_may_not_hold_a_colon(scope: Scope, resource: str | None) -> None:
    """A key's lease is named resource:key: a resource holding ':' (named, or the default,
    the table's name) could share a lease with another resource's key (billing:eu key 42,
    billing key eu:42), so such a fence is refused before any SQL is generated."""
    with pytest.raises(SpecError, match="may not hold ':'"):
        FenceSpec(
            table=TableName("public", "a:b"),
            scope=scope,
            key=("k",) if scope is Scope.KEY else (),
            resource=resource,
            lease_bound=True,
        )
    FenceSpec(TableName("public", "a:b"), scope=scope, key=("k",) if scope is Scope.KEY else ())
