"""fencekit.acquire / renew / release / leases_current, straight in SQL on a real server."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import errors

from fencekit.sqlgen import render_install


def q(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


@pytest.fixture
def conn(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def acquire(conn, resource, holder, ttl="5 s"):
    return q(conn, "SELECT fencekit.acquire(%s, %s, %s::interval)", resource, holder, ttl)


def renew(conn, resource, holder, token, ttl="5 s"):
    return q(conn, "SELECT fencekit.renew(%s, %s, %s, %s::interval)", resource, holder, token, ttl)


def release(conn, resource, holder, token):
    return q(conn, "SELECT fencekit.release(%s, %s, %s)", resource, holder, token)


@pytest.mark.all_servers
def test_lifecycle_tokens_strictly_increase(conn) -> None:
    first = acquire(conn, "billing:42", "a")
    assert first is not None
    assert first > 0
    assert acquire(conn, "billing:42", "b") is None  # held by a live holder
    other = acquire(conn, "billing:43", "b")
    # Tokens increase per resource and are unique across resources (a lease-bound fence
    # relies on that to refuse a token granted for another resource).
    assert other is not None
    assert other != first
    assert renew(conn, "billing:42", "a", first) is True
    assert release(conn, "billing:42", "a", first) is True
    second = acquire(conn, "billing:42", "b")  # after release
    assert second is not None
    assert second > first
    assert acquire(conn, "billing:42", "c", "50 ms") is None
    third = acquire(conn, "billing:42", "b", "50 ms")  # the holder again: a new token
    assert third is not None
    assert third > second
    time.sleep(0.1)
    fourth = acquire(conn, "billing:42", "c")  # after expiry (takeover)
    assert fourth is not None
    assert fourth > third
    rows = conn.execute("SELECT resource, holder, token FROM fencekit.leases_current").fetchall()
    assert sorted(rows) == [("billing:42", "c", fourth), ("billing:43", "b", other)]


def test_renew_after_expiry_fails_even_without_takeover(conn) -> None:
    token = acquire(conn, "r", "a", "50 ms")
    time.sleep(0.1)
    assert renew(conn, "r", "a", token) is False
    assert conn.execute("SELECT count(*) FROM fencekit.leases_current").fetchone() == (0,)
    taken = acquire(conn, "r", "b")
    assert taken is not None
    assert taken > token


def test_renew_refuses_wrong_holder_or_token(conn) -> None:
    token = acquire(conn, "r", "a")
    assert renew(conn, "r", "b", token) is False
    assert renew(conn, "r", "a", token + 1) is False
    assert renew(conn, "nope", "a", token) is False
    assert renew(conn, "r", "a", token) is True


def test_release_by_non_holder_is_refused(conn) -> None:
    token = acquire(conn, "r", "a")
    assert release(conn, "r", "b", token) is False  # another holder
    assert release(conn, "r", "a", token - 0 + 1) is False  # a token that is not the grant's
    assert acquire(conn, "r", "b") is None  # still held by a
    assert release(conn, "r", "a", token) is True
    assert release(conn, "r", "a", token) is False  # already released
    # An old holder cannot release its successor's lease.
    new = acquire(conn, "r", "b")
    assert release(conn, "r", "a", token) is False
    assert q(conn, "SELECT holder FROM fencekit.leases_current WHERE resource = 'r'") == "b"
    assert new is not None
    assert new > token


@pytest.mark.parametrize(
    ("resource", "holder", "ttl", "words"),
    [
        ("", "a", "5 s", "resource must be a non-empty name"),
        (None, "a", "5 s", "resource must be a non-empty name"),
        ("x" * 1025, "a", "5 s", "limit is 1024"),
        ("r", "", "5 s", "holder must be a non-empty name"),
        ("r", "a", "0 s", "ttl must be positive"),
        ("r", "a", "-1 s", "ttl must be positive"),
        ("r", "a", None, "ttl must be positive"),
        ("r", "a", "2 days", "longer than the 1 day limit"),
        ("r", "a", "1 month", "longer than the 1 day limit"),
        ("r", "a", "1000 years", "longer than the 1 day limit"),
    ],
)
def test_bad_input_is_a_clear_22023(conn, resource, holder, ttl, words) -> None:
    with pytest.raises(errors.InvalidParameterValue, match=words) as info:
        acquire(conn, resource, holder, ttl)
    assert info.value.sqlstate == "22023"


def test_bad_token_is_a_clear_22023(conn) -> None:
    acquire(conn, "r", "a")
    for fn in (
        lambda: renew(conn, "r", "a", 0),
        lambda: renew(conn, "r", "a", None),
        lambda: release(conn, "r", "a", -5),
    ):
        with pytest.raises(errors.InvalidParameterValue, match="token must be a positive"):
            fn()


def test_racing_acquirers_never_both_win(dsn: str) -> None:
    """Real concurrent connections: 8 threads, 30 rounds, one winner per round and resource."""
    rounds, n = 30, 8
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(n)]
    granted: dict[str, list[int]] = {}
    try:
        for r in range(rounds):
            barrier = threading.Barrier(n, timeout=10)
            resource = f"race:{r % 3}"

            def go(i: int, resource: str = resource, barrier: threading.Barrier = barrier):
                barrier.wait()
                return acquire(conns[i], resource, f"h{i}", "30 s")

            with ThreadPoolExecutor(n) as pool:
                tokens = list(pool.map(go, range(n)))
            winners = [(i, t) for i, t in enumerate(tokens) if t is not None]
            assert len(winners) == 1, f"round {r}: {tokens}"
            ((i, token),) = winners
            granted.setdefault(resource, []).append(token)
            assert release(conns[0], resource, f"h{i}", token) is True  # free for the next round
        last = (
            conns[0]
            .execute("SELECT resource, token FROM fencekit.leases ORDER BY resource")
            .fetchall()
        )
        # Ten grants per resource, strictly increasing, and the table keeps the last one.
        for tokens_of in granted.values():
            assert len(tokens_of) == 10
            assert tokens_of == sorted(set(tokens_of))
        assert last == [(res, granted[res][-1]) for res in sorted(granted)]
    finally:
        for c in conns:
            c.close()


def test_acquire_waits_for_an_uncommitted_grant(dsn: str) -> None:
    """A grant still in an open transaction blocks the row; the waiter then sees it live."""
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        assert acquire(first, "r", "a") is not None  # first's transaction stays open
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(acquire(second, "r", "b")))
        t.start()
        time.sleep(0.2)
        assert t.is_alive(), "the second acquirer must wait for the first transaction"
        first.commit()
        t.join(10)
        assert result == [None]
    # Rolled back grants are not grants: the token is issued again, and nobody saw it.
    with psycopg.connect(dsn) as third:
        rolled_back = acquire(third, "s", "a")
        assert rolled_back is not None
        third.rollback()
        granted = acquire(third, "s", "a")
        assert granted is not None
        third.commit()
        assert q(third, "SELECT token FROM fencekit.leases WHERE resource = 's'") == granted


def test_expiry_uses_the_clock_not_the_transaction_start(dsn: str) -> None:
    """now() is the transaction's start: a lease granted late in a long transaction must still
    run for its whole ttl from the moment of the grant."""
    with psycopg.connect(dsn) as c:
        c.execute("SELECT pg_sleep(1.0)")
        acquire(c, "r", "a", "800 ms")  # now() + 800 ms would already be past
        live = q(c, "SELECT expires_at > clock_timestamp() FROM fencekit.leases")
        c.commit()
    assert live is True


def test_grant_commits_durably_even_with_synchronous_commit_off(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SET synchronous_commit = off")
        assert q(c, "SHOW synchronous_commit") == "off"
        acquire(c, "r", "a")
        assert q(c, "SHOW synchronous_commit") == "on"  # for this transaction's commit
        c.commit()
        assert q(c, "SHOW synchronous_commit") == "off"
        c.execute("SET synchronous_commit = remote_apply")
        acquire(c, "s", "a")
        assert q(c, "SHOW synchronous_commit") == "remote_apply"  # never lowered
        c.rollback()


def test_install_is_idempotent_and_keeps_tokens(conn) -> None:
    token = acquire(conn, "r", "a")
    assert token is not None
    conn.execute(render_install().encode())
    conn.execute(render_install().encode())
    assert release(conn, "r", "a", token) is True
    after = acquire(conn, "r", "b")
    assert after is not None
    assert after > token


def test_app_role_uses_functions_but_cannot_touch_the_table(conn, make_role) -> None:
    # A hostile search_path must not change what the functions do: with a public
    # clock_timestamp() first in the path, an unpinned function would grant leases that
    # expired in 1970.
    conn.execute(
        "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz "
        "LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$"
    )
    app_dsn = make_role("lease_app", "fencekit_writer")  # may take leases, nothing else
    with psycopg.connect(app_dsn, autocommit=True) as app:
        app.execute("SET search_path = public, pg_catalog, pg_temp")
        assert q(app, "SELECT clock_timestamp() = 'epoch'") is True
        token = acquire(app, "r", "app")
        assert token is not None
        assert acquire(app, "r", "intruder") is None
        assert renew(app, "r", "app", token) is True
        assert q(app, "SELECT token FROM fencekit.leases_current WHERE resource = 'r'") == token
        for stmt in (
            "UPDATE fencekit.leases SET token = 0",
            "DELETE FROM fencekit.leases",
            "INSERT INTO fencekit.leases (resource, token) VALUES ('x', 1)",
            "SELECT * FROM fencekit.leases",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute(stmt)
        for helper in (
            "SELECT fencekit._lease_durable_commit()",
            "SELECT fencekit._lease_check_args('r', 'a', '1 s')",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute(helper)
        assert release(app, "r", "app", token) is True
    assert q(conn, "SELECT token FROM fencekit.leases WHERE resource = 'r'") == token


def test_functions_pin_search_path_and_are_security_definer(conn) -> None:
    rows = conn.execute(
        """SELECT p.proname, p.prosecdef, p.proconfig
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'fencekit'
              AND p.proname IN ('acquire', 'renew', 'release', 'lease_token')"""
    ).fetchall()
    assert len(rows) == 4
    for name, secdef, config in rows:
        assert secdef, name
        assert "search_path=pg_catalog, pg_temp" in config, (name, config)


def test_lease_token_reports_the_live_token_only(conn) -> None:
    assert q(conn, "SELECT fencekit.lease_token('r') IS NULL") is True
    token = acquire(conn, "r", "a", "100 ms")
    assert q(conn, "SELECT fencekit.lease_token('r')") == token
    time.sleep(0.15)
    assert q(conn, "SELECT fencekit.lease_token('r') IS NULL") is True
