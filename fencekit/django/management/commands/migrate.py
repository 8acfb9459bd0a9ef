"""``migrate`` whose "your models have changes" check counts ``Meta.fence`` changes too, and
which first refuses a connection whose search_path reaches a schema another role controls."""

from typing import Any

from django.core.management.commands import migrate
from django.db import connections

from fencekit.catalog.rollout import DBAPIConnection
from fencekit.catalog.trusted_path import check_migration_path
from fencekit.django.autodetect import FenceAutodetector


class Command(migrate.Command):
    autodetector = FenceAutodetector

    def handle(self, *args: Any, **options: Any) -> Any:
        # Django's introspection and its django_migrations reads and writes run under the
        # migrating role's path: an operator or trigger planted there would run as that role.
        connection = connections[options["database"]]
        if connection.vendor == "postgresql":
            connection.ensure_connection()
            check_migration_path(
                DBAPIConnection(connection.connection), version_table="django_migrations"
            )
        return super().handle(*args, **options)
