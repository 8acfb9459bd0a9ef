"""``fencekit.sqlalchemy.cooperate``: ORM flushes of a row-fenced class write the fence column as
token, so the row trigger's WHEN verifies them without running PL/pgSQL; whatever it cannot
verify still gets the full check."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import BigInteger, Engine, create_engine, event, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import fencekit.sqlalchemy
from fencekit.context import fencing
from fencekit.declare import fenced
from fencekit.errors import MissingTokenError, StaleTokenError
from tests.adapters.conftest import protect, sa_url


class Base(DeclarativeBase):
    pass


@fenced(scope="row")
class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    state: Mapped[str]
    fencekit_fence: Mapped[int | None] = mapped_column(BigInteger)


class Note(Base):
    """Not declared as fenced: left alone."""

    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str]


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    protect(dsn, "CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL)", "jobs")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO notes VALUES (1, 'n')")
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        conn.execute("INSERT INTO jobs VALUES (1, 'new'), (2, 'new')")
    eng = create_engine(sa_url(dsn))
    fencekit.sqlalchemy.install(eng)
    fencekit.sqlalchemy.cooperate(Base)
    fencekit.sqlalchemy.cooperate(Base)  # idempotent
    yield eng
    eng.dispose()


_CALLS = text(
    "SELECT coalesce(sum(pg_stat_get_xact_function_calls(p.oid)), 0) FROM pg_proc p "
    "WHERE p.pronamespace = 'fencekit'::regnamespace AND p.proname LIKE 'jobs\\_%\\_upd'"
)


def test_flushes_write_the_fence_and_skip_the_trigger(engine: Engine) -> None:
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    with fencing(9), Session(engine) as s:
        s.execute(text("SET track_functions = 'pl'"))  # this transaction's calls, counted
        job = s.get(Job, 1)
        assert job is not None
        job.state = "running"
        note = s.get(Note, 1)
        assert note is not None
        note.body = "also written"
        s.flush()
        assert s.execute(_CALLS).scalar() == 0, "the row trigger's PL/pgSQL ran"
        # The probe counts: a Core UPDATE (no cooperation) runs the function once.
        s.execute(update(Job.__table__).where(Job.__table__.c.id == 2).values(state="core"))
        assert s.execute(_CALLS).scalar() == 1
        s.commit()
        assert job.fencekit_fence == 9  # expired and read back: the token
    updates = [q for q in sent if q.lstrip().upper().startswith("UPDATE")]
    assert any("fencekit_fence=DEFAULT" in q.replace(" ", "") for q in updates), updates
    assert not any("notes" in q and "fencekit_fence" in q for q in updates)

    # A stale token still meets the full check.
    with fencing(7), Session(engine) as s:
        stale = s.get(Job, 1)
        assert stale is not None
        stale.state = "stale"
        with pytest.raises(StaleTokenError):
            s.commit()


def test_without_a_token_the_trigger_decides(engine: Engine) -> None:
    with Session(engine) as s:
        job = s.get(Job, 2)
        assert job is not None
        job.state = "unfenced"
        with pytest.raises(MissingTokenError):
            s.commit()
