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
from fencekit.testing import FencedDatabase, spawn
from pytest_fencekit import fenced_database
from tests.django.kit_workers import where_am_i


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


fenced_shop = fenced_database(schema="fencekit.django.testing:migrate")


def test_a_worker_the_kit_starts_uses_the_fenced_database(fenced_shop: FencedDatabase) -> None:
    # The worker's module imports a model at its top: Django is set up before it is loaded,
    # and DATABASES['default'] is the test's database, as the application role.
    outcome = fenced_shop.spawn(where_am_i, "acme").join()
    assert outcome.ok, outcome.describe()
    assert outcome.value == [fenced_shop.name, fenced_shop.app_role]
    with fenced_shop.connect() as conn:
        names = conn.execute("SELECT name FROM shop_account").fetchall()
    assert names == [("acme",)]


def test_a_worker_started_outside_a_fenced_database_keeps_its_settings() -> None:
    worker = spawn(where_am_i, "")
    try:
        outcome = worker.join()
    finally:
        worker.close()
    assert outcome.ok, outcome.describe()
    assert outcome.value == ["fk_django", "postgres"]  # tests/django/settings.py's, untouched
