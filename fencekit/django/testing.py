"""The testing kit's schema for a Django project: its migrations.

    # pytest.ini
    [pytest]
    fencekit_schema = fencekit.django.testing:migrate

The kit builds its template database once per session and calls ``migrate(dsn)`` on it:
Django's ``migrate`` runs there (fencekit's app installs the core, your migrations protect your
tables), with the settings of ``DJANGO_SETTINGS_MODULE`` and the ``default`` database's ENGINE
and OPTIONS, pointed at the template instead of your database.
"""

from __future__ import annotations

from typing import Any

__all__ = ["migrate"]

_ALIAS = "fencekit_testing_template"


def migrate(dsn: str) -> None:
    """Run every Django migration on the database ``dsn`` (a libpq connection string)."""
    import django
    from django.apps import apps
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections
    from psycopg.conninfo import conninfo_to_dict

    if not apps.ready:
        django.setup()  # needs DJANGO_SETTINGS_MODULE, as pytest-django does
    params: dict[str, Any] = conninfo_to_dict(dsn)
    config = dict(settings.DATABASES["default"])
    config.update(
        NAME=params.pop("dbname"),
        HOST=str(params.pop("host", "") or ""),
        PORT=str(params.pop("port", "") or ""),
        USER=str(params.pop("user", "") or ""),
        PASSWORD=str(params.pop("password", "") or ""),
    )
    config["OPTIONS"] = {**config.get("OPTIONS", {}), **params}
    connections.settings[_ALIAS] = connections.configure_settings({"default": config})["default"]
    try:
        call_command("migrate", database=_ALIAS, interactive=False, verbosity=0)
    finally:
        connections[_ALIAS].close()
        del connections[_ALIAS]
        del connections.settings[_ALIAS]
