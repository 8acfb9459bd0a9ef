"""SQLAlchemy plugin against the real triggers: ORM, Core, savepoints, sync and asyncio."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import Engine, create_engine, delete, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

import fencekit.sqlalchemy
from fencekit import metrics
from fencekit.context import fencing
from fencekit.errors import FenceError, MissingTokenError, StaleTokenError
from tests.adapters.conftest import TOKEN_SQL, round_trips, sa_url


class Base(DeclarativeBase):
    pass


class BillingSummary(Base):
    __tablename__ = "billing_summary"
    account_id: Mapped[int] = mapped_column(primary_key=True)
    summary: Mapped[str]


class PlainSummary(Base):
    """Same shape, not protected: the unfenced baseline."""

    __tablename__ = "plain_summary"
    account_id: Mapped[int] = mapped_column(primary_key=True)
    summary: Mapped[str]


@pytest.fixture
def engine(billing: str) -> Engine:
    eng = create_engine(sa_url(billing), pool_size=2)
    yield eng
    eng.dispose()


def read_summary(engine: Engine) -> str:
    with Session(engine) as s:
        return s.get(BillingSummary, 42).summary


def test_seed_example_through_the_orm(engine: Engine, events: list) -> None:
    maker = sessionmaker(engine)
    fencekit.sqlalchemy.install(maker)
    with maker() as a, maker() as b:
        with fencing(33):
            row_a = a.get(BillingSummary, 42)  # A loads, then pauses
        with fencing(34):
            b.get(BillingSummary, 42).summary = "written by B"
            b.commit()
        with fencing(33):
            row_a.summary = "stale summary from A"
            with pytest.raises(StaleTokenError) as info:
                a.flush()
        a.rollback()
    err = info.value
    assert (err.token, err.fence, err.key) == (33, 34, {"account_id": "42"})
    assert err.__cause__ is not None
    assert read_summary(engine) == "written by B"
    assert ("rejected", "stale") in [(e.kind, e.reason) for e in events]


def test_every_transaction_in_scope_carries_the_token(engine: Engine) -> None:
    maker = sessionmaker(engine)
    fencekit.sqlalchemy.install(maker)
    with fencing(50), maker() as s:
        assert s.scalar(text(TOKEN_SQL)) == "50"
        s.commit()  # a new transaction starts on the next statement
        s.execute(update(BillingSummary).values(summary="core update"))
        s.rollback()
        assert s.scalar(text(TOKEN_SQL)) == "50"
        s.execute(update(BillingSummary).values(summary="after rollback"))
        with s.begin_nested():
            assert s.scalar(text(TOKEN_SQL)) == "50"
            s.execute(update(BillingSummary).values(summary="in savepoint"))
        with fencing(51), s.begin_nested():
            s.get(BillingSummary, 42).summary = "nested scope"
            s.flush()
        s.commit()
        s.execute(delete(BillingSummary).where(BillingSummary.account_id == 7))
        s.commit()
    assert read_summary(engine) == "nested scope"
    with maker() as s:
        assert s.scalar(text(TOKEN_SQL)) is None


def test_unfenced_write_rejected_and_counted(engine: Engine, events: list) -> None:
    fencekit.sqlalchemy.install(engine)
    with Session(engine) as s, pytest.raises(MissingTokenError, match="fencing"):
        s.execute(update(BillingSummary).values(summary="unfenced"))
    kinds = {(e.kind, e.table, e.reason) for e in events}
    assert ("unfenced", "public.billing_summary", "unfenced") in kinds
    assert ("rejected", "public.billing_summary", "missing") in kinds
    assert metrics.counts()[("unfenced", "public.billing_summary", "unfenced")] >= 1


@pytest.mark.parametrize("target", ["session", "engine", "connection"])
def test_install_targets(engine: Engine, target: str) -> None:
    with engine.connect() as conn:
        if target == "connection":
            fencekit.sqlalchemy.install(conn)
            session = Session(conn)
        else:
            session = Session(engine)
            fencekit.sqlalchemy.install(session if target == "session" else engine)
        with fencing(60), session:
            session.get(BillingSummary, 42).summary = target
            session.commit()
    assert read_summary(engine) == target


def test_other_engines_untouched_without_install(billing: str) -> None:
    other = create_engine(sa_url(billing))
    try:
        with fencing(70), Session(other) as s:
            assert s.scalar(text(TOKEN_SQL)) is None
            with pytest.raises(Exception) as info:
                s.execute(update(BillingSummary).values(summary="x"))
            assert not isinstance(info.value, FenceError)  # no plugin, no translation
    finally:
        other.dispose()


def test_orm_unit_of_work_costs_no_extra_round_trip(engine: Engine) -> None:
    fencekit.sqlalchemy.install(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE plain_summary AS SELECT 42 AS account_id, 'x' AS summary"
        )
    with engine.connect() as conn:
        driver = conn.connection.driver_connection

        serial = itertools.count()

        def unit_of_work(token: int | None) -> None:
            with Session(bind=conn) as s:
                row = s.get(BillingSummary if token else PlainSummary, 42)
                row.summary = f"uow {next(serial)}"
                s.commit()

        with fencing(80):
            unit_of_work(80)  # warm up: mapper compilation, prepared statements
        unit_of_work(None)
        unfenced = round_trips(driver, lambda: unit_of_work(None))
        with fencing(81):
            fenced = round_trips(driver, lambda: unit_of_work(81))
    print(f"ORM unit of work round trips: unfenced {unfenced}, fenced {fenced}")
    assert fenced == unfenced == 4  # BEGIN, SELECT, UPDATE, COMMIT


async def test_async_session(billing: str, greenlet: None) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    engine = create_async_engine(sa_url(billing))
    maker = async_sessionmaker(engine, expire_on_commit=False)
    fencekit.sqlalchemy.install(maker)
    try:
        async with maker() as b:
            with fencing(34):
                (await b.get(BillingSummary, 42)).summary = "async B"
                await b.commit()
                assert await b.scalar(text(TOKEN_SQL)) == "34"
        async with maker() as a:
            with fencing(33), pytest.raises(StaleTokenError):
                await a.execute(update(BillingSummary).values(summary="async A (stale)"))
        async with maker() as s:
            assert await s.scalar(select(BillingSummary.summary)) == "async B"
            assert await s.scalar(text(TOKEN_SQL)) is None
    finally:
        await engine.dispose()
