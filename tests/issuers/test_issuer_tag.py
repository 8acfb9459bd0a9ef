"""One resource, one issuer: the issuer tag travels with the token, end to end.

A ``Lease`` puts its grant's issuer in the context scope with the token
(``fencing(token, issuer=...)``); the psycopg and SQLAlchemy adapters send it as
``fencekit.issuer`` in the same statement as ``fencekit.token`` (transaction-local); a table
whose named resource is bound to another issuer rejects the write with YF007
(IssuerMismatchError), and the same token is accepted by the resource bound to its own issuer.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fencekit.psycopg as fk
from fencekit.context import current_issuer, current_token, fencing
from fencekit.errors import IssuerMismatchError, StaleTokenError
from tests.issuers.pgfence import make_counter
from tests.lab import IN_CI

if not IN_CI:
    pytest.importorskip("etcd3gw")

BOUND = {"etcd": "t_etcd", "zookeeper": "t_zk", "postgres": "t_pg"}


@pytest.fixture
def bound_tables(db: psycopg.Connection[Any]) -> dict[str, str]:
    """Three counters, each on its own named resource bound to one issuer."""
    for issuer, table in BOUND.items():
        make_counter(db, issuer, table=table, resource=f"res_{issuer}")
    return BOUND


def _bump(conn: psycopg.Connection[Any], table: str) -> None:
    conn.execute(f"UPDATE {table} SET value = value + 1 WHERE id = 1")


def _settings(conn: psycopg.Connection[Any]) -> tuple[str | None, str | None]:
    row = conn.execute(
        "SELECT current_setting('fencekit.token', true), current_setting('fencekit.issuer', true)"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_scope_carries_the_issuer_and_inner_untagged_scope_clears_it() -> None:
    assert current_issuer() is None
    with fencing(40, issuer="etcd"):
        assert (current_token(), current_issuer()) == (40, "etcd")
        with fencing(41):
            assert (current_token(), current_issuer()) == (41, None)
        assert current_issuer() == "etcd"
    assert (current_token(), current_issuer()) == (None, None)
    assert repr(fencing(5, issuer="zookeeper")) == "fencing(5, issuer='zookeeper')"
    with pytest.raises(ValueError, match="issuer"):
        fencing(5, issuer="Etcd; DROP")


def test_etcd_lease_token_rejected_by_resources_of_other_issuers(
    etcd_issuer: Any, resource: str, bound_tables: dict[str, str], dsn: str
) -> None:
    from fencekit.leases import Lease

    with (
        Lease(etcd_issuer(), resource, ttl=5, wait=10) as lease,
        psycopg.connect(dsn) as conn,
    ):
        assert lease.grant.issuer == "etcd"
        assert (current_token(), current_issuer()) == (lease.token, "etcd")
        for other in ("postgres", "zookeeper"):
            with pytest.raises(IssuerMismatchError) as info, fk.transaction(conn):
                _bump(conn, bound_tables[other])
            assert info.value.sqlstate == "YF007"
            assert other in str(info.value)
            assert "etcd" in str(info.value)
        with fk.transaction(conn):  # the same token, on the resource bound to etcd
            assert _settings(conn) == (str(lease.token), "etcd")
            _bump(conn, bound_tables["etcd"])
    with psycopg.connect(dsn, autocommit=True) as check:
        values = {
            t: check.execute(f"SELECT value FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in bound_tables.values()
        }
        rejected = check.execute(
            "SELECT table_name, count FROM fencekit.rejections "
            "WHERE reason = 'issuer_mismatch' AND count > 0 ORDER BY 1"
        ).fetchall()
    assert values == {"t_etcd": 1, "t_zk": 0, "t_pg": 0}
    assert rejected == [("t_pg", 1), ("t_zk", 1)]


def test_tag_is_transaction_local_and_sent_with_the_token(
    bound_tables: dict[str, str], dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        fk.install(conn)
        with fencing(7, issuer="zookeeper"):
            _bump(conn, bound_tables["zookeeper"])
            assert _settings(conn) == ("7", "zookeeper")
            conn.commit()
        assert _settings(conn) == ("", "")  # gone with the transaction
        conn.commit()
        # explicit API: an untagged token is accepted anywhere its number is high enough,
        # a tagged one only where the issuer fits
        with fk.transaction(conn, 9):
            assert _settings(conn) == ("9", "")
            _bump(conn, bound_tables["postgres"])
        with pytest.raises(IssuerMismatchError), fk.transaction(conn, 10, issuer="etcd"):
            _bump(conn, bound_tables["postgres"])
        with fk.transaction(conn, 10, issuer="postgres"):
            _bump(conn, bound_tables["postgres"])
        # an inner untagged scope in the same transaction clears the outer tag
        with fencing(11, issuer="etcd"), fk.transaction(conn):
            assert _settings(conn) == ("11", "etcd")
            with fencing(12):
                assert _settings(conn) == ("12", "")
        conn.execute("BEGIN")
        fk.set_token(conn, 13, issuer="zookeeper")
        assert _settings(conn) == ("13", "zookeeper")
        conn.rollback()
    # a matching issuer does not make a stale token acceptable
    with (
        psycopg.connect(dsn) as conn,
        pytest.raises(StaleTokenError),
        fk.transaction(conn, 3, issuer="zookeeper"),
    ):
        _bump(conn, bound_tables["zookeeper"])


def test_orm_session_sends_the_tag_too(
    etcd_issuer: Any, resource: str, bound_tables: dict[str, str], dsn: str
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    import fencekit.sqlalchemy
    from fencekit.leases import Lease

    url = sqlalchemy.engine.make_url("postgresql+psycopg://").set(
        **{
            k: v
            for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()
            if k in ("host", "port", "database", "username", "password")
        },
        database=psycopg.conninfo.conninfo_to_dict(dsn)["dbname"],
        username=psycopg.conninfo.conninfo_to_dict(dsn).get("user"),
    )
    engine = sqlalchemy.create_engine(url)
    try:
        fencekit.sqlalchemy.install(engine)
        update = "UPDATE {} SET value = value + 1 WHERE id = 1"
        with Lease(etcd_issuer(), resource, ttl=5, wait=10):
            with pytest.raises(IssuerMismatchError), Session(engine) as session, session.begin():
                session.execute(sqlalchemy.text(update.format(bound_tables["postgres"])))
            with Session(engine) as session, session.begin():
                session.execute(sqlalchemy.text(update.format(bound_tables["etcd"])))
                tag = session.execute(
                    sqlalchemy.text("SELECT current_setting('fencekit.issuer', true)")
                ).scalar_one()
                assert tag == "etcd"
    finally:
        engine.dispose()
