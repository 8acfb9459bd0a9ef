"""``op.enforce_fence`` and ``op.rollout_fence``: one migration step from rollout mode to
enforcing, refused while the rollout report shows a writer without a token."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

import fencekit.alembic_plugin  # noqa: F401  (registers the operations)
from fencekit.catalog import CatalogError
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements
from tests.alembic.conftest import sqlalchemy_url

Conn = psycopg.Connection[Any]


def _on_missing(db: Conn) -> str:
    row = db.execute(
        "SELECT spec ->> 'on_missing' FROM fencekit.protected WHERE table_name = 'jobs'"
    ).fetchone()
    db.commit()
    assert row is not None
    return str(row[0])


def test_enforce_fence_refuses_while_a_writer_is_seen_then_switches(db: Conn, dsn: str) -> None:
    db.execute("CREATE TABLE jobs (id int PRIMARY KEY, status text)")
    for s in protect_statements(FenceSpec(TableName("public", "jobs"), on_missing="allow")):
        db.execute(s)
    db.commit()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO jobs VALUES (1, 'new')")  # a writer without a token
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            with pytest.raises(CatalogError, match="written without a token"):
                op.enforce_fence("jobs", schema="public", window="1h")  # type: ignore[attr-defined]
        assert _on_missing(db) == "allow"
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            op.enforce_fence("jobs", window="1h", force=True)  # type: ignore[attr-defined]
        assert _on_missing(db) == "reject"
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            op.rollout_fence("jobs")  # type: ignore[attr-defined]  # the downgrade
        assert _on_missing(db) == "allow"
        # Nobody wrote without a token for the window: no force needed.
        db.execute("UPDATE fencekit.unfenced_writers SET last_seen = now() - interval '2 hours'")
        db.execute("UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'")
        db.commit()
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            op.enforce_fence("jobs", window="1h")  # type: ignore[attr-defined]
        assert _on_missing(db) == "reject"
    finally:
        engine.dispose()


def test_enforce_fence_needs_a_database() -> None:
    ctx = MigrationContext.configure(
        dialect_name="postgresql", opts={"as_sql": True, "output_buffer": io.StringIO()}
    )
    with pytest.raises(CatalogError, match="needs a database"):
        Operations(ctx).enforce_fence("jobs")  # type: ignore[attr-defined]


def test_enforce_fence_refuses_tokenless_statements_whose_writer_was_not_recorded(
    db: Conn, dsn: str, make_role: Any
) -> None:
    """Another role, with no grant, holds the writer's record lock: the writer is never
    recorded, but its statements are counted as not attributed and the operation refuses."""
    db.execute("CREATE TABLE jobs (id int PRIMARY KEY, status text)")
    for s in protect_statements(FenceSpec(TableName("public", "jobs"), on_missing="allow")):
        db.execute(s)
    db.execute("UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'")
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = 'jobs'").fetchone()
    assert row is not None
    db.commit()
    stmt = "INSERT INTO jobs VALUES (1, 'new')"
    with (
        psycopg.connect(make_role("enforce_lock_holder"), autocommit=True) as m,
        psycopg.connect(dsn, autocommit=True) as w,
    ):
        m.execute(
            "SELECT pg_advisory_lock(hashtext('fencekit.attribution'), hashtext(%s::text || ' '"
            " || md5(concat_ws(E'\\x1f', %s::text, %s::text, %s::text, %s::text,"
            " md5(fencekit.statement_shape(%s::text))))))",
            [
                row[0],
                *(
                    w.execute(
                        "SELECT session_user, current_user, current_setting('application_name'),"
                        " host(inet_client_addr())"
                    ).fetchone()
                    or ()
                ),
                stmt,
            ],
        )
        w.execute(stmt)
    assert db.execute("SELECT count(*) FROM fencekit.unfenced_writers").fetchone() == (0,)
    db.commit()
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            with pytest.raises(CatalogError, match=r"1 tokenless statement\(s\) not attributed"):
                op.enforce_fence("jobs", schema="public", window="1h")  # type: ignore[attr-defined]
        assert _on_missing(db) == "allow"
    finally:
        engine.dispose()


def _enforce_refused(dsn: str, table: str, match: str) -> None:
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            with pytest.raises(CatalogError, match=match):
                op.enforce_fence(table, window="1h")  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_enforce_fence_refuses_while_a_child_also_inherits_from_a_table_outside_the_tree(
    db: Conn, dsn: str
) -> None:
    """Statements that name the other parent write the child's rows with none of a table
    fence's checks: nobody can tell who writes them, so the operation refuses."""
    db.execute(
        "CREATE TABLE tr (id bigint, v text); CREATE TABLE rc () INHERITS (tr);"
        "CREATE TABLE side3 (id bigint, v text)"
    )
    spec = FenceSpec(TableName("public", "tr"), scope=Scope.TABLE, on_missing="allow")
    for s in protect_statements(spec):
        db.execute(s)
    db.execute("ALTER TABLE rc INHERIT side3")
    db.execute("UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'")
    db.commit()
    _enforce_refused(dsn, "tr", r"child table public\.rc also inherits from public\.side3")
    db.execute("ALTER TABLE rc NO INHERIT side3")
    db.commit()
    engine = sa.create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            Operations(MigrationContext.configure(conn)).enforce_fence("tr", window="1h")  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_enforce_fence_refuses_while_a_child_lacks_its_checks(db: Conn, dsn: str) -> None:
    """An inheritance child made after protect: a tokenless write that names it is neither
    counted nor attributed."""
    db.execute("CREATE TABLE ua (id bigint, v text)")
    spec = FenceSpec(TableName("public", "ua"), scope=Scope.TABLE, on_missing="allow")
    for s in protect_statements(spec):
        db.execute(s)
    db.execute("CREATE TABLE uac () INHERITS (ua)")
    db.execute("UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'")
    db.commit()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO uac VALUES (1, 'tokenless')")
    _enforce_refused(dsn, "ua", r"inheritance child public\.uac lacks fencekit's trigger")
