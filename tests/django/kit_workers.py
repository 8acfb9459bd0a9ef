"""Worker functions of the Django project that the kit's tests start as processes: they import
models at module level, as a project's workers do, so they need Django set up first."""

from __future__ import annotations

from django.db import connection

from tests.django.shop.models import Account


def where_am_i(name: str) -> list[str]:
    """Create an account through the ORM (when ``name``); return the database's NAME and USER
    from the worker's settings."""
    if name:
        Account.objects.create(name=name)
    return [connection.settings_dict["NAME"], connection.settings_dict["USER"]]
