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
from fencekit.spec import FenceSpec, TableName
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
