"""The ``fencekit`` Django app: ``INSTALLED_APPS = [..., "fencekit.django"]``.

- Every PostgreSQL connection Django opens carries the current :func:`fencekit.fencing` token
  (:mod:`fencekit.django.runtime`).
- Its migration installs fencekit's core; its ``makemigrations`` and ``migrate`` commands see
  ``Meta.fence`` (:mod:`fencekit.django.autodetect`). List it before any app whose own
  ``makemigrations`` command should win, as for any app overriding a command.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.backends.signals import connection_created

__all__: list[str] = []


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    from fencekit.django.runtime import install

    if connection.vendor == "postgresql":
        install(connection)


class FencekitConfig(AppConfig):
    name = "fencekit.django"
    label = "fencekit"
    verbose_name = "fencekit"
    default = True

    def ready(self) -> None:
        from fencekit.django.runtime import install

        connection_created.connect(_on_connection_created, dispatch_uid="fencekit.django")
        # Connections this thread opened before the app was ready (a management command's).
        for connection in connections.all(initialized_only=True):
            if connection.vendor == "postgresql":
                install(connection)
