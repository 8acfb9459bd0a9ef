"""TRUNCATE of a lease-bound fence makes the lease check a row write makes: the token must be
the live lease of every key the resource has a fence for (of the resource, for a table fence).
Before, a key fence's TRUNCATE judged the token against the fences alone, so any token at or
above every fence emptied the table with no lease at all."""

from __future__ import annotations

import psycopg
import pytest

from fencekit.leases import PostgresIssuer
from tests.core.helpers import Conn, protect, reject, write

LEASE_MISMATCH = "YF006"


def _table(db: Conn, scope: str) -> None:
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, total int)")
    db.commit()
    kw = {"key": ("id",)} if scope == "key" else {}
    protect(db, "acct", scope, resource="billing", lease_bound=True, **kw)


def _acquire(issuer: PostgresIssuer, resource: str) -> int:
    g = issuer.try_acquire(resource, "worker", 30)
    assert g is not None
    return g.token


@pytest.mark.parametrize("scope", ["key", "table"])
def test_truncate_without_the_lease_is_refused(db: Conn, dsn: str, scope: str) -> None:
    _table(db, scope)
    keyed = scope == "key"
    with PostgresIssuer(dsn) as issuer:
        t1 = _acquire(issuer, "billing:1" if keyed else "billing")
        write(db, t1, "INSERT INTO acct VALUES (1, 10)")
        if keyed:
            t2 = _acquire(issuer, "billing:2")
            write(db, t2, "INSERT INTO acct VALUES (2, 20)")
        # A token above every fence, with no lease at all.
        reject(db, LEASE_MISMATCH, 2**62, "TRUNCATE acct")
        if keyed:
            # The lease of one key is not the lease of the other.
            reject(db, LEASE_MISMATCH, t2, "TRUNCATE acct")
        assert db.execute("SELECT count(*) FROM acct").fetchone() == (2 if keyed else 1,)
        fences = db.execute("SELECT max(fence) FROM fencekit.fences").fetchone()
        assert fences is not None
        assert fences[0] < 2**62


def test_truncate_under_every_keys_lease_is_accepted(db: Conn, dsn: str) -> None:
    _table(db, "key")
    with PostgresIssuer(dsn) as issuer:
        t1 = _acquire(issuer, "billing:1")
        write(db, t1, "INSERT INTO acct VALUES (1, 10)")
    # One token that is the live lease of every fenced key: the admin path for a whole-resource
    # TRUNCATE is a bypass; here key 1 is the only fenced key, so its holder may empty the table.
    write(db, t1, "TRUNCATE acct")
    assert db.execute("SELECT count(*) FROM acct").fetchone() == (0,)


def test_bypass_still_truncates(db: Conn, dsn: str) -> None:
    _table(db, "key")
    with PostgresIssuer(dsn) as issuer:
        write(db, _acquire(issuer, "billing:1"), "INSERT INTO acct VALUES (1, 10)")
    write(db, 2**62, "TRUNCATE acct", bypass=True)
    assert db.execute("SELECT count(*) FROM acct").fetchone() == (0,)
    with pytest.raises(psycopg.Error):
        write(db, 5, "INSERT INTO acct VALUES (1, 10)")  # the fences were raised
