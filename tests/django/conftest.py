"""pytest-django against the suite's PostgreSQL server, with the test project in this folder.

Django is set up when this folder is collected (``tests.django.settings``); the session's test
database (``test_fk_django``) is created on the embedded server (or ``FENCEKIT_TEST_DSN``'s) and
migrated, which installs fencekit's core and protects the shop's tables through the project's
migrations. Tests use the ``django_db`` marker: the repository's own ``db`` fixture (a psycopg
connection) keeps its name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import django
import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from fencekit.embedded import EmbeddedServer  # noqa: E402
from fencekit.testing.servers import Server, from_dsn  # noqa: E402


@pytest.fixture(scope="session")
def django_db_modify_db_settings(pg_server: EmbeddedServer) -> None:
    """Point the project at the suite's server before pytest-django creates the test database."""
    for alias in ("default", "pooled"):
        settings.DATABASES[alias].update(
            HOST=pg_server.host,
            PORT=str(pg_server.port),
            USER=pg_server.user,
            PASSWORD=pg_server.password or "",
        )


def _bypass_flush(
    execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Django's TransactionTestCase empties every table with TRUNCATE after each test; on a
    protected table that is a write like any other (refused without a token). The test user is
    a superuser, so it may use fencekit's audited bypass for that one statement's transaction
    (docs/django.md, "Tests")."""
    if str(sql).lstrip().upper().startswith("TRUNCATE"):
        context["cursor"].cursor.execute("SELECT set_config('fencekit.bypass', 'on', true)")
    return execute(sql, params, many, context)


@pytest.fixture(autouse=True)
def _flush_with_bypass() -> None:
    connection = connections["default"]
    if _bypass_flush not in connection.execute_wrappers:
        connection.execute_wrappers.append(_bypass_flush)


@pytest.fixture(scope="session")
def fencekit_server(pg_server: EmbeddedServer) -> Server:
    """The testing kit's server is the suite's main one, as in tests/testing_kit: one server
    holds every template the session's kit builds (a second one would be stopped first)."""
    if os.environ.get("FENCEKIT_TEST_DSN"):
        return from_dsn(os.environ["FENCEKIT_TEST_DSN"])
    return Server("embedded", pg_server.host, pg_server.port, pg_server.user, pg_server.password)
