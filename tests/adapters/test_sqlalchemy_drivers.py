"""fencekit.sqlalchemy on psycopg2 (``postgresql+psycopg2://``) and asyncpg
(``postgresql+asyncpg://``): the adapter contract through SQLAlchemy, against a real server.

Stale write rejected with the typed error (fencekit's and SQLAlchemy's DBAPIError, ``.orig``
the driver's), missing token refused, no token leaking across pooled connections, commit
outcomes reported, and an unsupported driver refused at install.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import fencekit
import fencekit.sqlalchemy
from fencekit import fencing
from tests.adapters.conftest import TOKEN_SQL, sa_url

UPDATE = text("UPDATE billing_summary SET summary = :s WHERE account_id = 42")


def summary(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT summary FROM billing_summary WHERE account_id = 42").fetchone()
    assert row is not None
    return str(row[0])


# ---------------------------------------------------------------- psycopg2 (sync)


@pytest.fixture
def pg2_engine(billing: str) -> Any:
    pytest.importorskip("psycopg2")
    engine = create_engine(sa_url(billing, "psycopg2"), pool_size=1, max_overflow=0)
    fencekit.sqlalchemy.install(engine)
    yield engine
    engine.dispose()


def test_psycopg2_stale_write_rejected(billing: str, pg2_engine: Any) -> None:
    import psycopg2

    with fencing(34), Session(pg2_engine) as s:
        s.execute(UPDATE, {"s": "written by B"})
        s.commit()
    with pytest.raises(fencekit.StaleTokenError) as info, fencing(33), Session(pg2_engine) as s:
        s.execute(UPDATE, {"s": "stale"})
    err = info.value
    assert isinstance(err, DBAPIError)
    assert isinstance(err.orig, psycopg2.Error)
    assert (err.token, err.fence, err.table) == (33, 34, "public.billing_summary")
    assert summary(billing) == "written by B"


def test_psycopg2_missing_token_and_no_leak(billing: str, pg2_engine: Any) -> None:
    with fencing(40), pg2_engine.connect() as conn:
        conn.execute(UPDATE, {"s": "fenced"})
        assert conn.execute(text(TOKEN_SQL)).scalar() == "40"
        conn.commit()
    # The same pooled connection (pool_size=1), outside any scope: no token.
    with pg2_engine.connect() as conn:
        assert conn.execute(text(TOKEN_SQL)).scalar() is None
        with pytest.raises(fencekit.MissingTokenError):
            conn.execute(UPDATE, {"s": "unfenced"})
    with fencing(41), pg2_engine.connect() as conn:  # a scope left mid-transaction is cleared
        conn.execute(UPDATE, {"s": "fenced again"})
    assert summary(billing) == "fenced"


def test_psycopg2_autocommit(billing: str, pg2_engine: Any) -> None:
    auto = pg2_engine.execution_options(isolation_level="AUTOCOMMIT")
    with fencing(45), auto.connect() as conn:
        conn.execute(UPDATE, {"s": "autocommit"})
    assert summary(billing) == "autocommit"


def test_psycopg2_commit_outcome_unknown(billing: str, pg2_engine: Any) -> None:
    with (  # noqa: PT012
        pytest.raises(fencekit.CommitOutcomeUnknownError) as info,
        fencing(50),
        Session(pg2_engine) as s,
    ):
        s.execute(UPDATE, {"s": "maybe"})
        pid = s.execute(text("SELECT pg_backend_pid()")).scalar()
        with psycopg.connect(billing, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        s.commit()
    assert info.value.token == 50


# ---------------------------------------------------------------- asyncpg (asyncio)


@pytest.fixture
async def apg_engine(billing: str) -> Any:
    pytest.importorskip("asyncpg")
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(sa_url(billing, "asyncpg"), pool_size=1, max_overflow=0)
    fencekit.sqlalchemy.install(engine)
    yield engine
    await engine.dispose()


async def test_asyncpg_stale_write_rejected(billing: str, apg_engine: Any) -> None:
    import asyncpg
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(apg_engine) as s:
        with fencing(34):
            await s.execute(UPDATE, {"s": "written by B"})
            await s.commit()
    with pytest.raises(fencekit.StaleTokenError) as info:  # noqa: PT012
        async with AsyncSession(apg_engine) as s:
            with fencing(33):
                await s.execute(UPDATE, {"s": "stale"})
    err = info.value
    assert isinstance(err, DBAPIError)
    assert isinstance(err.orig, asyncpg.PostgresError)  # asyncpg raised fencekit's class
    assert isinstance(err.orig, fencekit.StaleTokenError)
    assert (err.token, err.fence, err.table) == (33, 34, "public.billing_summary")
    assert summary(billing) == "written by B"


async def test_asyncpg_missing_token_and_no_leak(billing: str, apg_engine: Any) -> None:
    async with apg_engine.connect() as conn:
        with fencing(40):
            await conn.execute(UPDATE, {"s": "fenced"})
            assert (await conn.execute(text(TOKEN_SQL))).scalar() == "40"
        # Left inside the transaction: cleared before the next statement.
        assert (await conn.execute(text(TOKEN_SQL))).scalar() is None
        with fencing(42):  # entered inside the transaction: one statement catches up
            assert (await conn.execute(text(TOKEN_SQL))).scalar() == "42"
        await conn.commit()
    async with apg_engine.connect() as conn:  # the same pooled connection
        assert (await conn.execute(text(TOKEN_SQL))).scalar() is None
        with pytest.raises(fencekit.MissingTokenError):
            await conn.execute(UPDATE, {"s": "unfenced"})
    assert summary(billing) == "fenced"


async def test_asyncpg_commit_outcome_unknown(billing: str, apg_engine: Any) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    with pytest.raises(fencekit.CommitOutcomeUnknownError) as info:  # noqa: PT012
        async with AsyncSession(apg_engine) as s:
            with fencing(50):
                await s.execute(UPDATE, {"s": "maybe"})
                pid = (await s.execute(text("SELECT pg_backend_pid()"))).scalar()
                with psycopg.connect(billing, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                await s.commit()
    assert info.value.token == 50


# ---------------------------------------------------------------- unsupported


def test_unsupported_driver_refused_at_install() -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(TypeError, match=r"postgresql\+psycopg://.*postgresql\+asyncpg://"):
        fencekit.sqlalchemy.install(engine)
