"""Leases meet whatever connection the user has: ``claim``/``Lease.claim`` and the issuers take
a psycopg 3, psycopg2 or asyncpg connection, a SQLAlchemy Connection, Session, AsyncSession or
Engine, or a URL in either spelling. Each kind claims a key fence on a real server, and the
next kind's claim sees the fence the previous one raised."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fencekit
from fencekit.errors import StaleTokenError
from fencekit.leases import AsyncLease, AsyncPostgresIssuer, Lease, PostgresIssuer
from fencekit.leases.claim import async_claim, claim
from fencekit.spec import Scope
from tests.adapters.conftest import connect_kwargs, sa_url
from tests.leases.test_claim import _protect

TABLE = "billing_summary"


def _url(dsn: str, driver: str | None) -> str:
    url = sa_url(dsn, driver or "psycopg")
    return url if driver else url.replace("postgresql+psycopg://", "postgresql://", 1)


def _finish(conn: Any, commit: bool) -> None:
    """Commit (or roll back) and close what a kind made; URLs and engines need nothing."""
    if isinstance(conn, str) or not hasattr(conn, "close") or hasattr(conn, "dispose"):
        return
    if commit:
        conn.commit()
    else:
        conn.rollback()
    conn.close()


async def _async_finish(conn: Any, commit: bool) -> None:
    if isinstance(conn, str) or hasattr(conn, "dispose"):
        return
    if hasattr(conn, "is_in_transaction") and not hasattr(conn, "commit"):  # asyncpg
        await conn.close()
        return
    await (conn.commit() if commit else conn.rollback())
    await conn.close()


def _sync_kinds(dsn: str) -> list[tuple[str, Callable[[], Any]]]:
    import psycopg2
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(sa_url(dsn, "psycopg2"))
    return [
        ("psycopg", lambda: psycopg.connect(dsn)),
        ("psycopg2", lambda: psycopg2.connect(dsn)),
        ("sqlalchemy-connection", engine.connect),
        ("sqlalchemy-session", lambda: Session(engine)),
        ("sqlalchemy-engine", lambda: engine),
        ("url", lambda: _url(dsn, None)),
        ("sqlalchemy-url", lambda: _url(dsn, "psycopg2")),
    ]


def test_claim_takes_every_sync_connection_kind(dsn: str) -> None:
    pytest.importorskip("psycopg2")
    _protect(dsn, Scope.KEY)
    fence = None
    for token, (kind, make) in enumerate(_sync_kinds(dsn), start=10):
        conn = make()
        assert claim(conn, TABLE, [42], token) == fence, kind
        _finish(conn, commit=True)
        conn = make()
        with pytest.raises(StaleTokenError):
            claim(conn, TABLE, [42], token - 5)
        _finish(conn, commit=False)
        fence = token


async def test_async_claim_takes_every_async_connection_kind(dsn: str) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    _protect(dsn, Scope.KEY)
    engine = create_async_engine(sa_url(dsn, "asyncpg"))

    async def psycopg_async() -> Any:
        return await psycopg.AsyncConnection.connect(dsn)

    async def asyncpg_conn() -> Any:
        return await asyncpg.connect(**connect_kwargs(dsn))

    async def sa_connection() -> Any:
        return await engine.connect()

    async def sa_session() -> Any:
        return AsyncSession(engine)

    async def sa_engine() -> Any:
        return engine

    async def url() -> Any:
        return _url(dsn, "asyncpg")

    kinds = [psycopg_async, asyncpg_conn, sa_connection, sa_session, sa_engine, url]
    fence = None
    try:
        for token, make in enumerate(kinds, start=10):
            conn = await make()
            assert await async_claim(conn, TABLE, [42], token) == fence, make.__name__
            await _async_finish(conn, commit=True)
            conn = await make()
            with pytest.raises(StaleTokenError):
                await async_claim(conn, TABLE, [42], token - 5)
            await _async_finish(conn, commit=False)
            fence = token
    finally:
        await engine.dispose()


def test_issuer_and_lease_take_a_sqlalchemy_url_and_engine(dsn: str) -> None:
    from sqlalchemy import create_engine

    _protect(dsn, Scope.KEY)
    engine = create_engine(sa_url(dsn, "psycopg"))
    for source in (sa_url(dsn, "psycopg"), _url(dsn, None), engine):
        with (
            PostgresIssuer(source) as issuer,
            Lease(issuer, "billing:42", ttl=30, wait=0) as lease,
        ):
            with engine.connect() as conn:
                lease.claim(conn, TABLE, 42)
                conn.commit()
            assert fencekit.claim(engine, TABLE, [42], lease.token) == lease.token
    engine.dispose()


async def test_async_issuer_and_lease_take_a_url_and_asyncpg(dsn: str) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    _protect(dsn, Scope.KEY)
    conn = await asyncpg.connect(**connect_kwargs(dsn))
    try:
        async with (
            AsyncPostgresIssuer(sa_url(dsn, "asyncpg")) as issuer,
            AsyncLease(issuer, "billing:42", ttl=30, wait=0) as lease,
        ):
            assert await lease.claim(conn, TABLE, 42) is None
            assert await fencekit.async_claim(conn, TABLE, [42], lease.token) == lease.token
    finally:
        await conn.close()


def test_leases_doc_claim_example_runs(dsn: str) -> None:
    """docs/leases.md: the claim-with-any-connection example runs as written."""
    from tests.adapters.test_docs import python_blocks

    _protect(dsn, Scope.KEY)
    pages = Path(__file__).resolve().parents[2] / "docs"
    assert (pages / "leases.md").exists()
    [block] = [b for b in python_blocks("leases.md") if "fencekit.claim(engine" in b]
    exec(compile(block, "docs/leases.md", "exec", dont_inherit=True), {"url": sa_url(dsn)})  # noqa: S102
