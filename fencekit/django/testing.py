"""The testing kit for a Django project: its migrations build the test database, and the
workers the kit starts connect to it.

    # pytest.ini
    [pytest]
    DJANGO_SETTINGS_MODULE = shopsite.settings
    fencekit_schema = fencekit.django.testing:migrate

The kit builds its template database once per session and calls ``migrate(dsn)`` on it:
Django's ``migrate`` runs there (fencekit's app installs the core, your migrations protect your
tables), with the settings of ``DJANGO_SETTINGS_MODULE`` and the ``default`` database's ENGINE
and OPTIONS, pointed at the template instead of your database.

A worker the kit starts (``fenced_db.spawn``, ``takeover``, ``run_many``) runs
``setup_worker()`` before it imports your code: its ``DATABASES['default']`` becomes the test's
fenced database (the DSN the kit puts in ``FENCEKIT_TEST_APP_DSN``, as the application role),
then ``django.setup()`` runs. Your worker reads and writes through the ORM and takes its lease
from ``DATABASES`` (:mod:`fencekit.django.leases`) as in production: nothing in it names the
test.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["migrate", "setup_worker"]

_ALIAS = "fencekit_testing_template"
APP_DSN_ENV = "FENCEKIT_TEST_APP_DSN"


def _settings_for(dsn: str, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a ``DATABASES`` entry) connecting to ``dsn`` instead: its ENGINE, OPTIONS and
    other keys kept, the libpq keys of ``dsn`` beyond the usual five added to OPTIONS."""
    from psycopg.conninfo import conninfo_to_dict

    params: dict[str, Any] = conninfo_to_dict(dsn)
    config = dict(base)
    config.update(
        NAME=params.pop("dbname"),
        HOST=str(params.pop("host", "") or ""),
        PORT=str(params.pop("port", "") or ""),
        USER=str(params.pop("user", "") or ""),
        PASSWORD=str(params.pop("password", "") or ""),
    )
    config["OPTIONS"] = {**config.get("OPTIONS", {}), **params}
    return config


def migrate(dsn: str) -> None:
    """Run every Django migration on the database ``dsn`` (a libpq connection string)."""
    import django
    from django.apps import apps
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    if not apps.ready:
        django.setup()  # needs DJANGO_SETTINGS_MODULE, as pytest-django does
    config = _settings_for(dsn, settings.DATABASES["default"])
    connections.settings[_ALIAS] = connections.configure_settings({"default": config})["default"]
    try:
        call_command("migrate", database=_ALIAS, interactive=False, verbosity=0)
    finally:
        connections[_ALIAS].close()
        del connections[_ALIAS]
        del connections.settings[_ALIAS]


def setup_worker() -> None:
    """In a worker process the kit starts: point ``DATABASES['default']`` at the test's
    database (``FENCEKIT_TEST_APP_DSN``), then ``django.setup()``. Without that variable (a
    worker started outside the kit) the settings stay as they are."""
    import django
    from django.conf import settings

    dsn = os.environ.get(APP_DSN_ENV)
    if dsn:
        # Before any connection exists: Django reads DATABASES when it first connects.
        default = settings.DATABASES["default"]
        replaced = _settings_for(dsn, default)
        default.clear()
        default.update(replaced)
    django.setup()
