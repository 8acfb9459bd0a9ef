"""SQLAlchemy plugin: a rejection is a fencekit FenceError and SQLAlchemy's DBAPIError at once."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, select, text, update
from sqlalchemy.orm import Session

import fencekit.psycopg
import fencekit.sqlalchemy
from fencekit.context import fencing
from fencekit.errors import FenceError, MissingTokenError, StaleTokenError
from tests.adapters.conftest import sa_url
from tests.adapters.test_sqlalchemy import BillingSummary

STALE_SQL = "UPDATE billing_summary SET summary = 'A' WHERE account_id = 42"


@pytest.fixture
def engine(billing: str) -> Iterator[Engine]:
    eng = create_engine(sa_url(billing))
    with eng.begin() as conn:  # the fence becomes 34 (no plugin yet: the token set by hand)
        conn.execute(text("SELECT set_config('fencekit.token', '34', true)"))
        conn.execute(text("UPDATE billing_summary SET summary = 'B' WHERE account_id = 42"))
    yield eng
    eng.dispose()


def stale_write(engine: Engine) -> None:
    with fencing(33), engine.connect() as conn:
        conn.execute(text(STALE_SQL))


def plain_sqlalchemy_error(engine: Engine) -> sqlalchemy.exc.DBAPIError:
    """What SQLAlchemy raises for the same rejection without the plugin."""
    with engine.connect() as conn:
        conn.execute(text("SELECT set_config('fencekit.token', '33', true)"))
        with pytest.raises(sqlalchemy.exc.DBAPIError) as info:
            conn.execute(text(STALE_SQL))
    return info.value


@pytest.mark.parametrize(
    "catch", [sqlalchemy.exc.DBAPIError, sqlalchemy.exc.StatementError, StaleTokenError, FenceError]
)
def test_either_except_clause_catches_it(engine: Engine, catch: type[Exception]) -> None:
    fencekit.sqlalchemy.install(engine)
    try:
        stale_write(engine)
    except catch as exc:
        caught: BaseException = exc
    else:
        pytest.fail("the stale write was not rejected")
    assert isinstance(caught, StaleTokenError)
    assert isinstance(caught, sqlalchemy.exc.DBAPIError)


def test_it_is_what_sqlalchemy_would_raise_too(engine: Engine) -> None:
    plain = plain_sqlalchemy_error(engine)
    assert not isinstance(plain, FenceError)
    fencekit.sqlalchemy.install(engine)
    with pytest.raises(StaleTokenError) as info:
        stale_write(engine)
    err = info.value
    assert isinstance(err, type(plain))  # code catching the specific SQLAlchemy class still does
    # fencekit's attributes and message
    assert (err.token, err.fence, err.key, err.table) == (
        33,
        34,
        {"account_id": "42"},
        "public.billing_summary",
    )
    assert err.detail["reason"] == "stale"
    assert str(err).startswith("fencekit: stale write")
    # SQLAlchemy's attributes
    assert isinstance(err, sqlalchemy.exc.DBAPIError)
    assert err.statement == STALE_SQL
    assert isinstance(err.orig, psycopg.Error)
    assert err.orig.sqlstate == "YF001"
    assert err.connection_invalidated is False
    assert isinstance(err.__cause__, psycopg.Error)
    # one class per pair: the next rejection has the same type
    with pytest.raises(StaleTokenError) as again:
        stale_write(engine)
    assert type(again.value) is type(err)
    assert type(err).__name__ == "StaleTokenError"


def test_missing_token_is_a_dbapi_error_too(engine: Engine) -> None:
    fencekit.sqlalchemy.install(engine)
    with engine.connect() as conn, pytest.raises(sqlalchemy.exc.DBAPIError) as info:
        conn.execute(text(STALE_SQL))  # outside any scope: the table rejects unfenced writes
    assert isinstance(info.value, MissingTokenError)


def test_autoflush_detail_does_not_break_it(engine: Engine) -> None:
    """SQLAlchemy adds a note to errors raised by a query-invoked autoflush (add_detail)."""
    fencekit.sqlalchemy.install(engine)
    with Session(engine) as s, fencing(33):
        s.get(BillingSummary, 42).summary = "A"  # type: ignore[union-attr]
        with pytest.raises(StaleTokenError) as info:
            s.scalar(select(BillingSummary.summary))  # autoflush sends the UPDATE
        s.rollback()
    err = info.value
    assert isinstance(err, sqlalchemy.exc.DBAPIError)
    assert err.detail["reason"] == "stale"  # fencekit's detail is kept
    assert any("autoflush" in d for d in err.sqlalchemy_details)  # type: ignore[attr-defined]
    assert "autoflush" in str(err)


def test_pickles(engine: Engine) -> None:
    fencekit.sqlalchemy.install(engine)
    with pytest.raises(StaleTokenError) as info:
        stale_write(engine)
    copy = pickle.loads(pickle.dumps(info.value))  # noqa: S301 - our own object
    assert type(copy) is type(info.value)
    assert isinstance(copy, sqlalchemy.exc.DBAPIError)
    assert (copy.token, copy.fence, copy.statement) == (33, 34, STALE_SQL)
    assert str(copy) == str(info.value)


async def test_async_either_except_clause_catches_it(billing: str, greenlet: None) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    engine = create_async_engine(sa_url(billing))
    fencekit.sqlalchemy.install(engine)
    maker = async_sessionmaker(engine)
    try:
        async with maker() as s:
            with fencing(34):
                (await s.get(BillingSummary, 42)).summary = "B"  # type: ignore[union-attr]
                await s.commit()
        async with engine.connect() as conn:
            with fencing(33):
                try:
                    await conn.execute(text(STALE_SQL))
                except sqlalchemy.exc.DBAPIError as exc:
                    by_sqlalchemy: BaseException = exc
                else:
                    pytest.fail("the stale write was not rejected")
        async with maker() as s:
            with fencing(33):
                try:
                    await s.execute(update(BillingSummary).values(summary="A"))
                except StaleTokenError as exc:
                    by_fencekit: BaseException = exc
                else:
                    pytest.fail("the stale write was not rejected")
                await s.rollback()
    finally:
        await engine.dispose()
    for err in (by_sqlalchemy, by_fencekit):
        assert isinstance(err, StaleTokenError)
        assert isinstance(err, sqlalchemy.exc.DBAPIError)
        assert (err.token, err.fence) == (33, 34)


def test_connection_fenced_by_the_psycopg_adapter(
    engine: Engine, billing: str, events: list
) -> None:
    """A pooled connection already in fencekit.psycopg's automatic mode raises FenceError
    itself: it still comes out as a DBAPIError too, and is counted once."""

    def connect() -> psycopg.Connection:
        conn = psycopg.connect(billing)
        fencekit.psycopg.install(conn)  # translates errors itself
        return conn

    own = create_engine("postgresql+psycopg://", creator=connect)
    fencekit.sqlalchemy.install(own)
    try:
        with pytest.raises(sqlalchemy.exc.DBAPIError) as info:
            stale_write(own)
    finally:
        own.dispose()
    assert isinstance(info.value, StaleTokenError)
    assert info.value.statement == STALE_SQL
    assert [(e.kind, e.reason) for e in events] == [("rejected", "stale")]
