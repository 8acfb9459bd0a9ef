"""A claim makes every check a write makes, and works with
``on_equal=reject``.

For each check, on a key fence and a table fence, as the application role (DML and
fencekit_writer), the table's owner (not an admin) and an admin: a write that the check
refuses, and the same claim, must both be refused with the same SQLSTATE, and the fence must
not move. Then the claim the check accepts is accepted and leaves the live holder able to write.

- lease: on a lease-bound fence, a token that is not the live lease's (bigint max, the token
  that locked the holder out) is YF006;
- issuer: a token the session tags with another issuer (``fencekit.issuer``) is YF007;
- token: not positive is YF004; lower than the fence is YF001;
- privilege: a role that may only read the table is refused (42501).

``on_equal=reject``: a claim at grant no longer uses the token up: the holder's first write
under it is accepted, a second transaction under it is YF002, and every older token is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, fences, protect

BIG = 2**63 - 1
ROLES = ("cw_app", "cw_owner", "cw_admin")


def _spec(scope: Scope, **kw: Any) -> FenceSpec:
    return FenceSpec(
        TableName("public", "cw"),
        scope=scope,
        key=("k",) if scope is Scope.KEY else (),
        resource="cw",
        **kw,
    )


def _key(scope: Scope) -> str:
    return "{1}" if scope is Scope.KEY else "{}"


def _fence_key(scope: Scope) -> str:
    return "1" if scope is Scope.KEY else ""


@pytest.fixture
def roles(db: Conn, make_role: Callable[..., str]) -> dict[str, str]:
    out = {
        "cw_app": make_role("cw_app", "fencekit_writer"),
        "cw_owner": make_role("cw_owner", "fencekit_writer"),
        "cw_admin": make_role("cw_admin", "fencekit_admin"),
        "cw_reader": make_role("cw_reader", "fencekit_writer"),
    }
    db.execute("CREATE TABLE cw (id int PRIMARY KEY, k int NOT NULL, v int)")
    db.commit()
    return out


def _setup(db: Conn, spec: FenceSpec) -> None:
    protect(db, spec)
    db.execute("ALTER TABLE cw OWNER TO cw_owner")
    db.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON cw TO cw_app, cw_admin")
    db.execute("GRANT SELECT ON cw TO cw_reader")
    db.commit()


def _run(dsn: str, stmt: str, *, token: int | None = None, issuer: str | None = None) -> str | None:
    """Run ``stmt`` in its own transaction; its SQLSTATE, or None when it committed."""
    with psycopg.connect(dsn) as conn:
        try:
            if token is not None:
                conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
            if issuer is not None:
                conn.execute("SELECT set_config('fencekit.issuer', %s, true)", (issuer,))
            conn.execute(stmt)
            conn.commit()
        except psycopg.Error as exc:
            return exc.sqlstate
    return None


_IDS = itertools.count(1)


def _write(token: int) -> str:
    """A new row of key 1 (a fresh id each time: a refusal is never a duplicate key)."""
    return f"INSERT INTO cw VALUES ({next(_IDS)}, 1, {token % 1000})"


def _claim(scope: Scope, token: int) -> str:
    return f"SELECT fencekit.claim('cw', '{_key(scope)}', {token})"


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("role", ROLES)
def test_a_claim_needs_the_live_lease_as_a_write_does(
    db: Conn, roles: dict[str, str], scope: Scope, role: str
) -> None:
    _setup(db, _spec(scope, lease_bound=True))
    lease = "cw:1" if scope is Scope.KEY else "cw"
    row = db.execute("SELECT fencekit.acquire(%s, 'holder', '1 hour')", (lease,)).fetchone()
    db.commit()
    assert row is not None
    live = int(row[0])
    assert _run(roles[role], _write(BIG), token=BIG) == "YF006"
    assert _run(roles[role], _claim(scope, BIG)) == "YF006", "claim skipped the lease check"
    assert fences(db, "cw") == {}
    db.rollback()
    assert _run(roles[role], _claim(scope, live)) is None
    assert _run(roles[role], _write(live), token=live) is None  # the holder is not locked out
    assert fences(db, "cw") == {_fence_key(scope): live}
    db.rollback()


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("role", ROLES)
def test_a_claim_honours_the_sessions_issuer_as_a_write_does(
    db: Conn, roles: dict[str, str], scope: Scope, role: str
) -> None:
    _setup(db, _spec(scope, issuer="postgres"))
    assert _run(roles[role], _write(7), token=7, issuer="etcd") == "YF007"
    assert _run(roles[role], _claim(scope, 7), issuer="etcd") == "YF007", "claim skipped it"
    assert fences(db, "cw") == {}
    db.rollback()
    assert _run(roles[role], _claim(scope, 7), issuer="postgres") is None
    assert fences(db, "cw") == {_fence_key(scope): 7}
    db.rollback()


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("role", ROLES)
def test_a_claim_judges_the_token_as_a_write_does(
    db: Conn, roles: dict[str, str], scope: Scope, role: str
) -> None:
    _setup(db, _spec(scope))
    assert _run(roles[role], _write(20), token=20) is None
    assert _run(roles[role], _claim(scope, 0)) == "YF004"
    assert _run(roles[role], _claim(scope, -5)) == "YF004"
    assert _run(roles[role], _write(15), token=15) == "YF001"
    assert _run(roles[role], _claim(scope, 15)) == "YF001"
    assert _run(roles[role], _claim(scope, 20)) is None  # the holder's own token: accepted
    assert fences(db, "cw") == {_fence_key(scope): 20}
    db.rollback()


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
def test_a_claim_needs_write_privilege(db: Conn, roles: dict[str, str], scope: Scope) -> None:
    _setup(db, _spec(scope))
    assert _run(roles["cw_reader"], _write(5), token=5) == "42501"
    assert _run(roles["cw_reader"], _claim(scope, 5)) == "42501"
    # The definer part alone does not lend it either.
    key = "1" if scope is Scope.KEY else ""
    assert _run(roles["cw_reader"], f"SELECT fencekit.claim_fence('cw', '{key}', 5)") == "42501"
    assert fences(db, "cw") == {}
    db.rollback()


@pytest.mark.parametrize("scope", [Scope.KEY, Scope.TABLE])
@pytest.mark.parametrize("role", ROLES)
def test_claim_at_grant_works_with_on_equal_reject(
    db: Conn, roles: dict[str, str], scope: Scope, role: str
) -> None:
    _setup(db, _spec(scope, on_equal="reject"))
    dsn = roles[role]
    assert _run(dsn, _write(30), token=30) is None  # the old holder wrote under 30
    assert _run(dsn, _claim(scope, 31)) is None  # the new holder claims 31 at grant
    assert _run(dsn, _claim(scope, 31)) is None  # idempotent until used
    assert _run(dsn, _write(30), token=30) == "YF002"  # the old holder: refused
    assert _run(dsn, _write(31), token=31) is None, (
        "the claim used the token up: the holder's first write was refused"
    )
    assert _run(dsn, _write(31), token=31) == "YF002"  # once only
    assert _run(dsn, _claim(scope, 31)) == "YF002"  # used now
    assert fences(db, "cw") == {_fence_key(scope): 31}
    db.rollback()
