"""``fencekit_schema = fencekit.django.testing:migrate``: the testing kit's template database gets
the Django project's migrations (fencekit's core, the protected tables)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from fencekit.django.testing import migrate
from fencekit.embedded import EmbeddedServer


@pytest.fixture
def empty_dsn(pg_server: EmbeddedServer) -> Iterator[str]:
    name = f"fk_django_kit_{secrets.token_hex(4)}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.dsn_for(name)
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_migrate_builds_the_projects_schema_with_its_fences(
    empty_dsn: str, django_db_blocker: Any
) -> None:
    # The kit unblocks pytest-django's database access around its template build the same way.
    with django_db_blocker.unblock():
        migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        tables = {
            r[0] for r in conn.execute("SELECT table_name FROM fencekit.protected").fetchall()
        }
        applied = conn.execute(
            "SELECT count(*) FROM django_migrations WHERE app IN ('fencekit', 'shop')"
        ).fetchone()
    assert "shop_billingsummary" in tables
    assert applied is not None
    assert applied[0] >= 2
    # The project's own connection is untouched, and the alias is gone.
    from django.db import connections

    assert "fencekit_testing_template" not in connections.settings
