"""SQLAlchemy plugin: no statement leaves a fenced scope without the token, whatever connection
the pool hands out and whatever execution style runs it.

SQLAlchemy 2 creates a statement's cursor before it autobegins the transaction, so a plugin
that fences connections only at ``begin`` sent the first statement of a freshly opened pooled
connection without the token. The table here is row-fenced with ``on_missing = 'allow'`` (the
rollout path): a write whose token went missing is silently accepted, so every case checks both
that the stale write raises and that the stale value is not in the table afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy.exc
from pytest_postgresql.janitor import DatabaseJanitor
from sqlalchemy import Engine, create_engine, delete, event, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool

import fencekit.sqlalchemy
from fencekit.context import fencing
from fencekit.embedded import EmbeddedServer
from fencekit.errors import StaleTokenError, translate
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen import protect_statements
from tests.adapters.conftest import sa_url

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

FENCE = 34  # the row's fence, written by the current lease holder
STALE = 33  # the paused holder's token
ROW_SQL = "SELECT v, fencekit_fence FROM t WHERE id = 1"


class Base(DeclarativeBase):
    pass


class T(Base):
    __tablename__ = "t"
    id: Mapped[int] = mapped_column(primary_key=True)
    v: Mapped[str]


@pytest.fixture
def allow_dsn(dsn: str) -> str:
    """``public.t``: row fence, on_missing = 'allow'; row 1 written by the holder of token 34."""
    return make_table(dsn)


@pytest.fixture(scope="module")
def _pooled_db(request: pytest.FixtureRequest, pg_server: EmbeddedServer) -> Iterator[str]:
    """One database, cloned from the core template like ``dsn``'s, for every pool event x
    execution style case: a case whose stale write is rejected leaves the table as it found
    it, so the cases need not clone and drop a database each."""
    template = request.getfixturevalue("_noproc_core_embedded")
    janitor = DatabaseJanitor(
        user=template.user,
        host=template.host,
        port=template.port,
        dbname=f"{template.dbname}_pool",
        template_dbname=template.template_dbname,
        password=template.password,
    )
    janitor.drop()
    with janitor:
        dsn = pg_server.dsn_for(janitor.dbname)
        make_table(dsn)
        yield dsn


@pytest.fixture
def pooled_dsn(_pooled_db: str) -> str:
    """``allow_dsn``'s table in the module's shared database, as ``make_table`` left it: a case
    that let a stale write through (and failed) does not leave it to the next one."""
    with psycopg.connect(_pooled_db) as conn:
        rows = conn.execute("SELECT id, v, fencekit_fence FROM t ORDER BY id").fetchall()
        if rows != [(1, "B", FENCE)]:
            conn.execute("DROP TABLE t")
            conn.commit()
            make_table(_pooled_db)
    return _pooled_db


def make_table(dsn: str) -> str:
    spec = FenceSpec(TableName("public", "t"), on_missing="allow")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
        for stmt in protect_statements(spec):
            conn.execute(stmt.encode())
        conn.execute("INSERT INTO t (id, v) VALUES (1, 'init')")  # allowed: no token
        conn.commit()
        conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
        conn.execute("UPDATE t SET v = 'B' WHERE id = 1")
    assert row(dsn) == ("B", FENCE)
    return dsn


def row(dsn: str) -> tuple[str, int] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(ROW_SQL).fetchone()  # type: ignore[return-value]


def assert_stale_rejected(exc: BaseException, *, through_sqlalchemy: bool = True) -> None:
    if through_sqlalchemy:
        assert isinstance(exc, StaleTokenError), repr(exc)
        assert isinstance(exc, sqlalchemy.exc.DBAPIError), repr(exc)
        assert (exc.token, exc.fence) == (STALE, FENCE)
    else:  # the psycopg connection taken out of SQLAlchemy: psycopg's error, fencekit's SQLSTATE
        assert isinstance(exc, psycopg.Error), repr(exc)
        assert isinstance(translate(exc), StaleTokenError)


def count_opened(engine: Engine) -> list[object]:
    """Appends one item per DBAPI connection the pool opens from now on."""
    opened: list[object] = []
    event.listen(engine, "connect", lambda dbapi_conn, record: opened.append(dbapi_conn))
    return opened


def terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(200):
            gone = admin.execute(
                "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,)
            ).fetchone()
            if gone and gone[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} did not exit")


# ---------------------------------------------------------------- execution styles (sync)
#
# Each writes 'stale' over row 1 inside the current scope, on the connection the pool hands out.


def orm_flush(engine: Engine) -> None:
    with Session(engine) as s:
        s.get(T, 1).v = "stale"  # type: ignore[union-attr]
        s.commit()


def orm_bulk_update(engine: Engine) -> None:
    with Session(engine) as s:
        s.execute(update(T).where(T.id == 1).values(v="stale"))
        s.commit()


def engine_begin(engine: Engine) -> None:
    with engine.begin() as c:
        c.execute(update(T).where(T.id == 1).values(v="stale"))


def commit_as_you_go(engine: Engine) -> None:
    with engine.connect() as c:
        c.execute(update(T).where(T.id == 1).values(v="stale"))
        c.commit()


def autocommit_connection(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(update(T).where(T.id == 1).values(v="stale"))


def autocommit_engine(engine: Engine) -> None:
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as c:
        c.execute(text("UPDATE t SET v = 'stale' WHERE id = 1"))


def exec_driver_sql(engine: Engine) -> None:
    with engine.connect() as c:
        c.exec_driver_sql("UPDATE t SET v = %(v)s WHERE id = 1", {"v": "stale"})
        c.commit()


def exec_driver_sql_multi(engine: Engine) -> None:
    # Two statements in one string: psycopg sends them as one simple query.
    with engine.connect() as c:
        c.exec_driver_sql("SELECT 1; UPDATE t SET v = 'stale' WHERE id = 1")
        c.commit()


def text_statement(engine: Engine) -> None:
    with engine.connect() as c:
        c.execute(text("UPDATE t SET v = :v WHERE id = 1"), {"v": "stale"})
        c.commit()


def core_upsert(engine: Engine) -> None:
    stmt = pg_insert(T).values(id=1, v="stale")
    with engine.connect() as c:
        c.execute(stmt.on_conflict_do_update(index_elements=[T.id], set_={"v": "stale"}))
        c.commit()


def core_delete(engine: Engine) -> None:
    with engine.connect() as c:
        c.execute(delete(T).where(T.id == 1))
        c.commit()


def raw_connection(engine: Engine) -> None:
    raw = engine.raw_connection()
    try:
        raw.cursor().execute("UPDATE t SET v = 'stale' WHERE id = 1")
        raw.commit()
    finally:
        raw.close()


STYLES: dict[str, Callable[[Engine], None]] = {
    f.__name__: f
    for f in (
        orm_flush,
        orm_bulk_update,
        engine_begin,
        commit_as_you_go,
        autocommit_connection,
        autocommit_engine,
        exec_driver_sql,
        exec_driver_sql_multi,
        text_statement,
        core_upsert,
        core_delete,
        raw_connection,
    )
}


# ---------------------------------------------------------------- pool events (sync)
#
# (engine options, arrange): once arrange() has entered, the next checkout opens a new DBAPI
# connection. Warm-ups run inside a scope so the connections they leave behind are used ones.


def warm_up(engine: Engine) -> int:
    with fencing(FENCE), engine.connect() as c:
        pid = int(c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        c.commit()
    return pid


@contextmanager
def first(engine: Engine, dsn: str) -> Iterator[None]:
    yield


@contextmanager
def held(engine: Engine, dsn: str) -> Iterator[None]:
    with engine.connect() as other:  # growth or overflow: the write needs a second connection
        other.exec_driver_sql("SELECT 1")
        yield


@contextmanager
def recycled(engine: Engine, dsn: str) -> Iterator[None]:
    warm_up(engine)
    time.sleep(0.3)  # past pool_recycle
    yield


@contextmanager
def invalidated(engine: Engine, dsn: str) -> Iterator[None]:
    with engine.connect() as c:
        c.exec_driver_sql("SELECT 1")
        c.invalidate()
    yield


@contextmanager
def disposed(engine: Engine, dsn: str) -> Iterator[None]:
    warm_up(engine)
    engine.dispose()
    yield


@contextmanager
def pre_ping_reconnect(engine: Engine, dsn: str) -> Iterator[None]:
    terminate(dsn, warm_up(engine))  # the ping fails, the pool reconnects
    yield


POOL_EVENTS: dict[str, tuple[dict[str, Any], Callable[[Engine, str], Any]]] = {
    "first": ({}, first),
    "growth": ({"pool_size": 2, "max_overflow": 0}, held),
    "overflow": ({"pool_size": 1, "max_overflow": 1}, held),
    "recycle": ({"pool_recycle": 0.2}, recycled),
    "invalidate": ({"pool_size": 1}, invalidated),
    "dispose": ({}, disposed),
    "pre_ping": ({"pool_size": 1, "pool_pre_ping": True}, pre_ping_reconnect),
    "null_pool": ({"poolclass": NullPool}, first),
}


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("pool_event", POOL_EVENTS)
def test_fresh_pooled_connection_carries_the_token(
    pooled_dsn: str, pool_event: str, style: str
) -> None:
    allow_dsn = pooled_dsn
    options, arrange = POOL_EVENTS[pool_event]
    engine = create_engine(sa_url(allow_dsn), **options)
    fencekit.sqlalchemy.install(engine)
    try:
        with arrange(engine, allow_dsn):
            opened = count_opened(engine)
            with fencing(STALE), pytest.raises(Exception) as info:
                STYLES[style](engine)
            assert opened, "the write did not run on a connection the pool had just opened"
    finally:
        engine.dispose()
    assert_stale_rejected(info.value, through_sqlalchemy=style != "raw_connection")
    assert row(allow_dsn) == ("B", FENCE)


def test_fresh_connection_inserts_carry_the_token(allow_dsn: str) -> None:
    """An insert has no fence to be stale against: the token must reach the new row."""
    engine = create_engine(sa_url(allow_dsn))
    fencekit.sqlalchemy.install(engine)
    try:
        with fencing(40), engine.connect() as c:
            c.execute(pg_insert(T).values(id=2, v="new"))
            c.commit()
    finally:
        engine.dispose()
    with psycopg.connect(allow_dsn) as conn:
        assert conn.execute("SELECT fencekit_fence FROM t WHERE id = 2").fetchone() == (40,)


@pytest.mark.parametrize("target", ["engine", "connection"])
def test_connection_reopened_after_invalidate(allow_dsn: str, target: str) -> None:
    """The same Connection object reconnects on its next statement (a new pooled connection)."""
    engine = create_engine(sa_url(allow_dsn), pool_size=1)
    try:
        if target == "engine":
            fencekit.sqlalchemy.install(engine)
        with engine.connect() as c:
            if target == "connection":
                fencekit.sqlalchemy.install(c)
            c.exec_driver_sql("SELECT 1")
            c.commit()
            c.invalidate()
            opened = count_opened(engine)
            with fencing(STALE), pytest.raises(StaleTokenError) as info:
                c.execute(text("UPDATE t SET v = 'stale' WHERE id = 1"))
            assert opened
            c.rollback()
    finally:
        engine.dispose()
    assert_stale_rejected(info.value)
    assert row(allow_dsn) == ("B", FENCE)


def test_connection_checked_out_before_install(allow_dsn: str) -> None:
    engine = create_engine(sa_url(allow_dsn))
    try:
        with engine.connect() as c:
            c.exec_driver_sql("SELECT 1")
            c.commit()
            fencekit.sqlalchemy.install(engine)
            with fencing(STALE), pytest.raises(StaleTokenError):
                c.execute(text("UPDATE t SET v = 'stale' WHERE id = 1"))
            c.rollback()
    finally:
        engine.dispose()
    assert row(allow_dsn) == ("B", FENCE)


def test_outside_a_scope_nothing_is_sent(allow_dsn: str) -> None:
    """The allow policy still lets unfenced writes through: the plugin adds nothing there."""
    engine = create_engine(sa_url(allow_dsn))
    fencekit.sqlalchemy.install(engine)
    try:
        with engine.connect() as c:
            c.execute(text("UPDATE t SET v = 'unfenced' WHERE id = 1"))
            c.commit()
    finally:
        engine.dispose()
    assert row(allow_dsn) == ("unfenced", FENCE)


# ---------------------------------------------------------------- asyncio twins


async def a_session(engine: Any) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(engine) as s:
        (await s.get(T, 1)).v = "stale"  # type: ignore[union-attr]
        await s.commit()


async def a_begin(engine: Any) -> None:
    async with engine.begin() as c:
        await c.execute(update(T).where(T.id == 1).values(v="stale"))


async def a_commit_as_you_go(engine: Any) -> None:
    async with engine.connect() as c:
        await c.execute(update(T).where(T.id == 1).values(v="stale"))
        await c.commit()


async def a_autocommit(engine: Any) -> None:
    async with engine.connect() as c:
        c = await c.execution_options(isolation_level="AUTOCOMMIT")
        await c.execute(text("UPDATE t SET v = 'stale' WHERE id = 1"))


async def a_exec_driver_sql(engine: Any) -> None:
    async with engine.connect() as c:
        await c.exec_driver_sql("UPDATE t SET v = %(v)s WHERE id = 1", {"v": "stale"})
        await c.commit()


async def a_core_delete(engine: Any) -> None:
    async with engine.connect() as c:
        await c.execute(delete(T).where(T.id == 1))
        await c.commit()


async def a_raw_connection(engine: Any) -> None:
    async with engine.connect() as c:
        raw = (await c.get_raw_connection()).driver_connection
        await raw.execute("UPDATE t SET v = 'stale' WHERE id = 1")
        await raw.commit()


ASYNC_STYLES: dict[str, Callable[[Any], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        a_session,
        a_begin,
        a_commit_as_you_go,
        a_autocommit,
        a_exec_driver_sql,
        a_core_delete,
        a_raw_connection,
    )
}


async def a_warm_up(engine: Any) -> int:
    with fencing(FENCE):
        async with engine.connect() as c:
            pid = int((await c.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one())
            await c.commit()
    return pid


@asynccontextmanager
async def a_first(engine: Any, dsn: str) -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def a_held(engine: Any, dsn: str) -> AsyncIterator[None]:
    async with engine.connect() as other:
        await other.exec_driver_sql("SELECT 1")
        yield


@asynccontextmanager
async def a_recycled(engine: Any, dsn: str) -> AsyncIterator[None]:
    await a_warm_up(engine)
    await asyncio.sleep(0.3)
    yield


@asynccontextmanager
async def a_invalidated(engine: Any, dsn: str) -> AsyncIterator[None]:
    async with engine.connect() as c:
        await c.exec_driver_sql("SELECT 1")
        await c.invalidate()
    yield


@asynccontextmanager
async def a_disposed(engine: Any, dsn: str) -> AsyncIterator[None]:
    await a_warm_up(engine)
    await engine.dispose()
    yield


@asynccontextmanager
async def a_pre_ping_reconnect(engine: Any, dsn: str) -> AsyncIterator[None]:
    terminate(dsn, await a_warm_up(engine))
    yield


ASYNC_POOL_EVENTS: dict[str, tuple[dict[str, Any], Callable[[Any, str], Any]]] = {
    "first": ({}, a_first),
    "growth": ({"pool_size": 2, "max_overflow": 0}, a_held),
    "overflow": ({"pool_size": 1, "max_overflow": 1}, a_held),
    "recycle": ({"pool_recycle": 0.2}, a_recycled),
    "invalidate": ({"pool_size": 1}, a_invalidated),
    "dispose": ({}, a_disposed),
    "pre_ping": ({"pool_size": 1, "pool_pre_ping": True}, a_pre_ping_reconnect),
}


@pytest.mark.parametrize("style", ASYNC_STYLES)
@pytest.mark.parametrize("pool_event", ASYNC_POOL_EVENTS)
async def test_async_fresh_pooled_connection_carries_the_token(
    pooled_dsn: str, pool_event: str, style: str, greenlet: None
) -> None:
    allow_dsn = pooled_dsn
    from sqlalchemy.ext.asyncio import create_async_engine

    options, arrange = ASYNC_POOL_EVENTS[pool_event]
    engine = create_async_engine(sa_url(allow_dsn), **options)
    fencekit.sqlalchemy.install(engine)
    try:
        async with arrange(engine, allow_dsn):
            opened = count_opened(engine.sync_engine)
            with fencing(STALE), pytest.raises(Exception) as info:
                await ASYNC_STYLES[style](engine)
            assert opened, "the write did not run on a connection the pool had just opened"
    finally:
        await engine.dispose()
    assert_stale_rejected(info.value, through_sqlalchemy=style != "a_raw_connection")
    assert row(allow_dsn) == ("B", FENCE)


def test_install_on_an_engine_at_a_reused_address(allow_dsn: str) -> None:
    """SQLAlchemy's event registry is keyed by id(): an engine created where a dead one was,
    whose dialect is still alive (the ORM's compiled caches keep dialects), must not look
    installed already. Keep dialects alive and make engines until an address comes back."""
    url = sa_url(allow_dsn)
    kept: list[object] = []
    seen: set[int] = set()
    reused: Engine | None = None
    for _ in range(500):
        engine = create_engine(url)
        fencekit.sqlalchemy.install(engine)
        if id(engine) in seen:
            reused = engine
            break
        seen.add(id(engine))
        kept.append(engine.dialect)
        engine.dispose()
        del engine
    assert reused is not None, "no engine was created at a reused address"
    try:
        with fencing(STALE), pytest.raises(StaleTokenError), reused.begin() as c:
            c.execute(text("UPDATE t SET v = 'stale' WHERE id = 1"))
    finally:
        reused.dispose()
    assert row(allow_dsn) == ("B", FENCE)
